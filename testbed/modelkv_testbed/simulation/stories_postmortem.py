"""The post-mortem stories of issue 49: engines that die, told as the person paged at night expects them.

An engine that leaks until it runs out of memory, one that raises another error, one that shuts down cleanly,
one that is killed without ending its snapshot (vanished), and one that is restarted in place minutes after its
out-of-memory (the restart replaces its snapshot: its engine id is stable). ``stories`` lists them in ``STORIES``.
Times are story minutes.
"""

from __future__ import annotations

from modelkv_testbed.simulation.physics import GIB, MIB, Device, Engine, ramp
from modelkv_testbed.simulation.story import AlertTest, Episode, Firing, Held, Quiet, Story, Value, engine_labels

OUT_OF_MEMORY = "ModelKVEngineOutOfMemory"
STALE = "ModelKVSnapshotStale"
CRITICAL = {"severity": "critical"}
WARNING = {"severity": "warning"}
GROWN = {"part": "live_tensors"}
DIED_AT = 60
LEAK_PER_MINUTE = 100 * MIB
GROWN_WORDS = f"{(DIED_AT - 2) * LEAK_PER_MINUTE / GIB:.4g}GiB"
"""What the description says grew: the leak of all but the last two minutes before death, as the floor of live
tensors at the last sample reads it (the lowest of the engine's last two minutes), by humanize1024."""


def oom_annotations(engine: Engine) -> dict[str, str]:
    """ModelKVEngineOutOfMemory's annotations for ``engine``, whose live tensors grew ``GROWN_WORDS``."""
    return {
        "summary": "An engine died of out-of-memory; the part that grew is its part label.",
        "description": (
            f"Engine {engine.engine_id} in pod llm/{engine.pod} (model {engine.model}, stage {engine.stage}) raised "
            f"out-of-memory and ended. What grew most since its post-initialisation baseline: live_tensors, by "
            f"{GROWN_WORDS} (the parts are those of modelkv_engine_end_growth_bytes). Its memory by part at that "
            "moment is on the exporter's page and in `modelkv-exporter inspect`."
        ),
        "runbook_url": "https://modelkv-exporter.invalid/docs/runbook.md#modelkvengineoutofmemory",
    }


def _engines_that_die() -> Story:
    leaky = Engine(
        "omni-leak", "pm-0", "10.20.0.1:9400", Device("GPU-pm0"), leak=ramp(0, LEAK_PER_MINUTE), died_at=DIED_AT
    )
    failing = Engine("omni-error", "pm-1", "10.20.0.2:9400", Device("GPU-pm1"), died_at=DIED_AT, died_of="error")
    clean = Engine("omni-clean", "pm-2", "10.20.0.3:9400", Device("GPU-pm2"), ended_at=DIED_AT)
    killed = Engine("omni-killed", "pm-3", "10.20.0.4:9400", Device("GPU-pm3"), died_at=DIED_AT, died_of="vanished")
    restarted = Engine(
        "omni-restart",
        "pm-4",
        "10.20.0.5:9400",
        Device("GPU-pm4"),
        leak=ramp(0, LEAK_PER_MINUTE, DIED_AT),
        died_at=DIED_AT,
        restarted_at=DIED_AT + 3,
    )
    oom = (engine_labels(leaky, **CRITICAL, **GROWN), engine_labels(restarted, **CRITICAL, **GROWN))
    last_beat = DIED_AT - 1
    replaced = DIED_AT + 3
    forgotten = last_beat + 60
    return Story(
        "story-pm-a-engines-that-die",
        f"""
        Five engines, each on a device and in a pod of its own, stop at minute {DIED_AT}. "omni-leak" leaks
        live tensors ({LEAK_PER_MINUTE // MIB} MiB a minute) until it raises out-of-memory; its hook ends its
        snapshot with reason out_of_memory and its memory at that moment. "omni-error" raises another error and
        ends with reason error. "omni-clean" shuts down cleanly. "omni-killed" is killed (SIGKILL, the kernel's
        OOM killer): its snapshot stays as it was and its liveness lock is let go, so its sidecar tells it
        vanished once it is stale. "omni-restart" leaks as omni-leak and runs out of memory at the same minute;
        its container is restarted and the new engine, with the same engine id, replaces its snapshot from
        minute {DIED_AT + 3}. The sidecars forget an end an hour after its engine's last heartbeat.
        """,
        [
            Episode(
                """
                The operator expects one critical page per engine that ran out of memory, from the minute its end
                is exported, naming the part that grew (live tensors) and by how much: it stays for the hour the
                sidecar keeps the end and an hour after (after the restart, an hour after the new engine replaced
                the snapshot), so whoever is paged still reads why it died. No out-of-memory page for the error, the
                clean shutdown or the killed engine; the killed one is paged as a stale engine (a warning, 5 minutes
                after it stops, as before), and its end is exported as vanished at its last heartbeat.
                """,
                [leaky, failing, clean, killed, restarted],
                200,
                [
                    Quiet(OUT_OF_MEMORY, 0, DIED_AT - 1),
                    AlertTest(OUT_OF_MEMORY, DIED_AT - 1),
                    Firing(OUT_OF_MEMORY, DIED_AT, oom),
                    AlertTest(
                        OUT_OF_MEMORY,
                        DIED_AT + 1,
                        tuple(
                            (engine_labels(engine, **CRITICAL, **GROWN), oom_annotations(engine))
                            for engine in (leaky, restarted)
                        ),
                    ),
                    Held(OUT_OF_MEMORY, DIED_AT, replaced - 1 + 60, oom),
                    Quiet(OUT_OF_MEMORY, replaced + 60, 200, f'engine="{restarted.engine_id}"'),
                    Held(OUT_OF_MEMORY, replaced + 60, forgotten + 60, oom[:1]),
                    Quiet(OUT_OF_MEMORY, forgotten + 61, 200),
                    Quiet(OUT_OF_MEMORY, 0, 200, 'engine=~"omni-error|omni-clean|omni-killed"'),
                    Firing(STALE, DIED_AT + 6, (engine_labels(killed, **WARNING),)),
                    Value(
                        'modelkv_engine_ended_timestamp_seconds{reason="vanished"}',
                        DIED_AT + 2,
                        (
                            (
                                'modelkv_engine_ended_timestamp_seconds{engine="omni-killed",instance="10.20.0.4:9400",'
                                'job="modelkv-exporter",model="omni",namespace="llm",pod="pm-3",reason="vanished",'
                                'stage="talker"}',
                                last_beat * 60.0,
                            ),
                        ),
                    ),
                    Value(
                        "count by (reason) (modelkv_engine_ended_timestamp_seconds)",
                        DIED_AT + 2,
                        (('{reason="error"}', 1.0), ('{reason="out_of_memory"}', 2.0), ('{reason="vanished"}', 1.0)),
                    ),
                ],
            )
        ],
    )


POSTMORTEM_STORIES = [_engines_that_die()]
"""The stories of this module, in the order ``STORIES`` lists them."""
