"""The usage examples in the README and docs/engine-hook.md, run as written against a real sidecar."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from modelkv_exporter import publish
from modelkv_exporter.demo.engines import DEMO_ENGINES, build_model
from modelkv_exporter.demo.owners import DemoOwner
from modelkv_exporter.engine.observe import Observer
from modelkv_testbed import ROOT
from modelkv_testbed.exposition import Exposition
from modelkv_testbed.processes import Sidecar

DOC_SPOOL = "/var/run/modelkv"
CODE2WAV = next(engine for engine in DEMO_ENGINES if engine.owners)
"""A demo engine whose model declares caches (real transformers caches)."""


def python_block(path: Path, after: str) -> str:
    """The first ```python block after ``after`` in ``path``, dedented."""
    text = path.read_text()
    assert after in text, f"{path.name} lost the marker {after!r}"
    match = re.search(r"```python\n(.*?)```", text.split(after, 1)[1], re.DOTALL)
    assert match, f"no python block after {after!r} in {path.name}"
    lines = match.group(1).splitlines()
    indent = min(len(line) - len(line.lstrip()) for line in lines if line.strip())
    return "\n".join(line[indent:] for line in lines)


def metrics(sidecar: Sidecar) -> Exposition:
    return Exposition(sidecar.get("/metrics").text)


def test_the_snapshot_publisher_example_keeps_an_engine_live_then_ends_it(sidecar: Sidecar) -> None:
    code = python_block(ROOT / "docs" / "engine-hook.md", "<!-- example: snapshot-publisher")
    assert DOC_SPOOL in code
    seen: dict[str, object] = {}

    def serve(model: torch.nn.Module) -> None:
        """The serving loop: while it runs, the engine is exported with its baseline and heartbeat."""
        document = json.loads((sidecar.spool_dir / "talker-0.json").read_text())
        seen["document"] = document
        seen["during"] = metrics(sidecar)
        owners = [m for m in model.modules() if isinstance(m, DemoOwner)]
        for owner in owners:
            owner.allocate(2)
        seen["held"] = sum(sum(owner.held_bytes().values()) for owner in owners)
        seen["observed"] = namespace["observer"].sample()

    namespace: dict[str, object] = {
        "load_model": lambda: build_model(CODE2WAV),
        "device": torch.device("cpu"),
        "serve": serve,
    }
    try:
        exec(compile(code.replace(DOC_SPOOL, str(sidecar.spool_dir)), "docs/engine-hook.md", "exec"), namespace)
    finally:
        observer = namespace.get("observer")
        if isinstance(observer, Observer):
            observer.uninstall()
    (observation,) = seen["observed"]  # type: ignore[misc]
    assert observation.available and observation.peak_bytes == seen["held"] > 0, "the owner's caches, observed"

    document = seen["document"]
    assert isinstance(document, dict)
    assert document["heartbeat_interval_seconds"] == 5.0 and not document["ended"]
    assert document["measured"]["baseline"]["values"]["process_resident"] > 0
    during = seen["during"]
    assert isinstance(during, Exposition)
    assert during.value("modelkv_engine_up", engine="talker-0", model="qwen3-tts", stage="talker") == 1
    assert (during.value("modelkv_memory_process_resident_baseline_bytes", engine="talker-0") or 0) > 0
    assert during.all("modelkv_declared_peak_bytes", engine="talker-0")

    assert json.loads((sidecar.spool_dir / "talker-0.json").read_text())["ended"]
    after = metrics(sidecar)
    assert not after.all("modelkv_engine_up", engine="talker-0"), "an ended engine is no longer exported"


def test_the_readme_publish_example_publishes_a_one_shot_snapshot(sidecar: Sidecar) -> None:
    code = python_block(ROOT / "README.md", "**Any other engine, or a test**")
    exec(
        compile(code.replace(DOC_SPOOL, str(sidecar.spool_dir)), "README.md", "exec"),
        {"model": build_model(CODE2WAV)},
    )
    exposition = metrics(sidecar)
    assert exposition.value("modelkv_engine_up", engine="talker-0", model="qwen3-tts", stage="talker") == 1
    assert exposition.all("modelkv_declared_peak_bytes", engine="talker-0")


def test_publish_into_a_missing_directory_names_the_directory(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-spool"
    with pytest.raises(FileNotFoundError) as raised:
        publish(build_model(CODE2WAV), spool_dir=missing, max_num_seqs=8, engine_id="e")
    message = str(raised.value)
    assert "spool directory does not exist" in message and str(missing) in message
    assert ".tmp" not in message, "the temp file is ours, not the user's"
    (tmp_path / "a-file").write_text("")
    with pytest.raises(NotADirectoryError, match="spool directory is not a directory"):
        publish(build_model(CODE2WAV), spool_dir=tmp_path / "a-file", max_num_seqs=8, engine_id="e")
    assert not missing.exists(), "publish never creates the spool"
