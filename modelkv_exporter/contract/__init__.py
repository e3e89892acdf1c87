"""The contract between engine processes and the sidecar: the snapshot, its spool, and what they mean.

Standard library only, and importing nothing else of this package: the engine side (inside
vLLM) and the sidecar (without torch or vLLM) both build on it, and they may run different
versions of it, so everything here is versioned and documented in ``docs/snapshot-format.md``.

- ``vocabulary``: cache scopes, row drivers and measured-memory sources;
- ``snapshot``: the published state of one engine process, as plain dataclasses;
- ``decode``: untrusted bytes to a ``Snapshot`` or a reasoned rejection;
- ``spool``: file names and the atomic writer; ``scan``: the incremental reader;
- ``state``: an engine's state (exported, stale, ended) and the one classification of a scan;
- ``arithmetic`` and ``capacity``: the protocol's byte arithmetic and what fits a budget;
- ``sizes``: byte sizes for people; ``settings``: every setting, as a flag and a ``MODELKV_`` variable.
"""
