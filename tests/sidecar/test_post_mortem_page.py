"""The page, ``inspect`` and ``/api/v1/engines`` lead with an engine that died: why, when, the error, what grew by
part (the part that grew most first), its memory by part then, torch's free reserved bytes and largest segments."""

from __future__ import annotations

import json
from pathlib import Path

from modelkv_exporter.cli.reports import inspect_report
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.sidecar.attention import Concern, Status, findings, status
from modelkv_exporter.sidecar.presentation.page import render_page
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_exporter.sidecar.reader.state import EngineState, SpoolView
from modelkv_exporter.sidecar.source import SpoolSource
from modelkv_testbed.snapshots import ended, make_snapshot
from tests.support.engines_document import engines_document

NOW = 1_800_000_000.0
GIB = 1 << 30
MIB = 1 << 20
BASE = {"torch_allocated": 10 * GIB, "torch_reserved": 11 * GIB, "process_gpu": 12 * GIB}
LEAKED = {"torch_allocated": 16 * GIB, "torch_reserved": 17 * GIB, "process_gpu": 18 * GIB + 256 * MIB}
ERROR = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def spool_view(spool: Path) -> SpoolView:
    """A fresh engine with a problem of its own, one that died of OOM after a leak, one killed, one shut down."""
    leaked = make_snapshot("oom", heartbeat_at=NOW - 5, interval=5.0, measured=dict(LEAKED), baseline=dict(BASE))
    segments = ((4 * GIB, 4 * GIB), (2 * GIB, GIB), (GIB, 0), (GIB, 0), (GIB, 0))
    write_snapshot(spool, ended(leaked, error=ERROR, reserved_free_bytes=GIB, segments=segments))
    write_snapshot(spool, ended(make_snapshot("clean", heartbeat_at=NOW - 5, interval=5.0), "shutdown"))
    write_snapshot(spool, make_snapshot("alive", heartbeat_at=NOW, interval=5.0, measured=dict(LEAKED),
                                        baseline=dict(BASE)))  # fmt: skip
    write_snapshot(spool, make_snapshot("killed", heartbeat_at=NOW - 100, interval=5.0, measured=dict(LEAKED),
                                        baseline=dict(BASE)))  # fmt: skip
    (spool / "killed.alive").write_bytes(b"")
    return SpoolSource(SpoolReader(spool), clock=lambda: NOW).view()


def test_the_died_and_the_vanished_engines_lead_with_their_post_mortem(spool: Path) -> None:
    view = spool_view(spool)
    states = {i.snapshot.engine.engine_id: i.state for i in view.entries}
    assert states == {"oom": EngineState.ENDED, "clean": EngineState.ENDED, "alive": EngineState.EXPORTED,
                      "killed": EngineState.VANISHED}  # fmt: skip
    by_id = {i.snapshot.engine.engine_id: i for i in view.entries}
    oom = findings(by_id["oom"].snapshot, EngineState.ENDED, NOW)
    assert [f.concern for f in oom] == [Concern.DIED]
    assert "ended out_of_memory" in oom[0].detail and "live_tensors grew" in oom[0].detail
    assert oom[0].step.alert == "ModelKVEngineOutOfMemory"
    assert status(EngineState.ENDED, oom) is Status.DIED
    killed = findings(by_id["killed"].snapshot, EngineState.VANISHED, NOW)
    assert [f.concern for f in killed] == [Concern.VANISHED], "vanished replaces stale; its growth is not judged"
    assert findings(by_id["clean"].snapshot, EngineState.ENDED, NOW) == []

    page = render_page(view, spool_dir="spool", version="v", max_discovered=16)
    attention = page[page.index('id="attention"') : page.index("<nav>")]
    killed_at, oom_at, alive_at = (attention.index(f'id="attention-{e}"') for e in ("killed", "oom", "alive"))
    assert killed_at < oom_at < alive_at, "the engines that died come first (in file order), then the others"
    assert "attention-clean" not in attention
    oom_article = attention[oom_at:alive_at]
    assert oom_article.index("Post-mortem") < oom_article.index('class="finding"')
    for words in ("out_of_memory", ERROR, "live_tensors +6.0 GiB since baseline", "torch reserved, free",
                  "4.0 GiB (4.0 GiB in use)", "and 1 more", "memory by part of process_gpu 18.2 GiB",
                  "ModelKVEngineOutOfMemory"):  # fmt: skip
        assert words in oom_article, words
    assert "last heartbeat" in attention[killed_at:oom_at]
    assert 'id="engine-oom"' in page, "the link from the post-mortem has its target"

    report = inspect_report(view, 120, "SPOOL")
    summary = report[: report.index("\n\n")]
    assert summary.index("killed (m, vanished): vanished") < summary.index("oom (m, ended): died")
    assert summary.index("oom (m, ended)") < summary.index("alive (m, exported)"), (
        "died first, though 'alive' sorts first"
    )
    section = report[report.index("engine oom [ended]") :]
    assert section.splitlines()[1] == "post-mortem:"
    assert "  grew most: live_tensors +6.0 GiB since baseline" in section

    document = json.loads(json.dumps(engines_document(view, "spool", 16)))
    engines = {e["snapshot"]["engine"]["engine_id"]: e for e in document["engines"]}
    assert engines["oom"]["snapshot"]["end"]["reason"] == "out_of_memory"
    declared = by_id["oom"].snapshot.declared_peak_bytes
    assert engines["oom"]["post_mortem"]["grew_most"] == {"part": "live_tensors", "bytes": 6 * GIB - declared}
    assert engines["oom"]["post_mortem"]["growth_by_part"]["model_local_caches"] == declared
    assert engines["oom"]["post_mortem"]["reserved_free_bytes"] == GIB
    assert engines["killed"]["post_mortem"]["reason"] == "vanished"
    assert engines["killed"]["state"] == "vanished"
    assert "post_mortem" not in engines["clean"] and "post_mortem" not in engines["alive"]
