"""The main job: `modelkv-exporter demo` starts engine processes, serves them, and ends them cleanly."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from modelkv_exporter.demo.engines import UNDECLARED
from modelkv_exporter.demo.owners import StreamingAudioKVCache
from tests.engine.test_real_caches import KNOWN_ROW_BYTES
from tests.support import VENV_BIN
from tests.support.exposition import Exposition
from tests.support.processes import Sidecar, free_port, wait_http

EXPECTED_PEAKS = {
    ("qwen3-tts-s1-r0", "codec_decoder_request"): KNOWN_ROW_BYTES["codec_decoder_request"] * 8,
    ("qwen3-tts-s1-r0", "codec_decoder_working_copy"): KNOWN_ROW_BYTES["codec_decoder_working_copy"] * 8,
    ("qwen3-tts-s1-r0", "codec_decoder_graph_pool"): KNOWN_ROW_BYTES["codec_decoder_graph_pool"] * (1 + 2 + 4),
    ("mimo-audio-s0-r0", "local_transformer"): KNOWN_ROW_BYTES["local_transformer"] * 16,
    ("mimo-audio-s0-r0", "local_transformer_graph_pool"): KNOWN_ROW_BYTES["local_transformer_graph_pool"]
    * (1 + 2 + 4 + 8),
    ("minicpm-o-s0-r0", "whisper_encoder_self_attn"): KNOWN_ROW_BYTES["whisper_encoder_self_attn"],
    ("ming-flash-omni-s1-r0", "talker_llm_static_cache"): KNOWN_ROW_BYTES["talker_llm_static_cache"],
    ("qwen3-tts-eager-s1-r0", "codec_decoder_request"): KNOWN_ROW_BYTES["codec_decoder_request"] * 4,
    ("qwen3-tts-eager-s1-r0", "codec_decoder_working_copy"): KNOWN_ROW_BYTES["codec_decoder_working_copy"] * 4,
}


@pytest.mark.slow
def test_demo_serves_every_engine_and_marks_them_ended_on_exit(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    port = free_port()
    process = subprocess.Popen(
        [
            str(VENV_BIN / "modelkv-exporter"),
            "demo",
            "--spool-dir",
            str(spool),
            "--port",
            str(port),
            "--heartbeat-interval",
            "1",
            "--duration",
            "300",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/healthz", timeout=240, process=process)
        text = Sidecar(process, url, spool).get("/metrics").text
        families = {f.name: f for f in Exposition(text)}
        peaks = {
            (s.labels["engine"], s.labels["cache"]): s.value for s in families["modelkv_declared_peak_bytes"].samples
        }
        assert peaks == EXPECTED_PEAKS
        up = {s.labels["engine"]: s.value for s in families["modelkv_engine_up"].samples}
        assert up == {
            e: 1.0
            for e in (
                "qwen3-tts-s0-r0",
                "qwen3-tts-s1-r0",
                "mimo-audio-s0-r0",
                "minicpm-o-s0-r0",
                "ming-flash-omni-s1-r0",
                "qwen3-tts-eager-s1-r0",
                "minicpm-o-streaming-s0-r0",
            )
        }
        declared: dict[tuple[str, str], float] = {}
        for s in families["modelkv_declared_peak_bytes"].samples:
            key = (s.labels["engine"], s.labels["owner"])
            declared[key] = declared.get(key, 0) + s.value
        observed = {
            (s.labels["engine"], s.labels["owner"]): s.value for s in families["modelkv_observed_peak_bytes"].samples
        }
        available = {(s.labels["engine"], s.labels["owner"]) for s in families["modelkv_observation_available"].samples}
        assert observed.keys() == declared.keys() == available, "every demo owner is observed beside its declaration"
        for key, value in observed.items():
            expected = 1.5 * declared[key] if key[0] == "qwen3-tts-eager-s1-r0" else declared[key]
            assert value == expected, key
        rss = {s.labels["engine"]: s.value for s in families["modelkv_memory_process_resident_bytes"].samples}
        base = {s.labels["engine"]: s.value for s in families["modelkv_memory_process_resident_baseline_bytes"].samples}
        whisper = KNOWN_ROW_BYTES["whisper_encoder_self_attn"]
        assert rss["minicpm-o-s0-r0"] - base["minicpm-o-s0-r0"] >= 0.9 * whisper, "the allocated caches show in RSS"
    finally:
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=60)[0].decode()
    assert process.returncode == 0, output
    assert "Serving on" in output and "engines stopped" in output
    assert "holds 1.50x its declaration" in output and output.count("within its declaration") == 4
    snapshots = [json.loads(p.read_text()) for p in spool.glob("*.json")]
    assert len(snapshots) == 7 and all(s["ended"] for s in snapshots)
    discovered = {s["engine"]["engine_id"]: s.get("discovered", []) for s in snapshots}
    streaming = StreamingAudioKVCache.LAYERS * 2 * 750 * StreamingAudioKVCache.EMBED_DIM * 2
    assert streaming > 64 << 20, "above ModelKVUndeclaredCache's threshold"
    assert {
        engine: [(d["owner"], d["found_by"], d["peak_bytes"]) for d in found] for engine, found in discovered.items()
    } == {
        engine: ([("apm.streaming_kv", "census", streaming)] if engine == UNDECLARED else []) for engine in discovered
    }, "the undeclared streaming cache is discovered, exactly, and nothing else in any demo engine"


def test_a_taken_port_fails_before_any_engine_starts(tmp_path: Path) -> None:
    """The demo binds its port first: a taken one ends it at once, naming the flag and the variable."""
    spool = tmp_path / "spool"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [str(VENV_BIN / "modelkv-exporter"), "demo", "--spool-dir", str(spool), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "--port" in result.stderr and "MODELKV_PORT" in result.stderr and result.stderr.endswith("\n")
    assert "starting" not in result.stdout and not spool.exists(), "no engine was started"
