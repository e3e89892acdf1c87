"""The landing page and ``inspect`` judge an engine's growth since baseline (issue 48): by part, with the alert it
would raise, from the snapshots of the leak stories' simulated engines."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.sidecar.attention import NEXT_STEPS, Concern, findings
from modelkv_exporter.sidecar.presentation.page import render_page
from modelkv_exporter.sidecar.reader.scan import SpoolReader
from modelkv_exporter.sidecar.reader.state import EngineState, classify
from modelkv_testbed.simulation.physics import simulate
from modelkv_testbed.simulation.render import snapshot
from modelkv_testbed.simulation.stories import STORIES

EPOCH = 1_800_000_000.0
"""Story minute 0 as a time a snapshot may carry (the stories' engines start before it)."""


def story_snapshot(story: str, engine_id: str, minute: int) -> Snapshot:
    episode = next(s for s in STORIES if s.name == story).episodes[0]
    engine = next(e for e in episode.engines if e.engine_id == engine_id)
    timeline = simulate(episode.engines, minute)
    sample = timeline.samples[engine.key][minute]
    assert sample is not None
    found = snapshot(engine, sample, minute)
    return replace(found, started_at=found.started_at + EPOCH, heartbeat_at=found.heartbeat_at + EPOCH)


def page(spool: Path, *snapshots: Snapshot) -> str:
    for found in snapshots:
        write_snapshot(spool, found)
    now = max(s.heartbeat_at for s in snapshots) + 1
    return render_page(classify(SpoolReader(spool).scan(), now, 30.0, 0.0), spool_dir=str(spool), version="0",
                          max_discovered=16)  # fmt: skip


def growth_rows(html: str) -> dict[str, list[str]]:
    table = html.split('<h3 id="growth">', 1)[1].split("</table>", 1)[0]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", table)]
    return {re.sub(r"<[^>]+>", "", row[0]): row[1:] for row in rows if row}


def test_a_slow_leak_is_a_finding_with_its_parts_and_the_alert_it_raises(tmp_path: Path) -> None:
    leaking = story_snapshot("story-leaks-slow-leak-from-the-floor", "slow-leak", 80)
    html = page(tmp_path, leaking)
    attention = html.split("<nav>", 1)[0]
    assert "unexplained growth" in attention and "ModelKVUndeclaredMemoryGrowth" in attention
    assert "lasts 15 minutes" in attention
    assert "since baseline that neither the memory profile nor the caches explain" in attention
    live, outside, resident, explained, unexplained, alert = growth_rows(html)["slow-leak"]
    assert live == "+470.0 MiB", "the floor a minute ago: 94 minutes of 5 MiB"
    assert outside == "+0 B" and resident == "—" and explained == "0 B" and unexplained == "470.0 MiB"
    assert alert == "ModelKVUndeclaredMemoryGrowth, once this lasts 15 minutes"


def test_a_busy_engine_after_its_rush_and_an_older_hook_inside_its_activation_allowance_need_nothing(
    tmp_path: Path,
) -> None:
    busy = story_snapshot("story-leaks-busy-engine-and-a-stopped-leak", "busy", 95)
    older = story_snapshot("story-leaks-slow-leak-from-the-floor", "slow-leak-old-hook", 95)
    html = page(tmp_path, busy, older)
    assert "Nothing: 2 engines ok" in html
    rows = growth_rows(html)
    assert rows["busy"][0] == "+64.0 MiB", "the buffers its first requests made and kept"
    assert rows["busy"][-1] == "none" and rows["slow-leak-old-hook"][-1] == "none"
    assert rows["slow-leak-old-hook"][0].startswith("−"), (
        "the high-water figure: the leak hidden in the activation allowance"
    )


def test_inspect_and_the_page_say_the_growth_finding_in_one_wording(tmp_path: Path) -> None:
    stopped = story_snapshot("story-leaks-busy-engine-and-a-stopped-leak", "stopped-leak", 200)
    (finding,) = findings(stopped, EngineState.EXPORTED, stopped.heartbeat_at + 1)
    assert finding.concern is Concern.GROWTH and finding.step is NEXT_STEPS[Concern.GROWTH]
    assert finding.step.alert == "ModelKVUndeclaredMemoryGrowth" and finding.step.command == "inspect"
    assert finding.detail.startswith("1.2 GiB since baseline")
    assert findings(stopped, EngineState.STALE, stopped.heartbeat_at + 60)[0].concern is Concern.STALE
    assert len(findings(stopped, EngineState.STALE, stopped.heartbeat_at + 60)) == 1, "a stale engine is not judged"
