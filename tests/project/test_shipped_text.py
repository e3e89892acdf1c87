"""Shipped text names only settings the tables have, and says of a setting's default only what the table says.

The settings tables (``contract/settings.py``'s ``Table``s: the commands' in ``cli/command_settings.py``, the
engine's in ``engine/config.py``) are the one source of each setting's name and default. Text that ships beside
them copies neither by hand, or names a flag or a variable after it was renamed: the metric catalogue's HELP served on
/metrics, the command's help, every document under docs/ and the README, and everything under deploy/. Here each
``--flag`` and ``MODELKV_`` name in that text must be a setting, a flag of one of this repository's programs or of
a program the docs name (``FOREIGN_FLAGS``), or a variable the project reads that is no setting
(``OTHER_VARIABLES``); each default stated beside a setting ("`--flag` (N)", "(`--flag`, N)", "`--flag` (N by default)", "`--flag`,
default N") must be one of the table's defaults of that setting;
a setting's own help never restates its default (the command's help adds it from the table); and a manifest
neither sets a variable to its default nor opens a port other than the one the sidecar listens on.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from modelkv_exporter.cli.main import build_parser
from modelkv_exporter.contract.settings import REQUIRED, Setting
from modelkv_exporter.sidecar.catalogue import CATALOGUE
from scripts.docgen import SETTINGS

ROOT = Path(__file__).resolve().parents[2]

FOREIGN_FLAGS = {
    # helm and kubectl
    "--set": "helm",
    "--install": "helm",
    "--namespace": "helm, kubectl",
    "--create-namespace": "helm",
    "--dry-run": "helm, kubectl",
    "--post-renderer": "helm",
    "--post-renderer-args": "helm",
    "--reset-then-reuse-values": "helm",
    "--selector": "kubectl",
    "--image": "kubectl",
    # container builds, Python packaging, schema checks
    "--build-arg": "docker, podman",
    "--wheel": "python -m build",
    "--report": "pip install",
    "--strict": "tsc, kubernetes-validate",
    "--no-deps": "pip",
    "--no-cache-dir": "pip",
    "--target": "pip",
    "--prefix": "pip",
    # Prometheus and Alertmanager
    "--author": "amtool silence add",
    "--comment": "amtool silence add",
    "--alertmanager.url": "promtool, Prometheus",
    "--rules.max-concurrent-evals": "Prometheus",
    "--enable-feature": "Prometheus",
    # vLLM
    "--omni": "vllm serve (vLLM-Omni)",
    "--port": "vllm serve",
    "--max-num-seqs": "vllm serve",
    "--data-parallel-size": "vllm serve",
    "--cpu-offload-gb": "vllm serve",
    "--no-enable-extensible-kv-cache": "vllm serve",
    "--kv-cache-memory-bytes": "vllm serve",
    "--gpu-memory-utilization": "vllm serve",
    # valgrind, pytest, argparse
    "--tool": "valgrind",
    "--dist": "pytest-xdist",
    "--help": "every command",
}
"""Flags of other programs that the docs and manifests use, each with its program."""

OTHER_VARIABLES = {
    "MODELKV_EXPORTER_IMAGE": "deploy/helm/post-renderer/modelkv-sidecar.py",
    "MODELKV_SELECTOR": "deploy/helm/post-renderer/modelkv-sidecar.py",
    "MODELKV_PODMAN_CACHE": "the Makefile's image tests",
    "MODELKV_UPDATE_GOLDEN": "tests/sidecar/test_golden.py",
}
"""Variables the project reads that are no setting of the exporter, each with its reader; ``MODELKV_TEST_`` and
``MODELKV_BENCH_`` variables belong to the tests and the benchmarks."""

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9.-]*[a-z0-9]")
VARIABLE = re.compile(r"\bMODELKV_[A-Z0-9_]*[A-Z0-9]\b")
OWN_FLAG = re.compile(r"""add_argument\(\s*["'](--[a-z0-9-]+)["']|["'](--[a-z0-9-]+)["'] in sys\.argv""")
NUMBER = r"(\d+(?:[  ]\d{3})*(?:\.\d+)?)\s*(s|seconds?|minutes?|min|hours?|h|B|bytes|KiB|MiB|GiB)?\b"
DEFAULT_AFTER = re.compile(r"\A`?[^.;`)]{0,40}?\bdefaults?\b(?: is| of| to)?:?\s*`?" + NUMBER)
DEFAULT_BEFORE = re.compile(r"\A`?(?:\s\w+)?\s*\(" + NUMBER + r"(?=\)| by default|;)")
DEFAULT_INSIDE = re.compile(r"\A`?,\s*" + NUMBER + r"\)")
UNITS = {
    "s": 1,
    "second": 1,
    "seconds": 1,
    "min": 60,
    "minute": 60,
    "minutes": 60,
    "h": 3600,
    "hour": 3600,
    "hours": 3600,
    "B": 1,
    "bytes": 1,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
}


@dataclass(frozen=True)
class Text:
    """One piece of shipped text and where it is shipped."""

    where: str
    text: str


def _help_of(parser: argparse.ArgumentParser, name: str) -> Iterator[Text]:
    for text in (parser.description, parser.epilog):
        if text:
            yield Text(f"{name} help", text)
    for action in parser._actions:
        if action.help and action.help != argparse.SUPPRESS:
            yield Text(f"{name} help of {'/'.join(action.option_strings) or action.dest}", action.help % {})
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                yield from _help_of(sub, f"{name} {command}")


def shipped_text(root: Path = ROOT) -> Iterator[Text]:
    """The HELP of every metric, the command's help, docs/*.md and the README, and every file under deploy/."""
    for metric in CATALOGUE.values():
        yield Text(f"HELP of {metric.name}", metric.help)
    yield from _help_of(build_parser(), "modelkv-exporter")
    for path in [*sorted((root / "docs").glob("*.md")), root / "README.md"]:
        yield Text(str(path.relative_to(root)), path.read_text())
    for path in sorted((root / "deploy").rglob("*")):
        if path.is_file() and path.suffix in {".md", ".yaml", ".yml", ".py", ".json", ".txt", ".tpl"}:
            yield Text(str(path.relative_to(root)), path.read_text())


def own_flags(root: Path = ROOT) -> set[str]:
    """The flags of this repository's programs: the settings, and each flag its Python code (the files git tracks,
    not the libraries installed beside them) adds to a parser or looks for in ``sys.argv``."""
    found = {setting.flag for setting in SETTINGS}
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=root, capture_output=True, text=True, check=True)
    for name in tracked.stdout.split():
        found |= {flag for pair in OWN_FLAG.findall((root / name).read_text()) for flag in pair if flag}
    return found


def _value(number: str, unit: str | None) -> float:
    return float(re.sub(r"[  ]", "", number)) * UNITS.get(unit or "", 1)


def _defaults(setting: Setting) -> set[float]:
    return {
        float(default)
        for default in setting.defaults.values()
        if default is not REQUIRED and isinstance(default, (int, float))
    }


def stated_defaults(text: str) -> Iterator[tuple[Setting, float, str]]:
    """Each default the text states beside a setting's flag or variable: the setting, the value, the words."""
    by_name = {name: setting for setting in SETTINGS for name in (setting.flag, setting.env)}
    for match in re.finditer("|".join([FLAG.pattern, VARIABLE.pattern]), text):
        setting = by_name.get(match.group())
        if setting is None:
            continue
        rest = text[match.end() :]
        said = DEFAULT_AFTER.match(rest) or DEFAULT_BEFORE.match(rest) or DEFAULT_INSIDE.match(rest)
        if said and _defaults(setting):
            yield setting, _value(said.group(1), said.group(2)), f"{match.group()}{rest[: said.end()]}"


def unknown_names(texts: list[Text], flags: set[str]) -> list[str]:
    """``where: name`` for each flag or variable no table, program or reader has."""
    variables = {setting.env for setting in SETTINGS} | set(OTHER_VARIABLES)
    found = []
    for text in texts:
        for flag in sorted(set(FLAG.findall(text.text)) - flags - set(FOREIGN_FLAGS)):
            found.append(f"{text.where}: {flag}")
        for variable in sorted(set(VARIABLE.findall(text.text)) - variables):
            if not variable.startswith(("MODELKV_TEST_", "MODELKV_BENCH_")):
                found.append(f"{text.where}: {variable}")
    return found


def wrong_defaults(texts: list[Text]) -> list[str]:
    """``where: words`` for each stated default that is none of the table's defaults of that setting."""
    return [
        f"{text.where}: {words!r} (the table: {sorted(_defaults(setting))})"
        for text in texts
        for setting, value, words in stated_defaults(text.text)
        if value not in _defaults(setting)
    ]


def restated_defaults() -> list[str]:
    """Each setting whose own help spells its default, which the command's help already adds from the table."""
    found = []
    for setting in SETTINGS:
        for number, unit in re.findall(NUMBER, setting.help):
            if _value(number, unit) in _defaults(setting) - {0.0, 1.0}:
                found.append(f"{setting.dest}: {number}{unit or ''} in {setting.help!r}")
    return found


def _containers(node: object) -> Iterator[dict[str, object]]:
    if isinstance(node, dict):
        if "image" in node and "name" in node:
            yield node
        for value in node.values():
            yield from _containers(value)
    elif isinstance(node, list):
        for value in node:
            yield from _containers(value)


def manifest_copies(root: Path = ROOT) -> list[str]:
    """A variable set to its default in a manifest, and a sidecar port other than the one it listens on."""
    by_env = {setting.env: setting for setting in SETTINGS}
    found = []
    for path in sorted((root / "deploy").rglob("*.yaml")):
        if "templates" in path.parts:
            continue
        for document in yaml.safe_load_all(path.read_text()):
            for container in _containers(document):
                env = {item["name"]: item.get("value") for item in container.get("env") or [] if "name" in item}
                for name, value in env.items():
                    setting = by_env.get(name)
                    if setting is not None and value is not None and _parsed(setting, str(value)) in _defaults(setting):
                        found.append(f"{path.relative_to(root)}: {name}={value} is the default; leave it out")
                ports = {port.get("name"): port.get("containerPort") for port in container.get("ports") or []}
                for port_name, dest in (("modelkv-metrics", "port"), ("modelkv-probe", "probe_port")):
                    if port_name in ports and f"MODELKV_{dest.upper()}" not in env:
                        listens = _defaults(next(s for s in SETTINGS if s.dest == dest))
                        if float(ports[port_name]) not in listens:
                            found.append(f"{path.relative_to(root)}: {port_name} {ports[port_name]} is not {listens}")
    return found


def _parsed(setting: Setting, text: str) -> float | None:
    try:
        return float(setting.parse(text))
    except (TypeError, ValueError):
        return None


@pytest.fixture(scope="module")
def texts() -> list[Text]:
    return list(shipped_text())


def test_shipped_text_names_only_flags_and_variables_that_exist(texts: list[Text]) -> None:
    assert unknown_names(texts, own_flags()) == []


def test_a_default_stated_beside_a_setting_is_the_tables(texts: list[Text]) -> None:
    assert wrong_defaults(texts) == []


def test_no_setting_restates_its_default_in_its_help() -> None:
    assert restated_defaults() == []


def test_no_manifest_copies_a_default() -> None:
    assert manifest_copies() == []


def test_the_checks_see_a_renamed_flag_a_wrong_default_and_a_copied_one(tmp_path: Path) -> None:
    """The checks themselves: each finds what it is for in text made to hold it."""
    stale_after = next(s for s in SETTINGS if s.dest == "stale_after")
    planted = [
        Text(
            "planted", "Set `--max-discovered-owners` or MODELKV_DISCOVER_MAX_OWNERS; `--stale-after` (default 45 s)."
        ),
        Text(
            "planted", "`MODELKV_STALE_AFTER` (30 s by default), `--stale-after`, default: 30, (`--stale-after`, 31 s)."
        ),
    ]
    assert unknown_names(planted, own_flags()) == [
        "planted: --max-discovered-owners",
        "planted: MODELKV_DISCOVER_MAX_OWNERS",
    ]
    assert [words for _, _, words in stated_defaults(planted[1].text)] == [
        "MODELKV_STALE_AFTER` (30 s",
        "--stale-after`, default: 30",
        "--stale-after`, 31 s)",
    ]
    table = sorted(_defaults(stale_after))
    assert wrong_defaults(planted) == [
        f"planted: '--stale-after` (default 45 s' (the table: {table})",
        f"planted: '--stale-after`, 31 s)' (the table: {table})",
    ]
    manifest = tmp_path / "deploy" / "base.yaml"
    manifest.parent.mkdir()
    manifest.write_text(
        "spec:\n  containers:\n    - name: modelkv-exporter\n      image: x\n"
        "      env: [{name: MODELKV_STALE_AFTER, value: '30'}]\n"
        "      ports: [{name: modelkv-metrics, containerPort: 9500}]\n"
    )
    assert manifest_copies(tmp_path) == [
        "deploy/base.yaml: MODELKV_STALE_AFTER=30 is the default; leave it out",
        "deploy/base.yaml: modelkv-metrics 9500 is not {9400.0}",
    ]
