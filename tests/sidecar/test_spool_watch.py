"""serve says so in its log, at start and while it lasts, when the spool directory is missing, a file or unlistable."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelkv_exporter.sidecar.http import spool_watch
from modelkv_exporter.sidecar.http.sidecar_config import SidecarConfig
from modelkv_testbed.polling import eventually
from modelkv_testbed.processes import serving_in_thread, start_sidecar, stop_process


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_serve_warns_at_start_naming_the_directory(tmp_path: Path, kind: str) -> None:
    spool = tmp_path / "spool"
    if kind == "file":
        spool.write_text("not a directory")
    sidecar = start_sidecar(spool)  # --log-level warning, as the Kubernetes manifest runs it
    try:
        assert sidecar.get("/healthz").status_code == 200, "a wrong spool never stops the sidecar"
        assert sidecar.get("/readyz").status_code == 503
    finally:
        stop_process(sidecar.process)
    output = sidecar.output()
    problem = "does not exist" if kind == "missing" else "is not a directory"
    assert f"WARNING modelkv_exporter.sidecar: spool directory {spool} {problem}" in output, output
    assert "--spool-dir / MODELKV_SPOOL_DIR" in output


def test_serve_says_nothing_about_a_good_spool(spool: Path) -> None:
    sidecar = start_sidecar(spool)
    try:
        assert sidecar.get("/readyz").status_code == 200
    finally:
        stop_process(sidecar.process)
    assert "spool directory" not in sidecar.output()


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """Every check the watch makes, with its result (the real check, counted)."""
    seen: list[str | None] = []
    real = spool_watch.spool_problem

    def counted(directory: Path) -> str | None:
        seen.append(real(directory))
        return seen[-1]

    monkeypatch.setattr(spool_watch, "spool_problem", counted)
    return seen


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Path]:
    """A real uvicorn server in this process over a missing spool, checked every 20 ms."""
    spool = tmp_path / "spool"
    with serving_in_thread(SidecarConfig(spool, spool_check_interval=0.02)):
        yield spool


def test_the_warning_repeats_while_the_problem_lasts_and_stops_after(
    checks: list[str | None], served: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="modelkv_exporter.sidecar")

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "modelkv_exporter.sidecar"]

    eventually(lambda: len(warnings()) >= 3, "three warnings while the spool is missing")
    assert all(f"spool directory {served} does not exist" in w for w in warnings())

    served.mkdir()
    eventually(lambda: any("is readable now" in w for w in warnings()), "the all-clear")
    after = len(warnings())
    healthy = len(checks)
    eventually(lambda: len(checks) >= healthy + 5, "five more checks")
    assert len(warnings()) == after, "no warning while the spool is fine"
    assert checks[-1] is None

    served.rmdir()
    served.write_text("")
    eventually(lambda: any("is not a directory" in w for w in warnings()), "a warning when it breaks again")
