"""The model's threads never wait for a lock the heartbeat or the collector can hold.

A model finaliser the collector runs on the heartbeat thread may take a model lock whose holder is updating a cache;
a child forked while the heartbeat samples has no heartbeat; a sample of many live layers runs beside a model thread
that updates without pause. Scenes that can hang run in a process of their own (``hot_path_scenes``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from modelkv_exporter.engine.observe import Observer, install
from tests.engine import hot_path_scenes
from tests.engine.hot_path_scenes import keep_layers, updating

ROOT = Path(__file__).resolve().parents[2]
SLOW_UPDATE = 0.005
"""An update slower than this waited for something (the GIL's switch interval is 5 ms)."""


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


def slow_updates(observer: Observer, layers: int, seconds: float = 2.0) -> tuple[int, int, float]:
    """A model thread updating without pause while a heartbeat samples ``layers`` live layers without pause:
    (updates, updates slower than ``SLOW_UPDATE``, the slowest in seconds)."""
    owner = keep_layers(observer, layers)
    observer.sample()
    durations: list[float] = []
    stop = hot_path_scenes.sampling(observer)
    deadline = time.perf_counter() + seconds

    def model() -> None:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            updating(owner)
            durations.append(time.perf_counter() - started)

    thread = threading.Thread(target=model, name="model")
    thread.start()
    thread.join()
    stop.set()
    return len(durations), sum(1 for d in durations if d > SLOW_UPDATE), max(durations)


def test_a_model_thread_never_waits_for_a_sample_of_10000_layers(observer: Observer) -> None:
    """Each sample used to hold the hooks' lock in short chunks, but the heartbeat took it again before the waiting
    model thread woke: the model waited for whole samples (tens of ms at 10 000 layers, every sample)."""
    updates, slow, slowest = slow_updates(observer, 10_000)
    assert updates > 100
    assert slow <= max(3, updates // 200), f"{slow} of {updates} updates over 5 ms, the slowest {slowest * 1e3:.0f} ms"
