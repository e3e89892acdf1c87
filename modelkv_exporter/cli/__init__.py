"""The ``modelkv-exporter`` command: ``serve`` the sidecar, run the ``demo``, ``inspect`` or ``plan`` a spool.

- ``main``: the commands and the parser; ``arguments``: flags and ``MODELKV_`` variables from
  the settings table; ``reports``: the text of ``inspect`` and ``plan``; ``demo``: the ``demo``
  command over the demo engines (``modelkv_exporter.demo``); ``docgen``: the generated reference docs.
"""

from modelkv_exporter.cli.main import main

__all__ = ["main"]
