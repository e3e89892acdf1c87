"""Reading the spool: untrusted files to snapshots, within limits, and the state each engine is in.

What the sidecar and the CLI's ``inspect`` and ``plan`` read with; engines never load it.

- ``decode``: untrusted bytes to a ``Snapshot``, or a rejection with a stable reason;
- ``scan``: the incremental reader of a spool directory, within ``SpoolLimits``;
- ``state``: an engine's state (exported, stale, ended, forgotten) and the one classification of a scan.
"""
