"""Every setting is a flag and a MODELKV_ variable; bad values get a clear error."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from modelkv_exporter.cli.main import parse_arguments
from modelkv_exporter.contract.settings import SETTINGS


def parse(argv: list[str], **env: str) -> argparse.Namespace:
    return parse_arguments(argv, env)


def test_defaults_env_and_flags_in_that_order() -> None:
    args = parse(["serve", "--spool-dir", "/s"])
    assert (args.host, args.port, args.stale_after, args.log_level) == ("0.0.0.0", 9400, 30.0, "info")
    args = parse(["serve"], MODELKV_SPOOL_DIR="/env", MODELKV_PORT="9500", MODELKV_STALE_AFTER="12.5")
    assert (args.spool_dir, args.port, args.stale_after) == ("/env", 9500, 12.5)
    args = parse(["serve", "--port", "9600"], MODELKV_SPOOL_DIR="/env", MODELKV_PORT="9500")
    assert args.port == 9600
    args = parse(["serve", "--port", "9600"], MODELKV_SPOOL_DIR="/env", MODELKV_PORT="not a port")
    assert args.port == 9600, "a flag wins over a malformed variable, which is then never read"
    assert parse(["demo"]).host == "127.0.0.1"


def test_every_setting_has_a_flag_and_variable_of_its_name() -> None:
    for setting in SETTINGS:
        assert setting.flag == "--" + setting.dest.replace("_", "-")
        assert setting.env == "MODELKV_" + setting.dest.upper()


@pytest.mark.parametrize(
    "argv,env,message",
    [
        (["serve"], {}, "--spool-dir"),
        (["serve", "--spool-dir", "s", "--port", "70000"], {}, "70000 is not a port"),
        (["serve", "--spool-dir", "s"], {"MODELKV_MAX_SNAPSHOT_BYTES": "-1"}, "MODELKV_MAX_SNAPSHOT_BYTES='-1'"),
        (["serve", "--spool-dir", "s"], {"MODELKV_LOG_LEVEL": "loud"}, "loud is not a log level"),
        (["plan", "d"], {"MODELKV_LOG_LEVEL": "loud"}, "modelkv-exporter plan: error: --max-num-seqs"),
    ],
)
def test_bad_settings_are_clear_errors(argv: list[str], env: dict[str, str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "modelkv_exporter", *argv],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", **env},
    )
    assert result.returncode == 2 and message in result.stderr


def test_a_command_checks_only_its_own_variables(tmp_path: Path) -> None:
    """MODELKV_LOG_LEVEL belongs to serve and demo: inspect neither reads it nor blames serve for it."""
    result = subprocess.run(
        [sys.executable, "-m", "modelkv_exporter", "inspect", str(tmp_path)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "MODELKV_LOG_LEVEL": "loud", "MODELKV_PORT": "x"},
    )
    assert result.returncode == 0 and result.stdout == "no snapshots in the spool\n", result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "modelkv_exporter", "serve", "--spool-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "MODELKV_PORT": "x"},
    )
    assert result.returncode == 2 and "modelkv-exporter serve: error: MODELKV_PORT='x'" in result.stderr
