"""The model's threads never wait for a lock the heartbeat or the collector can hold.

A model finaliser the collector runs on the heartbeat thread may take a model lock whose holder is updating a cache;
a child forked while the heartbeat samples has no heartbeat; a sample of many live layers runs beside a model thread
that updates without pause. Scenes that can hang run in a process of their own (``modelkv_testbed.hot_path_scenes``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from modelkv_exporter.engine.observe import Observer, hooks
from modelkv_testbed import hot_path_scenes
from modelkv_testbed.hot_path_scenes import WaitingLock, keep_layers, updating

ROOT = Path(__file__).resolve().parents[2]


def scene(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "testbed")])}
    command = [sys.executable, "-m", hot_path_scenes.__name__, *args]
    try:
        return subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        return subprocess.CompletedProcess(command, -1, str(expired.stdout or ""), str(expired.stderr or ""))


def test_a_finaliser_that_takes_a_model_lock_on_the_heartbeat_thread_never_deadlocks_the_model() -> None:
    """The collector runs the model's finaliser wherever it collects; the model thread holding that lock updates a
    cache meanwhile. With the hooks' lock on the hot path this hung (the heartbeat held it while allocating)."""
    done = scene("deadlock", "on", timeout=100)
    assert done.returncode == 0, f"the model thread hung with the hook on: {done.stdout} {done.stderr[-2000:]}"


def test_a_child_forked_while_the_heartbeat_samples_updates_and_samples() -> None:
    done = scene("fork", timeout=150)
    assert done.returncode == 0, f"{done.stdout} {done.stderr[-2000:]}"


def model_waits(observer: Observer, layers: int, seconds: float = 2.0) -> tuple[int, list[float]]:
    """A model thread updating without pause while a heartbeat samples ``layers`` live layers without pause:
    the updates it made and each time it waited for the hooks' lock (seconds)."""
    owner = keep_layers(observer, layers)
    observer.sample()
    lock = WaitingLock(hooks.lock)
    hooks.lock = lock  # type: ignore[assignment]
    updates = [0]
    stop = hot_path_scenes.sampling(observer)
    deadline = time.perf_counter() + seconds

    def model() -> None:
        while time.perf_counter() < deadline:
            updating(owner)
            updates[0] += 1

    thread = threading.Thread(target=model, name="model")
    try:
        thread.start()
        thread.join()
        stop.set()
        time.sleep(0.2)
    finally:
        hooks.lock = lock.inner
    assert lock.taken.get("heartbeat", 0) > 20, "the heartbeat sampled (a sample holds the lock a few times)"
    return updates[0], lock.waits.get("model", [])


@pytest.mark.parametrize("layers", [10_000, 30_000])
def test_a_model_thread_never_waits_for_a_sample(observer: Observer, layers: int) -> None:
    """Each sample held the hooks' lock in short chunks, but the heartbeat took it again before the waiting model
    thread woke: the model waited for whole samples (tens of ms at 10 000 layers, every sample). Waits for the GIL
    are not counted: on a shared machine they move by more than that."""
    updates, waits = model_waits(observer, layers)
    assert updates > 100
    assert sum(waits) < 0.001, f"the model thread waited {len(waits)} times, {max(waits) * 1e3:.1f} ms at most"
