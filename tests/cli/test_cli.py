"""Every setting is a flag and a MODELKV_ variable; bad values get a clear error."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from modelkv_exporter.cli.arguments import attach_dashed_values
from modelkv_exporter.cli.command_settings import TABLES
from modelkv_exporter.cli.main import build_parser, parse_arguments
from modelkv_exporter.contract.settings import build
from modelkv_exporter.contract.spool import write_snapshot
from modelkv_exporter.sidecar.http.sidecar_config import SidecarConfig
from modelkv_exporter.sidecar.reader.scan import SpoolLimits
from modelkv_exporter.sidecar.reader.state import Staleness
from modelkv_testbed.snapshots import make_snapshot
from scripts.docgen import SETTINGS


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


def test_serve_builds_the_sidecars_config_from_its_settings() -> None:
    """A setting is a field of the typed object it configures: its flag or variable reaches that field."""
    args = parse(["serve", "--http-idle-timeout", "2"], MODELKV_SPOOL_DIR="/s", MODELKV_MAX_SERIES="50")
    config = build(SidecarConfig, vars(args), spool_dir=Path(args.spool_dir))
    assert (config.http.idle_timeout, config.budget.max_series, config.probe_port) == (2.0, 50, 9401)
    assert config.reading == SpoolLimits() and config.staleness == Staleness()
    assert build(SidecarConfig, vars(parse(["demo"])), spool_dir=Path("/d")).probe_port == 0


def test_the_sidecars_owner_budget_has_one_name(capsys: pytest.CaptureFixture[str]) -> None:
    """Named so that it is not taken for the engine's (MODELKV_ENGINE_MAX_DISCOVERED_OWNERS); its former name,
    never released, is neither a flag nor a variable."""
    args = parse(["serve", "--spool-dir", "s", "--sidecar-max-discovered-owners", "3"])
    assert build(SidecarConfig, vars(args), spool_dir=Path("s")).budget.sidecar_max_discovered_owners == 3
    args = parse(["serve", "--spool-dir", "s"], MODELKV_MAX_DISCOVERED_OWNERS="3")
    assert build(SidecarConfig, vars(args), spool_dir=Path("s")).budget.sidecar_max_discovered_owners == 64
    with pytest.raises(SystemExit):
        parse(["serve", "--spool-dir", "s", "--max-discovered-owners", "3"])
    assert "unrecognized arguments: --max-discovered-owners" in capsys.readouterr().err


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
        (["plan", "d"], {"MODELKV_CACHE_MEMORY": "-5MiB"}, "error: MODELKV_CACHE_MEMORY='-5MiB': '-5MiB' is negative"),
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
    assert result.returncode == 0 and result.stdout.startswith("summary: no engine: no engine has published"), (
        result.stderr
    )
    result = subprocess.run(
        [sys.executable, "-m", "modelkv_exporter", "serve", "--spool-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "MODELKV_PORT": "x"},
    )
    assert result.returncode == 2 and "modelkv-exporter serve: error: MODELKV_PORT='x'" in result.stderr


def run_cli(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The real command in a clean environment (no terminal: reports use their widest width)."""
    return subprocess.run(
        [sys.executable, "-m", "modelkv_exporter", *argv],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", **env},
    )


def option_help(help_text: str, flag: str) -> str:
    """The text argparse prints for ``flag`` under "options:", joined into one line."""
    lines = help_text.split("\noptions:\n", 1)[-1].splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(f"  {flag} ")), None)
    if start is None:
        return ""
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if line.startswith("  -") or not line.startswith("   "):
            break
        block.append(line)
    return " ".join(" ".join(block).split())


def test_no_arguments_print_the_help() -> None:
    result = run_cli()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: modelkv-exporter")
    for command in ("serve", "demo", "inspect", "plan"):
        assert command in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize("command", [None, "serve", "demo", "inspect", "plan"])
def test_help_is_plain_text_about_its_own_command(command: str | None) -> None:
    result = run_cli(*([command] if command else []), "--help")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "`" not in text, "no reST or Markdown markup in help"
    assert "None" not in text and "default unset" not in text and "default required" not in text
    spool_help = option_help(text, "--spool-dir")
    if command == "serve":
        assert "[env MODELKV_SPOOL_DIR; required]" in spool_help
        for other in ("demo", "inspect", "plan", "DIR", "plugin"):
            assert not re.search(rf"\b{other}\b", spool_help), f"serve's --spool-dir help talks about {other}"
    if command in ("inspect", "plan"):
        assert "DIR argument" in spool_help and "demo" not in spool_help


@pytest.mark.parametrize(
    "argv,message",
    [
        (["plan", "d", "--max-num-seqs", "x"], "argument --max-num-seqs: 'x' is not a whole number"),
        (["plan", "d", "--max-num-seqs", "0"], "argument --max-num-seqs: 0 is not 1 or more"),
        (
            ["plan", "d", "--max-num-seqs", "8", "--cache-memory", "0"],
            "argument --cache-memory: '0' is not a size above 0 bytes",
        ),
        (["plan", "d", "--max-num-seqs", "8", "--cache-memory", "lots"], "'lots' is not a size such as"),
        (["inspect", "d", "--stale-after", "soon"], "argument --stale-after: 'soon' is not a number"),
        (["inspect", "d", "--stale-after", "nan"], "'nan' is not a finite number"),
        (["serve", "--spool-dir", "s", "--port", "http"], "argument --port: 'http' is not a whole number"),
        (["plan", "d", "--max-num-seqs", "8", "--max-snapshot-bytes", "-1"], "'-1' is negative: a size is"),
        (
            ["plan", "d", "--cache-memory", "-5MiB"],
            "argument --cache-memory: '-5MiB' is negative: a size is a number of bytes",
        ),
        (["plan", "d", "--cache-memory=-5MiB"], "argument --cache-memory: '-5MiB' is negative"),
        (
            ["plan", "d", "--cache-memory", "2 gigs"],
            "powers of 1024 (2GiB = 2147483648 bytes); kB, MB, GB, TB are powers",
        ),
        (["plan", "d", "--max-num-seqs", "-3"], "argument --max-num-seqs: -3 is not 1 or more"),
    ],
)
def test_bad_values_are_plain_errors_ending_in_a_newline(argv: list[str], message: str) -> None:
    result = run_cli(*argv)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stderr.endswith("\n")
    for python in ("invalid literal", "int()", "float(", "Traceback", "ValueError"):
        assert python not in result.stderr


def test_sizes_take_units_wherever_bytes_are_set() -> None:
    assert parse(["plan", "d", "--max-num-seqs", "1", "--max-snapshot-bytes", "8MiB"]).max_snapshot_bytes == 8 << 20
    assert parse(["serve"], MODELKV_SPOOL_DIR="/s", MODELKV_MAX_SNAPSHOT_BYTES="64KiB").max_snapshot_bytes == 64 << 10
    assert parse(["plan", "d", "--max-num-seqs", "1", "--cache-memory", "2GiB"]).cache_memory == 2 << 30
    assert parse(["plan", "d", "--max-num-seqs", "1"]).cache_memory is None


def test_an_unreadable_spool_is_an_error_on_stderr_ending_in_a_newline(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    for spool in (tmp_path / "missing", tmp_path / "a-file"):
        for argv in (["inspect", str(spool)], ["plan", str(spool), "--max-num-seqs", "8"]):
            result = run_cli(*argv)
            assert result.returncode == 1 and result.stdout == ""
            assert result.stderr.startswith(f"modelkv-exporter {argv[0]}: cannot read the spool: {spool}")
            assert result.stderr.endswith("\n") and result.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "text,value",
    [
        ("2GiB", 2 * 2**30),
        ("2Gi", 2 * 2**30),
        ("2gib", 2 * 2**30),
        ("2GB", 2 * 10**9),
        ("2 GB", 2 * 10**9),
        ("512MiB", 512 * 2**20),
        ("512MB", 512 * 10**6),
        ("1.5GiB", 3 * 2**29),
        ("4 kB", 4000),
        ("4KB", 4000),
        ("4KiB", 4096),
        ("100B", 100),
        ("1073741824", 2**30),
    ],
)
def test_binary_and_decimal_units_are_each_read_as_defined(text: str, value: int) -> None:
    assert parse(["plan", "d", "--cache-memory", text]).cache_memory == value
    assert parse(["plan", "d"], MODELKV_CACHE_MEMORY=text).cache_memory == value


@pytest.mark.parametrize(
    "text,why,meant",
    [
        ("2G", "a bare G is 10^9 to Kubernetes but 2^30 to Docker and the JVM", "2GB (2000000000 bytes) or 2GiB"),
        ("2g", "a bare g is 10^9 to Kubernetes but 2^30 to Docker and the JVM", "2GB (2000000000 bytes) or 2GiB"),
        ("2Gb", "a lowercase b is a bit, not a byte", "2GB (2000000000 bytes) or 2GiB (2147483648 bytes)"),
        ("2gb", "a lowercase b is a bit, not a byte", "2GB (2000000000 bytes) or 2GiB (2147483648 bytes)"),
        ("512m", "a bare m is milli to Kubernetes and mega elsewhere", "512MB (512000000 bytes) or 512MiB"),
        ("512M", "a bare M is 10^6 to Kubernetes but 2^20 to Docker and the JVM", "512MB (512000000 bytes)"),
        ("1.5k", "a bare k is 10^3 to Kubernetes but 2^10 to Docker and the JVM", "1.5kB (1500 bytes) or 1.5KiB"),
    ],
)
def test_a_size_tools_read_differently_is_refused_saying_what_to_write(text: str, why: str, meant: str) -> None:
    """2G is 2,000,000,000 bytes to Kubernetes and 2,147,483,648 to Docker: which was meant cannot be known."""
    for argv, environ in ((["plan", "d", "--cache-memory", text], {}), (["plan", "d"], {"MODELKV_CACHE_MEMORY": text})):
        result = run_cli(*argv, **environ)
        assert result.returncode == 2
        message = " ".join(result.stderr.split())
        assert f"{text!r} is ambiguous: {why}; write {meant}" in message
        assert ("MODELKV_CACHE_MEMORY=" if environ else "argument --cache-memory:") in message


def test_help_and_plan_say_which_unit_a_size_was_read_in(tmp_path: Path) -> None:
    """2GB is 2,000,000,000 bytes, about 1.9 GiB: the help says so, and plan prints the cache memory it read."""
    assert "2GB is 2000000000" in option_help(run_cli("plan", "--help").stdout, "--cache-memory")
    result = run_cli("plan", str(tmp_path), "--cache-memory", "2GB")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("cache memory: 2000000000 bytes (1.9 GiB);")
    assert run_cli("plan", str(tmp_path), "--cache-memory", "2GiB").stdout.startswith(
        "cache memory: 2147483648 bytes (2.0 GiB);"
    )


def test_a_negative_size_after_its_flag_reaches_the_sizes_own_error(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse alone takes -5MiB for an option; joining it to its flag is what lets the size's error speak."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["plan", "d", "--cache-memory", "-5MiB"])
    assert "expected one argument" in capsys.readouterr().err
    assert attach_dashed_values(["plan", "--cache-memory", "-5MiB", "-h"], TABLES) == [
        "plan",
        "--cache-memory=-5MiB",
        "-h",
    ]
    assert attach_dashed_values(["plan", "--cache-memory", "-h"], TABLES) == ["plan", "--cache-memory", "-h"]
    result = run_cli("plan", "d", "--cache-memory", "-5MiB")
    assert result.returncode == 2 and "expected one argument" not in result.stderr


def test_dir_and_a_different_spool_dir_are_refused(tmp_path: Path) -> None:
    other = tmp_path / "other"
    for command in ("inspect", "plan"):
        extra = ["--cache-memory", "1GiB"] if command == "plan" else []
        result = run_cli(command, str(tmp_path), "--spool-dir", str(other), *extra)
        assert result.returncode == 2 and result.stdout == ""
        assert (
            f"modelkv-exporter {command}: error: DIR {tmp_path} and --spool-dir {other} name different directories: "
            "give one"
        ) in result.stderr
        same = run_cli(command, str(tmp_path), "--spool-dir", f"{tmp_path}/./", *extra)
        assert same.returncode == 0 and same.stderr == "", "the same directory twice is no conflict"


def test_dir_wins_over_the_variable_and_says_so(tmp_path: Path, spool: Path) -> None:
    write_snapshot(spool, make_snapshot("in-dir"))
    result = run_cli("inspect", str(spool), MODELKV_SPOOL_DIR=str(tmp_path / "elsewhere"))
    assert result.returncode == 0 and "engine in-dir" in result.stdout
    assert (
        result.stderr
        == f"modelkv-exporter inspect: reading DIR {spool}, not MODELKV_SPOOL_DIR {tmp_path / 'elsewhere'}\n"
    )
    quiet = run_cli("inspect", str(spool), MODELKV_SPOOL_DIR=str(spool))
    assert quiet.returncode == 0 and quiet.stderr == ""
