"""The contract: everything an engine and a sidecar must agree on, and nothing else.

An engine process writes snapshots into a spool directory; a sidecar, with neither torch nor
vLLM, reads them. They may run different versions of this package, so what they share is
small, standard library only, and versioned (``docs/snapshot-format.md``):

- ``snapshot``: what one engine process publishes, as plain dataclasses, and the format's
  version (``SCHEMA_VERSION``);
- ``vocabulary``: the words a snapshot carries: cache scopes, row drivers, measured-memory
  sources, reasons a declaration was dropped;
- ``arithmetic``: the protocol's byte arithmetic, which the writer applies and the reader checks;
- ``spool``: where the snapshots go: one file per engine, its name, and the atomic writer;
- ``settings``: how a setting is spelled and read (a flag and a ``MODELKV_`` variable), and the
  one setting both sides read, the spool directory; ``setting_values``: every kind of value a
  setting takes, with its parser; ``sizes``: byte sizes as people write and read them;
- ``version``: the package's version, stamped by both sides;
- ``fields``: how a snapshot field is declared once (type, bounds, meaning), which the writer,
  the reader and the docs follow;
- ``validity``: what makes a field value and a declaration valid, for the engine and the reader;
- ``thresholds``: the tolerances that judge an engine.

How the sidecar reads and judges a spool is the sidecar's (``sidecar.reader``); how an engine
fills a snapshot is the engine's.
"""
