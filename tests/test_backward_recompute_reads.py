"""Which backward ops read a checkpoint's recomputed values, on the eager path, checked against
torch's own record of the same step: the tensors each autograd node of a real step unpacks
(``node._saved_*``, which checkpoint's unpack hook answers with its recomputation)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

import fxviz
from fxviz.ir import Graph
from tests.backward_models import autograd_nodes, default_loss


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.n = nn.LayerNorm(16)
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(nn.functional.gelu(self.a(self.n(x))))


class Checkpointed(nn.Module):
    """Three residual blocks, each under a non-reentrant checkpoint, on 3-d activations: each linear
    is a view, an addmm and a view, so the op's output's grad_fn (a ViewBackward0) unpacks nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(3)])
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False)
        return self.head(x)


class _Made(TorchDispatchMode):
    """The storages of every tensor the forward makes (kept alive, so that none is reused)."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[torch.Tensor] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.kept += [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        return out


def torch_recompute_readers(model: nn.Module, x: torch.Tensor) -> Counter[str]:
    """Per autograd node type of a real step, how many nodes unpack a tensor that neither the forward
    made nor is a parameter or the input: a recomputed value (torch's own unpacking of each
    ``_saved_*``; the first one of a region runs its recomputation)."""
    with _Made() as made:
        loss = default_loss(model(x))
    known = {t.untyped_storage()._cdata for t in [*made.kept, *model.parameters(), x]}
    readers: Counter[str] = Counter()
    for f in autograd_nodes(loss):
        saved = [getattr(f, a) for a in dir(f) if a.startswith("_saved_")]
        if any(isinstance(t, torch.Tensor) and t.untyped_storage()._cdata not in known for t in saved):
            readers[type(f).__name__] += 1
    return readers


def fxviz_recompute_readers(g: Graph) -> Counter[str]:
    recomputed = {n.name for n in g.nodes if n.phase == "recompute"}
    return Counter(n.target for n in g.nodes
                   if n.phase == "backward" and any(r.node in recomputed for r in n.inputs))


def test_the_backward_ops_that_read_a_recomputation_are_those_that_unpack_it() -> None:
    """A linear's ViewBackward0 was said to read the linear's recomputation, which runs later (the
    graph JSON then failed to load: 'inputs' not an earlier node), and a GeluBackward0 its own
    op's recomputed output rather than its input's. Now each read is an unpack torch makes: the
    addmm's (its mat1) and the GELU's (its input) per block, 6 and 3, as a real step's autograd
    nodes unpack; no op reads a node listed after it."""
    torch.manual_seed(0)
    model, x = Checkpointed(), torch.randn(2, 5, 16)
    expected = torch_recompute_readers(model, x)
    model.zero_grad(set_to_none=True)
    g = fxviz.capture(model, (x,), backward=True, method="eager")
    place = {n.name: k for k, n in enumerate(g.nodes)}
    late = [(n.name, r.node) for n in g.nodes for r in n.inputs if place[r.node] >= place[n.name]]
    assert not late
    assert Graph.from_json(g.to_json()).to_json() == g.to_json()
    got = fxviz_recompute_readers(g)
    assert got["ViewBackward0"] == 0 and expected["ViewBackward0"] == 0
    assert (got["AddmmBackward0"], got["GeluBackward0"]) == (expected["AddmmBackward0"], expected["GeluBackward0"]) == (6, 3)
    assert got <= expected  # torch's LayerNorm also unpacks its recomputed mean and rstd, which no node outputs
    by = {n.name: n for n in g.nodes}
    for n in g.nodes:
        if n.target == "GeluBackward0":
            (r,) = [r for r in n.inputs if by[r.node].phase == "recompute"]
            assert by[r.node].attrs["recomputes"].startswith("linear"), r  # its input, the first linear's output
