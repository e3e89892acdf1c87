"""Leaks of live tensors seen from their floor (issue 48): the stories written before the leak rule changed.

A GPU engine's live tensors stand at a floor between engine steps (weights, paged KV cache,
buffers, what leaks) and rise with each step's activations. These stories are an H100 (80 GiB) at
``gpu_memory_utilization`` 0.9: 72 GiB for vLLM, of which 16 GiB of weights, a 3.5 GiB activation
allowance (the peak vLLM profiled) and 52 GiB of paged KV cache. Their engines serve in waves: half
a GiB of activations between waves, 2 GiB at their height.
"""

from __future__ import annotations

from dataclasses import replace

from modelkv_testbed.simulation.physics import GIB, MIB, Device, Engine, bursts, flat, plus, ramp, step
from modelkv_testbed.simulation.render import selector
from modelkv_testbed.simulation.story import Episode, Firing, Held, Quiet, Story, Value, engine_labels

UNDECLARED = "ModelKVUndeclaredMemoryGrowth"
WARNING = {"severity": "warning"}
GROWTH = "modelkv_engine:live_tensor_growth_bytes"
H100 = 80 * GIB
WAVES = plus(flat(GIB // 2), bursts(5, 30, 12, 3 * GIB // 2))
"""Activations: half a GiB, 2 GiB for 12 minutes of every half hour."""
RUSH = plus(flat(GIB // 2), bursts(5, 60, 20, 3 * GIB // 2))
"""A saturated engine's activations: half a GiB, 2 GiB in a rush of 20 minutes every hour."""


def h100_engine(name: str, pod: str, instance: str, device: str, **physics: object) -> Engine:
    """An engine alone on an H100 at ``gpu_memory_utilization`` 0.9, serving in waves, ready 15 minutes before the
    story starts."""
    fields: dict[str, object] = {
        "model": "qwen3-32b",
        "stage": "",
        "architecture": "Qwen3ForCausalLM",
        "started": -25,
        "weights": 16 * GIB,
        "paged_kv": 52 * GIB,
        "graphs": GIB // 2,
        "profiled_activation_peak": 3 * GIB + GIB // 2,
        "activation": WAVES,
        **physics,
    }
    return Engine(name, pod, instance, Device(device, total=H100), **fields)  # type: ignore[arg-type]


def _slow_leak() -> Story:
    leaking = h100_engine("slow-leak", "chat-0", "10.20.0.1:9400", "GPU-l1", leak=ramp(-15, 5 * MIB))
    older = replace(leaking, engine_id="slow-leak-old-hook", pod="chat-1", instance="10.20.0.2:9400", floor=False)
    older = replace(older, device=Device("GPU-l2", total=H100))
    return Story(
        "story-leaks-slow-leak-from-the-floor",
        """
        A slow leak of live tensors. Engine "slow-leak" became ready 15 minutes before the story
        starts and leaks 5 MiB of live tensors a minute from then on, forever; its hook reports the
        floor of live tensors (the lowest of its samples over two minutes). "slow-leak-old-hook" is
        the same engine, leaking the same way, with a hook from before the floor: it reports the
        high-water mark of live tensors and nothing lower.
        """,
        [
            Episode(
                """
                The operator expects "slow-leak" to page by minute 80 (its live tensors are 475 MiB
                above their baseline then), whatever its activation allowance, and to keep paging while it
                leaks. The older hook pages as it did before: only once the leak has eaten the
                activation allowance that its high-water baseline includes, not within these 7 hours; its
                growth figure is still the high-water mark against its baseline.
                """,
                [leaking, older],
                420,
                [
                    Quiet(UNDECLARED, 0, 45, 'engine="slow-leak"'),
                    Firing(UNDECLARED, 80, (engine_labels(leaking, **WARNING),)),
                    Held(UNDECLARED, 80, 420, (engine_labels(leaking, **WARNING),), 'engine="slow-leak"'),
                    Quiet(UNDECLARED, 0, 420, 'engine="slow-leak-old-hook"'),
                    Value(
                        f'{GROWTH}{{engine="slow-leak-old-hook"}}',
                        70,
                        (
                            (
                                selector(GROWTH, tuple(sorted(engine_labels(older).items()))),
                                float(older.leak(70) + WAVES(70) - older.profiled_activation_peak),
                            ),
                        ),
                    ),
                ],
            )
        ],
    )


def _busy_and_stopped() -> Story:
    busy = h100_engine(
        "busy",
        "chat-2",
        "10.20.0.3:9400",
        "GPU-l3",
        activation=RUSH,
        busy=bursts(5, 60, 20, 3 * GIB // 4),
        leak=plus(step(2, 48 * MIB), step(3, 16 * MIB)),
    )
    stopped = h100_engine("stopped-leak", "chat-3", "10.20.0.4:9400", "GPU-l4", leak=ramp(30, 20 * MIB, 90))
    return Story(
        "story-leaks-busy-engine-and-a-stopped-leak",
        """
        Two engines without a leak's trend. "busy" is saturated in a rush of 20 minutes every hour:
        every sample its hook takes then lands inside an engine step, with at least 768 MiB of
        activations live (2 GiB at most); its first requests made 64 MiB of
        buffers that it keeps (cuBLAS workspaces, a lazily made sampler buffer). "stopped-leak" leaks
        20 MiB of live tensors a minute from minute 30 to minute 90 and then stops, 1.2 GiB held.
        """,
        [
            Episode(
                """
                The operator expects "busy" never to page: activations, however busy the engine, are
                inside its memory plan, and a few buffers its first traffic keeps are not a leak.
                "stopped-leak" pages within 45 minutes of its leak starting and keeps paging after it
                stops, because the leaked memory is still held (a stopped leak is not healed).
                """,
                [busy, stopped],
                360,
                [
                    Quiet(UNDECLARED, 0, 360, 'engine="busy"'),
                    Firing(UNDECLARED, 75, (engine_labels(stopped, **WARNING),)),
                    Held(UNDECLARED, 75, 360, (engine_labels(stopped, **WARNING),), 'engine="stopped-leak"'),
                ],
            )
        ],
    )


LEAK_STORIES = [_slow_leak(), _busy_and_stopped()]
"""The stories of this module, in the order they are written."""
