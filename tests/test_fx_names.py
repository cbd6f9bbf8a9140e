"""Forced fx names its nodes as torch.fx does, also after it rolled back a module it could not
trace through and kept it as one op: checked against a plain ``torch.fx.Tracer`` that keeps the
same modules as single ops from the start."""

from __future__ import annotations

import pytest
import torch
import torch.fx
from torch import nn

import fxviz


class Block(nn.Module):
    """Records ops, then decides on a traced value (a proxy's rank): fx stops there."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu((self.lin(x) + 1) * 2)
        if h.dim() == 3:
            return h + x
        return h - x


class Wrapper(nn.Module):
    """Traces through its block (which is rolled back), then stops itself: a rollback in a rollback."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(self.block(x + 1) * 2)
        if h.shape[0] == 2:
            h = h + 1
        return h.relu()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block, self.wrapper, self.lin = Block(), Wrapper(), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(x + 1) * 2
        z = self.wrapper(self.block(y) * 2)
        return torch.relu(self.lin(z + y) * 2) + x


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wrapper = Wrapper()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.wrapper(x) * 2 + 1)


class _KeepAsOneOp(torch.fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, (Block, Wrapper)) or super().is_leaf_module(m, qualname)


@pytest.mark.parametrize("model", [Net(), Outer()], ids=["blocks", "nested"])
def test_nodes_after_a_rollback_are_named_as_torch_fx_names_them(model: nn.Module) -> None:
    model.eval()
    g = fxviz.capture(model, (torch.randn(2, 3, 8),), method="fx")
    want = [n.name for n in _KeepAsOneOp().trace(model).nodes if n.op not in ("placeholder", "output", "get_attr")]
    assert [n.name for n in g.nodes if n.kind == "op"] == want
    assert any(n.attrs.get("opaque") for n in g.nodes)  # the premise: fxviz rolled something back
