"""What weighing a tensor costs, and how often the hooks run a hostile subclass's ``__torch_dispatch__``.

Two measures, of the tree this file sits in (for an older commit, copy it into a ``git archive`` of that commit and
run it there: before issue 46 the weigher is ``engine.discover.safe.weigh``):

- Dispatch (issue 46): a real ``DynamicCache`` layer updated with a tensor subclass that sends its sizes, device
  and layout to ``__torch_dispatch__``, which sleeps ``--sleep`` ms on each such query (as a subclass living on
  another device might): dispatch calls and wall time per update, the hook off (installed, the owner not observed)
  and on.
- Instructions (``valgrind --tool=callgrind``, ``bench.regions``): one ``weigh`` of a plain tensor, a view, a sparse
  tensor and a wrapper subclass, and one ``model_weight_bytes`` of a 16-layer model, per call.

    .venv/bin/python -m bench.weigher [--sleep MS] [--no-callgrind]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

LOOP = 200
"""Calls per callgrind region."""
UPDATES = 5
SIZE_QUERIES = ("prim.layout", "prim.device", "aten.sym_", "aten.dim", "aten.numel", "aten.is_")


def _cases() -> dict[str, tuple[Callable[..., Any], tuple[Any, ...]]]:
    import torch

    try:
        from modelkv_exporter.engine.tensors import weigh
    except ImportError:
        from modelkv_exporter.engine.discover.safe import weigh  # the tree before issue 46
    from modelkv_exporter.engine.weights import model_weight_bytes

    class Wrapper(torch.Tensor):
        @staticmethod
        def __new__(cls, inner: torch.Tensor) -> Any:
            made = torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)  # type: ignore[attr-defined]
            made._inner = inner
            return made

        @classmethod
        def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            raise NotImplementedError

    plain = torch.ones(1, 2, 64, 8)
    model = torch.nn.Sequential(*(torch.nn.Linear(16, 16) for _ in range(16)))
    return {
        "weigh plain": (weigh, (plain, {})),
        "weigh view": (weigh, (plain[:, :, 1:], {})),
        "weigh sparse": (weigh, (torch.eye(16).to_sparse(), {})),
        "weigh wrapper": (weigh, (Wrapper(plain), {})),
        "model_weight_bytes 16 layers": (model_weight_bytes, (model, "cpu")),
    }


def dispatch(sleep_ms: float) -> dict[str, float]:
    """Dispatch calls and wall ms per update of a hostile-tensor cache layer, the hook off and on."""
    import torch
    from transformers import DynamicCache

    from modelkv_exporter.engine.observe import install

    calls = [0]

    class SizesTensor(torch.Tensor):
        @staticmethod
        def __new__(cls, data: torch.Tensor) -> Any:
            return torch.Tensor._make_subclass(  # type: ignore[attr-defined]
                cls, data, False, dispatch_sizes_strides_policy="sizes", dispatch_device=True, dispatch_layout=True
            )

        @classmethod
        def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            calls[0] += 1
            if str(func).startswith(SIZE_QUERIES):
                time.sleep(sleep_ms / 1000)

            def plain(value: Any) -> Any:
                return torch.Tensor._make_subclass(torch.Tensor, value) if type(value) is cls else value  # type: ignore[attr-defined]

            with torch._C._DisableTorchDispatch():
                out = func(*torch.utils._pytree.tree_map(plain, args), **(kwargs or {}))
                if type(out) is torch.Tensor and func is not torch.ops.aten.detach.default:
                    return cls(out)
                return out

    class Owner(torch.nn.Module):
        def forward(self, cache: Any) -> None:
            cache.update(SizesTensor(torch.ones(1, 2, 1, 8)), SizesTensor(torch.ones(1, 2, 1, 8)), 0)

    observer = install([], enabled=True)
    owner = Owner()
    found: dict[str, float] = {}
    try:
        for label in ("off", "on"):
            if label == "on":
                observer.add_owners([("owner", owner)])
            cache = DynamicCache()
            owner(cache)  # the layer's first update (its lazy initialisation) is not timed
            calls[0] = 0
            began = time.perf_counter()
            for _ in range(UPDATES):
                owner(cache)
            found[f"ms per update, hook {label}"] = (time.perf_counter() - began) * 1000 / UPDATES
            found[f"dispatch calls per update, hook {label}"] = calls[0] / UPDATES
    finally:
        observer.uninstall()
    return found


def child(library: str) -> None:
    """Under callgrind: each case ``LOOP`` times in its own region, and an empty region."""
    from bench.regions import load_helper

    helper = load_helper(library)
    cases = _cases()
    for call, args in cases.values():
        call(*args)
    helper.mkv_start()
    for label, (call, args) in {"empty": (lambda *_: None, ()), **cases}.items():
        helper.mkv_zero()
        for _ in range(LOOP):
            call(*args)
        helper.mkv_dump(label.encode())


def instructions() -> dict[str, float] | str:
    """Instructions per call of every case, less the empty loop's."""
    from bench.regions import region_totals

    totals = region_totals("bench.weigher")
    if isinstance(totals, str):
        return totals
    empty = totals.pop("empty", 0)
    return {label: (total - empty) / LOOP for label, total in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sleep", type=float, default=20.0, help="ms each size query sleeps in __torch_dispatch__")
    parser.add_argument("--no-callgrind", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    result: dict[str, Any] = {"dispatch": dispatch(args.sleep)}
    if not args.no_callgrind:
        result["instructions per call"] = instructions()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
