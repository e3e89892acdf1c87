"""The on-call stories of issue 48: pods that are gone, a CPU engine's warm-up, a plateau's jitter, no engine at all.

Each is told as the operator expects it, before the rules were changed for it; ``stories`` lists them
in ``STORIES``. Sizes are in MiB, times in story minutes.
"""

from __future__ import annotations

import random

from modelkv_testbed.simulation.physics import MIB, Curve, Device, Engine, flat, plus, ramp, step
from modelkv_testbed.simulation.render import ScrapeGap
from modelkv_testbed.simulation.story import Episode, Firing, Held, Quiet, Story, Value, engine_labels

STALE = "ModelKVSnapshotStale"
UNDECLARED = "ModelKVUndeclaredMemoryGrowth"
NO_ENGINE = "ModelKVNoEnginePublishing"
WARNING = {"severity": "warning"}
NEVER = 10**6
"""A ``started`` minute no story reaches: the engine beside the sidecar never publishes a snapshot."""
LONGEST_PENDING = 10
"""The most consecutive minutes a CPU warm-up of up to 30 minutes may keep ModelKVUndeclaredMemoryGrowth pending: 5
short of its 15-minute ``for`` (the "still rising" test needs a rise in a 5-minute step 25 minutes before the last
5-minute step that rises, so a rise of 30 minutes meets it for at most 10)."""


def jitter(start: int, size: int, seed: int) -> Curve:
    """From minute ``start``, a heap that moves up and down within ``size`` bytes at random, never trending."""
    draws = random.Random(seed)
    values = [draws.randrange(size + 1) for _ in range(2000)]
    return lambda t: values[t - start] if t >= start else 0


def pending_at_most(alert: str, engine: Engine, minutes: int, until: int) -> Value:
    """``alert`` is never pending for more than ``minutes`` evaluations in a row for ``engine`` up to ``until``."""
    run = minutes + 1
    pending = f'ALERTS{{alertname="{alert}", alertstate="pending", engine="{engine.engine_id}"}}'
    # A range half a minute short of ``run`` minutes holds ``run`` evaluations, whether it includes its start
    # (Prometheus 2) or not (Prometheus 3): all of them pending is a run of ``run``.
    window = f"{run * 60 - 30}s"
    return Value(f"max_over_time((count_over_time({pending}[{window}]) >= {run})[{until}m:1m])", until, ())


def _drained_pods() -> Story:
    node = "10.11.0"
    killed = Engine("omni-a", "drain-0", f"{node}.1:9400", Device("GPU-d0"), hung_at=59)
    ended = Engine("omni-b", "drain-1", f"{node}.2:9400", Device("GPU-d1"), ended_at=59)
    moved = Engine("omni-a", "omni-0b", "10.11.1.1:9400", Device("GPU-e0"), started=63)
    hung = Engine("omni-c", "kept-0", "10.11.2.1:9400", Device("GPU-e1"), hung_at=60)
    return Story(
        "story-oncall-a-drained-pods-are-gone",
        """
        A node drain. At minute 59 the engines of the two pods on the drained node stop: "omni-a" is killed
        without ending its snapshot (its sidecar, still serving, reports it stale at minutes 59 and 60),
        "omni-b" shuts down cleanly. Both pods are deleted at minute 61 (omni-b's at 60): Prometheus drops
        their targets, and every series they returned, up included, ends with a staleness marker. omni-a's
        replacement pod is created on another node at minute 61 and its engine
        publishes from minute 63. On a node that stays, engine "omni-c" hangs at
        minute 60 and its sidecar goes on being scraped.
        """,
        [
            Episode(
                """
                The operator expects no page for the pods that are gone: there is nothing left to look at.
                The hung engine, whose pod is still there, is paged 5 minutes after it stops, as before,
                and stays paged; the replacement pod is never paged, for a stale engine or for having none.
                """,
                [killed, ended, moved, hung],
                120,
                [
                    Quiet(STALE, 0, 120, 'pod=~"drain-.+|omni-0b"'),
                    Firing(STALE, 66, (engine_labels(hung, **WARNING),)),
                    Held(STALE, 66, 120, (engine_labels(hung, **WARNING),)),
                    Quiet(NO_ENGINE, 0, 120),
                ],
                gaps=(
                    ScrapeGap(killed.instance, 61, 121, deleted=True),
                    ScrapeGap(ended.instance, 60, 121, deleted=True),
                    ScrapeGap(moved.instance, 0, 61, deleted=True),
                ),
            )
        ],
    )


def _cpu_warm_up_and_adapters() -> Story:
    warm_24 = Engine("cpu-warm-24", "cpu-w-0", "10.12.0.1:9400", None, started=0, heap=ramp(18, 20 * MIB, 42))
    warm_30 = Engine("cpu-warm-30", "cpu-w-1", "10.12.0.2:9400", None, started=0, heap=ramp(18, 16 * MIB, 48))
    adapters = plus(*(step(at, 160 * MIB) for at in (20, 27, 33, 41, 46, 52)))
    lora = Engine("cpu-lora", "cpu-w-2", "10.12.0.3:9400", None, started=0, heap=plus(ramp(18, 10 * MIB, 30), adapters))
    plateau = Engine(
        "cpu-jitter",
        "cpu-w-3",
        "10.12.0.4:9400",
        None,
        started=0,
        heap=plus(ramp(12, 20 * MIB, 32), jitter(32, 16 * MIB, 48)),
    )
    leak = Engine(
        "cpu-leak-40",
        "cpu-w-4",
        "10.12.0.5:9400",
        None,
        started=0,
        heap=ramp(12, 15 * MIB, 30),
        leak=ramp(90, 40 * MIB),
    )
    slow = Engine(
        "cpu-leak-2", "cpu-w-5", "10.12.0.6:9400", None, started=0, heap=ramp(12, 15 * MIB, 30), leak=ramp(60, 2 * MIB)
    )
    quiet = 'engine=~"cpu-warm-24|cpu-warm-30|cpu-lora|cpu-jitter"'
    return Story(
        "story-oncall-b-cpu-warm-up-adapters-and-jitter",
        """
        CPU engines, measured by resident memory, that declare nothing. Each starts at minute 0 and is
        ready at 10. "cpu-warm-24" takes its first requests at 18 and its heap grows 480 MiB over 24
        minutes, then stays flat; "cpu-warm-30" grows as much over 30 minutes. "cpu-lora" serves LoRA
        adapters loaded on demand: from its first requests at 18 its heap warms up by 120 MiB, and six adapters of 160 MiB load at minutes 20, 27,
        33, 41, 46 and 52, and then no more (its max_loras). "cpu-jitter" settles 400 MiB above its
        baseline by minute 32 and then moves up and down at random within 16 MiB. "cpu-leak-40" warms up
        like the others and from 1 hour 30 minutes leaks 40 MiB a minute; "cpu-leak-2" from 1 hour leaks 2 MiB a
        minute, less than a plateau's jitter in any 5 minutes.
        """,
        [
            Episode(
                """
                The operator expects none of the warm-ups to page: a heap that grows for up to 30 minutes
                after the first requests and then stays flat, adapters loaded in steps that stop, and a
                plateau's jitter are not a leak. Nor should they come close: the alert may be pending for
                at most 10 minutes in a row of the 15 its `for` needs, and the plateau's jitter never sets it
                pending. "cpu-leak-40" pages within 45 minutes of its leak starting, and for as long as it
                leaks. "cpu-leak-2" pages too, later: within 2 hours 15 minutes of its leak starting, and for as long
                as it leaks.
                """,
                [warm_24, warm_30, lora, plateau, leak, slow],
                240,
                [
                    Quiet(UNDECLARED, 0, 240, quiet),
                    pending_at_most(UNDECLARED, warm_24, LONGEST_PENDING, 240),
                    pending_at_most(UNDECLARED, warm_30, LONGEST_PENDING, 240),
                    pending_at_most(UNDECLARED, lora, LONGEST_PENDING, 240),
                    pending_at_most(UNDECLARED, plateau, 0, 240),
                    Firing(UNDECLARED, 135, (engine_labels(leak, **WARNING),)),
                    Held(UNDECLARED, 135, 240, (engine_labels(leak, **WARNING),), 'engine="cpu-leak-40"'),
                    Firing(UNDECLARED, 195, (engine_labels(leak, **WARNING), engine_labels(slow, **WARNING))),
                    Held(UNDECLARED, 195, 240, (engine_labels(slow, **WARNING),), 'engine="cpu-leak-2"'),
                ],
            )
        ],
    )


def _sidecar_without_engine() -> Story:
    missing = Engine("omni-np", "np-0", "10.13.0.1:9400", Device("GPU-n0"), started=NEVER)
    slow = Engine("omni-slow", "np-1", "10.13.0.2:9400", Device("GPU-n1"), started=25, activation=flat(0))
    running = Engine("omni-ok", "np-2", "10.13.0.3:9400", Device("GPU-n2"))
    return Story(
        "story-oncall-c-sidecar-without-engine",
        """
        Three pods start their sidecars at minute 0. In "np-0" the engine never loads the plugin (VLLM_PLUGINS
        without it, an engine image without the package, or the spool not mounted in the engine): no
        snapshot ever reaches the sidecar's spool, while the sidecar is scraped and healthy. In "np-1" the
        engine pulls its image and loads a large model first: its first snapshot reaches the spool at minute
        25. "np-2" has served for hours.
        """,
        [
            Episode(
                """
                The operator expects to be told about "np-0" within half an hour, an engine's model load
                long, once a healthy engine would have published, and for as long as none does; never
                about the slow start of "np-1" or about "np-2".
                """,
                [missing, slow, running],
                90,
                [
                    Quiet(NO_ENGINE, 0, 29),
                    Firing(
                        NO_ENGINE,
                        31,
                        (
                            {
                                "job": "modelkv-exporter",
                                "instance": missing.instance,
                                "namespace": "llm",
                                "pod": missing.pod,
                                **WARNING,
                            },
                        ),
                    ),
                    Held(
                        NO_ENGINE,
                        31,
                        90,
                        (
                            {
                                "job": "modelkv-exporter",
                                "instance": missing.instance,
                                "namespace": "llm",
                                "pod": missing.pod,
                                **WARNING,
                            },
                        ),
                    ),
                ],
            )
        ],
    )


ONCALL_STORIES = [_drained_pods(), _cpu_warm_up_and_adapters(), _sidecar_without_engine()]
"""The on-call stories, in the order their files sort."""
