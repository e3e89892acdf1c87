"""Which cache object each observed layer belongs to: how the check tells rows from layers.

Separate cache objects live at once (one per request in a dict or list, a pool of static caches,
a retained cache beside a working copy) hold separate rows; the layers of one cache are its
layers. The observer sees layers only, so the check keeps track of the caches itself, from three
places: every ``transformers`` cache constructed or deep-copied during the run (its constructors
wrapped, and a ``__setstate__`` added, for the run's duration), the caches an owner holds in its own attributes when the run starts (a pool
built before it), and the cache whose method is on the call stack when a layer's bytes change.

An encoder-decoder cache is one cache: its self-attention and cross-attention caches are its parts.
Only plain attributes are read (``vars()``), never the model's code. Test-process only: an engine
never loads this.
"""

from __future__ import annotations

import functools
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import Any

PARTS = ("self_attention_cache", "cross_attention_cache")
"""Attributes of a cache made of caches (``EncoderDecoderCache``)."""
ATTRIBUTE_DEPTH = 3
"""How deep an owner's attributes are searched for caches (a dict of lists of caches is depth 2)."""
STACK_FRAMES = 16
"""How many frames above a byte change are searched for the cache being updated."""

Where = tuple[int, int]
"""``(cache, part)``: the ``id`` of the outermost cache a layer belongs to, and of the one that holds it directly."""


def _cache_classes(base: type) -> Iterator[type]:
    seen: set[type] = set()
    stack = [base]
    while stack:
        cls = stack.pop()
        if cls not in seen:
            seen.add(cls)
            yield cls
            stack.extend(cls.__subclasses__())


class CacheTracker:
    """The ``transformers`` caches alive during one check, and the cache each layer belongs to."""

    def __init__(self) -> None:
        self.caches: weakref.WeakSet[Any] = weakref.WeakSet()
        self._cache_type: type | None = None
        self._replaced: list[tuple[type, Callable[..., None]]] = []
        self._added_setstate: type | None = None

    def install(self) -> None:
        """Record every cache constructed from now on (every cache class's own ``__init__`` wrapped)."""
        try:
            from transformers.cache_utils import Cache
        except ImportError:
            return
        self._cache_type = Cache
        caches = self.caches
        for cls in _cache_classes(Cache):
            init = cls.__dict__.get("__init__")
            if init is None or not callable(init):
                continue

            def recording(self: Any, *args: Any, __init: Callable[..., None] = init, **kwargs: Any) -> None:
                __init(self, *args, **kwargs)
                caches.add(self)

            functools.update_wrapper(recording, init)
            self._replaced.append((cls, init))
            setattr(cls, "__init__", recording)  # noqa: B010 - put back by remove()
        if "__setstate__" not in Cache.__dict__:

            def __setstate__(self: Any, state: Any) -> None:
                """``copy.deepcopy`` (a working copy) builds a cache without ``__init__``: restore as copy does, record."""
                slots = None
                if isinstance(state, tuple) and len(state) == 2:
                    state, slots = state
                if state:
                    self.__dict__.update(state)
                for key, value in (slots or {}).items():
                    setattr(self, key, value)
                caches.add(self)

            Cache.__setstate__ = __setstate__  # type: ignore[attr-defined]
            self._added_setstate = Cache

    def remove(self) -> None:
        """Put every constructor back."""
        for cls, init in reversed(self._replaced):
            setattr(cls, "__init__", init)  # noqa: B010
        self._replaced.clear()
        if self._added_setstate is not None:
            delattr(self._added_setstate, "__setstate__")
            self._added_setstate = None

    def seed(self, owners: Iterable[object]) -> None:
        """Record the caches the owners already hold in their attributes (and in dicts, lists, tuples of them)."""
        for owner in owners:
            self._search(getattr(owner, "__dict__", {}), ATTRIBUTE_DEPTH)

    def _search(self, value: object, depth: int) -> None:
        cache_type = self._cache_type
        if cache_type is None or depth < 0:
            return
        if isinstance(value, cache_type):
            self.caches.add(value)
            return
        items: Iterable[object]
        if isinstance(value, dict):
            items = list(value.values())
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            return
        for item in items:
            self._search(item, depth - 1)

    def note_stack(self) -> None:
        """Record the cache whose method is on the call stack (a layer is being updated through it)."""
        cache_type = self._cache_type
        if cache_type is None:
            return
        frame: FrameType | None = sys._getframe(1)
        for _ in range(STACK_FRAMES):
            if frame is None:
                return
            owner = frame.f_locals.get("self") if frame.f_code.co_argcount else None
            if owner is not None and isinstance(owner, cache_type):
                self.caches.add(owner)
                return
            frame = frame.f_back

    def layer_caches(self) -> dict[int, Where]:
        """``id(layer)`` -> where it belongs, for every layer of every cache alive now."""
        found: dict[int, Where] = {}
        composites = []
        for cache in list(self.caches):
            state = vars(cache)
            if any(part in state for part in PARTS):
                composites.append(cache)
                continue
            for layer in list(state.get("layers") or ()):
                found.setdefault(id(layer), (id(cache), id(cache)))
        for cache in composites:
            state = vars(cache)
            for part_name in PARTS:
                part = state.get(part_name)
                if part is None:
                    continue
                self.caches.add(part)
                for layer in list(vars(part).get("layers") or ()):
                    found[id(layer)] = (id(cache), id(part))
        return found
