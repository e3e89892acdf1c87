"""Every setting is a flag and a MODELKV_ variable; bad values get a clear error."""

from __future__ import annotations

import subprocess
import sys

import pytest

from modelkv_exporter.cli import build_parser
from modelkv_exporter.settings import SETTINGS


def parse(argv: list[str], monkeypatch: pytest.MonkeyPatch, **env: str):
    for setting in SETTINGS:
        monkeypatch.delenv(setting.env, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return build_parser().parse_args(argv)


def test_defaults_env_and_flags_in_that_order(monkeypatch: pytest.MonkeyPatch) -> None:
    args = parse(["serve", "--spool-dir", "/s"], monkeypatch)
    assert (args.host, args.port, args.stale_after, args.log_level) == ("0.0.0.0", 9400, 30.0, "info")
    args = parse(["serve"], monkeypatch, MODELKV_SPOOL_DIR="/env", MODELKV_PORT="9500", MODELKV_STALE_AFTER="12.5")
    assert (args.spool_dir, args.port, args.stale_after) == ("/env", 9500, 12.5)
    args = parse(["serve", "--port", "9600"], monkeypatch, MODELKV_SPOOL_DIR="/env", MODELKV_PORT="9500")
    assert args.port == 9600
    assert parse(["demo"], monkeypatch).host == "127.0.0.1"


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
