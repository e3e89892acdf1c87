"""The ``modelkv-exporter`` command: ``serve`` the sidecar, run the ``demo``, ``inspect`` or ``plan`` a spool.

- ``main``: the commands and the parser; ``command_settings``: what each command reads, one settings
  table per command; ``arguments``: a table's flags and ``MODELKV_`` variables; ``reports``: the
  text of ``inspect`` (the spool's report, ``sidecar.presentation``) and ``plan``; ``text_layout``: tables and
  commands fitted to a terminal; ``check_report``: ``check``'s verdicts per owner of a spool;
  ``command_line``: a command as the reader would paste it; ``ports``: binding the ports before
  anything slow starts; ``extras``: the line a command says when an extra it needs is missing; ``demo``: the ``demo`` command over the demo engines
  (``modelkv_exporter.demo``).
"""

from modelkv_exporter.cli.main import main

__all__ = ["main"]
