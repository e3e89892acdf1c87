"""Demo engines: a multi-stage deployment's worth of processes, each publishing like a real engine.

Each engine runs in its own process (as each vLLM-Omni stage does), measures what it holds before
its model (its runtime: the interpreter, torch, transformers), builds a small model with real
weights whose inner modules own real transformers caches, publishes its declarations,
starts observing its owners' caches (unless ``MODELKV_OBSERVE=0``), takes a post-load
memory baseline, allocates the caches through each owner, then beats with its measured
resident memory, what its caches were observed to hold and the owners discovery found,
until told to stop, when it marks its snapshot ended. One engine's owner declares less than it
holds, on purpose; another engine's module holds a cache it does not declare at all.

``DYING_ENGINE``, started beside them by the ``demo`` command, steps its model at every heartbeat; its model's
streaming cache leaks a page a step until its model raises a real ``torch.OutOfMemoryError``. The engine records
its end as the vLLM hook records a worker's (``SnapshotPublisher.died``: why, and its memory at that moment) and,
as vLLM's engine core does with a fatal error, logs it; its process stays until the demo stops, its snapshot ended
``out_of_memory``: the post-mortem the sidecar shows.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.context
import multiprocessing.synchronize
import os
import signal
import sys
from dataclasses import dataclass

import torch
from torch import nn

from modelkv_exporter.demo import owners
from modelkv_exporter.engine.config import HookConfig
from modelkv_exporter.engine.discover import discover
from modelkv_exporter.engine.heartbeat import SnapshotPublisher
from modelkv_exporter.engine.observe import install
from modelkv_exporter.engine.protocol import declaring_owners
from modelkv_exporter.engine.publish import build_snapshot
from modelkv_exporter.engine.samplers import process_resident_bytes, sample_host_memory
from modelkv_exporter.engine.weights import model_weight_bytes


@dataclass(frozen=True)
class DemoEngine:
    """One demo engine process: identity, concurrency, and where its cache owners sit."""

    engine_id: str
    served_model_name: str
    architecture: str
    stage_id: int
    stage_name: str
    max_num_seqs: int
    owners: tuple[tuple[str, str], ...]
    undeclared: tuple[tuple[str, str], ...] = ()
    """Modules that hold caches and declare nothing: ``(path, class name)``."""
    dies: bool = False
    """Whether its model steps at every heartbeat until it runs out of memory (``DYING_ENGINE``)."""


DEMO_ENGINES: tuple[DemoEngine, ...] = (
    DemoEngine("qwen3-tts-s0-r0", "qwen3-tts", "Qwen3TTSTalkerForConditionalGeneration", 0, "talker", 8, ()),
    DemoEngine(
        "qwen3-tts-s1-r0", "qwen3-tts", "Qwen3TTSCode2Wav", 1, "code2wav", 8, (("tokenizer.decoder", "CodecDecoder"),)
    ),
    DemoEngine(
        "mimo-audio-s0-r0",
        "mimo-audio",
        "MiMoAudioForConditionalGeneration",
        0,
        "llm",
        16,
        (("local_transformer", "LocalTransformer"),),
    ),
    DemoEngine("minicpm-o-s0-r0", "minicpm-o-4.5", "MiniCPMO", 0, "thinker", 4, (("apm", "WhisperStreamingEncoder"),)),
    DemoEngine(
        "ming-flash-omni-s1-r0",
        "ming-flash-omni",
        "MingFlashOmniTalker",
        1,
        "talker",
        4,
        (("talker.audio_generator", "TalkerGenerator"),),
    ),
    DemoEngine(
        "qwen3-tts-eager-s1-r0",
        "qwen3-tts-eager",
        "Qwen3TTSCode2Wav",
        1,
        "code2wav",
        4,
        (("tokenizer.decoder", "EagerCodecDecoder"),),
    ),
    DemoEngine(
        "minicpm-o-streaming-s0-r0",
        "minicpm-o-streaming",
        "MiniCPMO",
        0,
        "thinker",
        4,
        (),
        (("apm.streaming_kv", "StreamingAudioKVCache"),),
    ),
)
DYING_ENGINE = DemoEngine(
    "minicpm-o-leaking-s0-r0",
    "minicpm-o-leaking",
    "MiniCPMO",
    0,
    "thinker",
    4,
    (),
    (("apm.streaming_kv", "LeakingStreamingKVCache"),),
    dies=True,
)
"""The demo engine that dies of out-of-memory mid-run; not in ``DEMO_ENGINES`` (whose engines serve until stopped)."""
UNDER_DECLARING = "qwen3-tts-eager-s1-r0"
"""The demo engine whose owner deliberately declares less than it holds."""
UNDECLARED = "minicpm-o-streaming-s0-r0"
"""The demo engine with a module that holds a cache it does not declare."""


REQUESTED_MEMORY = 2 * 1024**3
"""The memory each demo engine sizes itself to, as vLLM's ``requested_memory`` (``settings.requested_memory_bytes``):
what ``plan`` prescribes its KV cache from."""

EMBEDDING = (2048, 1024)
"""The demo models' token embedding (rows, width): 8 MiB of float32 weights, so each bar has weights as an engine's has."""


def build_model(engine: DemoEngine) -> nn.Module:
    """A module tree with a token embedding (its weights) and each owner at its dotted path."""
    root = nn.Module()
    root.add_module("embed_tokens", nn.Embedding(*EMBEDDING))
    for path, class_name in engine.owners + engine.undeclared:
        parent = root
        *parents, leaf = path.split(".")
        for name in parents:
            if not hasattr(parent, name):
                parent.add_module(name, nn.Module())
            parent = getattr(parent, name)
        parent.add_module(leaf, getattr(owners, class_name)())
    return root


def return_freed_heap() -> None:
    """Give the C heap's freed pages back to the system (glibc's ``malloc_trim``; nothing elsewhere).

    The demo fills its caches with prefills that ``transformers`` copies into each cache (``torch.cat``), and the C
    allocator keeps the freed prefills in its heap: 5 to 70 MiB of resident memory no part names, an artefact of the
    demo's filling that an engine allocating its KV once does not have.
    """
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):
        pass


def run_engine(engine: DemoEngine, spool_dir: str, interval: float, stop: multiprocessing.synchronize.Event) -> None:
    """The body of one demo engine process; the parent ends it (Ctrl-C reaches the parent only)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    runtime = process_resident_bytes()
    model = build_model(engine)
    snapshot = build_snapshot(
        model,
        max_num_seqs=engine.max_num_seqs,
        engine_id=engine.engine_id,
        served_model_name=engine.served_model_name,
        model=f"demo/{engine.served_model_name}",
        architecture=engine.architecture,
        stage_id=engine.stage_id,
        stage_name=engine.stage_name,
        replica="0",
        tp_rank=0,
        pp_rank=0,
        dp_index=0,
        device="cpu",
        weights_bytes=model_weight_bytes(model, "cpu"),
        runtime_bytes=runtime,
        requested_memory_bytes=REQUESTED_MEMORY,
    )
    config = HookConfig.from_environ({**os.environ, "MODELKV_SPOOL_DIR": spool_dir})
    assert config is not None
    observer = install(declaring_owners(model), enabled=config.observe)
    declaring = {d.owner for d in snapshot.declarations}
    discovery = discover(model, config, observer, declaring)
    discovery.start()
    publisher = SnapshotPublisher(spool_dir, snapshot)
    publisher.set_baseline(sample_host_memory())
    for module in model.modules():
        if isinstance(module, (owners.DemoOwner, owners.StreamingAudioKVCache)):
            module.allocate(engine.max_num_seqs)
    return_freed_heap()
    if interval > 0:
        publisher.start_heartbeat(interval, sample_host_memory, observer.sample, discovery)
    discovery.census()
    observations = observer.sample()
    publisher.beat(sample_host_memory(), observations, discovery.sample(observations))
    if engine.dies:
        step_until_out_of_memory(engine, model, publisher, interval, stop)
    stop.wait()
    publisher.end()


def step_until_out_of_memory(
    engine: DemoEngine,
    model: nn.Module,
    publisher: SnapshotPublisher,
    interval: float,
    stop: multiprocessing.synchronize.Event,
) -> None:
    """Step the model's leaking cache every ``interval`` seconds until its model raises ``torch.OutOfMemoryError``
    (or ``stop`` is set). The step's exception ends the snapshot (``publisher.died``) and goes on unchanged; here, where
    an engine core handles a fatal error, it is logged in one line."""
    leaking = [module for module in model.modules() if isinstance(module, owners.LeakingStreamingKVCache)]
    try:
        while not stop.wait(max(interval, 0.05)):
            try:
                for module in leaking:
                    module.step()
            except Exception as error:
                publisher.died(error)
                raise
    except torch.OutOfMemoryError as error:
        print(f"demo engine {engine.engine_id} died of out-of-memory, on purpose: {error}", file=sys.stderr, flush=True)


def start_engines(
    spool_dir: str, interval: float, engines: tuple[DemoEngine, ...] = DEMO_ENGINES
) -> tuple[list[multiprocessing.context.SpawnProcess], multiprocessing.synchronize.Event]:
    """Start each of ``engines`` (every demo engine by default) in its own spawned process; returns them and their
    stop event."""
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    processes = [
        context.Process(target=run_engine, args=(engine, spool_dir, interval, stop), name=engine.engine_id, daemon=True)
        for engine in engines
    ]
    for process in processes:
        process.start()
    return processes, stop
