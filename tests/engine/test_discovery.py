"""Discovered owners: modules that hold caches they do not declare, found and weighed exactly.

Real parts throughout: real ``transformers`` caches, real modules holding their own tensors (the real
vLLM-Omni Qwen3-TTS tokenizer decoder is in ``test_discovery_omni.py``, which needs vLLM-Omni). Every mechanism that keeps a
figure honest (de-duplication against parameters and the baseline, the paged KV cache and the
observed caches; following a cache outward to the module that built it; the census budget) is
broken on purpose in a test of its own, which shows the figure going wrong.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch import nn
from transformers import DynamicCache

from modelkv_exporter.contract.snapshot import DiscoveredOwner, DiscoveryStatus
from modelkv_exporter.contract.spool import snapshot_file_name
from modelkv_exporter.engine import engine_log
from modelkv_exporter.engine.config import TABLE, DiscoverySettings, HookConfig
from modelkv_exporter.engine.discover import Discovery, census, discover, discovery
from modelkv_exporter.engine.discover.module_map import ModuleMap, takes_cache
from modelkv_exporter.engine.heartbeat import SnapshotPublisher
from modelkv_exporter.engine.observe import Observer, hooks
from modelkv_exporter.engine.publish import build_snapshot
from modelkv_testbed.polling import eventually

EVERYTHING = DiscoverySettings(census_interval=0, discover_floor_bytes=0)
"""A census at every beat, every owner published."""
LAYERS, EMBED, PAGE = 4, 64, 250


class StreamingKV(nn.Module):
    """Keeps its own KV in one plain tensor ``[layers, 2, capacity, embed]``, grown a page of positions at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(EMBED, EMBED)
        self.kv: torch.Tensor | None = None
        self.length = 0

    def forward(self, positions: int) -> None:
        capacity = 0 if self.kv is None else self.kv.shape[2]
        needed = self.length + positions
        if needed > capacity:
            pages = -(-needed // PAGE)
            grown = torch.zeros(LAYERS, 2, pages * PAGE, EMBED)
            if self.kv is not None:
                grown[:, :, :capacity] = self.kv
            self.kv = grown
        self.kv[:, :, self.length : needed] = 1.0
        self.length = needed

    def reset(self) -> None:
        self.kv, self.length = None, 0


class Delegate:
    """A plain object (not a module) that keeps per-request caches in a dict."""

    def __init__(self) -> None:
        self.caches: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def step(self, request: str, positions: int) -> None:
        self.caches[request] = (torch.ones(1, 2, positions, 16), torch.ones(1, 2, positions, 16))


class Talker(nn.Module):
    """Hands its requests to a plain-object delegate."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(16, 16)
        self.runner = Delegate()

    def forward(self, request: str, positions: int) -> None:
        self.runner.step(request, positions)


class Rotary(nn.Module):
    """A buffer present after load, and a weight view taken lazily after it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(256, 256)
        self.register_buffer("table", torch.ones(1024, 64))
        self.transposed: torch.Tensor | None = None

    def forward(self) -> torch.Tensor:
        if self.transposed is None:
            self.transposed = self.lin.weight.t()
        scratch = torch.ones(512, 512)  # lives only inside the call
        return scratch.sum()


class Attention(nn.Module):
    """Where vLLM binds a paged KV cache after load (``kv_cache``), and where a DynamicCache is built and kept."""

    def __init__(self) -> None:
        super().__init__()
        self.kv_cache: list[torch.Tensor] = []
        self.kept: DynamicCache | None = None

    def forward(self, positions: int) -> None:
        cache = DynamicCache()
        for layer in range(2):
            cache.update(torch.ones(1, 2, positions, 8), torch.ones(1, 2, positions, 8), layer)
        self.kept = cache


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.audio = nn.Module()
        self.audio.encoder = StreamingKV()
        self.talker = Talker()
        self.rotary = Rotary()
        self.attn = Attention()


def kv_bytes(positions: int) -> int:
    return LAYERS * 2 * positions * EMBED * 4


def by_owner(found: tuple[DiscoveredOwner, ...]) -> dict[tuple[str, str], DiscoveredOwner]:
    return {(o.owner, o.found_by): o for o in found}


@pytest.fixture
def started(observer: Observer) -> Iterator[tuple[Model, Discovery, torch.Tensor]]:
    """A loaded model, discovery started after load, and a paged KV tensor bound to it as vLLM does."""
    model = Model()
    found = Discovery(model, EVERYTHING, observer=observer)
    paged = torch.zeros(2, 64, 16, 2, 8)
    model.attn.kv_cache = [paged[0], paged[1]]
    found.start(lambda: [paged])
    yield model, found, paged
    found.uninstall()


def beat(found: Discovery) -> dict[tuple[str, str], DiscoveredOwner]:
    published, status = found.beat()
    assert status.enabled, status.reason
    return by_owner(published)


# -- what is found, and its exact bytes ---------------------------------------------------------------


def test_a_paged_plain_tensor_cache_is_found_at_its_module_with_its_storage_bytes(started) -> None:
    model, found, _ = started
    model.audio.encoder(100)
    assert beat(found)[("audio.encoder", "census")].live_bytes == kv_bytes(250)
    model.audio.encoder(200)  # 300 positions: a second page, a new tensor
    owner = beat(found)[("audio.encoder", "census")]
    assert (owner.live_bytes, owner.peak_bytes, owner.storages) == (kv_bytes(500), kv_bytes(500), 1)
    assert owner.owner_class == "StreamingKV" and not owner.declares and owner.layout is None


def test_per_request_caches_in_a_dict_on_a_plain_object_delegate_are_found_at_the_module(started) -> None:
    model, found, _ = started
    model.talker("a", 10)
    model.talker("b", 30)
    request = 2 * 16 * 4
    owner = beat(found)[("talker", "census")]
    assert (owner.live_bytes, owner.storages) == (2 * 40 * request, 4)


def test_released_caches_leave_live_then_recent_and_the_peak_stays(started) -> None:
    model, found, _ = started
    model.audio.encoder(100)
    model.talker("a", 10)
    beat(found)
    model.audio.encoder.reset()
    del model.talker.runner.caches["a"]
    first = beat(found)
    assert first[("audio.encoder", "census")].live_bytes == 0
    assert first[("audio.encoder", "census")].recent_peak_bytes == kv_bytes(250), "the interval still saw it"
    second = beat(found)
    encoder, talker = second[("audio.encoder", "census")], second[("talker", "census")]
    assert (encoder.live_bytes, encoder.recent_peak_bytes, encoder.peak_bytes) == (0, 0, kv_bytes(250))
    assert (talker.live_bytes, talker.recent_peak_bytes) == (0, 0)


def test_a_dynamic_cache_built_and_kept_by_a_module_is_found_by_its_layers_not_twice(started) -> None:
    model, found, _ = started
    model.attn(5)
    got = beat(found)
    owner = got[("attn", "cache_layer")]
    assert owner.live_bytes == 2 * 2 * (2 * 5 * 8 * 4)
    assert owner.layout is not None
    assert (owner.layout.layers, owner.layout.kv_heads, owner.layout.head_dim, owner.layout.rows) == (2, 2, 8, 1)
    assert ("attn", "census") not in got, "the census must not count the observed layers again"


# -- what is never found ------------------------------------------------------------------------------


def test_weights_buffers_the_paged_cache_and_call_temporaries_are_never_discovered(started) -> None:
    model, found, paged = started
    model.rotary()
    during: list[dict[tuple[str, str], DiscoveredOwner]] = []
    original = model.rotary.forward

    def inside_a_call() -> torch.Tensor:
        temporary = torch.ones(1024, 1024)
        during.append(beat(found))
        return temporary.sum()

    model.rotary.forward = inside_a_call  # type: ignore[method-assign]
    model.rotary()
    model.rotary.forward = original  # type: ignore[method-assign]
    assert during == [{}] and beat(found) == {}


def test_without_the_baseline_a_weight_view_and_a_buffer_would_be_reported(started) -> None:
    model, found, _ = started
    model.rotary()
    found.baseline = set()
    owner = beat(found)[("rotary", "census")]
    assert (owner.live_bytes, owner.storages) == (1024 * 64 * 4 + 256 * 256 * 4, 2), "the buffer and the weight"


def test_without_the_paged_cache_excluded_it_would_be_reported(observer: Observer) -> None:
    model = Model()
    found = Discovery(model, EVERYTHING, observer=observer)
    paged = torch.zeros(2, 64, 16, 2, 8)
    model.attn.kv_cache = [paged[0], paged[1]]
    found.start()
    try:
        assert beat(found)[("attn", "census")].live_bytes == paged.nbytes
    finally:
        found.uninstall()


def test_without_the_observed_layers_excluded_the_census_would_count_a_cache_twice(started, monkeypatch) -> None:
    model, found, _ = started
    monkeypatch.setattr(found, "_layer_storages", set)
    model.attn(5)
    got = beat(found)
    assert got[("attn", "census")].live_bytes == got[("attn", "cache_layer")].live_bytes


def test_a_layer_is_attributed_once_never_per_update(started, monkeypatch) -> None:
    model, found, _ = started
    walks: list[object] = []
    walk = found._attribute
    monkeypatch.setattr(found, "_attribute", lambda layer: walks.append(layer) or walk(layer))
    hooks.discover = found.attribute
    cache = DynamicCache()
    model.attn.kept = cache

    class Stepper(nn.Module):
        def forward(self) -> None:
            for _ in range(5):
                cache.update(torch.ones(1, 2, 1, 8), torch.ones(1, 2, 1, 8), 0)

    model.stepper = stepper = Stepper()
    stepper()
    assert len(walks) == 1


# -- the census: slices, budgets ----------------------------------------------------------------------


def test_the_census_yields_in_slices_and_finds_the_same(started) -> None:
    model, found, _ = started
    model.audio.encoder(10)
    model.more = nn.ModuleList(nn.Linear(2, 2) for _ in range(200))
    found.modules = ModuleMap(model)
    whole = census.run(census.census(found.modules, found.budget, slice_seconds=1.0), pause=False)
    walk = census.census(found.modules, found.budget, slice_seconds=0.0)
    slices = 0
    while True:
        try:
            next(walk)
            slices += 1
        except StopIteration as done:
            sliced = done.value
            break
    assert slices > 1 and sliced.storages() == whole.storages() and sliced.modules == whole.modules


@pytest.mark.parametrize(
    ("budget", "exhausted"),
    [
        (census.Budget(modules=3, objects=10_000, depth=6), "modules"),
        (census.Budget(modules=100, objects=3, depth=6), "objects"),
        (census.Budget(modules=100, objects=10_000, depth=1), "depth"),
    ],
)
def test_a_spent_budget_is_reported(observer: Observer, budget: census.Budget, exhausted: str) -> None:
    model = Model()
    limits = {
        "census_max_modules": budget.modules,
        "census_max_objects": budget.objects,
        "census_max_depth": budget.depth,
    }
    found = Discovery(model, replace(EVERYTHING, **limits), observer=observer)
    found.start()
    model.talker("a", 10)
    try:
        published, status = found.beat()
    finally:
        found.uninstall()
    assert status.budget_exhausted == exhausted
    if exhausted == "depth":
        assert ("talker", "census") not in by_owner(published), "the delegate's dict lies deeper than 1"


def test_the_floor_and_the_owner_budget_are_counted_not_hidden(started) -> None:
    model, found, _ = started
    model.audio.encoder(10)
    model.talker("a", 10)
    found.settings = replace(EVERYTHING, discover_floor_bytes=10_000, engine_max_discovered_owners=0)
    published, status = found.beat()
    assert published == ()
    assert (status.owners_below_floor, status.owners_over_budget) == (1, 1)


# -- off and safe -------------------------------------------------------------------------------------


def config(**environ: str) -> HookConfig:
    values, problems = TABLE.from_environ({"MODELKV_SPOOL_DIR": "/tmp/spool", **environ})
    assert not problems
    settings = HookConfig.from_environ({"MODELKV_SPOOL_DIR": "/tmp/spool", **environ})
    assert settings is not None
    return settings


@pytest.mark.parametrize(
    ("environ", "reason"),
    [({"MODELKV_OBSERVE": "0"}, discovery.OBSERVE_OFF), ({"MODELKV_DISCOVER": "off"}, discovery.OFF)],
)
def test_the_switches_turn_discovery_off(environ: dict[str, str], reason: str) -> None:
    found = discover(Model(), config(**environ), None)
    assert found.beat() == ((), DiscoveryStatus(enabled=False, reason=reason))
    assert hooks.discover is None


def test_the_settings_reach_discovery() -> None:
    settings = config(
        MODELKV_CENSUS_INTERVAL="60",
        MODELKV_DISCOVER_FLOOR_BYTES="4096",
        MODELKV_ENGINE_MAX_DISCOVERED_OWNERS="3",
        MODELKV_CENSUS_MAX_MODULES="10",
        MODELKV_CENSUS_MAX_OBJECTS="20",
        MODELKV_CENSUS_MAX_DEPTH="2",
    ).discovery
    assert settings == DiscoverySettings(
        census_interval=60.0,
        discover_floor_bytes=4096,
        engine_max_discovered_owners=3,
        census_max_modules=10,
        census_max_objects=20,
        census_max_depth=2,
    )
    assert Discovery(Model(), settings).budget == census.Budget(10, 20, 2)


def test_the_engines_owner_budget_has_one_name() -> None:
    """Its former name (MODELKV_DISCOVER_MAX_OWNERS), never released, is not read."""
    assert config(MODELKV_DISCOVER_MAX_OWNERS="3").discovery.engine_max_discovered_owners == 32
    assert config(MODELKV_ENGINE_MAX_DISCOVERED_OWNERS="5").discovery.engine_max_discovered_owners == 5


def test_a_failing_census_is_logged_once_turns_discovery_off_and_never_reaches_the_model(
    started, monkeypatch, caplog
) -> None:
    model, found, _ = started

    def broken(*arguments: object, **keywords: object) -> None:
        raise RuntimeError("census broke")

    monkeypatch.setattr(census, "census", broken)
    with caplog.at_level(logging.WARNING):
        assert found.beat() == (
            (),
            DiscoveryStatus(enabled=False, reason="discovery failed in census: RuntimeError: census broke"),
        )
        found.beat()
        engine_log.flush()
    assert sum("discovery failed in census" in r.getMessage() for r in caplog.records) == 1
    assert hooks.discover is None
    model.attn(5)
    assert isinstance(model.attn.kept, DynamicCache)


def test_a_failing_attribution_never_reaches_the_model(started, monkeypatch) -> None:
    model, found, _ = started

    def broken(layer: object) -> None:
        raise RuntimeError("attribution broke")

    monkeypatch.setattr(found, "_attribute", broken)
    hooks.discover = found.attribute
    model.attn(5)
    assert model.attn.kept is not None and model.attn.kept.get_seq_length() == 5
    assert not found.enabled and "attribution broke" in (found.reason or "")
    assert hooks.discover is None and hooks.broken() is None, "observation itself goes on"


def test_no_census_runs_during_a_cuda_graph_capture(started, monkeypatch) -> None:
    model, found, _ = started
    model.audio.encoder(10)
    monkeypatch.setattr(hooks, "_graph_depth", 1)
    _, status = found.beat()
    assert status.census_at is None
    monkeypatch.setattr(hooks, "_graph_depth", 0)
    _, status = found.beat()
    assert status.census_at is not None


# -- published by the heartbeat -----------------------------------------------------------------------


def test_the_heartbeat_publishes_discovered_owners_and_the_status(started, observer: Observer, tmp_path) -> None:
    model, found, _ = started
    snapshot = build_snapshot(model, max_num_seqs=1, engine_id="e")
    publisher = SnapshotPublisher(tmp_path, snapshot)
    model.audio.encoder(100)
    publisher.start_heartbeat(0.05, None, observer.sample, found)
    try:

        def written() -> dict[str, Any]:
            return json.loads((tmp_path / snapshot_file_name("e")).read_text())

        eventually(
            lambda: tmp_path.joinpath(snapshot_file_name("e")).exists() and written().get("discovered"), "a beat"
        )
    finally:
        publisher.stop()
    data = written()
    assert [(d["owner"], d["found_by"], d["live_bytes"]) for d in data["discovered"]] == [
        ("audio.encoder", "census", kv_bytes(250))
    ]
    assert data["discovery"]["enabled"] and data["discovery"]["census_at"] is not None
    assert data["discovery"]["modules"] == sum(1 for _ in model.modules())


# -- attribution by code: shared code, shallow copies -----------------------------------------------------


class KeepingAttention(nn.Module):
    """Several instances (so its code names none of them); each builds and keeps a cache of its own."""

    def forward(self, positions: int) -> None:
        cache = DynamicCache()
        cache.update(torch.ones(1, 2, positions, 8), torch.ones(1, 2, positions, 8), 0)
        self.kept = cache


class Layers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.ModuleList(KeepingAttention() for _ in range(3))

    def forward(self, positions: int) -> None:
        for attention in self.attention:
            attention(positions)


def test_caches_kept_by_modules_that_share_code_go_to_the_module_around_them_then_to_each_holder(
    observer: Observer,
) -> None:
    """When built, the attention layers' shared code names none of them: the stack module around them is found; the
    census then finds each layer's holder and moves it there."""
    root = nn.Module()
    root.stack = Layers()
    found = Discovery(root, EVERYTHING, observer=observer)
    found.start()
    try:
        root.stack(5)
        before = found.sample()[0]
        after = beat(found)
    finally:
        found.uninstall()
    layer = 2 * (2 * 5 * 8 * 4)
    assert [(o.owner, o.live_bytes) for o in before] == [("stack", 3 * layer)]
    assert {key: o.live_bytes for key, o in after.items()} == {
        (f"stack.attention.{index}", "cache_layer"): layer for index in range(3)
    } | {("stack", "cache_layer"): 0}


class Snapshotting(nn.Module):
    """Builds and keeps a cache, and keeps shallow copies of its layers (sharing their tensors)."""

    def forward(self, positions: int) -> None:
        cache = DynamicCache()
        cache.update(torch.ones(1, 2, positions, 8), torch.ones(1, 2, positions, 8), 0)
        self.kept = cache
        self.copies = [copy.copy(layer) for layer in cache.layers]


def test_a_shallow_copy_of_a_layer_does_not_double_its_owners_peak(observer: Observer) -> None:
    root = nn.Module()
    root.snap = Snapshotting()
    found = Discovery(root, EVERYTHING, observer=observer)
    found.start()
    try:
        root.snap(5)
        owner = beat(found)[("snap", "cache_layer")]
    finally:
        found.uninstall()
    assert (owner.peak_bytes, owner.live_bytes) == (2 * 2 * 5 * 8 * 4, 2 * 2 * 5 * 8 * 4)


class Filler(nn.Module):
    """Handed a cache under a name other than ``past_key_values``, and fills its first layer."""

    def forward(self, cache: DynamicCache) -> None:
        cache.update(torch.ones(1, 2, 3, 8), torch.ones(1, 2, 3, 8), 0)


class Maker(nn.Module):
    """Builds a cache, hands it to its child to fill, and keeps it."""

    def __init__(self) -> None:
        super().__init__()
        self.filler = Filler()

    def forward(self) -> None:
        cache = DynamicCache()
        self.filler(cache)
        self.kept = cache


@pytest.mark.parametrize(("read_locals", "owner"), [(False, "maker.filler"), (True, "maker")])
def test_a_cache_handed_under_another_name_is_followed_outward_only_when_reading_locals_is_opted_into(
    observer: Observer, read_locals: bool, owner: str
) -> None:
    """What the code-only walk loses, and the opt-in walk (``MODELKV_DISCOVER_READ_LOCALS=1``) keeps."""
    root = nn.Module()
    root.maker = Maker()
    found = Discovery(root, replace(EVERYTHING, discover_read_locals=read_locals), observer=observer)
    found.start()
    try:
        root.maker()
        got = beat(found)
    finally:
        found.uninstall()
    assert [key[0] for key in got] == [owner]


def test_reading_locals_is_opted_into_by_its_setting() -> None:
    assert config(MODELKV_DISCOVER_READ_LOCALS="1").discovery.discover_read_locals
    assert not config().discovery.discover_read_locals


def test_transformers_own_layers_are_seen_handed_the_cache_whatever_its_parameter_is_called() -> None:
    """Qwen2's model, decoder layer and attention take the cache as ``past_key_values`` up to 5.19 and as ``cache``
    in 5.25: either way they only pass it along. ``make test`` runs this on the lowest and the newest transformers."""
    from transformers import Qwen2Config, Qwen2Model

    model = Qwen2Model(
        Qwen2Config(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=100,
        )
    )
    for module in (model, model.layers[0], model.layers[0].self_attn):
        forward = type(module).forward
        while hasattr(forward, "__wrapped__"):
            forward = forward.__wrapped__
        assert takes_cache(forward.__code__), type(module).__name__
