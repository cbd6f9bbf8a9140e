"""A line that runs once more under torch.compile than eagerly must not shift the pairing of the ops
after it. ``pair()`` matched each Dynamo op with the next eager op of its (file, line, name): where a
helper's line ran an extra time only on the compiled side (a branch on
``torch.compiler.is_compiling()``, transformers' ``and_masks(causal, padding)`` under Dynamo), the
extra op took that line's later eager op, the cursor jumped past the ops between, and they showed as
"no eager op" (the map), were put in the wrong graph, or were not compared (numerics). Checked
against torch's own record of the same run: the graphs Dynamo hands a backend, whose nodes'
``stack_trace`` says which user line each op ran on, and the compiled model's own output."""

from __future__ import annotations

from typing import Any

import torch
import torch._dynamo as dynamo
from torch import nn

import fxviz
from fxviz.analyze.compilemap.match import pair
from fxviz.analyze.numerics import numerics
from fxviz.ir import Node, SourceLoc


def scale(t: torch.Tensor, k: float = 2.0) -> torch.Tensor:
    return t * k


class Extra(nn.Module):
    """``scale``'s line runs twice compiled, once eagerly: first only under Dynamo (``k``=1, the
    same value), then on both sides."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        if torch.compiler.is_compiling():
            y = scale(y, 1.0)  # the compiled-only op
        z = torch.sin(y)
        w = self.b(z)
        return scale(w).relu()


class ExtraBroken(Extra):
    """The same with a break between: two graphs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        if torch.compiler.is_compiling():
            y = scale(y, 1.0)  # the compiled-only op
        z = torch.sin(y)
        dynamo.graph_break()
        w = self.b(z)
        return scale(w).relu()


def _kept(model: nn.Module, x: torch.Tensor) -> tuple[Any, list[torch.fx.GraphModule]]:
    gms: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        gms.append(gm)
        return gm.forward

    return fxviz.compile_map(model, (x,), backend=keep), gms


def _lines(gm: torch.fx.GraphModule) -> list[tuple[str, str]]:
    """torch's record: each call node's target and the code of its innermost frame (stack_trace)."""
    out = []
    for n in gm.graph.nodes:
        if n.op in ("call_function", "call_method"):
            code = (n.meta.get("stack_trace") or "").strip().splitlines()
            out.append((str(getattr(n.target, "__name__", n.target)), code[-2].strip() if len(code) > 1 else ""))
    return out


def test_a_compiled_only_op_leaves_the_ops_after_it_paired() -> None:
    torch.manual_seed(0)
    cm, (gm,) = _kept(Extra(), torch.randn(2, 4))
    theirs = _lines(gm)
    # torch's graph has the compiled-only mul first, then the eager forward's five ops
    assert [t for t, _ in theirs] == ["linear", "mul", "sin", "linear", "mul", "relu"]
    assert theirs[1][1] == "return t * k" and theirs[4][1] == "return t * k"
    (g,) = cm.graphs
    # one Dynamo op is no eager op: the first mul (the old cursor left sin, linear and the real mul out)
    assert len(g.no_eager_op) == 1 and g.no_eager_op[0].startswith("mul (no eager op)"), g.no_eager_op
    assert g.eager_ops == len(theirs) - 1 == cm.compiled_ops


def test_after_a_compiled_only_op_each_eager_op_is_in_the_graph_that_ran_it() -> None:
    torch.manual_seed(0)
    cm, gms = _kept(ExtraBroken(), torch.randn(2, 4))
    assert len(gms) == 2 and len(cm.graphs) == 2
    # torch's record: the second graph holds self.b's linear, the mul and the relu
    assert [t for t, _ in _lines(gms[1])] == ["linear", "mul", "relu"]
    first, second = (g.id for g in cm.graphs)
    where = {n.name: cm.assigned[n.name] for n in cm.graph.ops}
    assert where == {"linear": first, "sin": first, "linear_1": second, "mul": second, "relu": second}, where
    assert [g.no_eager_op for g in cm.graphs][1] == []


def test_numerics_compares_the_ops_after_a_compiled_only_op() -> None:
    torch.manual_seed(0)
    model, x = Extra(), torch.randn(2, 4)
    with torch.no_grad():
        dynamo.reset()
        theirs = torch.compile(model, backend="aot_eager")(x)
        dynamo.reset()
        torch.testing.assert_close(theirs, model(x), rtol=0, atol=0)  # torch's run: the same values
    r = numerics(model, (x,), {}, against="compile:aot_eager")
    assert r.first is None
    # every eager op compared (the old pairing compared only linear and relu), none beyond tolerance
    assert sorted(n for n, e in r.nodes.items() if e.comparable) == ["linear", "linear_1", "mul", "relu", "sin"]
    assert not any(e.exceeds for e in r.nodes.values())


class _D:
    def __init__(self, name: str, line: int, module: str = "") -> None:
        self.name, self.module, self.file, self.line = name, module, "m.py", line


def _op(name: str, line: int) -> Node:
    return Node(name=f"{name}{line}", kind="call_function", target=f"torch.{name}", source=SourceLoc("m.py", line))


def test_pair_is_an_alignment_not_a_cursor_that_runs_ahead() -> None:
    # two layers of (mul@5, sin@6); the compiled side runs mul@5 once more before the first layer
    eager = [_op("mul", 5), _op("sin", 6), _op("mul", 5), _op("sin", 6), _op("relu", 7)]
    dyn = [_D("mul", 5), _D("mul", 5), _D("sin", 6), _D("mul", 5), _D("sin", 6), _D("relu", 7)]
    (row,) = pair(eager, [("g0", dyn)])
    assert row in ([None, 0, 1, 2, 3, 4], [0, None, 1, 2, 3, 4])
    # indices still increase along the runs, and a skip that pays off is still taken
    eager = [_op("size", 3), _op("mul", 5), _op("sin", 6)]
    assert pair(eager, [("g0", [_D("mul", 5), _D("sin", 6)])]) == [[1, 2]]
    # several runs: one alignment across them (the run that ends early is a later run's first)
    eager = [_op("mul", 5), _op("sin", 6), _op("relu", 7), _op("cos", 8)]
    runs = [("g0", [_D("mul", 5), _D("mul", 5)]), ("g1", [_D("sin", 6), _D("relu", 7), _D("cos", 8)])]
    assert pair(eager, runs) in ([[0, None], [1, 2, 3]], [[None, 0], [1, 2, 3]])


def test_pair_aligns_past_a_block_that_runs_only_compiled() -> None:
    # Gemma2's shape: compiled, the full mask is ones & causal & packed (and_masks), eagerly only
    # causal; then both build the sliding mask, ones & sliding & causal. A greedy lookahead paired the
    # compiled full mask's ``&`` with the eager sliding mask's and lost the whole sliding mask.
    ones, le, to, and_, eq, expand, sub, gt = (("new_ones", 52), ("le", 78), ("to", 54), ("bitwise_and", 54), ("eq", 190),
                                               ("expand", 539), ("sub", 97), ("gt", 97))
    eager_keys = [le, expand,  # full mask
                  ones, sub, gt, to, and_, le, to, and_, expand]  # sliding mask
    dyn_keys = [ones, le, to, and_, eq, to, and_, expand,  # full mask, and_masks
                ones, sub, gt, to, and_, le, to, and_, eq, to, and_, expand]  # sliding mask
    eager = [_op(n, line) for n, line in eager_keys]
    (row,) = pair(eager, [("g0", [_D(n, line) for n, line in dyn_keys])])
    assert row == [None, 0, None, None, None, None, None, 1,
                   2, 3, 4, 5, 6, 7, 8, 9, None, None, None, 10], row


def test_gemma2_each_pair_holds_the_value_torch_computed() -> None:
    """Every pair against torch's own run: the output of each Dynamo node (the graph torch hands the
    backend, run node by node) equals its eager op's, and the sliding mask, built on both sides, is
    paired op for op (a lookahead without alignment paired the full mask's ``&`` and ``.to`` with the
    sliding mask's, 10-38 of 64 booleans apart, and left the sliding mask unpaired)."""
    import fxviz.analyze.compilemap.run as cmrun
    from fxviz.analyze.numerics.keep import Keeper
    from fxviz.analyze.numerics.run import run_eager
    from tests import numerics_models as nm

    seen: dict[str, Any] = {}
    build = cmrun.build

    def kept(graph: Any, rec: Any, **kw: Any) -> Any:
        seen["ops"], seen["runs"] = graph.ops, [(rec.graphs[g].id, rec.graphs[g].ops) for g, k in rec.runs
                                               if k == 0 and rec.forward(g)]
        return build(graph, rec, **kw)

    values: dict[str, Any] = {}

    def backend(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        class Kept(torch.fx.Interpreter):
            def run_node(self, n: torch.fx.Node) -> Any:
                out = super().run_node(n)
                values[n.name] = out
                return out

        return lambda *a: Kept(gm).run(*a)

    cmrun.build = kept
    try:
        model, args, kwargs = nm.gemma2()
        fxviz.compile_map(model, args, kwargs, backend=backend)
    finally:
        cmrun.build = build
    ops, runs = seen["ops"], seen["runs"]
    keeper = Keeper(lambda n: "new", budget=1 << 40)
    graph, _ = run_eager(*nm.gemma2(), keeper, seed=None)
    assert [n.name for n in graph.ops] == [n.name for n in ops]
    (row,) = pair(ops, runs)
    (dops,) = (d for _, d in runs)
    wrong, masks = [], 0
    for d, i in zip(dops, row, strict=True):
        if i is None or not isinstance(values.get(d.node), torch.Tensor):
            continue
        mine, theirs = keeper.values[ops[i].name][0], values[d.node]
        masks += "masking_utils" in d.file
        if mine is None or mine.shape != theirs.shape or not torch.allclose(mine.float(), theirs.float()):
            wrong.append((d.node, ops[i].name))
    assert wrong == []
    # both masks' ops paired: 32 of the compiled masks' ops have an eager op that computed them
    assert masks >= 32, masks
