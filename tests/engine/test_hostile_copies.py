"""Copies of an observed model run their own code on their own state, pickle, and are not the original owner."""

from __future__ import annotations

import copy
import io
import pickle

import torch
from transformers import DynamicCache, StaticCache

from modelkv_exporter.engine.observe import Observer
from tests.engine.observing import Owner, add, figures, full_config, kv, storage_bytes


class Scaling(Owner):
    """An owner with a parameter: its forward's result depends on its own state."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((4,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        cache = DynamicCache()
        cache.update(kv(1, 3), kv(1, 3), 0)
        self.kept["cache"] = cache
        return x * self.weight


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.talker = Scaling()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.talker(x)


def test_a_deep_copy_runs_its_own_forward_on_its_own_state(observer: Observer) -> None:
    model = Model()
    unobserved = copy.deepcopy(model)
    add(observer, model.talker)
    model(torch.ones(4))
    clone = copy.deepcopy(model)
    with torch.no_grad():
        clone.talker.weight.fill_(3.0)
        unobserved.talker.weight.fill_(3.0)
    x = torch.arange(4.0)
    assert torch.equal(clone(x), unobserved(x)) and torch.equal(clone(x), x * 3)
    assert torch.equal(model(x), x * 2), "the original still runs on its own parameters"
    f = figures(observer, model.talker)
    assert f.calls == 2, "the copy's calls are not the original owner's"
    assert f.live_bytes == 2 * kv(1, 3).nbytes, "nor are its caches"


def test_an_observed_owner_pickles_and_round_trips(observer: Observer) -> None:
    model = Model()
    add(observer, model.talker)
    model(torch.ones(4))
    model.talker.kept.clear()
    again = pickle.loads(pickle.dumps(model.talker))
    assert torch.equal(again(torch.ones(4)), torch.full((4,), 2.0))
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert torch.equal(loaded(torch.ones(4)), torch.full((4,), 2.0))
    assert figures(observer, model.talker).calls == 1, "neither copy counts as the original"


def test_a_shallow_copy_of_a_layer_shares_its_tensors_and_counts_once(observer: Observer) -> None:
    owner = Owner()
    add(observer, owner)
    static = StaticCache(config=full_config(1), max_cache_len=8)
    dynamic = DynamicCache()

    def run(self: Owner) -> None:
        static.update(kv(1, 2), kv(1, 2), 0, {"cache_position": torch.arange(2)})
        dynamic.update(kv(1, 3), kv(1, 3), 0)
        self.kept["copies"] = [copy.copy(static.layers[0]), copy.copy(dynamic.layers[0])]
        static.update(kv(1, 1), kv(1, 1), 0, {"cache_position": torch.tensor([2])})  # in place: still shared

    owner(run)
    f = figures(observer, owner)
    held = storage_bytes(static, dynamic)
    assert f.live_bytes == f.peak_bytes == held

    def grow(self: Owner) -> None:  # the original moves to new tensors; the copy alone holds the old ones now
        dynamic.update(kv(1, 1), kv(1, 1), 0)

    owner(grow)
    f = figures(observer, owner)
    copies = owner.kept["copies"]
    assert copies[1].keys is not dynamic.layers[0].keys
    assert f.live_bytes == storage_bytes(static, dynamic) + 2 * kv(1, 3).nbytes, "the copy's 3 positions"
    assert f.peak_bytes == f.live_bytes
