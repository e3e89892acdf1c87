"""Settings: each one a ``MODELKV_`` variable (and a flag, for a command), declared once, as a field of the
typed object it configures.

A setting is a dataclass field made by ``setting()``: its name is the field's (``max_series`` is
``--max-series`` and ``MODELKV_MAX_SERIES``), its default the field's, and beside them its parser and
what it means. ``group()`` nests a typed object whose settings are named with a prefix (``http_``).
A ``Table`` is what one program reads (the engine hook, or one command): the spool directory, then
the settings of its typed objects, with the defaults it changes; ``build`` makes a typed object from
the values a table read. A new setting is one field and its use: flags, variables, parsing and the
reference docs follow from the field.

The one setting engines and sidecars share is here: ``SPOOL_DIR``, the directory both use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from modelkv_exporter.contract.fields import REQUIRED

T = TypeVar("T")


_SETTING = "modelkv_setting"
_GROUP = "modelkv_group"


@dataclass(frozen=True)
class Setting:
    """One setting: its flag, variable, parser and meaning, and its default in each program that reads it.

    A default is ``REQUIRED``, None (optional, and unset), or a value. ``notes`` holds a sentence per
    program that only that program's help adds (the docs show them all).
    """

    dest: str
    parse: Callable[[str], Any]
    help: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)

    @property
    def flag(self) -> str:
        """``--spool-dir`` for ``spool_dir``."""
        return "--" + self.dest.replace("_", "-")

    @property
    def env(self) -> str:
        """``MODELKV_SPOOL_DIR`` for ``spool_dir``."""
        return "MODELKV_" + self.dest.upper()

    def help_for(self, program: str) -> str:
        """The help of this setting as ``program`` shows it."""
        note = self.notes.get(program)
        return f"{self.help} {note}" if note else self.help

    @property
    def full_help(self) -> str:
        """The help with every program's note, for the reference docs."""
        by_note: dict[str, list[str]] = {}
        for program, note in self.notes.items():
            by_note.setdefault(note, []).append(program)
        return " ".join(
            [self.help, *(f"{', '.join(programs)}: {note[:1].lower()}{note[1:]}" for note, programs in by_note.items())]
        )


def setting(default: Any, parse: Callable[[str], Any], help: str) -> Any:
    """A dataclass field that is a setting named as the field is: ``default`` (``REQUIRED`` for none), how a
    flag's or a variable's text becomes its value, and what it means.
    ``REQUIRED`` is the snapshot fields' own "no default" (``contract/fields.py``): one sentinel for both."""
    metadata = {_SETTING: Setting("", parse, help)}
    return field(metadata=metadata) if default is REQUIRED else field(default=default, metadata=metadata)


def group(kind: type, prefix: str = "") -> Any:
    """A dataclass field holding a typed object of ``kind`` whose settings are named ``prefix`` + their own name."""
    return field(default_factory=kind, metadata={_GROUP: prefix})


def settings_of(kind: type, prefix: str = "") -> tuple[tuple[Setting, Any], ...]:
    """Every setting of ``kind`` and of the objects it nests, in field order, each with its field's default."""
    found: list[tuple[Setting, Any]] = []
    for item in fields(kind):
        if _GROUP in item.metadata:
            assert isinstance(item.default_factory, type)
            found += settings_of(item.default_factory, prefix + item.metadata[_GROUP])
        elif _SETTING in item.metadata:
            row: Setting = item.metadata[_SETTING]
            default = REQUIRED if item.default is dataclasses.MISSING else item.default
            found.append((dataclasses.replace(row, dest=prefix + item.name), default))
    return tuple(found)


def build(kind: type[T], values: Mapping[str, Any], /, **given: Any) -> T:
    """A ``kind`` from the values a table read, by setting name: a value that is None keeps the field's
    default. ``given`` fills the fields that are no settings (a directory, say)."""
    return kind(**given, **_arguments(kind, values, ""))


def _arguments(kind: type, values: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    arguments: dict[str, Any] = {}
    for item in fields(kind):
        if _GROUP in item.metadata:
            assert isinstance(item.default_factory, type)
            nested = item.default_factory
            arguments[item.name] = nested(**_arguments(nested, values, prefix + item.metadata[_GROUP]))
        elif _SETTING in item.metadata:
            value = values.get(prefix + item.name)
            if value is not None:
                arguments[item.name] = value
    return arguments


SPOOL_DIR = Setting("spool_dir", str, "Directory of engine snapshots (the pod's shared emptyDir).")
"""The directory an engine writes its snapshot into and the sidecar reads: every program reads it, first."""


@dataclass(frozen=True)
class Table:
    """The settings one program reads: ``SPOOL_DIR``, then the settings of each of its typed ``objects``.

    ``defaults`` changes the default of a setting for this program alone (``REQUIRED`` makes it
    required); ``notes`` adds a sentence to a setting's help. Two settings of a program never share a name.
    """

    program: str
    objects: tuple[type, ...]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    notes: Mapping[str, str] = field(default_factory=dict)

    def settings(self) -> tuple[Setting, ...]:
        """Every setting of the program, its ``defaults`` and ``notes`` holding this program's alone."""
        rows = [(SPOOL_DIR, None)] + [row for kind in self.objects for row in settings_of(kind)]
        names = [row.dest for row, _ in rows]
        repeated = {name for name in names if names.count(name) > 1}
        unknown = (set(self.defaults) | set(self.notes)) - {row.dest for row, _ in rows}
        if repeated or unknown:
            raise ValueError(f"{self.program}: settings named twice {sorted(repeated)}, unknown {sorted(unknown)}")
        return tuple(
            dataclasses.replace(
                row,
                defaults={self.program: self.defaults.get(row.dest, default)},
                notes={self.program: self.notes[row.dest]} if row.dest in self.notes else {},
            )
            for row, default in rows
        )

    def from_environ(self, environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
        """Each setting from its variable, else its default (None when it has none).

        Returns the values by name, and a message by name for each malformed variable (whose default is kept).
        """
        values: dict[str, Any] = {}
        problems: dict[str, str] = {}
        for row in self.settings():
            default = row.defaults[self.program]
            values[row.dest] = None if default is REQUIRED else default
            raw = environ.get(row.env)
            if raw is None or not raw.strip():
                continue
            try:
                values[row.dest] = row.parse(raw.strip())
            except ValueError as error:
                problems[row.dest] = f"{row.env}={raw!r}: {error}"
        return values, problems
