"""The tensors a checkpointed step keeps, counted as torch's own record counts them: an outer
``saved_tensors_hooks`` sees one pack per tensor autograd keeps. Inside a non-reentrant checkpoint
region the parameters are not kept: the recomputation reads them again from the module. The export
path recorded each of them (at 0 bytes) as saved by the op that reads it again, so a headline said
"15 tensors" where torch packs 3 and the eager path says 3."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import fxviz


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False)
        return x


@pytest.mark.parametrize("method", ["export", "eager"])
def test_a_checkpointed_step_keeps_the_tensors_torch_packs(method: str) -> None:
    torch.manual_seed(0)
    model, x = Checkpointed(), torch.randn(4, 8)
    packs: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packs.append(t) or t, lambda t: t):
        model(x).sum().backward()
    model.zero_grad(set_to_none=True)
    g = fxviz.capture(model, (x,), method=method, backward=True)
    assert g.method.startswith(method)
    assert len(g.saved) == len(packs) == 3  # each region's input
    assert sorted(r.shape for r in g.saved) == sorted(tuple(t.shape) for t in packs)
    assert not any(r.shares in ("parameter", "buffer") for r in g.saved)
