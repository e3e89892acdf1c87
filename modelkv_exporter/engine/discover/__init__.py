"""Discovered owners: modules of the model that hold caches they do not declare.

- ``module_map``: the model's modules by path, and the code that names each;
- ``stack``: the walk that gives a new cache layer to the innermost module on the call stack, for one model or
  several in one process;
- ``census``: the sliced walk over the tensors the modules hold; ``shards``: the int tables it keeps, split
  so that none grows in one long step; ``safe``: reading what an object holds without running its code;
- ``locals_walk``: the opt-in attribution that reads frames' locals;
- ``discovered_layout``: the key/value geometry seen in a discovered owner's cache layers;
- ``discovery``: ``Discovery`` (attribution, census, baseline, figures), one a model, and ``discover``, which starts it.

Its settings are the engine's (``engine.config.DiscoverySettings``, ``HookConfig.discovery``), re-exported here.

See docs/observed-caches.md ("Discovered owners").
"""

from modelkv_exporter.engine.config import DiscoverySettings
from modelkv_exporter.engine.discover.discovery import Discovery, discover

__all__ = ["Discovery", "DiscoverySettings", "discover"]
