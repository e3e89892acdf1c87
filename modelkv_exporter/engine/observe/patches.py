"""Where the observer hooks in: the cache layer classes, ``torch.cuda.CUDAGraph``, and each owner's class.

Only class attributes are patched (and restored by ``ClassPatches.remove``). An owner's entry methods
are wrapped once on its class, where they resolve; the wrapper looks its ``self`` up among the observed
owners (``hooks.owners``) and passes any other instance straight through. No owner object is changed:
a deep copy runs its own methods on its own state, and pickling sees nothing of the observer. A wrapper is
of its method's kind and resolves names as the method does (``wrappers``).
"""

from __future__ import annotations

import types
from typing import Any

import torch

from modelkv_exporter.engine.observe import hooks
from modelkv_exporter.engine.observe.layers import HOOKED_METHODS
from modelkv_exporter.engine.observe.records import OwnerState
from modelkv_exporter.engine.observe.wrappers import wrap_owner_method

SPECS_METHOD = "model_local_kv_specs"
_FOREIGN_MODULES = ("torch.", "transformers.", "vllm.", "builtins")
_ABSENT = object()
_GRAPH_CALLBACKS = (
    ("capture_begin", hooks.on_capture_begin, None),
    ("capture_end", None, hooks.on_capture_end),
    ("replay", hooks.on_replay, None),
)


class ClassPatches:
    """The class attributes the observer replaced, so that they can be put back."""

    def __init__(self) -> None:
        self._replaced: list[tuple[type, str, Any]] = []
        self._mixin: type | None = None
        self._added_setstate = False
        self._init_subclass: Any = None

    def _set(self, cls: type, name: str, value: Any) -> None:
        self._replaced.append((cls, name, cls.__dict__.get(name, _ABSENT)))
        setattr(cls, name, value)

    def hook_owner(self, owner: object, state: OwnerState) -> None:
        """Observe ``owner``: wrap its class's entry methods where they resolve (once), and register it."""
        cls = type(owner)
        for name in owner_method_names(owner):
            site, function = _resolve(cls, name)
            if function is None or getattr(function, hooks.ENTRY, False):
                continue
            target = cls if _foreign(site) else site
            try:
                self._set(target, name, wrap_owner_method(function))
            except (TypeError, AttributeError) as error:
                state.unknown = f"cannot wrap {cls.__qualname__}.{name}: {error}"
        hooks.owners[id(owner)] = state

    def hook_layer_class(self, cls: type) -> None:
        """Wrap the measured methods ``cls`` itself defines."""
        for name in HOOKED_METHODS:
            function = cls.__dict__.get(name)
            if not isinstance(function, types.FunctionType) or getattr(function, "__isabstractmethod__", False):
                continue
            if not hasattr(function, hooks.ORIGINAL):
                self._set(cls, name, hooks.wrap_layer_method(function))

    def install(self, cache_utils: Any) -> None:
        """Hook every layer class of ``cache_utils`` and its subclasses, the ones defined later too."""
        mixin: type = cache_utils.CacheLayerMixin
        stack = [mixin]
        while stack:
            cls = stack.pop()
            self.hook_layer_class(cls)
            stack.extend(cls.__subclasses__())
        self._mixin = mixin
        self._set(mixin, "__init__", hooks.wrap_layer_init(mixin.__dict__["__init__"]))
        if "__setstate__" not in mixin.__dict__:
            mixin.__setstate__ = hooks.layer_setstate  # type: ignore[attr-defined]
            self._added_setstate = True
        original = mixin.__dict__.get("__init_subclass__")
        self._init_subclass = original
        patches = self

        def __init_subclass__(cls: type, **kwargs: Any) -> None:
            if original is not None:
                original.__func__(cls, **kwargs)
            else:
                super(mixin, cls).__init_subclass__(**kwargs)  # type: ignore[misc,arg-type]
            try:
                patches.hook_layer_class(cls)
            except Exception as error:
                hooks.fail("layer subclass hook", error)

        mixin.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]
        graph = getattr(torch.cuda, "CUDAGraph", None)
        if isinstance(graph, type):
            for name, before, after in _GRAPH_CALLBACKS:
                function = graph.__dict__.get(name)
                if isinstance(function, types.FunctionType):
                    self._set(graph, name, hooks.wrap_graph_method(function, before, after))

    def remove(self) -> None:
        """Put back every replaced attribute (and remove the ones added)."""
        for cls, name, value in reversed(self._replaced):
            if value is _ABSENT:
                delattr(cls, name)
            else:
                setattr(cls, name, value)
        self._replaced.clear()
        mixin = self._mixin
        if mixin is None:
            return
        if self._added_setstate and mixin.__dict__.get("__setstate__") is hooks.layer_setstate:
            delattr(mixin, "__setstate__")
        self._added_setstate = False
        if self._init_subclass is not None:
            mixin.__init_subclass__ = self._init_subclass  # type: ignore[assignment]
        else:
            delattr(mixin, "__init_subclass__")
        self._mixin = None


def owner_method_names(owner: object) -> list[str]:
    """The methods through which an owner is entered: its own code's plain methods, ``forward`` and ``generate``.

    Methods inherited from torch, transformers or vLLM are left alone (but the two entry points),
    as are dunders, static and class methods, properties and the declarer. Generator and coroutine
    functions are wrapped as what they are (``wrappers``).
    """
    names: dict[str, None] = {}
    for klass in type(owner).__mro__:
        if _foreign(klass):
            continue
        for name, attribute in vars(klass).items():
            if name.startswith("__") or name == SPECS_METHOD or name in names:
                continue
            if not isinstance(attribute, types.FunctionType):
                continue
            names[name] = None
    for entry in ("forward", "generate"):
        if callable(getattr(type(owner), entry, None)):
            names.setdefault(entry, None)
    return list(names)


def _foreign(klass: type) -> bool:
    module = getattr(klass, "__module__", "") or ""
    return klass is object or module == "torch" or module.startswith(_FOREIGN_MODULES)


def _resolve(cls: type, name: str) -> tuple[type, types.FunctionType | None]:
    """The class in ``cls``'s MRO that defines ``name``, and the plain function it defines (None if not one)."""
    for klass in cls.__mro__:
        attribute = klass.__dict__.get(name, _ABSENT)
        if attribute is not _ABSENT:
            return klass, attribute if isinstance(attribute, types.FunctionType) else None
    return cls, None
