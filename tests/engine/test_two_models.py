"""Two models in one process (an RL trainer runs vLLM beside training): each engine publishes its own model's caches.

Two models of one architecture, real ``transformers`` caches in both: a declaring owner (``talker``) that builds and
keeps a ``DynamicCache``, and a module that declares nothing (``decoder``) whose real ``Qwen2Model`` fills a cache it
builds and keeps. The hooks and the class patches are the process's, shared; each model has an observer and a
discovery of its own. The models run alternately and on two threads, at the observer's and discovery's level and
through the hook as vLLM drives a worker (``test_extensible_kv``'s stand-in worker), and one model is released or
its engine ended while the other goes on. Every byte figure is checked against the storages the model's own caches
hold (``observing.storage_bytes``), which differ between the two models.

The two models run the same code (a code object is a class's, not an instance's): only the nearest module call
tells them apart, and a test breaks that on purpose to show one model's cache going to the other.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch
from torch import nn
from transformers import DynamicCache, Qwen2Config, Qwen2Model, cache_utils

from modelkv_exporter.contract.snapshot import DiscoveredOwner, Observation, Snapshot
from modelkv_exporter.contract.spool import snapshot_file_name
from modelkv_exporter.engine.config import DiscoverySettings
from modelkv_exporter.engine.discover import Discovery, stack
from modelkv_exporter.engine.discover.discovery import Several
from modelkv_exporter.engine.discover.module_map import ModuleMap
from modelkv_exporter.engine.observe import Observer, hooks, install, installed
from modelkv_exporter.engine.protocol import ModelLocalKVScope, ModelLocalKVSpec, RowDriver, spec_from_hf_config
from modelkv_exporter.sidecar.reader.decode import parse_snapshot
from tests.engine.extensible_stand_in import StandInWorker, kv_cache_config, run_engine_core
from tests.engine.observing import storage_bytes
from tests.engine.test_extensible_kv import Engine, engines
from tests.engine.test_hostile_discovery import Builder, Runner, call_with_room, one_frame

KV_HEADS, HEAD_DIM = 4, 64
CONFIG = Qwen2Config(
    num_hidden_layers=2,
    num_attention_heads=KV_HEADS,
    num_key_value_heads=KV_HEADS,
    hidden_size=KV_HEADS * HEAD_DIM,
    intermediate_size=64,
    vocab_size=64,
)
EVERYTHING = DiscoverySettings(census_interval=0, discover_floor_bytes=0)


@dataclass(frozen=True)
class Step:
    """What one call of a model does: its talker's rows and positions, its decoder's tokens."""

    rows: int
    positions: int
    tokens: int


A, B = Step(rows=1, positions=30, tokens=300), Step(rows=2, positions=20, tokens=400)
"""Different sizes, so that a cache counted for the wrong model shows. Each decoder cache is above 1 MiB, the
engine's default floor for publishing a discovered owner."""


def states(rows: int, positions: int) -> torch.Tensor:
    return torch.randn(rows, KV_HEADS, positions, HEAD_DIM)


class Talker(nn.Module):
    """Declares its per-request cache; each call releases the last and builds a new one (a ``DynamicCache``)."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: DynamicCache | None = None

    def model_local_kv_specs(self) -> list[ModelLocalKVSpec]:
        return [
            spec_from_hf_config(
                CONFIG,
                name="request",
                physical_capacity_positions=64,
                capacity_source="the longest request",
                scope=ModelLocalKVScope.REQUEST,
                dtype=torch.float32,
                rows=RowDriver.MAX_NUM_SEQS,
            )
        ]

    def forward(self, rows: int, positions: int) -> None:
        self.kept = None
        cache = DynamicCache()
        for layer in range(CONFIG.num_hidden_layers):
            cache.update(states(rows, positions), states(rows, positions), layer)
        self.kept = cache


class Decoder(nn.Module):
    """Declares nothing; each call its real ``Qwen2Model`` fills a cache it builds, which it keeps."""

    def __init__(self) -> None:
        super().__init__()
        self.model = Qwen2Model(CONFIG).eval()
        self.kept: DynamicCache | None = None

    def forward(self, tokens: int) -> None:
        self.kept = None
        cache = DynamicCache(config=CONFIG)
        with torch.no_grad():
            self.model(input_ids=torch.zeros(1, tokens, dtype=torch.long), past_key_values=cache, use_cache=True)
        self.kept = cache


class Speech(nn.Module):
    """The architecture both models have."""

    def __init__(self) -> None:
        super().__init__()
        self.talker = Talker()
        self.decoder = Decoder()

    def forward(self, step: Step) -> None:
        self.talker(step.rows, step.positions)
        self.decoder(step.tokens)


def own_figures(model: Speech) -> tuple[int, int]:
    """What the model's own caches hold now (independent count): its talker's, its decoder's."""
    return storage_bytes(model.talker.kept), storage_bytes(model.decoder.kept)


def assert_own(model: Speech, observations: tuple[Observation, ...], discovered: tuple[DiscoveredOwner, ...]) -> None:
    """One engine's figures are exactly its own model's: its declaring owner observed, its undeclared cache found."""
    talker, decoder = own_figures(model)
    assert [(o.owner, o.live_bytes, o.peak_bytes) for o in observations] == [("talker", talker, talker)]
    assert [(d.owner, d.found_by, d.live_bytes, d.peak_bytes) for d in discovered] == [
        ("decoder", "cache_layer", decoder, decoder)
    ]


@dataclass
class Side:
    """One model with its own observer and discovery, as one engine's hook keeps them."""

    model: Speech
    observer: Observer
    discovery: Discovery

    def figures(self) -> tuple[tuple[Observation, ...], tuple[DiscoveredOwner, ...]]:
        """One heartbeat's figures, taken as the heartbeat thread takes them."""
        self.discovery.census()
        observations = self.observer.sample()
        discovered, status = self.discovery.sample(observations)
        assert status.enabled, status.reason
        return observations, discovered

    def assert_own(self) -> None:
        assert_own(self.model, *self.figures())

    def close(self) -> None:
        self.discovery.uninstall()
        self.observer.uninstall()


def side(model: Speech) -> Side:
    """What the hook does for a model after load: observe its declaring owners, discover in it."""
    observer = install([("talker", model.talker)], enabled=True)
    found = Discovery(model, EVERYTHING, observer=observer, declaring={"talker"})
    found.start()
    return Side(model, observer, found)


@pytest.fixture
def two() -> Iterator[tuple[Side, Side]]:
    """Two models of one architecture, each observed and discovered in, in this process."""
    assert installed() is None, "an earlier test left the observer installed"
    made = side(Speech()), side(Speech())
    yield made
    for one in made:
        one.close()
    left = installed()
    if left is not None:
        left.uninstall()


# -- each engine's figures are its own model's --------------------------------------------------------


def test_two_models_run_alternately_each_publish_their_own_owners_with_their_own_bytes(two) -> None:
    a, b = two
    for _ in range(2):
        a.model(A)
        b.model(B)
        a.assert_own()
        b.assert_own()
    assert own_figures(a.model) != own_figures(b.model)


def test_two_models_run_on_two_threads_each_publish_their_own_owners_with_their_own_bytes(two) -> None:
    calls = 12
    start = threading.Barrier(2)
    failures: list[BaseException] = []

    def run(one: Side, step: Step) -> None:
        try:
            start.wait()
            for _ in range(calls):
                one.model(step)
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=run, args=pair) for pair in ((two[0], A), (two[1], B))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    for one in two:
        observations, discovered = one.figures()
        assert_own(one.model, observations, discovered)
        assert observations[0].calls == calls


# -- one model goes away, the other goes on -----------------------------------------------------------


def test_a_released_model_leaves_and_the_other_keeps_observing(two) -> None:
    a, b = two
    a.model(A)
    b.model(B)
    a.assert_own()
    b.assert_own()
    b.model = None  # type: ignore[assignment]  # the model is released (its engine reloads, or is dropped)
    gc.collect()
    assert b.observer.sample() == (), "its owner left with it"
    a.model(Step(rows=3, positions=40, tokens=500))
    a.assert_own()


def test_ending_one_models_observer_leaves_the_other_models_hooks_in_place(two) -> None:
    a, b = two
    a.model(A)
    b.model(B)
    b.close()
    assert installed() is not None and a.observer.attached
    assert hasattr(vars(cache_utils.CacheLayerMixin)["__init__"], hooks.ORIGINAL), "the class patches stay"
    assert getattr(hooks.discover, "__self__", None) is a.discovery, "one model left: its own walk again"
    a.model(Step(rows=3, positions=40, tokens=500))
    a.assert_own()
    a.close()
    assert installed() is None and hooks.discover is None, "the last model's end removes the hooks"


@pytest.mark.parametrize("off", ["failed", "left out of the walk"])
def test_a_model_whose_discovery_failed_stays_in_the_walk_so_its_caches_go_to_no_other_model(two, off: str) -> None:
    """A model whose discovery is off keeps its modules in the walk: they still tell its frames from the other
    model's. Left out (as a model with no discovery of ours is: one whose engine ended but that still runs, or no
    engine's at all), its decoder cache goes to the other model's decoder, whose code is the same."""
    a, b = two
    b.discovery.fail("a site", RuntimeError("broke"))
    assert not b.discovery.sample()[1].enabled
    if off == "left out of the walk":
        b.discovery.uninstall()
    a.model(A)
    b.model(B)
    if off == "failed":
        assert isinstance(getattr(hooks.discover, "__self__", None), Several)
        a.assert_own()
    else:
        decoder = own_figures(a.model)[1] + own_figures(b.model)[1]
        assert [(d.owner, d.live_bytes) for d in a.figures()[1]] == [("decoder", decoder)]
    observations = b.observer.sample()
    assert [(o.owner, o.live_bytes) for o in observations] == [("talker", own_figures(b.model)[0])], "observed on"


# -- telling the models apart -------------------------------------------------------------------------


def test_without_telling_the_models_apart_one_models_cache_goes_to_the_other(two, monkeypatch) -> None:
    """The mechanism broken on purpose: every call taken for the first model's, the second model's decoder cache is
    counted for the first model's decoder."""
    a, b = two
    monkeypatch.setattr(stack, "running_model", lambda maps, frame: 0)
    a.model(A)
    b.model(B)
    _, discovered = a.figures()
    assert [(d.owner, d.live_bytes) for d in discovered] == [
        ("decoder", own_figures(a.model)[1] + own_figures(b.model)[1])
    ]
    assert b.figures()[1] == ()


def test_with_one_model_frames_are_matched_by_code_alone(monkeypatch) -> None:
    """One model: the hooks call its discovery directly, and no frame's locals are read; a second model of the same
    architecture brings the walk over both, which reads the nearest module call's ``self``."""
    assert installed() is None
    asked: list[object] = []
    told = stack.running_model
    monkeypatch.setattr(stack, "running_model", lambda maps, frame: asked.append(frame) or told(maps, frame))
    a = side(Speech())
    try:
        assert getattr(hooks.discover, "__self__", None) is a.discovery
        a.model(A)
        a.assert_own()
        assert asked == []
        b = side(Speech())
        try:
            b.model(B)
            b.assert_own()
            assert asked, "the code is both models': the module call tells them apart"
        finally:
            b.close()
    finally:
        a.close()


SNAPSHOTS = sys.version_info < (3, 13)
"""CPython before 3.13 stores a snapshot of a frame's locals on the frame when they are read (PEP 667 ended that)."""


def own_frame(maps: Sequence[ModuleMap], frame: FrameType | None) -> int:
    """``stack.running_model`` done as it must not be: by the ``self`` of the model's own frame."""
    assert frame is not None
    module = frame.f_locals.get("self")
    return next(position for position, modules in enumerate(maps) if modules.path_of(module) is not None)


@pytest.mark.parametrize("read", ["the module call", "the model's own frame"])
def test_telling_the_models_apart_keeps_no_tensor_of_the_frames_it_walks_alive(read: str, monkeypatch) -> None:
    """The one frame whose locals are read is torch's module call, which holds only what it holds anyway: the module's
    scratch tensor and the runner's die when their frames delete them. Reading the model's own frame instead keeps
    the scratch tensor alive until ``forward`` returns (on CPython before 3.13)."""
    assert installed() is None
    if read == "the model's own frame":
        monkeypatch.setattr(stack, "running_model", own_frame)
    builders = [Builder(), Builder()]
    models = [Speech(), Speech()]
    for model, builder in zip(models, builders, strict=True):
        model.builder = builder
    made = [side(model) for model in models]
    try:
        assert isinstance(getattr(hooks.discover, "__self__", None), Several)
        for one, builder in zip(made, builders, strict=True):
            assert Runner(builder).step(), "the runner's tensor died when its frame deleted it"
            assert builder() is (read == "the module call" or not SNAPSHOTS)
            (found,) = [d for d in one.figures()[1] if d.owner == "builder"]
            assert found.live_bytes == storage_bytes(builder.kept)
    finally:
        for one in made:
            one.close()


def test_attribution_over_two_models_near_the_recursion_limit_returns_none_and_never_raises(two) -> None:
    attribute = hooks.discover
    assert attribute is not None and isinstance(getattr(attribute, "__self__", None), Several)
    results: list[object] = []
    rooms = range(1, 40)
    escaped = [room for room in rooms if call_with_room(room, lambda: results.append(attribute(object())))]
    assert None in results and not any(one.discovery.enabled for one in two), "discovery is off for both"
    assert escaped == [room for room in rooms if call_with_room(room, lambda: results.append(one_frame(None)))]
    a, b = two
    a.model(A)
    assert a.observer.sample()[0].live_bytes == own_figures(a.model)[0], "observation goes on"


# -- through the hook, as vLLM drives two workers in one process ---------------------------------------


class SpeechWorker(StandInWorker):
    """The stand-in worker loading a ``Speech`` model, served under a name of its own."""

    def __init__(self, gpu: Any, served: str = "speech", **worker: Any) -> None:
        super().__init__(gpu, extensible=False, **worker)
        self.vllm_config.model_config.served_model_name = served

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        super().load_model(load_dummy_weights=load_dummy_weights)
        self.model_runner.model = Speech()

    @property
    def model(self) -> Speech:
        model: Speech = self.model_runner.model
        return model


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Engine]]:
    assert installed() is None, "an earlier test left the observer installed"
    yield from engines(tmp_path, monkeypatch, worker_class=SpeechWorker)


def started(make: Callable[..., Engine], served: str) -> Engine:
    """An engine started as vLLM's engine core starts it (load, profile, KV cache, warm-up)."""
    made = make(served=served)
    run_engine_core(made.worker, kv_cache_config(1000, [4096]), final_blocks=1000)
    return made


def beat(made: Engine) -> Snapshot:
    """One heartbeat as the hook's thread takes it, and the engine's file as the sidecar reads it."""
    hook = made.hook
    assert hook.observer is not None and hook.discovery is not None
    hook.discovery.census()
    observations = hook.observer.sample()
    path = hook.publisher.beat(hook.sampler(), observations, hook.discovery.sample(observations))
    return parse_snapshot(path.read_bytes())


def test_two_engines_in_one_process_each_write_their_own_models_figures(engine, tmp_path: Path) -> None:
    """Two engines of one served name and the same ranks (a trainer's policy and rollout copies): each its own id
    and file (the second to load gets ``-e1``), each with its own model's figures."""
    policy = started(engine, "speech")
    rollout = started(engine, "speech")
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["speech-dp0-e1.json", "speech-dp0.json"]
    for _ in range(2):
        policy.worker.model(A)
        rollout.worker.model(B)
        first, second = beat(policy), beat(rollout)
        assert (first.engine.engine_id, second.engine.engine_id) == ("speech-dp0", "speech-dp0-e1")
        assert_own(policy.worker.model, first.observations, first.discovered)
        assert_own(rollout.worker.model, second.observations, second.discovered)
        assert [d.owner for d in first.declarations] == [d.owner for d in second.declarations] == ["talker"]
    rollout.close()
    ended = parse_snapshot((tmp_path / snapshot_file_name(second.engine.engine_id)).read_bytes())
    assert ended.ended
    policy.worker.model(Step(rows=3, positions=40, tokens=500))
    after = beat(policy)
    assert_own(policy.worker.model, after.observations, after.discovered)
    policy.close()
    assert installed() is None, "the last engine's end removes the hooks"
