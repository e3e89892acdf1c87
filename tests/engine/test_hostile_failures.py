"""A failure anywhere in the hooks, their failure path included, turns observation off and never reaches the model.

Each case runs the same model call with the hook off and on: the model gets the same result, the hook
is off afterwards with a reason, nothing is logged while the model runs, and the line is logged later by
``flush()`` (the heartbeat thread's, holding no lock).
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from transformers import DynamicCache

from modelkv_exporter.engine.engine_log import flush, report
from modelkv_exporter.engine.heartbeat import SnapshotPublisher
from modelkv_exporter.engine.observe import Observer, hooks, install
from modelkv_exporter.engine.observe import tally as tally_module
from modelkv_testbed.snapshots import make_snapshot
from tests.engine.observing import Owner, add, engine_log_handler, figures, kv

WRAPPER_FRAMES = 3
"""Python frames the hooks add to an owner call that first updates a cache: the owner's method wrapper, ``update``'s
and ``lazy_initialization``'s (any Python decorator adds its frame the same way)."""


class Lines(logging.Handler):
    """Keeps every line logged under the engine side's logger, and the thread that logged it."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((threading.current_thread().name, record.getMessage()))


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    with engine_log_handler(handler):
        yield handler


def first_update(self: Owner) -> torch.Tensor:
    keys, _ = DynamicCache().update(torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4), 0)
    return keys


def assert_off_then_logged_by_flush(lines: Lines, site: str) -> None:
    assert not hooks.active() and site in (hooks.broken() or "")
    assert not [m for _, m in lines.lines if "observation failed" in m], "nothing is logged inline"
    flush()
    assert [m for _, m in lines.lines if "observation failed" in m and site in m]


def at_frames_left(frames_left: int, call: Callable[[], Any]) -> Any:
    """``call()`` with only ``frames_left`` Python frames left before the recursion limit."""
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back

    def dive(n: int) -> Any:
        return dive(n - 1) if n > 0 else call()

    return dive(sys.getrecursionlimit() - depth - frames_left - 1)


def lowest_working(call: Callable[[], Any]) -> int:
    for frames_left in range(200):
        try:
            at_frames_left(frames_left, call)
        except RecursionError:
            continue
        return frames_left
    raise AssertionError("the call never fits")


def test_near_the_recursion_limit_the_model_gets_its_result(lines: Lines) -> None:
    """At every depth where the call works with the hook off (plus the hooks' own frames), it works with it on.

    Close to the limit the hooks' own work (attributing and weighing a new layer) runs out of frames, and
    so may their failure path: observation turns off inline, and the line is logged at the next flush.
    """
    owner = Owner()
    expected = first_update(owner)
    off = lowest_working(lambda: owner(first_update))
    observer = install([], enabled=True)
    try:
        add(observer, owner)
        failed = []
        for frames_left in range(off + WRAPPER_FRAMES, off + WRAPPER_FRAMES + 60):
            hooks.activate()
            result = at_frames_left(frames_left, lambda: owner(first_update))
            assert torch.equal(result, expected)
            if not hooks.active():
                failed.append((frames_left, hooks.broken()))
        assert failed, "some depth ran the hooks out of frames (else this test checks nothing)"
        assert all("RecursionError" in (reason or "") for _, reason in failed), failed
        assert not [m for _, m in lines.lines if "observation failed" in m], "nothing is logged inline"
        flush()
        assert [m for _, m in lines.lines if "observation failed" in m]
        hooks.activate()
        owner(first_update)
        assert hooks.active(), "at an ordinary depth the hooks work again"
    finally:
        observer.uninstall()


def test_a_logging_handler_that_raises_never_reaches_the_model(
    observer: Observer, lines: Lines, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Raising(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            raise RuntimeError("the handler broke")

    owner = Owner()
    add(observer, owner)
    expected = first_update(owner)

    def explode(cls: type) -> object:
        raise ValueError("reader exploded")

    monkeypatch.setattr(hooks, "plan_for", explode)
    raising = Raising()
    logging.getLogger("vllm.modelkv_exporter").addHandler(raising)
    try:
        assert torch.equal(owner(first_update), expected)
        assert not hooks.active() and "reader exploded" in (hooks.broken() or "")
        flush()  # the raising handler loses the line; flush itself never raises
    finally:
        logging.getLogger("vllm.modelkv_exporter").removeHandler(raising)
    assert [m for _, m in lines.lines if "observation failed" in m], "the other handlers got the line"


def test_memory_error_inside_the_hook(observer: Observer, lines: Lines, monkeypatch: pytest.MonkeyPatch) -> None:
    owner = Owner()
    add(observer, owner)
    expected = first_update(owner)

    def exhausted(cls: type) -> object:
        raise MemoryError()

    monkeypatch.setattr(hooks, "plan_for", exhausted)
    assert torch.equal(owner(first_update), expected)
    assert "MemoryError" in (hooks.broken() or "")
    assert_off_then_logged_by_flush(lines, "cache layer creation")


class PoisonedOwner:
    """An owner state whose counters raise: whatever touches them fails."""

    @property
    def live(self) -> int:
        raise RuntimeError("counter exploded")

    @live.setter
    def live(self, value: int) -> None:
        raise RuntimeError("counter exploded")

    def add(self, delta: int) -> None:
        raise RuntimeError("counter exploded")


def test_a_raising_layer_finaliser_never_reaches_the_model(
    observer: Observer, lines: Lines, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finaliser of a dead layer (a weakref callback: any thread, inside a collection) fails."""
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    owner = Owner()
    add(observer, owner)
    kept: dict[str, Any] = {}
    owner(lambda self: kept.setdefault("cache", DynamicCache()).update(kv(1, 2), kv(1, 2), 0))
    (record,) = [r for r in hooks.records.values() if r() is kept["cache"].layers[0]]
    record.owner = PoisonedOwner()  # type: ignore[assignment]
    expected = first_update(owner)
    kept.clear()
    gc.collect()
    assert torch.equal(owner(first_update), expected)
    observer.sample()  # the death is counted where the heartbeat drains what the model handed over
    assert not unraisable, "nothing escaped from the finaliser"
    assert "counter exploded" in (hooks.broken() or "")
    assert not [m for _, m in lines.lines if "observation failed" in m], "nothing is logged inline"
    flush()
    assert [m for _, m in lines.lines if "observation failed" in m and "counter exploded" in m]


def test_a_collection_inside_a_slow_logging_handler_never_deadlocks(
    observer: Observer, lines: Lines, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced timing: the model thread fails holding the hooks' lock while another thread is inside a logging
    handler (holding its lock) that drops the last reference to a cache layer, so the layer's finaliser runs
    there. A finaliser that takes the hooks' lock, and a failure path that logs, wait for each other forever."""
    owner = Owner()
    add(observer, owner)
    victim: dict[str, Any] = {}
    owner(lambda self: victim.setdefault("cache", DynamicCache()).update(kv(1, 2), kv(1, 2), 0))
    in_emit, model_holds_lock = threading.Event(), threading.Event()

    class Slow(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if threading.current_thread().name == "logging":
                in_emit.set()
                model_holds_lock.wait(5)
                victim.clear()  # the layer dies here, inside this handler's lock

    def stalled(cls: type) -> object:  # runs under the hooks' lock, on the model thread
        in_emit.wait(5)
        model_holds_lock.set()
        raise RuntimeError("failed while a handler ran")

    slow = Slow()
    logging.getLogger("vllm.modelkv_exporter").addHandler(slow)
    monkeypatch.setattr(hooks, "plan_for", stalled)
    results: list[torch.Tensor] = []
    logging_thread = threading.Thread(
        target=lambda: logging.getLogger("vllm.modelkv_exporter.other").warning("a slow line"),
        name="logging",
        daemon=True,
    )
    model = threading.Thread(target=lambda: results.append(owner(first_update)), name="model", daemon=True)
    try:
        logging_thread.start()
        model.start()
        logging_thread.join(10)
        model.join(10)
        assert not logging_thread.is_alive() and not model.is_alive(), "the two threads deadlocked"
    finally:
        logging.getLogger("vllm.modelkv_exporter").removeHandler(slow)
    assert len(results) == 1 and "failed while a handler ran" in (hooks.broken() or "")
    monkeypatch.undo()
    with hooks.lock:
        hooks.drain()
    assert not [r for r in hooks.records.values() if r() is None], "the dead layer left the records"


def test_the_heartbeat_logs_holding_no_lock(observer: Observer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sample that fails on the heartbeat thread: its line is logged after the beat, outside every lock."""
    owner = Owner()
    add(observer, owner)
    owner(first_update)
    publisher = SnapshotPublisher(tmp_path, make_snapshot("e"))
    held: list[tuple[bool, bool]] = []

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if threading.current_thread().name == "modelkv-heartbeat":
                held.append((hooks.lock._is_owned(), publisher._lock.locked()))  # type: ignore[attr-defined]

    def explode(*args: object) -> None:
        raise OSError("cannot read")

    monkeypatch.setattr(tally_module, "storages", explode)
    monkeypatch.setattr(observer, "_recount", lambda state, observing: explode())
    watch = Watch()
    logging.getLogger("vllm.modelkv_exporter").addHandler(watch)
    try:
        publisher.start_heartbeat(0.05, observe=observer.sample)
        for _ in range(200):
            if held:
                break
            threading.Event().wait(0.05)
        publisher.stop()
    finally:
        logging.getLogger("vllm.modelkv_exporter").removeHandler(watch)
    assert held and not any(a or b for a, b in held), held
    assert figures(observer, owner).reason and "cannot read" in (figures(observer, owner).reason or "")


def test_a_reported_failure_keeps_no_frame_or_tensor_alive(lines: Lines) -> None:
    """The report of a failure outlives the failure until the next flush: it keeps its text, not the exception
    (whose traceback, and the tracebacks it chains, hold frames and the tensors in their locals)."""

    def fails_holding(tensor: torch.Tensor) -> None:
        try:
            raise KeyError("the model's own, being handled")
        except KeyError:
            raise ValueError("inside the hook") from None

    scratch = torch.ones(1024)
    alive = weakref.ref(scratch)
    try:
        fails_holding(scratch)
    except ValueError as error:
        report(logging.getLogger("vllm.modelkv_exporter.observe"), "failed", error=error)
    del scratch
    gc.collect()
    assert alive() is None, "the report kept the frame holding the tensor"
    flush()
    assert ("MainThread", "failed: ValueError: inside the hook") in lines.lines
