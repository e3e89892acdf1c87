"""Observed model-local KV: what the ``transformers`` caches of each declaring owner really hold.

After load, ``install`` wraps each owner's own methods (so "this owner is running" is known) and
the cache layer classes' ``update`` and friends, their constructor and deep copies (so each
layer is attributed to the owner running when it is first seen, and weighed exactly: the
storages behind its tensors). Per owner it keeps the high-water of bytes live since start and
within the last sample interval, and the calls that used a cache; ``Observer.sample`` turns them
into the snapshot's ``Observation`` records at every heartbeat. The hooks are installed once a
process (``Installation``); each model gets an ``Observer`` of its own, which samples its own owners.

- ``layers``: which layer classes are understood, and how one layer is weighed;
- ``records``: the per-owner counters and per-layer weak records;
- ``tally``: each owner's distinct storages kept between samples, re-weighed only where layers changed;
- ``hooks``: the hot path (what runs inside the model's calls) and the failure switch;
- ``patches``: installing and removing the class and owner wrappers;
- ``wrappers``: an owner method's wrapper, of the method's own kind (generator, coroutine);
- ``transformers_check``: the install-time check that this transformers keeps caches as the hooks expect;
- ``observer``: ``install``, ``Installation``, ``Observer`` and its sampling.
"""

from modelkv_exporter.engine.config import observation_enabled
from modelkv_exporter.engine.observe.observer import Installation, Observer, install, installed

__all__ = ["Installation", "Observer", "install", "installed", "observation_enabled"]
