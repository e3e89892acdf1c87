"""One catalogue: names follow the conventions, and the generated docs are up to date."""

from __future__ import annotations

import argparse
import re
import shlex
import sys

from modelkv_exporter.cli.main import build_parser
from modelkv_exporter.sidecar.attention import NEXT_STEPS, SIDECAR_CONTAINER
from modelkv_exporter.sidecar.catalogue import CATALOGUE, MAX_INFO_LABELS, MAX_LABELS
from modelkv_testbed import ROOT
from scripts.docgen import ENGINE, SETTINGS, expected_files

sys.path.insert(0, str(ROOT / "deploy" / "kubernetes"))
import generate_manifests  # noqa: E402


def test_generated_docs_are_current() -> None:
    for path, content in expected_files(ROOT).items():
        assert path.read_text() == content, f"{path.name} is stale: run python -m scripts.docgen"


def test_metric_names_follow_the_house_rules() -> None:
    for metric in CATALOGUE.values():
        assert re.fullmatch(r"modelkv_[a-z0-9_]+", metric.name), metric.name
        assert ":" not in metric.name
        assert len(metric.labels) <= (MAX_INFO_LABELS if metric.kind == "info" else MAX_LABELS)
        assert not {"pod", "namespace"} & set(metric.labels)
        if metric.kind == "counter":
            assert metric.name.endswith("_total")
        if metric.kind == "info":
            assert metric.name.endswith("_info")
        if "bytes" in metric.name:
            assert metric.name.endswith("_bytes"), metric.name
        if "seconds" in metric.name:
            assert metric.name.endswith("_seconds"), metric.name


def test_every_setting_and_metric_is_documented() -> None:
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    metrics_doc = (ROOT / "docs" / "metrics.md").read_text()
    assert "docs/configuration.md" in (ROOT / "README.md").read_text(), "the README points at every setting"
    for setting in SETTINGS:
        assert setting.env in configuration
        if set(setting.defaults) - {ENGINE}:
            assert setting.flag in configuration
    for name in CATALOGUE:
        assert f"`{name}`" in metrics_doc


def test_the_development_guide_names_every_part_of_the_package() -> None:
    guide = (ROOT / "docs" / "development.md").read_text()
    parts = [p.name for p in (ROOT / "modelkv_exporter").iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert parts and all(f"`{part}/`" in guide or f"{part}/:" in guide for part in parts), parts
    assert "docs/development.md" in (ROOT / "README.md").read_text()


def test_the_readme_sets_up_with_two_commands() -> None:
    """A newcomer's first block is the two commands, each with its own set-up, before anything about the package's
    insides; every ``make`` command the README shows is one of them."""
    readme = (ROOT / "README.md").read_text()
    first = readme.split("```sh\n", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in first.splitlines()] == ["make demo", "make test"]
    assert readme.index("## Two commands") < readme.index("## What you see") < readme.index("## Where to go next")
    assert "one folder per part" not in readme and "settings:begin" not in readme, "contributor detail is in docs"
    assert set(re.findall(r"\bmake \w+", readme)) == {"make demo", "make test"}


USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
"""Every page a user reads commands from."""
SHELL_FENCE = re.compile(r"(?ms)^ *```(?:sh|bash|shell|console)\n(.*?)^ *```")
COMMAND_SPAN = re.compile(
    r"`((?:kubectl|curl|modelkv-exporter|\.venv/bin/modelkv-exporter|python -m modelkv_exporter) [^`]*)`"
)
OPERATORS = {"|", "||", "&&", ";", "(", ")"}
REDIRECTS = {">", ">>", "<", "2>", "&>"}
METRICS_PORT = "9400"


def shell_commands(markdown: str) -> list[list[str]]:
    """Every command a page shows, in its shell blocks and inline code, split as a shell would (``<pod>`` kept as one
    word), pipelines and redirections taken apart."""
    lines = [line for block in SHELL_FENCE.findall(markdown) for line in block.replace("\\\n", " ").splitlines()]
    prose = SHELL_FENCE.sub("", markdown)
    lines += COMMAND_SPAN.findall(prose.replace("\n", " "))
    commands: list[list[str]] = []
    for line in lines:
        lexer = shlex.shlex(re.sub(r"<([A-Za-z][\w-]*)>", r"@\1@", line), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        current: list[str] = []
        skip = False
        for token in lexer:
            if skip:
                skip = False
            elif token in REDIRECTS:
                skip = True
            elif token in OPERATORS:
                commands.append(current)
                current = []
            else:
                current.append(token)
        commands.append(current)
    return [c for c in commands if c]


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _cli_problems(argv: list[str]) -> list[str]:
    """Why ``modelkv-exporter ARGV`` is not a command the CLI has: an unknown subcommand or flag."""
    if not argv or argv[0] in {"--version", "--help", "-h"}:
        return []
    subcommands = _subcommands()
    if argv[0] not in subcommands:
        return [f"modelkv-exporter has no subcommand {argv[0]!r}"]
    options = subcommands[argv[0]]._option_string_actions
    return [
        f"modelkv-exporter {argv[0]} has no option {flag!r}"
        for flag in (a.split("=", 1)[0] for a in argv[1:] if a.startswith("-"))
        if flag not in options
    ]


def command_problems(argv: list[str]) -> list[str]:
    """Why a command shown to a user would not run as written from a laptop; none when it would."""
    name = argv[0].rsplit("/", 1)[-1]
    if name == "modelkv-exporter":
        return _cli_problems(argv[1:])
    if argv[:3] == ["python", "-m", "modelkv_exporter"]:
        return _cli_problems(argv[3:])
    if name == "curl":
        urls = [a for a in argv[1:] if not a.startswith("-")]
        return [
            f"curl {url}: a pod's address does not resolve from a laptop; port-forward and use localhost"
            for url in urls
            if not re.match(r"(https?://)?(localhost|127\.0\.0\.1)[:/]", url)
        ]
    if name != "kubectl":
        return []
    if "exec" in argv and "--" in argv:
        inner = argv[argv.index("--") + 1 :]
        container = argv[argv.index("-c") + 1] if "-c" in argv else None
        if inner and inner[0] == "modelkv-exporter":
            problems = _cli_problems(inner[1:])
            if container != SIDECAR_CONTAINER:
                problems.append(f"kubectl exec: the CLI is in container {SIDECAR_CONTAINER!r}, not {container!r}")
            return problems
    if "port-forward" in argv:
        ports = [a for a in argv if re.fullmatch(r"\d+(:\d+)?", a)]
        if ports != [f"{METRICS_PORT}:{METRICS_PORT}"]:
            return [f"kubectl port-forward {ports}: forward the sidecar's port as {METRICS_PORT}:{METRICS_PORT}"]
    return []


def test_every_command_the_docs_show_runs_from_a_laptop() -> None:
    """The CLI's subcommands and flags as the parser has them, the sidecar's container, a forwarded port and
    localhost: in every page's commands and the landing page's next steps. Wrong commands are caught."""
    problems = []
    for doc in USER_DOCS:
        commands = shell_commands(doc.read_text())
        problems += [f"{doc.name}: {shlex.join(c)}: {p}" for c in commands for p in command_problems(c)]
    assert problems == []
    runbook = shell_commands((ROOT / "docs" / "runbook.md").read_text())
    assert ["kubectl", "port-forward", "pod/@pod@", "9400:9400", "-n", "@namespace@"] in runbook
    assert ["kubectl", "exec", "@pod@", "-n", "@namespace@", "-c", SIDECAR_CONTAINER, "--", "modelkv-exporter", "inspect"] in runbook  # fmt: skip
    for step in NEXT_STEPS.values():
        (command,) = shell_commands(f"`{step.in_pod()}`")
        assert command_problems(command) == [], step.in_pod()
    assert SIDECAR_CONTAINER == generate_manifests.sidecar_parts()["initContainer"]["name"]
    assert re.search(r'(?m)^ENTRYPOINT \["modelkv-exporter", "serve"\]', (ROOT / "Dockerfile").read_text())
    wrong = {
        "kubectl exec p -c engine -- modelkv-exporter inspect": "not 'engine'",
        "modelkv-exporter inspekt": "no subcommand 'inspekt'",
        "modelkv-exporter plan --max-seqs 4": "no option '--max-seqs'",
        "curl <pod>:9400/api/v1/engines": "does not resolve from a laptop",
        "kubectl port-forward pod/p 9400": "forward the sidecar's port",
    }
    for text, reason in wrong.items():
        (command,) = shell_commands(f"`{text}`")
        assert any(reason in p for p in command_problems(command)), text
