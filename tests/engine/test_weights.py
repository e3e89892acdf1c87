"""engine.weights: a model's weights by storage, read without running the model's code."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from modelkv_exporter.engine.weights import model_weight_bytes, storage_bytes


class Loud(torch.Tensor):
    """A tensor subclass whose every torch function is refused (and counted)."""

    calls = 0

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        cls.calls += 1
        raise RuntimeError("the model's __torch_function__ ran")


class Hostile(nn.Module):
    """A model whose own ``parameters``, ``buffers`` and ``__getattr__`` refuse to be called."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 4)
        self.tied = nn.Linear(8, 4)
        self.tied.weight = self.proj.weight
        self.register_buffer("scale", torch.ones(16).as_subclass(Loud))
        self.called: list[str] = []

    def parameters(self, recurse: bool = True) -> Any:
        self.called.append("parameters")
        raise RuntimeError("the model's parameters() ran")

    def buffers(self, recurse: bool = True) -> Any:
        self.called.append("buffers")
        raise RuntimeError("the model's buffers() ran")


def test_weights_count_each_storage_once() -> None:
    model = nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 2))
    model[1].weight = nn.Parameter(model[0].weight.detach()[:2, :4])
    expected = (4 * 8 + 4 + 2) * 4
    assert model_weight_bytes(model) == expected, "a view of the first weight adds nothing"


def test_a_hostile_model_is_weighed_without_its_code() -> None:
    model = Hostile()
    Loud.calls = 0
    assert model_weight_bytes(model) == (4 * 8 + 4 + 4 + 16) * 4, "the tied weight counts once"
    assert model.called == [] and Loud.calls == 0


def test_not_a_module_and_no_tensor() -> None:
    assert model_weight_bytes(object()) is None
    assert model_weight_bytes(nn.ReLU()) == 0
    assert storage_bytes([]) is None
