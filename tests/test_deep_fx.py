"""Forced fx on a model nested thousands of modules deep: the graph is the one torch.fx records, and
the capture's time grows with the nodes plus the depth, not with their product (torch.fx walks the
model's modules by nested generators and by getattr level by level, and fxviz converted each level
of each call's module stack in Python: 56.7 s at a depth of 2,000 for 0.7 s at 200)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.fx
from torch import nn

import fxviz
from fxviz.symbolic.fx import _Tracer
from tests.state_models import deep_nested


@contextmanager
def deep_recursion() -> Iterator[None]:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # fx traces through each level by a Python call
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


class Gate(nn.Module):
    """A module fx cannot trace through (a branch on a traced value): fxviz rolls back what it
    added and keeps it as one op, after it called the shared module twice inside."""

    def __init__(self, shared: nn.Linear) -> None:
        super().__init__()
        self.shared, self.lin = shared, nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.shared(self.shared(self.lin(x)))
        return x if x.sum() > 0 else -x


class Level(nn.Module):
    """One level of a chain: reads its own parameter and buffer as attributes (fx's ``getattr``),
    calls a module shared by every level (``shared@N`` in the module stacks), its gate if it has
    one, then the next level."""

    def __init__(self, shared: nn.Linear, inner: nn.Module | None, gate: Gate | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 4))
        self.register_buffer("scale", torch.full((4,), 0.5))
        self.shared, self.inner, self.gate = shared, inner, gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.shared(x @ self.weight * self.scale)
        if self.gate is not None:
            x = self.gate(x)
        return self.inner(x) if self.inner is not None else x


def chain(depth: int) -> nn.Module:
    shared = nn.Linear(4, 4)
    inner: nn.Module | None = None
    for k in range(depth):
        inner = Level(shared, inner, Gate(shared) if k == depth // 2 else None)
    assert inner is not None
    return inner


class GateLeaf(torch.fx.Tracer):
    """torch.fx's own tracer, told that a Gate is a leaf: what fxviz's roll-back must leave."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, Gate) or super().is_leaf_module(m, module_qualified_name)


def recorded(graph: torch.fx.Graph) -> list[tuple[Any, ...]]:
    """Each node as torch.fx records it: op, name, target, arguments (by position) and module stack."""
    at = {n: i for i, n in enumerate(graph.nodes)}
    return [(n.op, n.name, n.target, repr(torch.fx.node.map_arg((n.args, n.kwargs), at.__getitem__)),
             list((n.meta.get("nn_module_stack") or {}).items())) for n in graph.nodes]


def test_the_tracer_records_torch_fx_s_graph_deep_down() -> None:
    """fxviz's tracer answers fx's walks from tables made once (module paths, parameter names) and
    shares one module stack per call; the graph is torch.fx's, node for node: names, targets,
    arguments, ``get_attr`` of parameters and buffers, module stacks with their call numbers, and
    after a roll-back (the Gate) the call numbers fx gives when the Gate is a leaf."""
    with deep_recursion():
        for model in (deep_nested(120).eval(), chain(60).eval()):
            ours, theirs = recorded(_Tracer().trace(model)), recorded(GateLeaf().trace(model))
            if isinstance(model, Level):  # names fx took in the Gate's rolled-back trace stay taken
                ours, theirs = ([r[:1] + r[2:] for r in rs] for rs in (ours, theirs))
            assert ours == theirs
    assert [r[1].rpartition(".")[2] for r in ours if r[0] == "call_module"].count("gate") == 1
    assert [r[1] for r in ours if r[0] == "get_attr"][:2] == ["weight", "scale"]
    assert ours[-2][3][-1] == ("shared@59", ("shared", nn.Linear))  # the innermost level's call


def test_the_captured_graph_is_torch_fx_s_graph() -> None:
    """The IR's ops are fx's nodes, in order, with fx's names, inputs and module stacks (each
    level's path and call number, from torch's ``nn_module_stack``)."""
    with deep_recursion():
        model = deep_nested(150).eval()
        g = fxviz.capture(model, (torch.randn(3, 4),), method="fx", isolate=False)
        theirs = [n for n in torch.fx.symbolic_trace(model).graph.nodes if n.op == "call_module"]
    ops = [n for n in g.nodes if n.kind == "op"]
    assert [n.name for n in ops] == [n.name for n in theirs]
    for ir, n in zip(ops, theirs, strict=True):
        stack = tuple((path, int(key.rpartition("@")[2]) if "@" in key else 0)
                      for key, (path, _) in n.meta["nn_module_stack"].items())
        assert ir.stack == stack and ir.module == n.target
        assert [r.node for r in ir.inputs] == [a.name for a in n.args] + [f"{n.target}.weight", f"{n.target}.bias"]


def lines_run(depth: int) -> int:
    """Python lines run (fxviz's and torch's) by a forced fx capture at ``depth``: a count that a
    loaded machine does not move, as CPU time is moved (the timing is bench's, not a test's)."""
    model, x = deep_nested(depth).eval(), torch.randn(3, 4)
    count = [0]

    def line(frame: Any, event: str, arg: Any) -> Any:
        count[0] += 1
        return line

    sys.settrace(lambda frame, event, arg: line)
    try:
        fxviz.capture(model, (x,), method="fx", isolate=False)
    finally:
        sys.settrace(None)
    return count[0]


def test_forced_fx_work_grows_with_the_nodes_plus_the_depth() -> None:
    """Four times the depth (and the nodes) runs four times the Python lines: 3.9x from 100 to 400
    levels, where the walks level by level ran 7.3x (1.04 M, 7.58 M lines) before they were made
    once per capture (89b7446). What still grows with the depth per node is torch's C work (each
    node's name is made from its target, as long as the depth), which bench/ times."""
    with deep_recursion():
        lines_run(20)  # imports and first-call caches out of the way
        small, large = lines_run(100), lines_run(400)
    assert large / small < 4.4, (small, large)
