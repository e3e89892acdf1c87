"""Every setting in one table: each is a CLI flag and a ``MODELKV_`` environment variable.

The CLI builds its parsers from this table, the engine hook reads its variables through it,
and ``docs/configuration.md`` is generated from it, so flags, variables and docs cannot
drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from modelkv_exporter.contract import limits
from modelkv_exporter.contract.scan import DEFAULT_MAX_SNAPSHOT_BYTES, DEFAULT_MAX_SPOOL_BYTES, DEFAULT_MAX_SPOOL_FILES
from modelkv_exporter.contract.sizes import parse_bytes
from modelkv_exporter.contract.state import DEFAULT_FORGET_AFTER_SECONDS, DEFAULT_STALE_AFTER_SECONDS


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{text!r} is not a finite number")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = _whole_number(text)
    if value < 1:
        raise ValueError(f"{value} is not 1 or more")
    return value


def port_number(text: str) -> int:
    """A TCP port, 0 to 65535 (0 picks a free one)."""
    value = _whole_number(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"{value} is not a port (0 to 65535)")
    return value


def non_negative_float(text: str) -> float:
    """A number >= 0."""
    value = _number(text)
    if value < 0:
        raise ValueError(f"{text} is not 0 or more")
    return value


def positive_float(text: str) -> float:
    """A number > 0."""
    value = _number(text)
    if value <= 0:
        raise ValueError(f"{text} is not more than 0")
    return value


def log_level(text: str) -> str:
    """One of Python's logging level names."""
    value = text.lower()
    if value not in ("critical", "error", "warning", "info", "debug"):
        raise ValueError(f"{text} is not a log level (critical, error, warning, info or debug)")
    return value


@dataclass(frozen=True)
class Setting:
    """One setting: its flag, variable, parser, meaning, and default per command.

    A default of None makes the setting required for that command; "" makes it optional and unset.
    ``notes`` holds a sentence per command that only that command's help adds (the docs show them all).
    """

    dest: str
    parse: Callable[[str], Any]
    help: str
    defaults: Mapping[str, Any]
    notes: Mapping[str, str] = field(default_factory=dict)

    def help_for(self, command: str) -> str:
        """The help of this setting as ``command`` shows it."""
        note = self.notes.get(command)
        return f"{self.help} {note}" if note else self.help

    @property
    def full_help(self) -> str:
        """The help with every command's note, for the reference docs."""
        by_note: dict[str, list[str]] = {}
        for command, note in self.notes.items():
            by_note.setdefault(note, []).append(command)
        return " ".join(
            [self.help, *(f"{', '.join(commands)}: {note[:1].lower()}{note[1:]}" for note, commands in by_note.items())]
        )

    @property
    def flag(self) -> str:
        """``--spool-dir`` for ``spool_dir``."""
        return "--" + self.dest.replace("_", "-")

    @property
    def env(self) -> str:
        """``MODELKV_SPOOL_DIR`` for ``spool_dir``."""
        return "MODELKV_" + self.dest.upper()


DEFAULT_SAMPLE_INTERVAL = 5.0
MIN_SAMPLE_INTERVAL = 1.0


def sample_interval(text: str) -> float:
    """Seconds between samples, at least 1."""
    return max(MIN_SAMPLE_INTERVAL, _number(text))


def switch(text: str) -> bool:
    """On or off: 1, true, yes, on; 0, false, no, off."""
    value = text.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{text!r} is neither on (1, true, yes, on) nor off (0, false, no, off)")


def byte_size(text: str) -> int:
    """A size in bytes above 0: 1073741824, 512MiB, 2GiB."""
    value = parse_bytes(text)
    if value < 1:
        raise ValueError(f"{text!r} is not a size above 0 bytes")
    return value


ENGINE = "engine"


def _served(default: Any) -> dict[str, Any]:
    """One default for the two commands that serve HTTP: ``serve`` and ``demo``."""
    return {"serve": default, "demo": default}


def _read_spool(default: Any) -> dict[str, Any]:
    """One default for every command that reads a spool."""
    return {"serve": default, "demo": default, "inspect": default, "plan": default}


"""Settings of the in-engine hook: environment variables only (the engine owns the command line)."""

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "spool_dir",
        str,
        "Directory of engine snapshots (the pod's shared emptyDir).",
        {"serve": None, "demo": "", "inspect": "", "plan": "", ENGINE: ""},
        notes={
            "demo": "A temporary one is made when unset.",
            "inspect": "The DIR argument gives it too.",
            "plan": "The DIR argument gives it too.",
            ENGINE: "Setting it in the engine's environment turns the vLLM plugin on.",
        },
    ),
    Setting("host", str, "Address the HTTP server binds.", {"serve": "0.0.0.0", "demo": "127.0.0.1"}),
    Setting("port", port_number, "TCP port of the HTTP server.", {"serve": 9400, "demo": 9400}),
    Setting(
        "stale_after",
        non_negative_float,
        "Seconds without a heartbeat after which an engine is stale (at least 3 of its heartbeat intervals).",
        {
            "serve": DEFAULT_STALE_AFTER_SECONDS,
            "demo": DEFAULT_STALE_AFTER_SECONDS,
            "inspect": DEFAULT_STALE_AFTER_SECONDS,
        },
    ),
    Setting(
        "forget_after",
        non_negative_float,
        "Seconds after its last heartbeat at which a stale or ended engine's file is forgotten: no longer exported, "
        'only counted (modelkv_exporter_spool_files{state="forgotten"}); 0 never forgets.',
        {
            "serve": DEFAULT_FORGET_AFTER_SECONDS,
            "demo": DEFAULT_FORGET_AFTER_SECONDS,
            "inspect": DEFAULT_FORGET_AFTER_SECONDS,
        },
    ),
    Setting(
        "max_snapshot_bytes",
        byte_size,
        "Snapshot files larger than this are rejected unread (262144, 256KiB).",
        {
            "serve": DEFAULT_MAX_SNAPSHOT_BYTES,
            "demo": DEFAULT_MAX_SNAPSHOT_BYTES,
            "inspect": DEFAULT_MAX_SNAPSHOT_BYTES,
            "plan": DEFAULT_MAX_SNAPSHOT_BYTES,
        },
    ),
    Setting(
        "log_level", log_level, "Log level: critical, error, warning, info or debug.", {"serve": "info", "demo": "info"}
    ),
    Setting("heartbeat_interval", non_negative_float, "Seconds between the demo engines' heartbeats.", {"demo": 5.0}),
    Setting(
        "duration",
        non_negative_float,
        "Stop the demo after this many seconds (0 runs until interrupted).",
        {"demo": 0.0},
    ),
    Setting("max_num_seqs", positive_int, "The max_num_seqs to plan for.", {"plan": None}),
    Setting(
        "budget",
        byte_size,
        "Bytes the declared peak may take (1073741824, 512MiB, 2GiB); plan then prints the largest max_num_seqs that fits.",
        {"plan": ""},
    ),
    Setting(
        "sample_interval",
        sample_interval,
        "Seconds between the engine's memory samples and heartbeats (at least 1).",
        {ENGINE: DEFAULT_SAMPLE_INTERVAL},
    ),
    Setting(
        "engine_id",
        str,
        "Prefix of the engine ids the plugin publishes under (default: the served model name, else the "
        "model directory's name); "
        "set it when two engines in one pod serve the same model name.",
        {ENGINE: ""},
    ),
    Setting(
        "observe",
        switch,
        "Observe what the transformers caches of each declaring owner really hold (1 or 0); "
        "0 installs no hook at all, and every observed figure is then absent.",
        {ENGINE: True},
    ),
    Setting(
        "max_spool_files",
        positive_int,
        "Snapshot files read per scan, the first by name; the others are counted as rejected (over_budget), not read.",
        _read_spool(DEFAULT_MAX_SPOOL_FILES),
    ),
    Setting(
        "max_spool_bytes",
        byte_size,
        "Bytes of snapshot files read per scan, the first files by name; the others are counted as rejected "
        "(over_budget), not read.",
        _read_spool(DEFAULT_MAX_SPOOL_BYTES),
    ),
    Setting(
        "max_declarations",
        positive_int,
        "A snapshot with more declarations, or more entries of dropped declarations, is rejected (over_budget).",
        _served(limits.MAX_DECLARATIONS),
    ),
    Setting(
        "max_label_bytes",
        byte_size,
        "A snapshot whose series carry more bytes of label values in all is rejected (over_budget).",
        _served(limits.MAX_LABEL_BYTES),
    ),
    Setting(
        "max_series",
        positive_int,
        "Series of all engines in one scrape; engines, in file-name order, that would pass it are rejected (over_budget).",
        _served(limits.MAX_SERIES),
    ),
    Setting(
        "max_scrape_label_bytes",
        byte_size,
        "Bytes of label values of all engines in one scrape; engines, in file-name order, that would pass it are "
        "rejected (over_budget).",
        _served(limits.MAX_SCRAPE_LABEL_BYTES),
    ),
    Setting(
        "probe_port",
        port_number,
        "TCP port of the liveness listener: GET /healthz answered from its own thread, 200 while the server's "
        "event loop turns (0 turns it off; /healthz on --port answers too).",
        {"serve": limits.PROBE_PORT, "demo": 0},
    ),
    Setting(
        "http_max_connections",
        positive_int,
        "Open HTTP connections; a new one closes the longest-idle, else it is closed unanswered.",
        _served(limits.HTTP_MAX_CONNECTIONS),
    ),
    Setting(
        "http_max_line_bytes",
        byte_size,
        "Longest request line (else 414) and header line (else 431).",
        _served(limits.HTTP_MAX_LINE_BYTES),
    ),
    Setting(
        "http_max_header_bytes",
        byte_size,
        "Longest request head, request line and headers together (else 431).",
        _served(limits.HTTP_MAX_HEADER_BYTES),
    ),
    Setting(
        "http_max_headers",
        positive_int,
        "Most header lines in a request (else 431).",
        _served(limits.HTTP_MAX_HEADERS),
    ),
    Setting(
        "http_max_body_bytes",
        byte_size,
        "Largest request body: a larger declared one is answered 413, an unread one is dropped up to this size, "
        "beyond it the connection is closed.",
        _served(limits.HTTP_MAX_BODY_BYTES),
    ),
    Setting(
        "http_header_timeout",
        positive_float,
        "Seconds from a request head's first byte to its end (else 408).",
        _served(limits.HTTP_HEADER_TIMEOUT),
    ),
    Setting(
        "http_idle_timeout",
        positive_float,
        "Seconds a connection may wait for its next request before it is closed.",
        _served(limits.HTTP_IDLE_TIMEOUT),
    ),
    Setting(
        "http_send_timeout",
        positive_float,
        "Seconds a client has to take a response; then the connection is aborted.",
        _served(limits.HTTP_SEND_TIMEOUT),
    ),
    Setting(
        "http_max_unsent_bytes",
        byte_size,
        "Bytes held for responses clients have not taken yet (distinct bodies, and unsent bytes in connections); "
        "past it the oldest response (or the connection holding the most) is aborted.",
        _served(limits.HTTP_MAX_UNSENT_BYTES),
    ),
)


def settings_of(command: str) -> tuple[Setting, ...]:
    """The settings ``command`` takes, in table order."""
    return tuple(setting for setting in SETTINGS if command in setting.defaults)


def from_environ(command: str, environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Each setting of ``command`` from its variable, else its default (None when unset).

    Returns the values by ``dest``, and a message by ``dest`` for each malformed variable (whose default is kept).
    """
    values: dict[str, Any] = {}
    problems: dict[str, str] = {}
    for setting in settings_of(command):
        declared = setting.defaults[command]
        values[setting.dest] = None if declared in ("", None) else declared
        raw = environ.get(setting.env)
        if raw is None or not raw.strip():
            continue
        try:
            values[setting.dest] = setting.parse(raw.strip())
        except ValueError as error:
            problems[setting.dest] = f"{setting.env}={raw!r}: {error}"
    return values, problems
