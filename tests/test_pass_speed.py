"""What makes the passes of a capture cheap, and that it changes no graph: the call tree is built once
per run of passes, and torch's FLOP formulas run once per distinct shape (issue 18 point 9)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

import fxviz
import fxviz.passes.tree as tree_mod
from fxviz.analyze import flops as flops_mod
from fxviz.analyze.flops import CAPTURE_PASSES
from fxviz.ir import Graph
from fxviz.passes import PASSES, run_passes
from tests.models import cnn


class _Stack(nn.Module):
    def __init__(self, layers: int = 12, dim: int = 16) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = x + torch.relu(b(x))
        return x


def _tiny_gpt2() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
    return transformers.GPT2Model(cfg).eval(), (torch.randint(0, 100, (1, 8)),), {}


def _stack() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    torch.manual_seed(0)
    return _Stack().eval(), (torch.randn(4, 16),), {}


def test_a_flop_formula_runs_once_per_distinct_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    aten = torch.ops.aten
    formula = flop_counter.flop_registry[aten.mm]
    calls: list[tuple[Any, ...]] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return formula(*args, **kwargs)

    monkeypatch.setitem(flop_counter.flop_registry, aten.mm, counted)
    flops_mod._apply.cache_clear()
    model, args, _ = _stack()
    g = fxviz.capture(model, args, method="eager", passes=("module_paths", "flops"))
    # twelve linears of one shape: torch's formula (and the tree_map its wrapper runs) once
    assert len(calls) == 1
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(*args)
    nodes = g.annotations["overlays"]["flops"]["nodes"]
    assert len(nodes) == 12 and set(nodes.values()) == {2 * 4 * 16 * 16}
    assert sum(nodes.values()) == counter.get_total_flops()


def test_a_run_of_passes_builds_the_call_tree_once(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[int] = []
    real = tree_mod.call_tree

    def counted(nodes: Any) -> Any:
        built.append(len(nodes))
        return real(nodes)

    monkeypatch.setattr(tree_mod, "call_tree", counted)
    model, args, _ = _stack()
    g = fxviz.capture(model, args, method="eager", passes=())
    run_passes(g, CAPTURE_PASSES)
    # stats, fold and flops read the tree; module_paths (which may change stacks) runs first
    assert built == [len(g.nodes)]
    # a pass that may change the stacks drops the shared tree: the next reader builds it anew
    built.clear()
    run_passes(g, ("stats", "module_paths", "fold"))
    assert built == [len(g.nodes), len(g.nodes)]


@pytest.mark.parametrize("factory", [cnn, _tiny_gpt2, _stack], ids=["cnn", "gpt2", "stack"])
def test_shared_tree_and_flop_memo_change_no_graph(
    factory: Callable[[], tuple[nn.Module, tuple[Any, ...], dict[str, Any]]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, args, kwargs = factory()
    bare = fxviz.capture(model, args, kwargs, method="eager", passes=())
    fast = run_passes(Graph.from_json(bare.to_json()), CAPTURE_PASSES)
    # the reference: each pass on its own (a fresh call tree each time), torch's formulas uncached
    monkeypatch.setattr(flops_mod, "_apply", flops_mod._apply.__wrapped__)
    slow = Graph.from_json(bare.to_json())
    for name in CAPTURE_PASSES:
        slow = PASSES[name](slow)
    assert slow.annotations["overlays"]["flops"]["nodes"]  # the models have matmuls or convolutions
    assert fast.annotations["fold"] == slow.annotations["fold"]
    assert fast.to_json() == slow.to_json()


def test_a_trace_leaves_no_cycle_for_the_collector() -> None:
    import gc

    from fxviz.fallback.recorder import Recorder
    from fxviz.fallback.trace import trace_eager

    model, args, _ = _stack()
    gc.collect()
    # every object alive now is held, so that only cycles the trace makes are found (earlier tests'
    # compiles leave Dynamo's fake tensors behind weak references that a trace can let go of)
    alive = gc.get_objects()
    enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        g = trace_eager(model, args, {})
        found = gc.collect()
        garbage = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        del alive
        if enabled:
            gc.enable()
    # the recorder and its map of every tensor the forward made go by reference counting: before,
    # each op left a tuple, a list and a weak reference for the collector
    assert not [o for o in garbage if isinstance(o, Recorder)]
    ops = sum(n.kind == "op" for n in g.nodes)
    assert ops == 36 and found < ops, Counter(type(o).__name__ for o in garbage).most_common(8)


def test_an_eager_capture_leaves_the_heap_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """``malloc_trim`` after an eager trace gave back what the forward had just freed (4-16 ms on
    GPT-2, and the next forward faulted those pages in again): only a capture that ran torch's
    symbolic machinery in this process trims the heap."""
    import fxviz.torchbridge.run as run_mod

    trims: list[int] = []
    monkeypatch.setattr(run_mod, "give_back_memory", lambda: trims.append(1))
    model, args, _ = _stack()
    assert fxviz.capture(model, args, method="eager").method == "eager"
    assert trims == []
    assert fxviz.capture(model, args, method="fx", isolate=False).method == "fx"
    assert trims == [1]


def test_a_ref_is_a_value_without_a_frozen_init() -> None:
    """One :class:`~fxviz.ir.Ref` is made per recorded value: a frozen dataclass's ``__init__``
    (``object.__setattr__`` per field) cost 3 µs of the tracer's per-op budget. It stays a value:
    equal and hashed by its fields."""
    import dataclasses

    from fxviz.ir import Edge, Ref

    for cls in (Ref, Edge):
        params = cls.__dataclass_params__  # type: ignore[attr-defined]
        assert not params.frozen and params.eq and cls.__hash__ is not None and hasattr(cls, "__slots__")
    assert Ref("a", 1) == Ref("a", 1) and {Ref("a", 1): 0}[Ref("a", 1)] == 0 and Ref("a") != Ref("a", 1)
    assert dataclasses.astuple(Ref("a")) == ("a", 0)


@pytest.mark.parametrize("factory", [cnn, _tiny_gpt2, _stack], ids=["cnn", "gpt2", "stack"])
def test_passes_read_stacks_by_value_not_by_sharing(
    factory: Callable[[], tuple[nn.Module, tuple[Any, ...], dict[str, Any]]],
) -> None:
    # the passes find a stack's call, scope and fold levels once per stack object (by id): a graph
    # whose nodes each hold their own copy of every stack and metadata object gets the same result
    model, args, kwargs = factory()
    bare = fxviz.capture(model, args, kwargs, method="eager", passes=())
    shared = Graph.from_json(bare.to_json())
    apart = Graph.from_json(bare.to_json())
    for n in apart.nodes:
        n.stack = tuple((str(p + " ")[:-1], int(c)) for p, c in n.stack)
        n.outputs = tuple(type(m)(tuple(m.shape), m.dtype, m.device, m.value) for m in n.outputs)
    assert len({id(n.stack) for n in apart.nodes if n.stack}) == sum(1 for n in apart.nodes if n.stack)
    assert len({id(n.stack) for n in shared.nodes if n.stack}) < sum(1 for n in shared.nodes if n.stack)
    fast = run_passes(shared, CAPTURE_PASSES)
    slow = run_passes(apart, CAPTURE_PASSES)
    assert fast.annotations["fold"] == slow.annotations["fold"]
    if factory is _tiny_gpt2:  # its two blocks fold: the signatures compared are not empty
        assert [r["label"] for r in fast.annotations["fold"]] == ["h.0-1"]
    assert fast.to_json() == slow.to_json()


def test_a_capture_walks_the_modules_once_and_lists_them_once_per_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    from fxviz.torchbridge import walk as walk_mod

    shared = nn.Linear(8, 8)  # met twice: the two lists differ
    model = nn.Sequential(shared, nn.ReLU(), shared, nn.Sequential(nn.Linear(8, 8), nn.Identity())).eval()
    walks: list[int] = []
    lists: Counter[tuple[int, bool]] = Counter()  # (id of the list handed out, remove_duplicate)
    walk, named = walk_mod._walk, walk_mod.named_modules

    def counting_walk(m: nn.Module) -> Any:
        walks.append(id(m))
        return walk(m)

    def counting_named(m: nn.Module, *, remove_duplicate: bool = True) -> Any:
        out = named(m, remove_duplicate=remove_duplicate)
        if m is model:
            lists[(id(out), remove_duplicate)] += 1
            torch_own = list(model.named_modules(remove_duplicate=remove_duplicate))
            assert [(p, id(x)) for p, x in out] == [(p, id(x)) for p, x in torch_own]
        return out

    monkeypatch.setattr(walk_mod, "_walk", counting_walk)
    for mod in [m for k, m in __import__("sys").modules.items() if k.startswith("fxviz") and m is not None]:
        if getattr(mod, "named_modules", None) is named:
            monkeypatch.setattr(mod, "named_modules", counting_named)
    fxviz.capture(model, (torch.randn(2, 8),), method="eager")
    assert walks.count(id(model)) == 1
    # every caller of a kind got the one list made for the capture
    assert lists and len({key[1] for key in lists}) == len(lists), lists
    # outside a capture, each call hands out a list of its own (the caller may change it)
    assert named(model) is not named(model)
    assert named(model, remove_duplicate=False) is not named(model, remove_duplicate=False)


def test_fold_reads_the_structure_only_of_neighbours_of_one_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run is made of neighbours: ``ln_1`` and ``ln_2`` (or ``mlp.c_fc`` and ``mlp.c_proj``),
    siblings of one class with other modules between them, are never compared, so their structure
    is not read (GPT-2 small: 86 modules read before, 38 after); the runs are the same."""
    from fxviz.passes import fold as fold_mod

    read: list[set[str]] = []
    signatures = fold_mod._signatures

    def recording(graph: Graph, candidates: set[str]) -> Any:
        read.append(set(candidates))
        return signatures(graph, candidates)

    monkeypatch.setattr(fold_mod, "_signatures", recording)
    model, args, _ = _tiny_gpt2()
    g = fxviz.capture(model, args, method="eager")
    assert [r["label"] for r in g.annotations["fold"]] == ["h.0-1"]
    assert read == [{"wte", "wpe", "h.0", "h.1", "h.0.attn.c_attn", "h.0.attn.c_proj", "h.1.attn.c_attn",
                     "h.1.attn.c_proj"}]


def test_a_call_lists_its_nodes_in_execution_order_when_its_parent_interrupts_it() -> None:
    """A call's ``nodes`` are joined from its ``steps`` where its blocks follow each other; where a
    child call's ops are interleaved with its parent's (one call of ``m.c``, interrupted by an op of
    ``m``), they are merged by position."""
    from fxviz.calls import call_tree
    from fxviz.ir import Node, Ref, TensorMeta

    out = (TensorMeta((2,)),)
    m, mc = (("m", 0),), (("m", 0), ("m.c", 0))
    nodes = [Node("x", "input", "x", (), (), out)]
    for name, stack in [("a", m), ("b", mc), ("c", m), ("d", mc), ("e", m), ("f", (("g", 0),))]:
        nodes.append(Node(name, "op", "torch.relu", (Ref("x"),), stack, out))
    tree = call_tree(nodes)
    assert tree.by_stack[m].nodes == ["a", "b", "c", "d", "e"]
    assert tree.by_stack[mc].nodes == ["b", "d"]
    assert tree.root.nodes == ["a", "b", "c", "d", "e", "f"]
