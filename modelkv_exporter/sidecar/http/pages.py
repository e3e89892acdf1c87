"""The landing page and the JSON document, rendered once per spool change like /metrics.

Each body is keyed by what it shows: every file's name, version and state, whether the spool
could be listed, and how many files were not read; the landing page also by its age column's
``AGE_STEP_SECONDS`` step and by whether the exporter may still be waiting for its engine's first
snapshot. Clients asking again get the same bytes object: a client hammering
``/`` costs a scan and a send, not a rendering, and responses in flight share one body.

The JSON document is joined from one cached piece per file, so a heartbeat re-encodes one
engine: the encoder holds the interpreter for the whole of what it encodes, and the whole
document of a full spool would stall every other thread (the liveness listener's) for 100 ms.
"""

from __future__ import annotations

import threading

from modelkv_exporter.contract.version import VERSION
from modelkv_exporter.sidecar.attention import CLI, waiting
from modelkv_exporter.sidecar.presentation.engines_document import document_fields, entry_document
from modelkv_exporter.sidecar.presentation.page import render_page
from modelkv_exporter.sidecar.presentation.safe_text import json_body
from modelkv_exporter.sidecar.reader.state import EngineState, SpoolView
from modelkv_exporter.sidecar.source import SpoolSource

AGE_STEP_SECONDS = 5
"""The landing page's ages and generation time are at most this old."""


def view_key(view: SpoolView) -> tuple[object, ...]:
    """What a page of ``view`` shows, but for the clock."""
    files = tuple((item.entry.file_name, item.entry.version, item.state.value) for item in view.entries)
    return (view.scan.ok, view.scan.skipped, files)


class Pages:
    """The sidecar's two documents for people and scripts, cached by ``view_key``. Thread-safe."""

    def __init__(
        self, source: SpoolSource, version: str = VERSION, *, cli: str = CLI, cli_spool: str = "", runbook_url: str = ""
    ) -> None:
        self.source = source
        self.version = version
        self.cli = cli
        """The command the landing page's next steps name."""
        self.cli_spool = cli_spool
        """The spool as those commands name it ("": none; they read MODELKV_SPOOL_DIR)."""
        self.runbook_url = runbook_url
        """Where the landing page links runbook sections ("": it names them in docs/runbook.md)."""
        self.started = source.clock()
        """When the exporter started serving its pages, by the source's clock."""
        self._lock = threading.Lock()
        self._landing: tuple[object, bytes] = (None, b"")
        self._engines: tuple[object, bytes] = (None, b"")
        self._pieces: dict[tuple[str, int, str], bytes] = {}
        self.renders = 0
        """Documents rendered so far (for tests)."""

    def landing(self) -> bytes:
        """The landing page, UTF-8."""
        with self._lock:
            view = self.source.view()
            up_for = view.now - self.started
            key = (view_key(view), int(view.now) // AGE_STEP_SECONDS, waiting(up_for))
            if self._landing[0] != key:
                page = render_page(
                    view,
                    spool_dir=self.source.reader.directory.name,
                    version=self.version,
                    max_discovered=self.source.budget.sidecar_max_discovered_owners,
                    cli=self.cli,
                    cli_spool=self.cli_spool,
                    runbook_url=self.runbook_url,
                    up_for=up_for,
                )
                self._landing = (key, page.encode())
                self.renders += 1
            return self._landing[1]

    def engines(self) -> bytes:
        """The JSON document of ``/api/v1/engines``, ASCII."""
        with self._lock:
            view = self.source.view()
            key = view_key(view)
            if self._engines[0] != key:
                self._engines = (key, self._document(view))
                self.renders += 1
            return self._engines[1]

    def _document(self, view: SpoolView) -> bytes:
        pieces: dict[tuple[str, int, str], bytes] = {}
        lists: dict[bool, list[bytes]] = {False: [], True: []}
        for item in view.entries:
            key = (item.entry.file_name, item.entry.version, item.state.value)
            piece = pieces[key] = self._pieces.get(key) or json_body(
                entry_document(item, self.source.budget.sidecar_max_discovered_owners)
            )
            lists[item.state is EngineState.REJECTED].append(piece)
        self._pieces = pieces
        fields = json_body(document_fields(view, self.source.reader.directory.name))
        return b"".join(
            (fields[:-1], b',"engines":[', b",".join(lists[False]), b'],"rejected":[', b",".join(lists[True]), b"]}")
        )
