"""A fuzz of random module graphs (issue 9): chains of blocks that write in place, BatchNorm in train
and eval mode, chunk/slice/setitem, dropout, captured by every method forced and by ``auto``. Each
capture must give the outputs' shapes and names of a plain forward, cover every module in which an
ATen op ran (the ground truth of ``capture_models.aten_modules``), and leave the model, its inputs
and the process as it found them (``statecheck``).
"""

from __future__ import annotations

import copy
from typing import Any

import capture_models as cm
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from statecheck import assert_unchanged, take
from torch import nn

import fxviz

pytestmark = pytest.mark.slow

WIDTH = 8
METHODS = ["export", "export-strict", "fx", "eager", "auto"]
KINDS = ["linear", "inplace", "batchnorm", "batchnorm_cumulative", "chunk", "slice_setitem", "dropout"]


class Block(nn.Module):
    """One block of a random graph: what it does is its ``kind``."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        if kind in ("linear", "inplace", "chunk"):
            self.proj = nn.Linear(WIDTH, WIDTH)
        elif kind == "batchnorm":
            self.norm = nn.BatchNorm1d(WIDTH)
        elif kind == "batchnorm_cumulative":
            self.norm = nn.BatchNorm1d(WIDTH, momentum=None)
        elif kind == "dropout":
            self.drop = nn.Dropout(0.25)
        else:
            self.register_buffer("scale", torch.full((WIDTH // 2,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "linear":
            return self.proj(x)
        if self.kind == "inplace":
            y = self.proj(x)
            y.relu_()
            return y.add_(1.0)
        if self.kind in ("batchnorm", "batchnorm_cumulative"):
            return self.norm(x)
        if self.kind == "chunk":
            a, b = self.proj(x).chunk(2, dim=-1)
            return torch.cat([b * torch.sigmoid(a), a], dim=-1)
        if self.kind == "dropout":
            return self.drop(x)
        y = x.clone()
        y[:, : WIDTH // 2] = y[:, : WIDTH // 2] * self.scale
        return y


class Random(nn.Module):
    """Blocks in a row; the output is the last block's result and, by name, one in the middle."""

    def __init__(self, kinds: list[str], mid: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(k) for k in kinds)
        self.mid = mid

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        middle = x
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i == self.mid:
                middle = x
        return x, {"middle": middle}


@st.composite
def models(draw: Any) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=6))
    model = Random(kinds, draw(st.integers(0, len(kinds) - 1)))
    model.train(draw(st.booleans()))
    torch.manual_seed(draw(st.integers(0, 2**16)))
    return model, (torch.randn(draw(st.integers(2, 4)), WIDTH),)


def plain_outputs(model: nn.Module, args: tuple[torch.Tensor, ...]) -> dict[str, tuple[int, ...]]:
    """Output names and shapes of a plain forward, run on a copy (BatchNorm's statistics stay put)."""
    x, named = copy.deepcopy(model)(*args)
    return {"output[0]": tuple(x.shape), "output[1].middle": tuple(named["middle"].shape)}


def check(model: nn.Module, args: tuple[torch.Tensor, ...], method: str) -> None:
    truth, _ = cm.aten_modules(model, args, {})
    expected = plain_outputs(model, args)
    before = take(model, args)
    try:
        g = fxviz.capture(model, args, method=method)
    except fxviz.CaptureError:
        # a symbolic method may fail for torch's own reasons (export cannot trace a cumulative
        # BatchNorm's ``1 / num_batches_tracked`` in train mode); the failure must leave nothing behind,
        # and the eager tracer and auto must never fail
        assert_unchanged(before, take(model, args))
        assert method not in ("eager", "auto")
        return
    assert_unchanged(before, take(model, args))
    g.validate()
    if method != "auto":
        assert g.method == method
    got = {n.target: tuple(n.outputs[0].shape) for n in g.outputs}
    assert got == expected, (method, got, expected)
    assert truth <= cm.graph_modules(g), f"{method}: missing modules {sorted(truth - cm.graph_modules(g))}"


@pytest.mark.parametrize("method", METHODS)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=models())
def test_random_graphs_capture_complete_and_leave_state(method: str, case: Any) -> None:
    model, args = case
    check(model, args, method)
