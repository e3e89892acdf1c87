"""Issue 49, the post-mortem on the engine side: a worker that raises records why it ended, and the exception goes on.

The worker is the stand-in of vLLM 0.34's ``Worker`` on a simulated device (``extensible_stand_in.py``): no GPU runs
here. The exceptions are real (torch's own ``OutOfMemoryError``, torch's CPU allocator's), the tensors in the raising
frames are real torch tensors, and the snapshot is read back from the spool through the sidecar's reader.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from modelkv_exporter.contract.snapshot import MemorySample, Snapshot
from modelkv_exporter.contract.spool import alive_file_name, snapshot_file_name, writer_alive
from modelkv_exporter.contract.vocabulary import EndReason
from modelkv_exporter.engine import heartbeat
from modelkv_exporter.engine.config import HookConfig
from modelkv_exporter.engine.ending import end_reason, error_line
from modelkv_exporter.engine.heartbeat import SnapshotPublisher
from modelkv_exporter.engine.observe import installed
from modelkv_exporter.engine.samplers import LARGEST_SEGMENTS, CudaSampler
from modelkv_exporter.engine.vllm_hook import lifecycle, sleep
from modelkv_exporter.engine.vllm_hook import plugin as vllm_plugin
from modelkv_exporter.sidecar.reader.scan import read_snapshot_file
from modelkv_testbed.polling import eventually
from modelkv_testbed.snapshots import make_snapshot
from tests.engine.extensible_stand_in import (
    GIB,
    MIB,
    Gpu,
    SleepAllocator,
    StandInWorker,
    kv_cache_config,
    run_engine_core,
)
from tests.support import vllm_wheel

STRIDES = [4096, 4096]
LEAK = 3 * GIB
"""What the stand-in's step leaks in live tensors before it runs out of memory."""
DRIVER_OUT_OF_MEMORY = "GPU driver error 2: out of memory"
"""vLLM 0.34's ``VmmDriver._check`` for ``CUDA_ERROR_OUT_OF_MEMORY`` (2), whose ``cuGetErrorString`` is "out of
memory" (``test_vllm_034_maps_the_drivers_out_of_memory_to_that_message`` reads the format from the wheel)."""

kept: list[Any] = []
"""Where the steps below leave what a test asks them to keep, cleared after each test."""


class DyingWorker(StandInWorker):
    """The stand-in worker whose step leaks ``LEAK`` bytes of live tensors and then raises what the test sets."""

    raises: BaseException | None = None
    extend_raises: BaseException | None = None

    def execute_model(self, scheduler_output: Any) -> str:
        frame_tensor = torch.ones(1024)
        kept.append(weakref.ref(frame_tensor))
        if self.raises is None:
            return "output"
        self.gpu.allocate(LEAK)
        raise self.take()

    def take(self) -> BaseException:
        """The exception to raise, which the worker no longer holds (the raising frame holds it only while raising)."""
        error, self.raises = self.raises, None
        assert error is not None
        return error

    def extend_kv_cache(self, num_blocks: int) -> None:
        if self.extend_raises is not None:
            raise self.extend_raises
        super().extend_kv_cache(num_blocks)


class Engine:
    """A hooked ``DyingWorker`` on its own simulated device, started as vLLM 0.34's engine core starts it."""

    def __init__(self, spool: Path, monkeypatch: pytest.MonkeyPatch, extend_raises: BaseException | None = None):
        self.spool = spool
        self.gpu = Gpu()
        monkeypatch.setattr(
            lifecycle, "sampler_for", lambda device: CudaSampler(self.gpu, "cuda:0", nvml=self.gpu, nvml_device=0)
        )
        monkeypatch.setitem(sys.modules, sleep.ALLOCATOR_MODULE, SimpleNamespace(CuMemAllocator=SleepAllocator))
        cls = type("Worker", (DyingWorker,), {"extend_raises": extend_raises})
        vllm_plugin.Registration(HookConfig(spool, sample_interval=3600)).patch_worker(SimpleNamespace(Worker=cls))  # type: ignore[arg-type]
        self.worker = cls(self.gpu)
        self.error: BaseException | None = None
        self.id = getattr(self.worker, lifecycle.ATTRIBUTE, None)

    def start(self) -> None:
        run_engine_core(self.worker, kv_cache_config(1000, STRIDES), final_blocks=800)

    @property
    def hook(self) -> lifecycle.WorkerHook:
        hook: lifecycle.WorkerHook = getattr(self.worker, lifecycle.ATTRIBUTE)
        return hook

    def step_raising(self, error: BaseException) -> BaseException:
        """One engine step whose model raises ``error``; returns what reached the caller."""
        self.worker.raises = error
        del error  # the catching frame goes into the traceback: it must not hold the exception itself
        try:
            self.worker.execute_model("scheduler output")
        except BaseException as caught:  # noqa: BLE001 - what reached the caller, whatever it is
            return caught
        raise AssertionError("the step raised nothing")

    def written(self) -> Snapshot:
        return read_snapshot_file(
            self.spool / snapshot_file_name(self.hook.publisher.snapshot.engine.engine_id), 1 << 24
        )

    def alive(self) -> bool | None:
        return writer_alive(self.spool / alive_file_name(self.hook.publisher.snapshot.engine.engine_id))


@pytest.fixture
def make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    made: list[Engine] = []

    def engine(**settings: Any) -> Engine:
        made.append(Engine(tmp_path, monkeypatch, **settings))
        return made[-1]

    yield engine
    for one in made:
        one.worker.shutdown()
    kept.clear()
    left = installed()
    if left is not None:
        left.uninstall()


def test_an_out_of_memory_step_ends_the_snapshot_with_the_memory_at_death_and_the_error_goes_on_unchanged(
    make: Any,
) -> None:
    engine = make()
    engine.start()
    assert engine.worker.execute_model("scheduler output") == "output", "a step that raises nothing is untouched"
    baseline = engine.written()
    assert not baseline.ended and baseline.end is None and engine.alive() is True
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.\nGPU 0 has a total capacity")
    reached = engine.step_raising(error)

    assert reached is error, "the very exception the model raised reaches vLLM"
    assert reached.__cause__ is None and reached.__context__ is None and not reached.__suppress_context__
    assert reached.__traceback__ is not None and reached.__traceback__.tb_next is not None
    written = engine.written()
    assert written.ended and written.end is not None
    assert written.end.reason == "out_of_memory"
    assert written.end.error == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
    current, start = written.measured.current, written.measured.baseline
    assert current is not None and start is not None
    assert current.values["torch_allocated"] - start.values["torch_allocated"] == LEAK, "the sample is at death"
    assert written.end.reserved_free_bytes == engine.gpu.reserved - engine.gpu.allocated
    segments = written.end.largest_segments
    assert segments is not None and 0 < len(segments) <= LARGEST_SEGMENTS
    assert [s.total_bytes for s in segments] == sorted((s.total_bytes for s in segments), reverse=True)
    assert sum(s.allocated_bytes for s in segments) == engine.gpu.allocated
    assert engine.alive() is False, "the ending lets go of the liveness lock"

    engine.worker.shutdown()
    after = engine.written()
    assert after.end is not None and after.end.reason == "out_of_memory", "a later shutdown keeps the out-of-memory"
    assert after.end.at == written.end.at


def test_nothing_keeps_the_exception_or_the_tensors_of_its_frames(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The raising frame's tensor is freed once the caller has handled the exception; a hook that kept the
    exception would keep it alive (shown by breaking the hook on purpose)."""
    engine = make()
    engine.start()
    engine.step_raising(torch.OutOfMemoryError("out of memory"))
    (ref,) = kept
    assert ref() is None, "the frame's tensor outlived the handled exception"
    assert engine.written().end is not None

    keeping: list[BaseException] = []
    original = lifecycle.ended_by
    monkeypatch.setattr(
        lifecycle, "ended_by", lambda worker, config, error: (keeping.append(error), original(worker, config, error))
    )
    kept.clear()
    broken = make()
    broken.start()
    broken.step_raising(torch.OutOfMemoryError("out of memory"))
    assert kept[0]() is not None, "a hook that keeps the exception keeps the frame's tensor: the check can fail"
    keeping.clear()


@pytest.mark.parametrize(
    ("error", "reason", "line"),
    [
        (ValueError("bad input\nsecond line"), "error", "ValueError: bad input"),
        (KeyError("missing"), "error", "KeyError: missing"),
        (MemoryError(), "out_of_memory", "MemoryError"),
        (RuntimeError(DRIVER_OUT_OF_MEMORY), "out_of_memory", f"RuntimeError: {DRIVER_OUT_OF_MEMORY}"),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), "error", "RuntimeError: CUDA error: an"),
    ],
)
def test_each_error_ends_the_snapshot_with_its_reason(make: Any, error: BaseException, reason: str, line: str) -> None:
    engine = make()
    engine.start()
    assert engine.step_raising(error) is error
    end = engine.written().end
    assert end is not None and end.reason == reason and end.error.startswith(line)


def test_the_cpu_allocators_own_failure_is_an_out_of_memory() -> None:
    with pytest.raises(RuntimeError) as caught:
        torch.empty(1 << 62, dtype=torch.uint8)
    assert end_reason(caught.value) is EndReason.OUT_OF_MEMORY
    assert error_line(caught.value).startswith("RuntimeError: [enforce fail at alloc_cpu")
    assert end_reason(torch.cuda.OutOfMemoryError("x")) is EndReason.OUT_OF_MEMORY


def test_vllm_034_maps_the_drivers_out_of_memory_to_that_message() -> None:
    """The extensible KV cache's driver errors are ``RuntimeError(f"GPU driver error {result}: ...")``; the CUDA
    driver's out-of-memory is result 2 (``CUDA_ERROR_OUT_OF_MEMORY``, "out of memory")."""
    text = vllm_wheel.source(vllm_wheel.wheel("0.34.0"), "vllm/utils/vmm_driver.py")
    assert 'raise RuntimeError(f"GPU driver error {result}: {self.error_string(result)}")' in text
    assert end_reason(RuntimeError("GPU driver error 2: out of memory")) is EndReason.OUT_OF_MEMORY
    assert end_reason(RuntimeError("GPU driver error 1: invalid argument")) is EndReason.ERROR


def test_the_reason_and_line_run_none_of_the_exceptions_code() -> None:
    class Hostile(Exception):
        def __str__(self) -> str:
            raise AssertionError("the exception's __str__ ran")

        @property  # type: ignore[misc]
        def args(self) -> Any:
            raise AssertionError("the exception's args property ran")

    error = Hostile("what it says")
    assert end_reason(error) is EndReason.ERROR
    assert error_line(error).endswith("Hostile: what it says")
    assert len(error_line(ValueError("x" * 5000))) == 512


def test_the_drivers_out_of_memory_while_extending_the_kv_cache_ends_the_snapshot(make: Any) -> None:
    error = RuntimeError(DRIVER_OUT_OF_MEMORY)
    engine = make(extend_raises=error)
    with pytest.raises(RuntimeError) as caught:
        engine.start()
    assert caught.value is error and caught.value.__context__ is None
    end = engine.written().end
    assert end is not None and end.reason == "out_of_memory" and end.error == f"RuntimeError: {DRIVER_OUT_OF_MEMORY}"


def test_a_plain_shutdown_ends_as_shutdown(make: Any) -> None:
    engine = make()
    engine.start()
    engine.worker.execute_model("scheduler output")
    assert engine.alive() is True
    engine.worker.shutdown()
    end = engine.written().end
    assert end is not None and end.reason == "shutdown" and end.error == ""
    assert end.largest_segments is not None, "a shutdown's ending write has the memory then too"
    assert engine.alive() is False


def test_our_own_failure_while_recording_is_logged_once_and_the_models_error_goes_on(
    make: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def failing(worker: Any, config: Any, error: BaseException) -> None:
        raise OSError("the spool is gone")

    monkeypatch.setattr(lifecycle, "ended_by", failing)
    engine = make()
    engine.start()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            error = torch.OutOfMemoryError("out of memory")
            reached = engine.step_raising(error)
            assert reached is error and reached.__context__ is None
    assert sum("failing failed" in r.getMessage() for r in caplog.records) == 1
    assert not engine.written().ended


def test_a_step_that_raises_a_base_exception_ends_nothing(make: Any) -> None:
    """``KeyboardInterrupt`` and ``SystemExit`` are no engine failure: they pass untouched; shutdown or exit ends."""
    engine = make()
    engine.start()
    error = KeyboardInterrupt()
    assert engine.step_raising(error) is error
    assert not engine.written().ended


def test_the_largest_segments_are_bounded_largest_first_and_of_this_device_only() -> None:
    class Segments:
        def memory_snapshot(self, include_traces: bool = True) -> list[dict[str, Any]]:
            mine = [{"device": 0, "total_size": (i + 1) * MIB, "allocated_size": i * MIB} for i in range(20)]
            return [*mine, {"device": 1, "total_size": 999 * MIB, "allocated_size": 0}]

    segments = CudaSampler(Segments(), SimpleNamespace(index=0)).largest_segments()
    assert segments is not None and len(segments) == LARGEST_SEGMENTS
    assert [(s.total_bytes, s.allocated_bytes) for s in segments] == [
        ((i + 1) * MIB, i * MIB) for i in range(19, 11, -1)
    ]
    assert CudaSampler(object(), SimpleNamespace(index=0)).largest_segments() is None, "torch cannot say: absent"


def test_the_dying_model_thread_never_waits_for_a_beat_that_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A beat holds the publisher's lock while its observation waits for something the model's thread holds (a
    finalizer taking the model's lock, run by the collector on the heartbeat thread). The model's step raises out of
    memory: the thread waits for its ending at most ``ENDING_WAIT``, not for the beat, and the ending is written once
    the beat lets go. Broken on purpose (the ending written on the model's thread, as before), the same scene hangs."""
    monkeypatch.setattr(heartbeat, "ENDING_WAIT", 0.5)
    models_lock_held = threading.Event()
    models_lock_held.set()
    beat_waiting = threading.Event()
    sampled_on: list[threading.Thread] = []
    model_threads: list[threading.Thread] = []

    def observe() -> list[Any]:
        sampled_on.append(threading.current_thread())
        if models_lock_held.is_set():
            beat_waiting.set()
            while models_lock_held.is_set():
                time.sleep(0.01)
        return []

    def scene(publisher: SnapshotPublisher) -> float:
        publisher.start_heartbeat(0.05, lambda: MemorySample(time.time(), {"process_resident": 2}), observe)
        assert beat_waiting.wait(10), "the beat reached the model's lock"
        started = time.monotonic()
        dying = threading.Thread(target=publisher.died, args=(torch.OutOfMemoryError("out of memory"),), daemon=True)
        model_threads.append(dying)
        dying.start()
        dying.join(timeout=5)
        waited = time.monotonic() - started if not dying.is_alive() else float("inf")
        models_lock_held.clear()
        return waited

    publisher = SnapshotPublisher(tmp_path, make_snapshot("e"))
    publisher.set_baseline(MemorySample(time.time(), {"process_resident": 1}))
    waited = scene(publisher)
    assert waited < 0.5 + 1, f"the model's thread waited {waited:.2f} s"
    written = eventually(
        lambda: read_snapshot_file(tmp_path / snapshot_file_name("e"), 1 << 24).end, "the ending, once the beat let go"
    )
    assert written.reason == "out_of_memory"
    assert model_threads[0] not in sampled_on, "nothing of the ending ran on the model's thread"
    publisher.stop()

    models_lock_held.set()
    beat_waiting.clear()
    broken = SnapshotPublisher(tmp_path / "broken", make_snapshot("b"))
    (tmp_path / "broken").mkdir()
    broken.set_baseline(MemorySample(time.time(), {"process_resident": 1}))
    monkeypatch.setattr(broken, "died", lambda error: broken._end(end_reason(error), error_line(error)))
    assert scene(broken) == float("inf"), "broken: the model's thread waits for the beat that waits for it"
    broken.stop()
