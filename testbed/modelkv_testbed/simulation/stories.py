"""The stories: one per situation the rules once got wrong, each told as an operator would expect it.

Every engine below runs on a simulated device (``physics``) and exports every series a sidecar
would (``render``). Sizes are in GiB and MiB, times in story minutes; engines that start at a
negative minute were running long before the story begins.
"""

from __future__ import annotations

from dataclasses import replace

from modelkv_exporter.engine.vllm_hook.identity import engine_id_for
from modelkv_testbed.simulation.physics import (
    GIB,
    MIB,
    SLEEP_TAGS_034,
    Cache,
    Curve,
    Device,
    Engine,
    ExtensibleKV,
    Sleep,
    Undeclared,
    burst,
    bursts,
    flat,
    plus,
    ramp,
    step,
)
from modelkv_testbed.simulation.render import ScrapeGap, selector
from modelkv_testbed.simulation.stories_leaks import LEAK_STORIES
from modelkv_testbed.simulation.stories_oncall import ONCALL_STORIES
from modelkv_testbed.simulation.stories_postmortem import POSTMORTEM_STORIES
from modelkv_testbed.simulation.story import (
    AlertTest,
    Episode,
    Firing,
    Held,
    Quiet,
    Story,
    Value,
    device_labels,
    engine_labels,
)

PREDICTED = "ModelKVDeviceMemoryExhaustionPredicted"
UNDECLARED = "ModelKVUndeclaredMemoryGrowth"
WILL_NOT_FIT = "ModelKVDeclaredPeakWillNotFit"
STALE = "ModelKVSnapshotStale"
UNDECLARED_CACHE = "ModelKVUndeclaredCache"
UNDER_REPORTS = "ModelKVDeclarationUnderReports"
IMMINENT = "ModelKVDeviceMemoryExhaustionImminent"
IMMINENT_URL = "https://modelkv-exporter.invalid/docs/runbook.md#modelkvdevicememoryexhaustionimminent"
EXPORTER_DOWN = "ModelKVExporterDown"
BREAKDOWN = "modelkv_memory_breakdown_bytes"
WARNING = {"severity": "warning"}
PENDING = "modelkv_engine:device_declared_pending_bytes:sum"


def _steps() -> Story:
    prefill = Engine(
        "prefill",
        "tts-0",
        "10.1.0.1:9400",
        Device("GPU-a"),
        weights=16 * GIB,
        paged_kv=50 * GIB,
        profiled_activation_peak=3 * GIB + GIB // 2,
        activation=plus(flat(GIB // 2), step(120, 2 * GIB + GIB // 2)),
    )
    extension = Engine(
        "extension", "tts-1", "10.1.0.2:9400", Device("GPU-b"), paged_kv=50 * GIB, non_torch=step(120, 2 * GIB)
    )
    leak = Engine(
        "stopped-leak", "tts-2", "10.1.0.3:9400", Device("GPU-c"), paged_kv=40 * GIB, leak=ramp(120, 3 * GIB // 20, 180)
    )
    return Story(
        "story-a-step-is-not-a-trend",
        """
        A one-off step must not predict exhaustion. Three engines, each alone on
        an 80 GiB device and running for hours. At 2 hours, "prefill" serves its first full-size
        prefill: its activations reach 3 GiB (vLLM profiled 3.5 GiB), and torch's caching allocator
        keeps them, so its reserved memory, NVML's figure and the device grow by 2.5 GiB to 70 GiB and
        stay flat. At the same time an extension in "extension" allocates 2 GiB outside torch once.
        "stopped-leak" leaks 0.15 GiB of live tensors a minute for an hour and then stops, 9 GiB held.
        """,
        [
            Episode(
                """
                The operator expects no exhaustion prediction for "prefill" or "extension" at any time: a
                step that stays flat is not a trend. "extension" does hold 2 GiB that nothing explains,
                so it pages as undeclared memory growth 15 minutes after the step, and keeps paging;
                "prefill" never does (its activations are inside their allowance). "stopped-leak" is
                predicted to fill its device within 4 hours while it leaks (a warning, never
                critical), and that warning resolves within 20 minutes of the leak stopping; its
                undeclared growth pages and stays, because the leaked memory is still held.
                """,
                [prefill, extension, leak],
                360,
                [
                    Quiet(PREDICTED, 0, 360, 'device=~"GPU-a|GPU-b"'),
                    Quiet(IMMINENT, 0, 360),
                    Quiet(UNDECLARED, 0, 360, 'engine="prefill"'),
                    Firing(UNDECLARED, 110, ()),
                    Firing(UNDECLARED, 140, (engine_labels(extension, **WARNING),)),
                    Firing(UNDECLARED, 160, (engine_labels(extension, **WARNING), engine_labels(leak, **WARNING))),
                    Firing(UNDECLARED, 360, (engine_labels(extension, **WARNING), engine_labels(leak, **WARNING))),
                    Firing(PREDICTED, 175, (device_labels(leak.device, **WARNING),)),  # type: ignore[arg-type]
                    Quiet(PREDICTED, 200, 360),
                    Quiet(PREDICTED, 0, 360, 'severity="critical"'),
                ],
            )
        ],
    )


def _cpu() -> Story:
    talker = Cache("talker", "talker_kv", 256 * MIB, held=plus(flat(200 * MIB), burst(60, 75, 1300 * MIB)))
    quiet = Engine(
        "cpu-talker",
        "cpu-0",
        "10.2.0.1:9400",
        None,
        caches=(talker,),
        heap=ramp(0, MIB, 300),
    )
    leaking = Engine(
        "cpu-leaker",
        "cpu-1",
        "10.2.0.2:9400",
        None,
        caches=(talker,),
        heap=ramp(0, MIB, 300),
        leak=ramp(60, 20 * MIB),
    )
    under = Cache("talker", "talker_kv", 128 * MIB, held=talker.held)
    under_reporting = Engine(
        "cpu-under",
        "cpu-2",
        "10.2.0.3:9400",
        None,
        caches=(under,),
        heap=ramp(0, MIB, 150),
    )
    return Story(
        "story-b-cpu-heap-growth",
        """
        A CPU engine, measured by its resident memory, pages on ordinary heap
        growth. Two CPU engines declare 2 GiB of talker cache (8 rows of 256 MiB) and their caches are
        observed. Their caches usually hold 200 MiB; for a quarter of an hour at 1 hour a burst of
        requests fills them to 1.5 GiB. The C allocator keeps the freed heap, so resident memory keeps
        the burst. Python's own heap grows by 300 MiB over five hours. "cpu-leaker" also leaks 20 MiB a
        minute from 1 hour on. "cpu-under" declares only 1 GiB (8 rows of 128 MiB) for the same caches,
        so the burst takes them past their declaration; its heap grows by 150 MiB.
        """,
        [
            Episode(
                """
                The operator expects "cpu-talker" never to page: everything it grew by is inside what
                its caches once held and may hold again (its declared peak). "cpu-leaker" pages once its
                resident growth exceeds its declared peak by more than 256 MiB for 15 minutes (the
                burst it kept, its heap and its leak pass that about 1 hour 45 minutes in), and keeps
                paging. "cpu-under" is paged for its declaration, which under-reports from the burst on,
                and never for undeclared memory: what its caches held explains its growth, although
                that is more than it declares.
                """,
                [quiet, leaking, under_reporting],
                300,
                [
                    Quiet(UNDECLARED, 0, 300, 'engine=~"cpu-talker|cpu-under"'),
                    Firing(UNDECLARED, 100, ()),
                    Firing(UNDECLARED, 135, (engine_labels(leaking, **WARNING),)),
                    Firing(UNDECLARED, 300, (engine_labels(leaking, **WARNING),)),
                    Quiet(UNDER_REPORTS, 0, 55),
                    Firing(UNDER_REPORTS, 90, (engine_labels(under_reporting, owner="talker", **WARNING),)),
                    Firing(UNDER_REPORTS, 300, (engine_labels(under_reporting, owner="talker", **WARNING),)),
                ],
            )
        ],
    )


def _overcommit() -> Story:
    def pair(device: Device, prefix: str, host: str) -> list[Engine]:
        engines = []
        for stage in ("thinker", "talker"):
            cache = Cache(stage, f"{stage}_kv", GIB, held=step(-500, 2 * GIB))
            engines.append(
                Engine(
                    f"{prefix}-{stage}",
                    f"omni-{prefix}",
                    host,
                    device,
                    stage=stage,
                    weights=10 * GIB,
                    paged_kv=15 * GIB,
                    profiled_activation_peak=4 * GIB + GIB // 2,
                    activation=step(-500, 4 * GIB),
                    caches=(cache,),
                )
            )
        return engines

    tight, roomy = Device("GPU-s", others=6 * GIB), Device("GPU-t", others=2 * GIB)
    engines = pair(tight, "tight", "10.3.0.1:9400") + pair(roomy, "roomy", "10.3.0.2:9400")
    return Story(
        "story-c-shared-device-over-commit",
        """
        Over-commit on a shared device. Two stages share each of two 80 GiB
        devices; each declares 8 GiB of cache at max_num_seqs 8 and its caches are observed holding 2
        GiB. vLLM emptied torch's cache at start-up; since then the activations of each stage (4 GiB,
        inside the 4.5 GiB it profiled) are cached again, so each stage's NVML figure grew by 6 GiB,
        only 2 of which are cache. Processes that publish nothing hold 6 GiB of GPU-s (10 GiB free) and
        2 GiB of GPU-t (14 GiB free).
        """,
        [
            Episode(
                """
                The operator expects GPU-s to page once: its stages still have 6 + 6 = 12 GiB of
                declared cache to allocate (declared peak minus what their caches hold), more than its
                10 GiB free. GPU-t fits the same 12 GiB in its 14 GiB and stays quiet. Neither stage
                holds undeclared memory.
                """,
                engines,
                60,
                [
                    Value(
                        PENDING,
                        30,
                        (
                            (f'{PENDING}{{device="GPU-s",device_key="GPU-s"}}', 12 * GIB),
                            (f'{PENDING}{{device="GPU-t",device_key="GPU-t"}}', 12 * GIB),
                        ),
                    ),
                    Firing(WILL_NOT_FIT, 30, (device_labels(tight, **WARNING),)),
                    Quiet(WILL_NOT_FIT, 0, 60, 'device="GPU-t"'),
                    Quiet(UNDECLARED, 0, 60),
                ],
            )
        ],
    )


def _hung_neighbour() -> Story:
    shared = Device("GPU-h")
    innocent = Engine(
        "innocent", "asr-0", "10.4.0.1:9400", shared, weights=10 * GIB, paged_kv=20 * GIB, nvml=False, stage="asr"
    )
    neighbour = Engine(
        "neighbour",
        "asr-0",
        "10.4.0.1:9400",
        shared,
        started=-300,
        weights=10 * GIB,
        paged_kv=20 * GIB,
        nvml=False,
        stage="tts",
        hung_at=120,
    )
    return Story(
        "story-d-hung-neighbour",
        """
        A hung neighbour must not be blamed on the innocent. Two engines share an
        80 GiB device without NVML (the usual container). "innocent" took its baseline before
        "neighbour" loaded its 30 GiB. At 2 hours "neighbour" hangs: it stops heartbeating but keeps
        its memory. An hour later the sidecar forgets its file (--forget-after), though it is still
        hung.
        """,
        [
            Episode(
                """
                The operator expects ModelKVSnapshotStale for "neighbour" 5 minutes after it goes stale,
                firing for as long as it stays hung (its file forgotten or not). "innocent" never pages
                for undeclared memory: the device's memory it did not take is the hung process's.
                """,
                [innocent, neighbour],
                360,
                [
                    Quiet(UNDECLARED, 0, 360),
                    Firing(STALE, 127, (engine_labels(neighbour, **WARNING),)),
                    Firing(STALE, 240, (engine_labels(neighbour, **WARNING),)),
                    Firing(STALE, 360, (engine_labels(neighbour, **WARNING),)),
                ],
            )
        ],
    )


def _stale_and_young() -> Story:
    hung = Engine("hung", "vl-0", "10.5.0.1:9400", Device("GPU-x"), hung_at=60)
    restarted = Engine("restarted", "vl-1", "10.5.0.2:9400", Device("GPU-w"), hung_at=60, restarted_at=100)
    ended = Engine("ended", "vl-1", "10.5.0.2:9400", Device("GPU-v"), ended_at=60)
    young = Engine("young", "vl-2", "10.5.0.3:9400", Device("GPU-y"), started=0, leak=ramp(35, GIB // 2))
    warming = Engine(
        "warming",
        "vl-3",
        "10.5.0.4:9400",
        Device("GPU-z"),
        started=0,
        profiled_activation_peak=4 * GIB,
        activation=plus(step(15, GIB), step(25, GIB), step(40, GIB)),
    )
    young_device = young.device
    assert young_device is not None
    return Story(
        "story-e-alerts-that-last-and-come-in-time",
        """
        Alerts must stay firing while their cause lasts, and come in time.
        """,
        [
            Episode(
                """
                "hung" stops heartbeating at 1 hour and stays hung; the sidecar forgets its file at 2
                hours. "restarted" hangs at the same time and is restarted at 1 hour 40 minutes.
                "ended" shuts down cleanly at 1 hour. The operator expects ModelKVSnapshotStale for
                "hung" from 1 hour 5 minutes to the end, forgotten file or not; for "restarted" until
                its restart; never for "ended".
                """,
                [hung, restarted, ended],
                300,
                [
                    Firing(STALE, 70, (engine_labels(hung, **WARNING), engine_labels(restarted, **WARNING))),
                    Firing(STALE, 110, (engine_labels(hung, **WARNING),)),
                    Firing(STALE, 150, (engine_labels(hung, **WARNING),)),
                    Firing(STALE, 300, (engine_labels(hung, **WARNING),)),
                    Quiet(STALE, 0, 300, 'engine="ended"'),
                ],
            ),
            Episode(
                """
                "young" starts at minute 0, loads 46 GiB in 10 minutes and from 35 minutes leaks 0.5
                GiB a minute: its 80 GiB device is full at about 1 hour 40 minutes. "warming" starts at
                the same time and its caching allocator steps up three times as ever larger prefills
                arrive (1 GiB at 15, 25 and 40 minutes), then stays flat. The operator expects the
                critical prediction for "young"'s device at least 25 minutes before it is full (and the
                warning with it), and nothing for "warming".
                """,
                [young, warming],
                100,
                [
                    Firing(
                        PREDICTED,
                        75,
                        (
                            device_labels(young_device, severity="critical"),
                            device_labels(young_device, severity="warning"),
                        ),
                    ),
                    Quiet(PREDICTED, 0, 100, 'device="GPU-z"'),
                    Quiet(IMMINENT, 0, 100, 'device="GPU-z"'),
                ],
            ),
        ],
    )


def _undeclared_cache() -> Story:
    talker = Cache("talker", "talker_kv", 256 * MIB, held=step(20, 512 * MIB))
    undeclared = (
        Undeclared("code2wav.decoder", step(30, 512 * MIB)),
        Undeclared("vocoder.state", step(30, 200 * MIB), found_by="census"),
        Undeclared("vocoder.state", step(30, 300 * MIB), found_by="cache_layer"),
        Undeclared("tokenizer.window", step(30, 48 * MIB)),
    )
    device = Device("GPU-u")
    serving = flat(3 * GIB // 2)
    tts = Engine("tts", "tts-0", "10.6.0.1:9400", device, caches=(talker,), undeclared=undeclared, activation=serving)
    blind = Engine(
        "blind",
        "tts-1",
        "10.6.0.2:9400",
        Device("GPU-q"),
        caches=(talker,),
        undeclared=undeclared,
        discovers=False,
        activation=serving,
    )
    description = (
        "{owner} in engine tts in pod llm/tts-0 (model omni, stage talker) has kept up to {size} of key/value "
        "cache that it does not declare (found by discovery) within the last hour, for 15 minutes. The memory "
        "is accounted for as "
        "explained but undeclared: capacity figures built on the declarations do not include it."
    )
    summary = "A module keeps a model-local KV cache it does not declare."
    url = "https://modelkv-exporter.invalid/docs/runbook.md#modelkvundeclaredcache"
    return Story(
        "story-f-undeclared-cache",
        """
        Caches that discovery finds in modules that declare nothing. Engine "tts"
        declares its talker cache (observed), serves with 1.5 GiB of activations (2 GiB profiled) and,
        from 30 minutes on, three modules keep caches they
        do not declare: "code2wav.decoder" 512 MiB, "vocoder.state" 300 MiB (found by two methods,
        one seeing 200 MiB) and "tokenizer.window" 48 MiB. Engine "blind" is the same model with
        discovery off.
        """,
        [
            Episode(
                """
                The operator expects ModelKVUndeclaredCache for "code2wav.decoder" and "vocoder.state"
                15 minutes after they appear, with the larger of the two figures, and not for
                "tokenizer.window" (under 64 MiB) nor for the declaring talker. The memory they hold is
                explained, so "tts" does not page as undeclared growth; "blind", where nothing finds
                those caches, does.
                """,
                [tts, blind],
                90,
                [
                    AlertTest(UNDECLARED_CACHE, 40),
                    AlertTest(
                        UNDECLARED_CACHE,
                        60,
                        tuple(
                            (
                                {**engine_labels(tts), "owner": owner, "severity": "warning"},
                                {
                                    "summary": summary,
                                    "description": description.format(owner=owner, size=size),
                                    "runbook_url": url,
                                },
                            )
                            for owner, size in (("code2wav.decoder", "512MiB"), ("vocoder.state", "300MiB"))
                        ),
                    ),
                    Quiet(UNDECLARED, 0, 90, 'engine="tts"'),
                    Firing(UNDECLARED, 60, (engine_labels(blind, **WARNING),)),
                ],
            )
        ],
    )


def _cpu_warm_up() -> Story:
    plain = Engine("cpu-plain", "cpu-3", "10.7.0.1:9400", None, started=0, heap=ramp(10, 15 * MIB, 30))
    leaking = Engine(
        "cpu-leaking",
        "cpu-4",
        "10.7.0.2:9400",
        None,
        started=0,
        heap=ramp(10, 15 * MIB, 30),
        leak=ramp(90, 5 * MIB),
    )
    return Story(
        "story-g-cpu-heap-after-warm-up",
        """
        A CPU engine that declares nothing. "cpu-plain" starts at minute 0, is ready at 10 and takes
        its baseline then; its first requests warm it up: Python's allocator and the tokenizer's caches
        settle 300 MiB of heap above the baseline by minute 30, and it never grows again. "cpu-leaking"
        warms up the same way and from 1 hour 30 minutes leaks 5 MiB a minute.
        """,
        [
            Episode(
                """
                The operator expects "cpu-plain" never to page: a heap that settled after warm-up and
                stays flat is not growth, whatever its size. "cpu-leaking" pages while its memory keeps
                growing: within 45 minutes of its leak starting, and for as long as it leaks.
                """,
                [plain, leaking],
                180,
                [
                    Quiet(UNDECLARED, 0, 180, 'engine="cpu-plain"'),
                    Firing(UNDECLARED, 120, ()),
                    Firing(UNDECLARED, 135, (engine_labels(leaking, **WARNING),)),
                    Firing(UNDECLARED, 180, (engine_labels(leaking, **WARNING),)),
                ],
            )
        ],
    )


def _scrape_gap() -> Story:
    leaker = Engine("leaker", "gap-0", "10.8.0.1:9400", Device("GPU-g"), paged_kv=30 * GIB, leak=ramp(20, 100 * MIB))
    hung = Engine("hung", "gap-0", "10.8.0.1:9400", Device("GPU-f"), hung_at=40)
    return Story(
        "story-h-scrape-gap",
        """
        A scrape gap. Two engines sit beside one sidecar: "leaker" leaks 100 MiB of live tensors a minute
        from 20 minutes on (beyond its 2 GiB activation allowance at 40 minutes), "hung" stops heartbeating at 40 minutes and stays hung. At 1 hour 30 minutes
        the sidecar restarts and Prometheus cannot scrape it for 7 minutes (up is 0, every series it
        returned goes stale); then it serves the same engines again.
        """,
        [
            Episode(
                """
                The operator expects one page for each problem: the undeclared growth of "leaker" and the
                stale snapshot of "hung" fire before the gap and keep firing through it and after it, never
                resolved and fired again. The gap itself is paged as the exporter being down, and that
                resolves once the sidecar is back.
                """,
                [leaker, hung],
                150,
                [
                    Firing(UNDECLARED, 65, (engine_labels(leaker, **WARNING),)),
                    Held(UNDECLARED, 65, 150, (engine_labels(leaker, **WARNING),)),
                    Held(STALE, 65, 150, (engine_labels(hung, **WARNING),)),
                    Firing(
                        EXPORTER_DOWN,
                        96,
                        (
                            {
                                "job": "modelkv-exporter",
                                "instance": leaker.instance,
                                "namespace": "llm",
                                "pod": leaker.pod,
                                **WARNING,
                            },
                        ),
                    ),
                    Quiet(EXPORTER_DOWN, 100, 150),
                ],
                gaps=(ScrapeGap(leaker.instance, 90, 97),),
            )
        ],
    )


def _small_slice() -> Story:
    slice_ = Device("GPU-mig-1g-20gb", total=20 * GIB)
    engine = Engine(
        "asr-small",
        "asr-mig-0",
        "10.9.0.1:9400",
        slice_,
        weights=5 * GIB,
        paged_kv=10 * GIB,
        context=GIB,
        profiled_activation_peak=2 * GIB + GIB // 2,
        activation=step(10, 2 * GIB),
        nvml=False,
        stage="asr",
        leak=ramp(32, 100 * MIB),
    )
    return Story(
        "story-i-small-slice-filling-fast",
        """
        A MIG 1g.20gb slice: 20 GiB, without NVML's per-process figures. Its one engine has run for
        hours with 16 GiB in use. At minute 10 its first long prompt leaves 2 GiB of activations in
        torch's cache (inside the 2.5 GiB vLLM profiled): 18 GiB in use (90 %), flat again. From minute
        32 it leaks 100 MiB of live tensors a minute: the slice is full just before minute 53.
        """,
        [
            Episode(
                """
                The operator expects no alert for the step at minute 10, which stays flat, and to be paged
                while there is still time to act: a critical alert that the slice will run out of memory,
                firing by minute 45, 8 minutes before it is full. The
                hourly prediction, which waits 15 minutes on a trend it sees late, cannot tell in time.
                """,
                [engine],
                52,
                [
                    Quiet(IMMINENT, 0, 38),
                    AlertTest(IMMINENT, 38),
                    AlertTest(
                        IMMINENT,
                        45,
                        (
                            (
                                device_labels(slice_, severity="critical"),
                                {
                                    "summary": "A device is filling fast enough to run out of memory within 30 minutes.",
                                    "description": (
                                        "Memory in use on device GPU-mig-1g-20gb, counting the declared caches of its "
                                        "engines at their peak, has risen throughout the last 10 minutes; at that rate "
                                        "it exceeds the device's total within 30 minutes, sooner than the hourly "
                                        "prediction could tell. Engines on the device: llm/asr-mig-0/asr-small."
                                    ),
                                    "runbook_url": IMMINENT_URL,
                                },
                            ),
                        ),
                    ),
                    Firing(IMMINENT, 52, (device_labels(slice_, severity="critical"),)),
                    Quiet(PREDICTED, 0, 46),
                ],
            )
        ],
    )


def _undeclared_bursts() -> Story:
    retriever = Undeclared("retriever.prefix_cache", bursts(6, 20, 3, 600 * MIB))
    engine = Engine(
        "rag",
        "rag-0",
        "10.10.0.1:9400",
        Device("GPU-r"),
        undeclared=(retriever,),
        activation=flat(GIB),
    )
    return Story(
        "story-j-undeclared-cache-in-bursts",
        """
        An undeclared cache used in bursts. In engine "rag", "retriever.prefix_cache" declares nothing
        and builds a 600 MiB key/value cache for a request about every 20 minutes (from minute 6),
        freeing it 3 minutes later. Discovery finds it each time; its lifetime peak shows 600 MiB from
        minute 6.
        """,
        [
            Episode(
                """
                The operator expects a ticket for "retriever.prefix_cache" within the hour: it keeps a cache
                it does not declare, even if only at times. Nothing else about "rag" needs attention.
                """,
                [engine],
                180,
                [
                    Firing(UNDECLARED_CACHE, 60, ({**engine_labels(engine), "owner": retriever.owner, **WARNING},)),
                    Firing(UNDECLARED_CACHE, 180, ({**engine_labels(engine), "owner": retriever.owner, **WARNING},)),
                    Quiet(UNDECLARED, 0, 180),
                ],
            )
        ],
    )


def _extensible_kv() -> Story:
    graphs = Engine(
        "v034-graphs",
        "llm-0",
        "10.11.0.1:9400",
        Device("GPU-k0"),
        started=0,
        paged_kv=50 * GIB,
        extensible=ExtensibleKV(62 * GIB),
    )
    eager = Engine(
        "v034-eager",
        "llm-1",
        "10.11.0.2:9400",
        Device("GPU-k1"),
        started=0,
        paged_kv=50 * GIB,
        extensible=ExtensibleKV(62 * GIB, warm_up=56 * GIB, eager=True),
    )
    sleeper = Engine(
        "v034-sleeper",
        "llm-2",
        "10.11.0.3:9400",
        Device("GPU-k2"),
        started=0,
        paged_kv=50 * GIB,
        extensible=ExtensibleKV(62 * GIB),
        sleeps=(Sleep(60, 90), Sleep(150, 155)),
        sleep_tags=SLEEP_TAGS_034,
    )
    leak = Engine(
        "v034-leak",
        "llm-3",
        "10.11.0.4:9400",
        Device("GPU-k3"),
        started=0,
        paged_kv=50 * GIB,
        extensible=ExtensibleKV(62 * GIB),
        leak=ramp(60, 3 * GIB // 20, 130),
    )
    old_hook = Engine(
        "v034-old-hook",
        "llm-4",
        "10.11.0.5:9400",
        Device("GPU-k4"),
        started=0,
        paged_kv=50 * GIB,
        extensible=ExtensibleKV(62 * GIB, baseline_at_warm_up=True),
    )
    committed = "modelkv_memory_paged_kv_committed_bytes"
    return Story(
        "story-k-vllm-034-extensible-kv-cache",
        """
        vLLM 0.34 maps the paged KV cache outside torch and commits it in steps. Five engines start at
        minute 0, each alone on an 80 GiB device with 16 GiB of weights, and are ready at minute 10.
        Each reserves 62 GiB of address space for its KV cache at minute 6 and commits the null block;
        warm-up commits 8 GiB at minutes 7 and 8. "v034-graphs" gives them back before it captures
        CUDA graphs, and the final extend commits 50 GiB at minute 10. "v034-eager" runs without
        graphs: its warm-up commits 56 GiB and keeps them, and the final extend shrinks them to 50 GiB.
        "v034-sleeper" sleeps (level 1) from minute 60 to 90 and from 150 to 155: the sleep allocator
        unmaps its 16 GiB of weights and its cache releases its 50 GiB, and both come back when it wakes.
        "v034-leak" leaks 0.15 GiB of live tensors a minute from minute 60 to 130 and keeps them. The KV
        cache shows in NVML's figure and the device's, never in torch's.
        """,
        [
            Episode(
                """
                The operator expects no undeclared-growth page for the start-up, the shrink or the
                sleeps: the hook takes its baseline after the final commit, so the 50 GiB the cache
                commits then are not growth, and a cache released while asleep is less memory, not
                more. The leak still pages, from its first few hundred MiB of live tensors above their
                floor after initialisation, within 35 minutes of its start. The committed
                bytes read 50 GiB when awake and 0 asleep; the reservation reads 62 GiB throughout.
                Neither a start-up nor a wake-up predicts exhaustion; the leaking engine's device is
                left to the exhaustion stories.
                """,
                [graphs, eager, sleeper, leak],
                240,
                [
                    Quiet(UNDECLARED, 0, 240, 'engine=~"v034-graphs|v034-eager|v034-sleeper"'),
                    Quiet(UNDECLARED, 0, 60, 'engine="v034-leak"'),
                    Firing(UNDECLARED, 95, (engine_labels(leak, **WARNING),)),
                    Firing(UNDECLARED, 240, (engine_labels(leak, **WARNING),)),
                    Quiet(PREDICTED, 0, 240, 'device=~"GPU-k0|GPU-k1|GPU-k2"'),
                    Quiet(IMMINENT, 0, 240, 'device=~"GPU-k0|GPU-k1|GPU-k2"'),
                    Value(
                        f'{committed}{{engine=~"v034-(graphs|eager|sleeper)"}}',
                        30,
                        _each(committed, 50 * GIB, graphs, eager, sleeper),
                    ),
                    Value(f'{committed}{{engine="v034-sleeper"}}', 70, _each(committed, 0, sleeper)),
                    Value(f'{committed}{{engine="v034-sleeper"}}', 100, _each(committed, 50 * GIB, sleeper)),
                    Value(
                        'modelkv_engine_paged_kv_reserved_bytes{engine="v034-sleeper"}',
                        70,
                        _each("modelkv_engine_paged_kv_reserved_bytes", 62 * GIB, sleeper),
                    ),
                ],
            ),
            Episode(
                """
                The hook as it was before vLLM 0.34 took its baseline at the end of warm-up, before the
                final commit. With that hook the operator expects the wrong page this change removes:
                the 50 GiB committed at minute 10 count as growth outside torch, and the engine pages 15
                minutes after it is ready though nothing leaks.
                """,
                [old_hook],
                60,
                [
                    Quiet(UNDECLARED, 0, 24),
                    Firing(UNDECLARED, 30, (engine_labels(old_hook, **WARNING),)),
                ],
            ),
        ],
    )


def _data_parallel() -> Story:
    leak_per_minute = GIB // 10
    replicas = [
        Engine(
            engine_id_for({"served_model_name": "qwen3-8b", "dp_index": index, "tp_rank": 0, "pp_rank": 0}, None),
            "llm-dp-0",
            "10.12.0.1:9400",
            Device(f"GPU-l{index}"),
            model="qwen3-8b",
            stage="",
            architecture="Qwen3ForCausalLM",
            dp_index=index,
            paged_kv=40 * GIB,
            graphs=GIB,
            activation=flat(2 * GIB),
            leak=ramp(60, leak_per_minute, 180) if index == 2 else flat(),
        )
        for index in range(4)
    ]
    leaking = replicas[2]
    assert leaking.device is not None
    pod = 'pod="llm-dp-0"'
    return Story(
        "story-l-data-parallel-replicas",
        """
        Data-parallel replicas of a dense model on one node: `vllm serve qwen3-8b --data-parallel-size 4`
        runs four engine processes in one pod, beside one sidecar, each alone on a GPU of its own (16
        GiB of weights, 40 GiB of paged KV cache, 1 GiB of CUDA graphs, its 2 GiB activation allowance in
        use). vLLM sets data_parallel_rank to 0 in every replica of a dense model; each replica's hook
        names it by its data_parallel_index, qwen3-8b-dp0-tp0-pp0 to qwen3-8b-dp3-tp0-pp0. Replica dp2
        leaks 0.1 GiB of live tensors a minute from 1 hour to 3 hours, and keeps the 12 GiB.
        """,
        [
            Episode(
                """
                The operator expects every replica exported, each with its own device and its own
                figures: four engines in the pod, one per GPU, none overwriting another's file or
                baseline. The leak pages for dp2 alone, as undeclared memory growth within 20 minutes
                of its start and for as long as it holds the memory, and dp2's device alone is
                predicted to fill (a warning, while it leaks, resolved within 20 minutes after it
                stops). The other replicas and their devices never page.
                """,
                replicas,
                240,
                [
                    Value(f"count(modelkv_engine_info{{{pod}}})", 30, (("{}", 4),)),
                    Value(
                        f"count by (device) (modelkv_engine:device:info{{{pod}}})",
                        30,
                        tuple((f'{{device="{e.device.uuid}"}}', 1) for e in replicas if e.device is not None),
                    ),
                    Value(
                        f"modelkv_memory_process_gpu_bytes{{{pod}}} - ignoring (engine) group_left () "
                        f'modelkv_memory_process_gpu_bytes{{engine="{replicas[0].engine_id}"}}',
                        150,
                        tuple(
                            (
                                selector("", tuple(sorted(engine_labels(e).items()))),
                                90 * leak_per_minute if e is leaking else 0,
                            )
                            for e in replicas
                        ),
                    ),
                    Quiet(UNDECLARED, 0, 240, f'engine!="{leaking.engine_id}"'),
                    Quiet(UNDECLARED, 0, 70),
                    Firing(UNDECLARED, 80, (engine_labels(leaking, **WARNING),)),
                    Held(UNDECLARED, 80, 240, (engine_labels(leaking, **WARNING),)),
                    Quiet(PREDICTED, 0, 240, f'device!="{leaking.device.uuid}"'),
                    Firing(PREDICTED, 150, (device_labels(leaking.device, **WARNING),)),
                    Quiet(PREDICTED, 200, 240),
                    Quiet(IMMINENT, 0, 240),
                    Quiet(STALE, 0, 240),
                ],
            )
        ],
    )


SLEEPS = tuple(Sleep(start, start + 30, 1 if n % 2 == 0 else 2) for n, start in enumerate(range(30, 360, 60)))
"""Half an hour asleep every hour from minute 30, at level 1 and 2 in turn."""


def _sleep_cycles() -> Story:
    def trainer(freed: int) -> Curve:
        """The trainer's 4 GiB, and while the engine sleeps what it released and 13 GiB more."""
        return plus(flat(4 * GIB), lambda t: freed + 13 * GIB if any(s.covers(t) for s in SLEEPS) else 0)

    rollout = Engine(
        "rollout-030",
        "rl-rollout-030",
        "10.13.0.1:9400",
        Device("GPU-m0", others=trainer(16 * GIB + 40 * GIB)),
        model="omni-rl",
        stage="thinker",
        paged_kv=40 * GIB,
        graphs=GIB,
        activation=flat(2 * GIB),
        caches=(Cache("thinker", "thinker_kv", 512 * MIB, held=flat(GIB)),),
        sleeps=SLEEPS,
    )
    v034 = replace(
        rollout,
        engine_id="rollout-034",
        pod="rl-rollout-034",
        instance="10.13.0.2:9400",
        device=Device("GPU-m1", others=trainer(16 * GIB + 40 * GIB + GIB + GIB // 2)),
        extensible=ExtensibleKV(62 * GIB),
        sleep_tags=SLEEP_TAGS_034,
        runtime_buffers=GIB // 2,
    )
    blind = replace(
        rollout,
        engine_id="rollout-no-nvml",
        pod="rl-rollout-no-nvml",
        instance="10.13.0.3:9400",
        device=Device("GPU-m2", others=trainer(16 * GIB + 40 * GIB)),
        nvml=False,
    )
    engines = [rollout, v034, blind]
    breakdown = f'{BREAKDOWN}{{engine="rollout-030",component=~"weights|paged_kv|unexplained"}}'
    return Story(
        "story-m-rl-sleep-cycles",
        """
        Reinforcement learning beside vLLM's sleep mode. On each of three 80 GiB devices a rollout
        engine (16 GiB of weights, 40 GiB of paged KV cache, 1 GiB of CUDA graphs, its 2 GiB
        activation allowance in use, a declared 4 GiB cache holding 1 GiB) shares the card with a
        trainer that holds 4 GiB. The engines generate for half an hour and sleep for half an hour
        while the trainer trains, six times: at level 1 (weights backed up to host memory) and level 2
        (weights discarded) in turn. The sleep allocator unmaps the weights and the KV cache (vLLM
        0.34: the graph pools and its runtime buffers too, and the extensible cache releases its
        pages): NVML's figure for the engine drops by 56 GiB (57.5 GiB on vLLM 0.34), torch's figures
        do not move.
        The trainer takes what the engine released and 13 GiB more of the card's free memory, leaving
        2 GiB free, and gives it all back before the engine wakes. "rollout-030" runs vLLM 0.30 to
        0.33, "rollout-034" vLLM 0.34 with its extensible KV cache, "rollout-no-nvml" is the first
        without NVML's per-process figures (the usual container).
        """,
        [
            Episode(
                """
                The operator expects no page while an engine sleeps or when it wakes: no undeclared
                memory growth (what the trainer borrows is not the engine's, and the engine's NVML
                figure only dropped), no over-commit (a sleeping engine's caches cannot grow, and the
                trainer gives the memory back before the engine wakes), no stale snapshot (the hook
                beats through its sleep), no exhaustion prediction (the card's memory goes up and down
                with each cycle, a step each time, no trend). The sleep level reads 1 and 2 in turn, 0
                awake; while "rollout-030" sleeps its weights and KV cache parts read 0 (on vLLM 0.34 its
                graphs too, and its runtime is its CUDA context alone) and nothing is unexplained; the
                device's used memory is the engine's remaining 5 GiB and the trainer's 73 GiB.
                """,
                engines,
                360,
                [
                    Quiet(UNDECLARED, 0, 360),
                    Quiet(WILL_NOT_FIT, 0, 360),
                    Quiet(STALE, 0, 360),
                    Quiet(PREDICTED, 0, 360),
                    Quiet(IMMINENT, 0, 360),
                    Value(
                        'modelkv_engine_sleep_level{namespace="llm"}',
                        45,
                        _each("modelkv_engine_sleep_level", 1, *engines),
                    ),
                    Value(
                        'modelkv_engine_sleep_level{namespace="llm"}',
                        105,
                        _each("modelkv_engine_sleep_level", 2, *engines),
                    ),
                    Value(
                        'modelkv_engine_sleep_level{namespace="llm"}',
                        75,
                        _each("modelkv_engine_sleep_level", 0, *engines),
                    ),
                    Value(breakdown, 45, _parts(rollout, weights=0, paged_kv=0, unexplained=0)),
                    Value(breakdown, 75, _parts(rollout, weights=16 * GIB, paged_kv=40 * GIB, unexplained=0)),
                    Value(
                        f'{BREAKDOWN}{{engine="rollout-034",component=~"runtime|paged_kv|cuda_graphs|unexplained"}}',
                        105,
                        _parts(v034, runtime=GIB, paged_kv=0, cuda_graphs=0, unexplained=0),
                    ),
                    Value(
                        'modelkv_engine:device_used_bytes:max{device="GPU-m0"}',
                        45,
                        (('modelkv_engine:device_used_bytes:max{device="GPU-m0",device_key="GPU-m0"}', 78 * GIB),),
                    ),
                    Value(
                        'modelkv_memory_process_gpu_bytes{engine="rollout-030"}',
                        45,
                        _each("modelkv_memory_process_gpu_bytes", 5 * GIB, rollout),
                    ),
                ],
            )
        ],
    )


def _neighbour_during_capture() -> Story:
    declared = Cache("talker", "talker_kv", 768 * MIB, held=flat(GIB))

    def engine(name: str, host: str, device: Device, nvml: bool) -> Engine:
        return Engine(
            name,
            f"tts-{name}",
            host,
            device,
            started=0,
            paged_kv=40 * GIB,
            graphs=2 * GIB,
            activation=flat(2 * GIB),
            caches=(declared,),
            nvml=nvml,
        )

    roomy = Device("GPU-n0", others=plus(step(9, 12 * GIB), step(120, 2 * GIB)))
    tight = Device("GPU-n1", others=step(9, 16 * GIB))
    with_nvml = engine("capture-nvml", "10.14.0.1:9400", roomy, True)
    without = engine("capture-no-nvml", "10.14.0.2:9400", tight, False)
    parts = f'{BREAKDOWN}{{engine="capture-nvml",component=~"cuda_graphs|unexplained"}}'
    return Story(
        "story-n-neighbour-during-capture",
        """
        A neighbour allocating while an engine captures its CUDA graphs. Two engines start at minute 0
        on 80 GiB devices they share with processes that publish nothing, and are ready at minute 10:
        16 GiB of weights, 40 GiB of paged KV cache, 2 GiB of CUDA graphs captured in minute 9, their
        2 GiB activation allowance in use from then on, a declared 6 GiB talker cache holding 1 GiB. In
        minute 9, during the capture, a neighbour takes 12 GiB of GPU-n0 and another 16 GiB of GPU-n1:
        the devices' used memory jumps by the graphs and the neighbour at once (the drop in free memory
        that vLLM's capture_model returns is 14 and 18 GiB). At 2 hours GPU-n0's neighbour takes 2 GiB
        more. "capture-nvml" has NVML's per-process figures,
        "capture-no-nvml" has not.
        """,
        [
            Episode(
                """
                The operator expects no page for either engine: its graphs are the 2 GiB torch's pools
                hold, not the neighbour's bytes, and its baseline comes after the capture; its parts
                stay exact (cuda_graphs 2 GiB, nothing unexplained). The shared-device alerts see the
                neighbour as they see any: GPU-n1 keeps 2 GiB free for 5 GiB of declared cache still
                to allocate, so it pages as over-committed 5 minutes after the engine is ready and
                keeps paging; GPU-n0 fits (6 GiB free) until its neighbour takes 2 GiB more, and pages
                5 minutes after. No exhaustion is predicted: the start-up is no trend, nor is a step.
                """,
                [with_nvml, without],
                240,
                [
                    Quiet(UNDECLARED, 0, 240),
                    Quiet(PREDICTED, 0, 240),
                    Quiet(IMMINENT, 0, 240),
                    Firing(WILL_NOT_FIT, 20, (device_labels(tight, **WARNING),)),
                    Held(WILL_NOT_FIT, 20, 240, (device_labels(tight, **WARNING),), 'device="GPU-n1"'),
                    Quiet(WILL_NOT_FIT, 0, 120, 'device="GPU-n0"'),
                    Firing(WILL_NOT_FIT, 126, (device_labels(roomy, **WARNING), device_labels(tight, **WARNING))),
                    Held(WILL_NOT_FIT, 126, 240, (device_labels(roomy, **WARNING),), 'device="GPU-n0"'),
                    Value(parts, 30, _parts(with_nvml, cuda_graphs=2 * GIB, unexplained=0)),
                    Value(
                        f'{BREAKDOWN}{{engine="capture-no-nvml",component="cuda_graphs"}}',
                        30,
                        _parts(without, cuda_graphs=2 * GIB),
                    ),
                ],
            )
        ],
    )


def _restart_in_place() -> Story:
    declared = Cache("talker", "talker_kv", 512 * MIB, held=plus(flat(GIB), step(60, 2 * GIB)))
    under = Cache("talker", "talker_kv", 128 * MIB, held=declared.held)
    with_nvml = Engine(
        "restart-nvml", "omni-r0", "10.15.0.1:9400", Device("GPU-o0"), caches=(declared,), restarted_at=180
    )
    without = Engine(
        "restart-no-nvml",
        "omni-r1",
        "10.15.0.2:9400",
        Device("GPU-o1"),
        caches=(declared,),
        nvml=False,
        restarted_at=180,
    )
    cpu = Engine("restart-cpu", "omni-r2", "10.15.0.3:9400", None, caches=(under,), restarted_at=180)
    undeclared = 'max_over_time(modelkv_engine:undeclared_memory_bytes{engine=~"restart-.+"}[40m]) > 0'
    return Story(
        "story-o-restart-in-place",
        """
        Engines restarting in place: at 3 hours each engine's container crashes and is restarted
        at once, in the same pod (the spool keeps its file; the new process publishes under the
        same id from its first minute, loads for 10 minutes and takes a new baseline). Each
        engine's talker cache holds 1 GiB, and 3 GiB from 1 hour on, in either process.
        "restart-nvml" and "restart-no-nvml" (alone on its device, without NVML's per-process
        figures) declare 4 GiB; the CPU engine "restart-cpu" declares 1 GiB, less than its cache
        holds. The rule groups may evaluate in any order: at the restart, a group that read the
        leak signal of another would read the old process's growth against the new process's
        caches.
        """,
        [
            Episode(
                """
                The operator expects no undeclared memory for any engine, before, during or after the
                restart: the figure stays at 0 (what the old process grew by is its caches, and the new
                process starts from a new baseline), and ModelKVUndeclaredMemoryGrowth never fires.
                "restart-cpu" is paged for its declaration, which under-reports from 1 hour on, in the
                old process and in the new one.
                """,
                [with_nvml, without, cpu],
                300,
                [
                    Quiet(UNDECLARED, 0, 300),
                    Value(undeclared, 175, ()),
                    Value(undeclared, 215, ()),
                    Value(undeclared, 300, ()),
                    Firing(UNDER_REPORTS, 100, (engine_labels(cpu, owner="talker", **WARNING),)),
                    Firing(UNDER_REPORTS, 300, (engine_labels(cpu, owner="talker", **WARNING),)),
                ],
            )
        ],
    )


def _parts(engine: Engine, **components: float) -> tuple[tuple[str, float], ...]:
    """The samples of the engine's breakdown parts ``components``, each at its value."""
    return tuple(
        (selector(BREAKDOWN, tuple(sorted({**engine_labels(engine), "component": c}.items()))), value)
        for c, value in components.items()
    )


def _each(name: str, value: float, *engines: Engine) -> tuple[tuple[str, float], ...]:
    """The samples of the engine-level series ``name`` of ``engines``, each at ``value``."""
    return tuple((selector(name, tuple(sorted(engine_labels(engine).items()))), value) for engine in engines)


STORIES = [
    _steps(),
    _cpu(),
    _overcommit(),
    _hung_neighbour(),
    _stale_and_young(),
    _undeclared_cache(),
    _cpu_warm_up(),
    _scrape_gap(),
    _small_slice(),
    _undeclared_bursts(),
    _extensible_kv(),
    _data_parallel(),
    _sleep_cycles(),
    _neighbour_during_capture(),
    _restart_in_place(),
    *ONCALL_STORIES,
    *POSTMORTEM_STORIES,
    *LEAK_STORIES,
]
"""Every story, in the order their files sort."""
