"""The engine side's lifetimes in a hostile process: exceptions that are not ours pass, and nothing of ours outlives
the worker.

- An asynchronous ``KeyboardInterrupt`` (``PyThreadState_SetAsyncExc``, a signal) that lands in our code on the
  model's thread reaches the model, as it would with the hook off.
- A cache layer's death runs no Python code of ours (the weak reference's callback is ``deque.append``): a signal
  pending when the collector frees the layer is raised in the model's code, and the record is still queued.
- A logging handler that raises ``SystemExit`` on the heartbeat thread costs its line, never the heartbeat, and
  ``stop()`` raises nothing into its caller.
- After ``shutdown`` nothing of ours holds the worker or its model; a worker dropped without ``shutdown`` ends its
  snapshot at the next beat, which then stops changing.

Each case breaks the mechanism it relies on (a Python callback, a heartbeat that holds the worker) and shows the
case fails then.
"""

from __future__ import annotations

import _thread
import ctypes
import gc
import linecache
import logging
import shutil
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType, SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import DynamicCache

from modelkv_exporter.contract.spool import snapshot_file_name
from modelkv_exporter.engine import engine_log
from modelkv_exporter.engine.config import HookConfig
from modelkv_exporter.engine.engine_log import flush, report
from modelkv_exporter.engine.heartbeat import SnapshotPublisher
from modelkv_exporter.engine.observe import Observer, hooks, installed
from modelkv_exporter.engine.samplers import CudaSampler
from modelkv_exporter.engine.vllm_hook import lifecycle, sleep
from modelkv_exporter.engine.vllm_hook import plugin as vllm_plugin
from modelkv_exporter.sidecar.reader.decode import parse_snapshot
from modelkv_testbed.snapshots import make_snapshot
from tests.engine.extensible_stand_in import MIB, Gpu, SleepAllocator, StandInWorker, kv_cache_config, run_engine_core
from tests.engine.observing import Owner, add, engine_log_handler

ENGINE_LOGGER = "vllm.modelkv_exporter"


# -- asynchronous exceptions on the model's thread -------------------------------------------------------------


def interrupt_this_thread() -> None:
    """``PyThreadState_SetAsyncExc``: a ``KeyboardInterrupt`` raised in this thread at its next check."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(threading.get_ident()), ctypes.py_object(KeyboardInterrupt)
    )


def interrupting_inside(code: Any) -> Callable[[FrameType, str, Any], Any]:
    """A trace function that delivers one asynchronous ``KeyboardInterrupt`` at the first line ``code`` runs inside
    a ``try`` block (the line after its first ``try:``), where an ``except`` clause could catch it."""
    fired: list[int] = []
    entered: list[int] = []

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and not fired:
            if entered:
                fired.append(frame.f_lineno)
                interrupt_this_thread()
            elif linecache.getline(code.co_filename, frame.f_lineno).strip() == "try:":
                entered.append(frame.f_lineno)
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code is code and not fired else None

    tracer.fired = fired  # type: ignore[attr-defined]
    return tracer


def first_update(self: Owner) -> torch.Tensor:
    keys, _ = DynamicCache().update(torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4), 0)
    return keys


def test_an_asynchronous_keyboard_interrupt_in_our_failure_path_reaches_the_model(
    observer: Observer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Observation fails inside a cache update on the model's thread; while ``report`` queues the line, a
    ``KeyboardInterrupt`` arrives (``PyThreadState_SetAsyncExc``): the model's call raises it, as with the hook off."""
    owner = Owner()
    add(observer, owner)

    def explode(cls: type) -> object:
        raise ValueError("reader exploded")

    monkeypatch.setattr(hooks, "plan_for", explode)
    tracer = interrupting_inside(engine_log.report.__code__)
    sys.settrace(tracer)
    try:
        with pytest.raises(KeyboardInterrupt):
            owner(first_update)
            for _ in range(3):  # a pending asynchronous exception is raised here at the latest
                pass
    finally:
        sys.settrace(None)
    assert tracer.fired, "the interrupt was delivered inside report"  # type: ignore[attr-defined]
    assert not hooks.active() and "reader exploded" in (hooks.broken() or ""), "observation is off all the same"
    flush()


def test_an_asynchronous_keyboard_interrupt_in_report_is_not_swallowed() -> None:
    """``report`` itself, called at any point of our code: the interrupt leaves it unchanged."""
    tracer = interrupting_inside(engine_log.report.__code__)
    sys.settrace(tracer)
    try:
        with pytest.raises(KeyboardInterrupt):
            report(logging.getLogger(ENGINE_LOGGER), "a line", error=ValueError("why"))
            for _ in range(3):
                pass
    finally:
        sys.settrace(None)
    assert tracer.fired  # type: ignore[attr-defined]
    flush()


# -- a layer's death runs no Python code of ours ----------------------------------------------------------------


class Tripwire(weakref.ref):  # type: ignore[type-arg]
    """A weak reference whose callback, ``_thread.interrupt_main``, trips SIGINT from C when its referent dies: the
    signal is pending, not yet raised, when the next callback of the same object runs (CPython runs the newest
    first), as when a signal arrives while the collector frees the model's cache."""

    def __index__(self) -> int:
        return int(signal.SIGINT)


def python_on_dead(record: Any) -> None:
    """The base's kind of callback: Python code that queues the record."""
    try:
        hooks.changes.append(record)
    except Exception:  # noqa: BLE001 - the base's failure path
        pass


@pytest.mark.parametrize("callback", ["ours", "a Python function (broken on purpose)"])
def test_a_layers_death_passes_a_pending_interrupt_to_the_model_and_queues_the_record(
    observer: Observer, monkeypatch: pytest.MonkeyPatch, callback: str
) -> None:
    """A SIGINT pending when a layer dies is raised in the model's code (a Python weakref callback would run its
    handler inside the callback, where CPython drops the exception as unraisable and the record is never queued)."""
    if callback != "ours":
        monkeypatch.setattr(hooks, "_on_dead", python_on_dead)
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    owner = Owner()
    add(observer, owner)
    cache: list[DynamicCache] = []

    def keep(self: Owner) -> None:
        made = DynamicCache()
        made.update(torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4), 0)
        cache.append(made)

    owner(keep)
    layer = cache[0].layers[0]
    assert id(layer) in hooks.records, "the layer is observed"
    trip = Tripwire(layer, _thread.interrupt_main)  # type: ignore[arg-type]
    del layer
    unraisable: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(f"{u.exc_type.__name__} in {u.object}"))
    queued_before = len(hooks.changes)
    reached = False
    try:
        cache.clear()  # the model drops its cache: the layers die here
        for _ in range(3):
            pass
    except KeyboardInterrupt:
        reached = True
    assert trip() is None
    if callback == "ours":
        assert reached, "the interrupt reaches the model"
        assert unraisable == [], unraisable
        assert len(hooks.changes) > queued_before, "the dead layer is queued for the drain"
    else:
        assert not reached and unraisable and "KeyboardInterrupt" in unraisable[0], "a Python callback drops it"


def test_the_layer_callback_is_no_python_function() -> None:
    """What makes the case above hold: the callback the records get is a C method that only appends."""
    assert hooks._on_dead == hooks.changes.append
    assert not hasattr(hooks._on_dead, "__code__")


# -- a logging handler that raises SystemExit on the heartbeat thread ------------------------------------------


class Exiting(logging.Handler):
    """A handler that ends its thread (``sys.exit``), as some embedding applications' handlers do."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.calls += 1
        raise SystemExit(3)


@pytest.fixture
def exiting() -> Iterator[Exiting]:
    handler = Exiting()
    with engine_log_handler(handler):
        yield handler


def heartbeat_at(path: Path) -> float:
    return parse_snapshot(path.read_bytes()).heartbeat_at


def test_a_handler_raising_system_exit_costs_its_line_not_the_heartbeat(tmp_path: Path, exiting: Exiting) -> None:
    publisher = SnapshotPublisher(tmp_path, make_snapshot("e0"))
    path = publisher.write()
    publisher.start_heartbeat(0.02)
    report(logging.getLogger(f"{ENGINE_LOGGER}.test"), "a line the handler refuses")
    deadline = time.monotonic() + 5
    while exiting.calls == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert exiting.calls, "the heartbeat logged the line"
    before = heartbeat_at(path)
    time.sleep(0.2)
    thread = publisher._thread
    assert thread is not None and thread.is_alive(), "the heartbeat survives the handler's SystemExit"
    assert heartbeat_at(path) > before, "and goes on beating"
    assert publisher.handler_failure is not None and "SystemExit" in publisher.handler_failure
    report(logging.getLogger(f"{ENGINE_LOGGER}.test"), "a line left for stop")
    publisher.stop()  # raises nothing into its caller
    assert engine_log.pending() == 0, "stop logged what was left (and the handler lost it)"
    assert publisher.end().exists()


def test_stop_without_a_heartbeat_raises_no_handlers_system_exit(tmp_path: Path, exiting: Exiting) -> None:
    publisher = SnapshotPublisher(tmp_path, make_snapshot("e0"))
    report(logging.getLogger(f"{ENGINE_LOGGER}.test"), "a line left for stop")
    publisher.stop()
    assert exiting.calls == 1 and engine_log.pending() == 0


def test_an_exception_raised_into_the_heartbeat_thread_is_recorded_and_logged_never_unseen(tmp_path: Path) -> None:
    """``SystemExit`` raised into the heartbeat (here by its sampler): the thread stops, says why, and the line is
    logged, and ``stop()`` raises nothing."""

    def exiting_sampler() -> Any:
        raise SystemExit(4)

    publisher = SnapshotPublisher(tmp_path, make_snapshot("e0"))
    publisher.start_heartbeat(0.02, exiting_sampler)
    thread = publisher._thread
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive() and publisher.stopped is not None and "SystemExit" in publisher.stopped
    publisher.stop()
    assert engine_log.pending() == 0


# -- nothing of ours holds the worker ----------------------------------------------------------------------------


class BigModel(torch.nn.Module):
    """A 64 MiB model stand-in (its weights in one parameter)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(16 * MIB // 4, 4), requires_grad=False)


class BigWorker(StandInWorker):
    """The stand-in worker loading a 64 MiB model, without an extensible cache."""

    def __init__(self, gpu: Any) -> None:
        super().__init__(gpu, extensible=False)

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        super().load_model(load_dummy_weights=load_dummy_weights)
        self.model_runner.model = BigModel()


def started_worker(spool: Path, monkeypatch: pytest.MonkeyPatch, interval: float) -> Any:
    """A hooked stand-in worker driven through vLLM's start-up, its heartbeat every ``interval`` seconds."""
    gpu = Gpu()
    monkeypatch.setattr(lifecycle, "sampler_for", lambda device: CudaSampler(gpu, "cuda:0", nvml=gpu, nvml_device=0))
    monkeypatch.setitem(sys.modules, sleep.ALLOCATOR_MODULE, SimpleNamespace(CuMemAllocator=SleepAllocator))
    cls = type("Worker", (BigWorker,), {})
    vllm_plugin.Registration(HookConfig(spool, sample_interval=interval)).patch_worker(SimpleNamespace(Worker=cls))  # type: ignore[arg-type]
    worker = cls(gpu)
    run_engine_core(worker, kv_cache_config(1000, [4096]), final_blocks=1000)
    hook = getattr(worker, lifecycle.ATTRIBUTE)
    assert hook.discovery is not None and hook.discovery.enabled and hook.discovery.paged is not None
    return worker


@pytest.fixture
def clean_hooks() -> Iterator[None]:
    assert installed() is None, "an earlier test left the observer installed"
    yield
    left = installed()
    if left is not None:
        left.uninstall()


def holders(target: object) -> list[str]:
    """The frames that still hold ``target`` (through their locals or a tuple of arguments), innermost first, and what
    holds each of those frames (for the failure message)."""
    found = []
    for holder in gc.get_referrers(target):
        for frame in gc.get_referrers(holder):
            if isinstance(frame, FrameType):
                chain: list[str] = []
                walked: FrameType | None = frame
                while walked is not None and len(chain) < 6:
                    chain.append(f"{walked.f_code.co_name}:{walked.f_lineno}")
                    walked = walked.f_back
                found.append(f"{chain} held by {[type(r).__name__ for r in gc.get_referrers(frame)]}")
    return found


@pytest.mark.parametrize("spool", ["writable", "removed before shutdown"])
def test_after_shutdown_nothing_of_ours_holds_the_worker_or_its_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_hooks: None, spool: str
) -> None:
    """``shutdown`` releases the model even when the spool refuses the snapshot's last write (an RL loop's spool
    cleaned up before its engines): the failure is logged, and the hook holds neither the worker nor its model."""
    directory = tmp_path / "spool"
    worker = started_worker(directory, monkeypatch, interval=3600)
    model = weakref.ref(worker.model_runner.model)
    gone = weakref.ref(worker)
    if spool != "writable":
        shutil.rmtree(directory)
    worker.shutdown()
    del worker
    gc.collect()
    assert gone() is None, f"the worker is held by {holders(gone())}"
    assert model() is None, "and so is its 64 MiB model"
    assert hooks.discover is None and installed() is None


def test_a_worker_dropped_without_shutdown_ends_its_snapshot_which_then_stops_changing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_hooks: None
) -> None:
    interval = 0.05
    worker = started_worker(tmp_path, monkeypatch, interval=interval)
    path = tmp_path / snapshot_file_name(worker._modelkv_hook.publisher.snapshot.engine.engine_id)
    model = weakref.ref(worker.model_runner.model)
    gone = weakref.ref(worker)
    del worker
    gc.collect()
    assert gone() is None and model() is None, "the heartbeat holds neither the worker nor its model"
    deadline = time.monotonic() + 3 * interval + 2
    while not parse_snapshot(path.read_bytes()).ended and time.monotonic() < deadline:
        time.sleep(interval / 2)
    ended = path.read_bytes()
    assert parse_snapshot(ended).ended, "the snapshot of the dropped engine is ended"
    time.sleep(4 * interval)
    assert path.read_bytes() == ended, "and is no longer rewritten"
    assert hooks.discover is None and installed() is None, "the dropped model is no longer observed"
