"""A sample re-weighs only the layers that changed (``observe.tally``), and its figures stay exact.

A random sequence of new layers, updates, deaths and layers sharing storages (views of one buffer), sampled as it
goes, with the rolling re-weigh off (``ROLL`` 0: only what the hooks handed over is re-weighed): after every sample
the owner's live bytes equal a full recount of its layers and an independent count of their distinct storages, and
its peak is at least every live figure seen. Broken on purpose (a layer's old storages never leave its tally; the
changed layers never re-weighed), the same sequence gives other figures.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from modelkv_exporter.engine.observe import Observer, hooks, install, tally
from modelkv_exporter.engine.observe.observer import recount
from modelkv_exporter.engine.observe.records import Tally
from tests.engine.observing import Owner, add, figures, kv


def distinct_bytes(layers: list[Any]) -> int:
    """Independent count: the distinct storages behind the layers' keys and values."""
    seen: dict[int, int] = {}
    for layer in layers:
        for tensor in (layer.keys, layer.values):
            if isinstance(tensor, torch.Tensor) and tensor.numel():
                storage = tensor.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def full_recount(owner_state: Any) -> int:
    """The exact de-duplicated recount of every live layer of the owner (what a sample did before ``tally``)."""
    with hooks.lock:
        hooks.drain()
        mine = [record for record in hooks.records.values() if record.owner is owner_state and record() is not None]
    live, _ = recount(owner_state, mine, False)
    return live


class SharingLayer(DynamicLayer):
    """A layer class from elsewhere whose update keeps the tensors it is given (views of shared buffers)."""

    def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> Any:
        self.keys, self.values = key_states, value_states
        self.is_initialized = True
        return self.keys, self.values


def run_sequence(observer: Observer, seed: int, steps: int = 120) -> list[str]:
    """The random sequence; every mismatch between the sampled figures and the full counts, described."""

    rng = random.Random(seed)
    owner = Owner()
    add(observer, owner)
    state = observer.state_of(owner)
    assert state is not None
    pools = [torch.zeros(1, 2, 64, 8) for _ in range(3)]
    caches: list[Any] = []
    sharing: list[Any] = []
    mismatches: list[str] = []
    most = 0

    def shared_view() -> torch.Tensor:
        start = rng.randrange(0, 32)
        return pools[rng.randrange(len(pools))][:, :, start : start + rng.randrange(1, 32)]

    def step(self: Owner) -> None:
        action = rng.choice(("new", "update", "update", "death", "share", "share again", "death of a sharer"))
        if action == "new" or not caches:
            cache = DynamicCache()
            for layer in range(rng.randrange(1, 4)):
                cache.update(kv(1, rng.randrange(1, 5)), kv(1, rng.randrange(1, 5)), layer)
            caches.append(cache)
        elif action == "update":
            cache = rng.choice(caches)
            cache.update(kv(1, 1), kv(1, 1), rng.randrange(len(cache.layers)))
        elif action == "death":
            caches.pop(rng.randrange(len(caches)))
        elif action == "share" or not sharing:
            layer = SharingLayer()
            layer.update(shared_view(), shared_view())
            sharing.append(layer)
        elif action == "share again":
            rng.choice(sharing).update(shared_view(), shared_view())
        else:
            sharing.pop(rng.randrange(len(sharing)))

    for number in range(steps):
        owner(step)
        if number % 3:
            continue
        f = figures(observer, owner)
        expected = distinct_bytes([layer for cache in caches for layer in cache.layers] + sharing)
        full = full_recount(state)
        most = max(most, expected)
        if not f.available or f.live_bytes != expected or full != expected or (f.peak_bytes or 0) < most:
            mismatches.append(
                f"step {number}: live {f.live_bytes} peak {f.peak_bytes}, counted {expected}, full {full}"
            )
    return mismatches


@pytest.fixture
def rolling_off(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(tally, "ROLL", 0)
    yield


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_incremental_figures_equal_a_full_recount(observer: Observer, rolling_off: None, seed: int) -> None:
    assert run_sequence(observer, seed) == []


@pytest.mark.parametrize("first", ["the layer that takes the address", "the layer that lets it go"])
def test_an_address_let_go_by_one_layer_and_taken_by_another_counts_at_its_new_size(
    observer: Observer, rolling_off: None, first: str
) -> None:
    """Between two samples one layer lets go of a 192-byte storage and another takes a 64-byte one at the same
    address (as an allocator reuses freed memory; here two storages over one buffer): the figure is the 64 bytes
    there now, whichever of the two layers the sample weighs first. The tally keeps the newest size weighed at an
    address (``Tally.add``): a storage's first size, kept while the layer that let it go still held it, counted 192."""
    buffer = bytearray(192)

    def over_buffer(rows: int) -> torch.Tensor:
        return torch.frombuffer(buffer, dtype=torch.float32, count=rows * 8).view(1, 1, rows, 8)

    owner = Owner()
    add(observer, owner)
    letting_go, taking = SharingLayer(), SharingLayer()
    owner(lambda self: letting_go.update(over_buffer(6), over_buffer(6)))
    assert figures(observer, owner).live_bytes == 192
    elsewhere = torch.zeros(1, 1, 2, 8)

    def swap(self: Owner) -> None:
        if first == "the layer that takes the address":
            taking.update(over_buffer(2), over_buffer(2))
        letting_go.update(elsewhere, elsewhere)
        if first == "the layer that lets it go":
            taking.update(over_buffer(2), over_buffer(2))

    owner(swap)
    assert figures(observer, owner).live_bytes == 64 + 64 == distinct_bytes([letting_go, taking])


def test_broken_a_reused_address_keeps_its_first_size_and_the_figures_differ(
    observer: Observer, rolling_off: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Tally.add

    def first_size_kept(self: Tally, found: dict[Any, int]) -> None:
        real(self, {key: self.sizes.get(key, size) for key, size in found.items()})

    monkeypatch.setattr(Tally, "add", first_size_kept)
    with pytest.raises(AssertionError, match=r"assert 256 == \(64 \+ 64\)"):
        test_an_address_let_go_by_one_layer_and_taken_by_another_counts_at_its_new_size(
            observer, None, "the layer that takes the address"
        )


def test_broken_a_layers_old_storages_never_leave_and_the_figures_differ(
    observer: Observer, rolling_off: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Tally, "remove", lambda self, record, found: None)
    assert run_sequence(observer, 1)


def test_broken_changed_layers_never_reweighed_and_the_figures_differ(
    observer: Observer, rolling_off: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hooks, "take_changed", lambda: {})
    assert run_sequence(observer, 1)


def test_a_sample_reweighs_what_changed_not_every_live_layer(
    observer: Observer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1 000 live layers, 10 updated: the sample weighs those 10 and the rolling few, not the 1 000."""
    monkeypatch.setattr(tally, "ROLL", 16)
    owner = Owner()
    add(observer, owner)
    caches = [DynamicCache() for _ in range(10)]
    owner(lambda self: [cache.update(kv(1, 1), kv(1, 1), layer) for cache in caches for layer in range(100)])
    figures(observer, owner)
    weighed: list[object] = []
    real = tally.storages

    def counted(layer: object, plan: Any) -> Any:
        weighed.append(layer)
        return real(layer, plan)

    monkeypatch.setattr(tally, "storages", counted)
    owner(lambda self: [cache.update(kv(1, 1), kv(1, 1), 0) for cache in caches])
    f = figures(observer, owner)
    assert len(weighed) <= 10 + 16
    assert f.live_bytes == distinct_bytes([layer for cache in caches for layer in cache.layers])


def test_a_change_made_outside_the_hooked_methods_is_found_by_the_rolling_reweigh(observer: Observer) -> None:
    """A ``crop`` (not hooked) shrinks a layer: within ``live layers / ROLL`` samples the figure follows."""
    owner = Owner()
    add(observer, owner)
    cache = DynamicCache()
    owner(lambda self: cache.update(kv(1, 8), kv(1, 8), 0))
    assert figures(observer, owner).live_bytes == distinct_bytes(cache.layers)
    cache.layers[0].keys = cache.layers[0].keys[:, :, :2].clone()
    for _ in range(2):
        f = figures(observer, owner)
    assert f.live_bytes == distinct_bytes(cache.layers)


def test_two_models_sampled_at_once_each_read_exact_figures(observer: Observer, rolling_off: None) -> None:
    """Two models in one process, two heartbeats: one samples its model without pause while the other model's
    owner changes its caches and is sampled. Each sample reads figures no other sample has half-updated: the
    changes one heartbeat takes over are weighed before any figure is read (``tally.sampling``)."""
    other = install([], enabled=True)
    try:
        neighbour, owner = Owner(), Owner()
        add(other, neighbour)
        add(observer, owner)
        neighbour_caches: list[Any] = [DynamicCache()]
        neighbour(lambda self: neighbour_caches[0].update(kv(1, 4), kv(1, 4), 0))
        stop = threading.Event()

        def beating() -> None:
            while not stop.is_set():
                other.sample()

        heartbeat = threading.Thread(target=beating, daemon=True)
        heartbeat.start()
        caches: list[Any] = []
        wrong = []
        try:
            for number in range(300):

                def step(self: Owner, number: int = number) -> None:
                    if len(caches) > 8:
                        caches.pop(0)
                    cache = DynamicCache()
                    for layer in range(3):
                        cache.update(kv(1, 1 + number % 4), kv(1, 1 + number % 3), layer)
                    caches.append(cache)

                owner(step)
                f = figures(observer, owner)
                expected = distinct_bytes([layer for cache in caches for layer in cache.layers])
                if f.live_bytes != expected:
                    wrong.append((number, f.live_bytes, expected))
        finally:
            stop.set()
            heartbeat.join(timeout=10)
        assert wrong == [], f"{len(wrong)} of 300 samples read half-updated figures, first {wrong[:3]}"
    finally:
        other.uninstall()


def test_a_child_forked_while_a_sample_held_changes_rebuilds_its_tallies(observer: Observer, rolling_off: None) -> None:
    """A sample took changes over and the fork left it behind (its thread is not in the child): the parent's tally
    stays wrong (nothing re-weighs those layers with the rolling re-weigh off); the child rebuilds every tally from
    its live layers at its first sample and reads the exact figure."""
    owner = Owner()
    add(observer, owner)
    caches: list[Any] = [DynamicCache()]
    owner(lambda self: caches[0].update(kv(1, 2), kv(1, 2), 0))
    figures(observer, owner)
    owner(lambda self: caches[0].update(kv(1, 3), kv(1, 3), 0))
    with hooks.lock:
        hooks.drain()
        hooks.take_changed()  # taken over by the sample the fork cut short
    exact = distinct_bytes(list(caches[0].layers))
    assert figures(observer, owner).live_bytes != exact, "the lost changes leave the parent's tally behind"
    child = os.fork()
    if child == 0:
        os._exit(0 if figures(observer, owner).live_bytes == exact else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child's first sample reads the exact figure"
