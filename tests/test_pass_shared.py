"""What a run of passes shares (the call tree, its walk, the nodes by name) and what the passes cache
per metadata object or per stack must change no graph: the captured graph, as the tracer made it
(one metadata object per shape, one stack tuple per module call), annotated by a run of passes, is
the graph each pass makes on its own (issue 18, point 9)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import fxviz
from fxviz.analyze.flops import CAPTURE_PASSES
from fxviz.ir import Graph, Node, TensorMeta
from fxviz.passes import PASSES, run_passes
from tests import capture_models, fallback_models, models

Built = tuple[nn.Module, tuple[Any, ...], dict[str, Any]]


class _Mixed(nn.Module):
    """State of several dtypes under one shape (what plumbing's per-metadata cache must keep
    apart), a module-less constant (placed by ``module_paths``) and a tied weight (``stats``)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("steps", torch.zeros(4, dtype=torch.long))
        self.register_buffer("scale", torch.ones(4))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids) * self.scale + self.steps
        return self.head(h + torch.tensor([1.0, 2.0, 3.0, 4.0]))


def _mixed() -> Built:
    torch.manual_seed(0)
    return _Mixed().eval(), (torch.tensor([[1, 2, 3]]),), {}


def _zoo(name: str) -> Callable[[], Built]:
    return fallback_models.ZOO[name].build


CASES: dict[str, Callable[[], Built]] = {
    "cnn": models.cnn, "residual": models.residual, "attention": models.attention,
    "called_twice": models.called_twice, "mixed": _mixed,
    "checkpoint": capture_models.checkpoint_plain, "autocast": capture_models.autocast_block,
    "moe": _zoo("mixture_of_experts"), "in_place": _zoo("in_place"), "shared_thrice": _zoo("shared_thrice"),
    "deep_residual": _zoo("deep_residual"),
}


@pytest.mark.parametrize("method", ["eager", "eager-aten"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_run_of_passes_gives_each_pass_alone_s_graph(case: str, method: str) -> None:
    model, args, kwargs = CASES[case]()
    bare = fxviz.capture(model, args, kwargs, method=method, passes=())
    # the live graph's sharing (one TensorMeta per shape, one stack per call) is what the caches
    # key on: copied with it, not through JSON
    metas = [m for n in bare.nodes for m in n.outputs]
    assert len({id(m) for m in metas}) < len(metas)
    fast = run_passes(copy.deepcopy(bare), CAPTURE_PASSES)
    slow = copy.deepcopy(bare)
    for name in CAPTURE_PASSES:  # no run: a fresh tree, walk and index for each pass
        slow = PASSES[name](slow)
    assert fast.to_json() == slow.to_json()
    # and against torch's own record of the model: every parameter once, under the first name
    # torch lists it by (a tied weight counts for that module only)
    stats = fast.annotations["stats"]
    named = list(model.named_parameters())
    assert stats["total_params"] == sum(p.numel() for _, p in named)
    for path in stats["modules"]:
        expected = sum(p.numel() for name, p in named if not path or name.startswith(path + "."))
        assert stats["modules"][path]["params"] == expected, path


def test_mixed_state_is_counted_and_classified_by_its_own_metadata() -> None:
    model, args, kwargs = _mixed()
    # ATen level: the tensor the forward makes is a constant ``lift_fresh`` reads
    g = fxviz.capture(model, args, kwargs, method="eager-aten")
    # torch's own count: the tied weight once
    assert g.annotations["stats"]["total_params"] == sum(p.numel() for p in model.parameters())
    state = {n.target: n for n in g.nodes if n.kind == "buffer"}
    # one shape, two dtypes: two metadata objects, each read for its own node
    assert state["steps"].outputs[0].shape == state["scale"].outputs[0].shape
    assert state["steps"].outputs[0].dtype == "int64" and state["scale"].outputs[0].dtype == "float32"
    const = next(n for n in g.nodes if n.kind == "constant")
    reader = next(n for n in g.nodes if n.kind == "op" and any(r.node == const.name for r in n.inputs))
    assert const.stack == reader.stack  # placed with its first reader


def _add_node(graph: Graph) -> Graph:
    """A pass outside ``KEEPS_TREE`` that adds an op the shared facts have not seen."""
    x = next(n for n in graph.nodes if n.kind == "op" and n.target.endswith("linear"))
    graph.nodes.append(Node("extra", "op", target=x.target, inputs=x.inputs, stack=x.stack,
                            outputs=(TensorMeta(x.outputs[0].shape, "float32"),)))
    return graph


def test_facts_are_worked_out_again_after_a_pass_that_adds_a_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PASSES, "add_node", _add_node)
    model, args, kwargs = models.residual()
    g = fxviz.capture(model, args, kwargs, method="eager", passes=())
    ops = sum(n.kind == "op" for n in g.nodes)
    run_passes(g, ("module_paths", "stats", "flops"))
    before = copy.deepcopy(g.annotations)
    run_passes(g, ("module_paths", "stats", "add_node", "stats", "flops", "fold"))
    # the second stats and flops read the new node: the tree, its walk and the index were rebuilt
    extra = g.node("extra")
    module, call = extra.stack[-1][0], g.calls.of("extra").id
    assert g.annotations["stats"]["total_ops"] == ops + 1
    assert g.annotations["stats"]["modules"][module]["ops"] == before["stats"]["modules"][module]["ops"] + 1
    flops = g.annotations["overlays"]["flops"]
    assert flops["nodes"]["extra"] > 0
    assert flops["modules"][call] == before["overlays"]["flops"]["modules"][call] + flops["nodes"]["extra"]


def test_fold_s_module_hierarchy_is_the_graph_s_scope_tree() -> None:
    """``fold`` reads the module hierarchy as paths (no scope object per module) from the run's
    walk of the calls: the same parents with two children or more, in the same order, with the same
    children, classes and call counts as :attr:`Graph.scopes`."""
    from fxviz.passes.fold import _parents
    from fxviz.passes.tree import calls_of, sharing, tree_of

    model, args, kwargs = fallback_models.ZOO["shared_thrice"].build()
    g = fxviz.capture(model, args, kwargs, method="eager")
    full = g.scopes
    with sharing():
        lean = _parents(g, tree_of(g), calls_of(g))
    rows = [(s.path, [(c.path, c.cls, c.calls) for c in s.children.values()])
            for s in full.walk() if len(s.children) > 1]
    assert rows == lean and rows
    assert any(c[2] > 1 for _, children in lean for c in children)  # a module called thrice counts its calls
    # torch's own record: every named submodule with a sibling is a child listed there
    listed = {c[0] for _, children in lean for c in children}
    assert {p for p, _ in model.named_modules() if p and p.rpartition(".")[0] in dict(lean)} <= listed


def test_a_call_s_nodes_are_filled_when_first_read_not_by_the_passes() -> None:
    """No pass reads a call's ``nodes`` (every op inside it, in execution order): the tree a run of
    passes builds fills them only when someone reads one, for the whole tree at once, and they are
    every op of the call's subtree in the graph's order (issue 18, point 9)."""
    from fxviz.calls import call_tree
    from fxviz.passes.tree import sharing, tree_of

    for build in (models.residual, models.called_twice, capture_models.checkpoint_plain):
        model, args, kwargs = build()
        g = fxviz.capture(model, args, kwargs, method="eager", passes=())
        with sharing():
            run_passes(g, CAPTURE_PASSES)
            tree = tree_of(g)
            calls = list(tree.walk())
            assert all(c._nodes is None for c in calls)  # the passes left them unfilled
            position = {n.name: i for i, n in enumerate(g.nodes)}
            for c in calls:
                inside = [op for d in c.walk() for op in d.ops]
                assert c.nodes == sorted(inside, key=position.__getitem__)
            assert all(c._nodes is not None for c in calls)  # one read filled every call
        assert [c.nodes for c in call_tree(g.nodes).walk()] == [c.nodes for c in calls]


def test_a_call_s_boundaries_are_one_list_each_made_when_first_read() -> None:
    model, args, kwargs = models.residual()
    g = fxviz.capture(model, args, kwargs, method="eager")
    tree = g.calls
    calls = list(tree.walk())
    first = {c.id: (c.inputs, c.outputs) for c in calls}
    for c in calls:  # the same lists on every read, never remade
        assert c.inputs is first[c.id][0] and c.outputs is first[c.id][1]
    # a block reads the value before it and hands back its result: edges of the graph itself
    inner = [c for c in calls if c.stack and c.nodes]
    assert inner and all(c.inputs and c.outputs for c in inner)
    for c in inner:
        names = set(c.nodes)
        for r in c.inputs:
            assert r.node not in names and any(r in g.node(n).inputs for n in c.nodes)
        for r in c.outputs:
            assert r.node in names


def test_a_capture_leaves_no_reference_cycles_for_the_collector() -> None:
    """The call trees a run of passes shares are released when it ends (issue 18, point 9): they
    are freed by reference counting when the capture returns, not left in cycles for the
    collector's next pass (1,096 unreachable objects per GPT-2-shaped capture before: the trees'
    calls and their lists)."""
    import gc

    from fxviz.calls import Call

    model, args, kwargs = models.attention()  # calls inside calls
    gc.collect()
    gc.disable()
    try:
        g = fxviz.capture(model, args, kwargs, method="eager")
        # everything the capture made and still alive is young (the collector has not run since)
        left = [o for o in gc.get_objects(0) if type(o) is Call]
    finally:
        gc.enable()
    assert left == []
    # the passes ran, on a tree with calls inside calls: there were cycles to break
    assert g.annotations["stats"]["modules"] and any(n.stack and len(n.stack) > 1 for n in g.ops)
    tree = g.calls  # a tree derived again is whole: a released one was the passes' own
    assert tree.root.children and all(c.parent is tree.root for c in tree.root.children)
