"""The "Today" tables of docs/benchmarks.md: one marked block per bench, which ``--record`` rewrites.

A block is ``<!-- today:NAME begin ... -->``, the tables the bench ``bench/NAME.py`` printed in its
last recorded run and the date of that run, then ``<!-- today:NAME end -->``. A bench run with
``--record`` prints as usual; when it ends without an error, the Markdown tables it printed (or, if
it printed none, its whole output as text) replace its block, and nothing else in the file
changes. The text around the blocks (each bench's method and goal) is written by hand; earlier runs are in git.
"""

from __future__ import annotations

import io
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from modelkv_testbed import ROOT

BENCHMARKS = ROOT / "docs" / "benchmarks.md"
RECORD_HELP = "also write the tables printed into this bench's block of docs/benchmarks.md's Today section"
_BLOCK = re.compile(r"<!-- today:(?P<name>[\w-]+) begin[^>]*-->\n(?P<body>.*?)<!-- today:(?P=name) end -->", re.S)


def begin_marker(name: str) -> str:
    """The line that opens ``name``'s block, saying which command rewrites it."""
    return f"<!-- today:{name} begin: python -m bench.{name} --record rewrites this block -->"


def end_marker(name: str) -> str:
    """The line that closes ``name``'s block."""
    return f"<!-- today:{name} end -->"


def block_names(text: str) -> list[str]:
    """The benches that have a block in ``text``, in order."""
    return [match.group("name") for match in _BLOCK.finditer(text)]


def block_body(text: str, name: str) -> str:
    """What ``name``'s block holds between its markers."""
    for match in _BLOCK.finditer(text):
        if match.group("name") == name:
            return match.group("body")
    raise KeyError(f"docs/benchmarks.md has no block for {name}: add {begin_marker(name)!r} and its end marker")


def with_block(text: str, name: str, body: str) -> str:
    """``text`` with ``name``'s block holding ``body``, everything outside the block as it was."""
    block_body(text, name)  # the block must exist: a bench never adds one on its own
    new = f"{begin_marker(name)}\n{body.strip()}\n{end_marker(name)}"
    return _BLOCK.sub(lambda m: new if m.group("name") == name else m.group(0), text)


def printed_tables(output: str) -> str:
    """The Markdown tables in a bench's output, a blank line between them; its whole output as text if none."""
    tables: list[list[str]] = []
    previous_was_row = False
    for line in output.splitlines():
        row = line.startswith("|")
        if row and not previous_was_row:
            tables.append([])
        if row:
            tables[-1].append(line.rstrip())
        previous_was_row = row
    if tables:
        return "\n\n".join("\n".join(table) for table in tables)
    return "```text\n" + output.strip() + "\n```"


def record(name: str, output: str, path: Path = BENCHMARKS, when: float | None = None) -> None:
    """Rewrite ``name``'s block in ``path`` with the tables in ``output`` and the time of the run."""
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(time.time() if when is None else when))
    body = f"{printed_tables(output)}\n\nRun of {stamp} (`python -m bench.{name} --record`)."
    path.write_text(with_block(path.read_text(), name, body))


class _Tee(io.TextIOBase):
    """Writes to the terminal and keeps a copy."""

    def __init__(self, terminal: TextIO, copy: io.StringIO) -> None:
        self.terminal, self.copy = terminal, copy

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.terminal.write(text)

    def flush(self) -> None:
        self.terminal.flush()


@contextmanager
def recorded(name: str, enabled: bool, path: Path = BENCHMARKS) -> Iterator[None]:
    """Run a bench's body; if ``enabled`` and it ends without an error, record what it printed in ``name``'s block."""
    if not enabled:
        yield
        return
    copy = io.StringIO()
    terminal = sys.stdout
    sys.stdout = _Tee(terminal, copy)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout = terminal
    record(name, copy.getvalue(), path)
    print(f"recorded in {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: today:{name}")
