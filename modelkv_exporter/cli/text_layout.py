"""Text laid out for a terminal: tables whose columns fit its width, long names cut where a part ends, commands that
still paste when they wrap. What ``inspect``, ``plan`` and ``check`` print is laid out here."""

from __future__ import annotations

import re
import shutil
import textwrap
from collections.abc import Sequence

from modelkv_exporter.sidecar.presentation.safe_text import printable

_NUMERIC = re.compile(r"\d+(\.\d+)?( [KMGT]?i?B)?")
_BREAK = re.compile(r"[./_\-:\s]+")
MAX_WIDTH = 120
MIN_WIDTH = 60
MIN_COLUMN = 8


def report_width() -> int:
    """The terminal's width, kept between ``MIN_WIDTH`` and ``MAX_WIDTH`` (``MAX_WIDTH`` when not a terminal)."""
    return max(MIN_WIDTH, min(MAX_WIDTH, shutil.get_terminal_size((MAX_WIDTH, 24)).columns))


def abbreviate(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: its head and its tail joined by an ellipsis, cut where a word or
    a path's part ends (at ``.``, ``/``, ``_``, ``-``, ``:`` or a space).

    The tail, which tells module paths and engine ids apart, gets two thirds of the room, the head
    the rest; where no trailing part fits, the head alone is kept, and a text with no such place to
    cut at all is cut in the middle.
    """
    if len(text) <= width:
        return text
    if width < 2:
        return text[:width]
    room = width - 1
    cuts = [m.end() for m in _BREAK.finditer(text) if m.end() < len(text)]
    heads = [0, *cuts]
    head = max(i for i in heads if i <= room // 3)
    tail = next((j for j in cuts if j > head and len(text) - j <= room - head), None)
    if tail is None:
        head = 0
        tail = next((j for j in cuts if len(text) - j <= room), None)
    if tail is None and cuts and cuts[0] <= room:
        return text[: max(i for i in cuts if i <= room)] + "…"
    if tail is None:
        half = room // 2
        return text[:half] + "…" + text[len(text) - (room - half) :]
    head = max(i for i in heads if i <= min(tail, room - (len(text) - tail)))
    return text[:head] + "…" + text[tail:]


def _column_widths(
    headers: Sequence[str], rows: Sequence[Sequence[str]], width: int | None, narrow: Sequence[int]
) -> list[int]:
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=False)]
    if width is None:
        return widths
    floors = [min(w, MIN_COLUMN) if i in narrow else w for i, w in enumerate(widths)]
    while sum(widths) + 2 * (len(widths) - 1) > width:
        shrinkable = [i for i, w in enumerate(widths) if w > floors[i]]
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda i: widths[i])
        widths[widest] -= 1
    return widths


def table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], width: int | None = None, narrow: Sequence[int] = ()
) -> str:
    """Left-aligned columns; numbers and sizes right-aligned.

    With ``width``, the widest of the ``narrow`` columns (free text: names, ids) are narrowed
    until a line fits, and text longer than its column is cut in the middle with an ellipsis.
    """
    widths = _column_widths(headers, rows, width, narrow)

    def line(cells: Sequence[str]) -> str:
        cut = [abbreviate(c, w) for c, w in zip(cells, widths, strict=True)]
        return "  ".join(
            c.rjust(w) if _NUMERIC.fullmatch(c) else c.ljust(w) for c, w in zip(cut, widths, strict=True)
        ).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def wrapped(text: str, width: int, indent: str = "") -> str:
    """``text`` in lines of at most ``width`` columns, each after the first indented four more than ``indent``."""
    return textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent + "    ")


def command_lines(label: str, command: str, note: str, width: int, indent: str = "") -> list[str]:
    """A command to paste, then its note (beside it where it fits).

    A command is never wrapped inside a word (a path breaks at its hyphens otherwise): one longer than
    the line is split between its arguments with a shell continuation, so it still pastes as it is.
    """
    words, lines = printable(command).split(" "), [f"{indent}{label}"]
    for word in words:
        if len(lines[-1]) + 1 + len(word) + 2 > width and lines[-1].strip() not in (label, ""):
            lines[-1] += " \\"
            lines.append(indent + "    " + word)
        else:
            lines[-1] += " " + word
    if len(lines[-1]) + 1 + len(note) <= width:
        lines[-1] += " " + note
        return lines
    return [*lines, wrapped(note, width, indent + "    ")]
