"""What the snapshot every capture takes costs the collector (issue 18 point 9): it keeps the
model's dicts without a copy of each, and it is freed before the collection that ends a capture."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch
from torch import nn

import fxviz
from fxviz.torchbridge import guard
from fxviz.torchbridge import run as run_module


def _stack(layers: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(layers))).eval()


def _tracked_made(make: Any) -> tuple[Any, int]:
    """What ``make()`` returns, and how many objects the collector tracks that it left alive."""
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        out = make()
        return out, len(gc.get_objects()) - before
    finally:
        gc.enable()


def test_the_snapshot_keeps_dicts_without_an_object_per_dict() -> None:
    """A model twice as deep holds twice as many module dicts: the snapshot's objects must not
    grow with them (one copy per dict was 1,200 dicts made and walked per capture of a 300-layer
    stack); it still grows by the parameters' aliases, one per tensor."""
    small, big = _stack(20), _stack(40)
    _, n_small = _tracked_made(lambda: guard.ModelState(small, []))
    _, n_big = _tracked_made(lambda: guard.ModelState(big, []))
    dicts_added = sum(1 + bool(m._parameters) + bool(m._modules) for m in big.modules()) - sum(
        1 + bool(m._parameters) + bool(m._modules) for m in small.modules())
    tensors_added = len(list(big.parameters())) - len(list(small.parameters()))
    assert dicts_added == 100 and tensors_added == 40
    assert n_big - n_small <= tensors_added + 10


def test_a_dict_the_forward_changed_is_put_back() -> None:
    model = _stack(3)
    state = guard.ModelState(model, [])
    lin = model[1][0]
    weight, mods = lin.weight, dict(model[2]._modules)
    lin.weight = nn.Parameter(torch.zeros(8, 8))  # rebinds a parameter
    lin.extra = 1  # a new attribute
    del model[2]._modules["1"]
    model[0]._modules["0"], model[0]._modules["1"] = model[0]._modules["1"], model[0]._modules["0"]  # same keys and values, swapped
    state.restore()
    assert lin.weight is weight and "extra" not in vars(lin)
    assert model[2]._modules == mods and list(model[2]._modules) == ["0", "1"]
    assert isinstance(model[0][0], nn.Linear) and isinstance(model[0][1], nn.ReLU)


def test_the_snapshot_is_gone_before_the_closing_collection(monkeypatch: pytest.MonkeyPatch) -> None:
    """The collection that ends a capture walks what the capture left in the young generation:
    the snapshot (a copy of the model's dicts, an alias of every tensor) is freed before it."""
    model, x = _stack(5), torch.randn(2, 8)
    alive: list[int] = []
    collect = gc.collect

    def spy(generation: int = 2) -> int:
        alive.append(sum(type(o) is guard.ModelState for o in gc.get_objects()))
        return collect(generation)

    monkeypatch.setattr(run_module.gc, "collect", spy)
    fxviz.capture(model, (x,), method="eager", passes=())
    assert alive == [0]
