"""The compile map's matching of Dynamo's ops to the eager graph's, checked against torch's own
record of the same forward (``torch._dynamo.explain`` on a fresh copy): models whose forward is
library code, where Dynamo keeps no user frame for an op while the eager tracer finds the line that
called the model (an ``nn.Sequential`` of ``torch.nn`` layers showed 0% compiled in one graph)."""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path
from typing import Any

import compile_match_models as mm
import pytest
import torch
import torch._dynamo as dynamo
from click.testing import CliRunner
from torch import nn

from fxviz.analyze.compilemap import CompileMap, compile_map
from fxviz.analyze.compilemap.match import assign, matchable, op_key, pair
from fxviz.analyze.compilemap.record import OpRecord, op_records
from fxviz.cli import cli
from fxviz.ir import Node, SourceLoc
from fxviz.torchbridge.distributed import wait_collectives

OPS = ("call_function", "call_method", "call_module")


def explain(model: nn.Module, args: tuple[Any, ...]) -> Any:
    """torch's own record of a user's first call (no grad, as the map runs it), on a fresh copy."""
    dynamo.reset()
    fresh, outputs = copy.deepcopy(model), []
    fresh.register_forward_hook(lambda m, a, out: outputs.append(out))  # a side effect Dynamo replays
    try:
        with torch.no_grad():
            return dynamo.explain(fresh)(*args)
    finally:
        wait_collectives(outputs)  # a row-parallel output's all_reduce: waited, as a user would
        dynamo.reset()


def op_counts(truth: Any) -> list[int]:
    """The ops of each graph Dynamo compiled, as explain has them (its ``ops_per_graph`` counts
    ``call_function`` only; the map counts methods and modules too)."""
    return [sum(n.op in OPS for n in gm.graph.nodes) for gm in truth.graphs]


def check_against_explain(cmap: CompileMap, truth: Any, *, comparable: bool = True) -> None:
    """The graphs, breaks and per-graph ops are torch's; with one graph and no break every op is
    compiled; where the eager ops are Dynamo's one for one (``comparable``), each graph holds as
    many eager ops as explain's graph has ops, times the runs of that graph."""
    assert len(cmap.graphs) == truth.graph_count
    assert [g.ops for g in cmap.graphs] == op_counts(truth)
    assert [len(ops) for ops in truth.ops_per_graph] == [
        sum(n.op == "call_function" for n in gm.graph.nodes) for gm in truth.graphs]
    if truth.graph_count == 1 and truth.graph_break_count == 0:
        assert cmap.share == 1.0 and set(cmap.assigned.values()) == {"g0"}
    if comparable:
        per_graph = Counter(g for g in cmap.assigned.values() if g != "eager")
        assert per_graph == {g.id: n * g.runs for g, n in zip(cmap.graphs, op_counts(truth), strict=True)}


def test_a_sequential_of_torch_layers_is_one_whole_graph() -> None:
    model, args = mm.torch_sequential()
    truth = explain(model, args)
    assert (truth.graph_count, truth.graph_break_count, [len(o) for o in truth.ops_per_graph]) == (1, 0, [4])
    cmap = compile_map(model, args, backend="aot_eager")
    check_against_explain(cmap, truth)
    assert cmap.header().startswith("1 graph, 0 breaks, 100% of ops compiled (4/4)")
    assert all(m.compiled == m.ops for m in cmap.modules)


@pytest.mark.parametrize("training", [False, True], ids=["eval-fused", "train-inlined"])
def test_a_transformer_encoder_at_the_top_is_one_whole_graph(training: bool) -> None:
    model, args = mm.encoder(training)
    truth = explain(model, args)
    assert (truth.graph_count, truth.graph_break_count) == (1, 0)
    if not training:  # Dynamo runs each layer as one fused op, the tracer sees its Python path
        assert [str(getattr(t, "__name__", t)) for t in truth.ops_per_graph[0]] == ["_transformer_encoder_layer_fwd"] * 2
    cmap = compile_map(model, args, backend="aot_eager")
    # not comparable op for op: one fused op per layer, or multi_head_attention_forward inlined by Dynamo
    check_against_explain(cmap, truth, comparable=False)
    assert {n.module.split(".")[0] for n in cmap.graph.ops} == {"layers"} and cmap.ops > 20


def test_a_break_in_the_middle_of_a_sequential_of_user_modules() -> None:
    model, args = mm.sequential_with_break()
    truth = explain(model, args)
    assert truth.graph_count == 3
    cmap = compile_map(model, args, backend="aot_eager")
    check_against_explain(cmap, truth)
    # Block's graph ran for 0 and again for 4 (its paths are 0's): both calls are in it
    by_module = {n.module: cmap.assigned[n.name] for n in cmap.graph.ops if n.module in ("0.lin", "4.lin")}
    assert by_module == {"0.lin": "g0", "4.lin": "g0"} and cmap.graphs[0].runs == 2
    # Sequential.forward ran eagerly: the torch.nn layers it called directly are in no graph
    eager = sorted(n.module for n in cmap.graph.ops if cmap.assigned[n.name] == "eager")
    assert eager == ["1", "2", "3", "5"] and cmap.assigned["item"] == "eager"


def test_a_break_inside_a_sequential_a_user_module_calls() -> None:
    model, args = mm.nested_sequential_with_break()
    truth = explain(model, args)
    cmap = compile_map(model, args, backend="aot_eager")
    check_against_explain(cmap, truth)
    assert sorted(n.name for n in cmap.graph.ops if cmap.assigned[n.name] == "eager") == ["item", "linear", "linear_2"]


def test_a_library_module_in_a_users_sequential() -> None:
    model, args = mm.bert_in_sequential()
    truth = explain(model, args)
    assert (truth.graph_count, truth.graph_break_count) == (1, 0)
    cmap = compile_map(model, args, backend="aot_eager")
    check_against_explain(cmap, truth)


def test_cli_on_a_torch_only_model() -> None:
    target = f"{Path(mm.__file__).parent / 'compile_match_models.py'}:torch_sequential"
    r = CliRunner().invoke(cli, ["compile", target, "-b", "aot_eager", "--json", "-"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert (d["summary"]["graphs"], d["summary"]["breaks"], d["summary"]["share"]) == (1, 0, 1.0)
    # no line of the user's is behind these ops: none is shown (it was click's, that called fxviz)
    assert [n.get("source") for n in d["graph"]["nodes"] if n["kind"] == "op"] == [None] * 4


def test_the_eager_tracer_gives_no_line_from_outside_the_model() -> None:
    from fxviz.fallback.trace import trace_eager

    model, args = mm.torch_sequential()
    assert [n.source for n in trace_eager(model, args).ops] == [None] * 4  # was this test's line
    model, args = mm.sequential_with_break()
    lines = {n.module: n.source.func if n.source else None for n in trace_eager(model, args).ops}
    assert lines["0.lin"] == lines["2"] == "forward" and lines["1"] is None


# ---- the matching itself, without torch.compile ----------------------------------------------------


def _op(name: str, module: str, line: int | None) -> Node:
    src = SourceLoc("user.py", line, "forward", "") if line is not None else None
    return Node(name=name, kind="op", target=f"torch.nn.functional.{name.rstrip('_0123456789')}",
                stack=((module, 0),) if module else (), source=src)


def test_a_dynamo_op_without_a_user_line_matches_by_name_and_module_in_order() -> None:
    ops = [_op("linear", "enc", 9), _op("relu", "act", 9), _op("linear_1", "dec", 9)]
    # no user frame inside the compiled code: the line the eager op has (the model's caller) is not asked for
    dyn = [OpRecord("linear", "enc", "", 0), OpRecord("relu", "act", "", 0), OpRecord("linear", "dec", "", 0)]
    assert pair(ops, [("g0", dyn)]) == [[0, 1, 2]]
    # a user line is still asked for where Dynamo has one, and a module where it names one
    assert pair(ops, [("g0", [OpRecord("linear", "enc", "user.py", 8)])]) == [[None]]
    assert pair(ops, [("g0", [OpRecord("linear", "dec", "", 0)])]) == [[2]]
    # list indices of a top-level Sequential are indices too: a graph compiled for 0 runs again for 4
    seq = [_op("linear", "0.lin", 5), _op("linear_1", "4.lin", 5)]
    assert pair(seq, [("g0", [OpRecord("linear", "0.lin", "user.py", 5)])] * 2) == [[0], [1]]
    # op_key keeps its meaning; matchable says which eager ops a set of Dynamo keys can match
    assert op_key(ops[0]) == ("user.py", 9, "linear")
    assert matchable(ops[0], {("", 0, "linear")}) and matchable(ops[0], {("user.py", 9, "linear")})
    assert not matchable(ops[0], {("user.py", 8, "linear")}) and not matchable(ops[1], {("", 0, "linear")})


def test_a_fused_op_takes_its_modules_whole_call_only() -> None:
    ops = [_op("linear", "l.0.a", 5), _op("relu", "l.0", 6), _op("linear_1", "l.1.a", 5), _op("relu_1", "l.1", 6),
           _op("tanh", "", 3)]
    fused = [OpRecord("layer_fwd", "l.0", "", 0), OpRecord("layer_fwd", "l.1", "", 0)]
    assert assign(ops, [("g0", fused)]) == {n.name: ("g0", 0) for n in ops[:4]}
    # a Dynamo op of a name the tracer recorded is no fused op, and a call one of whose ops matched
    # elsewhere is not taken
    assert assign(ops, [("g0", [OpRecord("tanh", "l.0", "", 0)])]) == {}
    # a library op after a matched one inside the same call takes that call's unmatched ops up to
    # the next match (DTensor's redistribute and its all_reduce), never the next call's
    part = [OpRecord("linear", "l.0.a", "user.py", 5), OpRecord("layer_fwd", "l.0", "", 0)]
    assert assign(ops, [("g0", part)]) == {"linear": ("g0", 0), "relu": ("g0", 0)}


def test_numerics_compares_every_op_of_a_torch_only_model() -> None:
    """numerics pairs values with the same matching: each op of the Sequential is compared at its
    own ATen node (before, only the model's output was)."""
    from fxviz.analyze.numerics.compiled import compiled_errors

    model, args = mm.torch_sequential()
    r = compiled_errors(model, args, {}, backend="aot_eager", rtol=1e-6, atol=1e-5, seed=0)
    compared = {name for name, errs in r.errors.items() if any(e.comparable for e in errs)}
    assert compared == {n.name for n in r.graph.ops} == {"linear", "batch_norm", "relu", "linear_1"}


@torch.library.custom_op("fxviz_test::scaled", mutates_args=())
def _scaled(x: torch.Tensor, k: float) -> torch.Tensor:
    return x * k


@_scaled.register_fake
def _(x: torch.Tensor, k: float) -> torch.Tensor:
    return torch.empty_like(x)


class DispatcherOps(nn.Module):
    """Ops called through the dispatcher: an ATen overload and a custom op (as DTensor's collectives
    and users' kernels appear in Dynamo's graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.ops.aten.mm.default(self.lin(x), self.lin.weight)
        return torch.ops.fxviz_test.scaled(h, 2.0).relu()


def test_dispatcher_ops_in_a_dynamo_graph_match_their_eager_ops() -> None:
    """Dynamo records ``torch.ops.aten.mm.default`` and a custom op as OpOverloads; the map named
    them ``default`` and left their eager ops 'eager' although torch compiled them."""
    torch.manual_seed(0)
    model, args = DispatcherOps(), (torch.randn(4, 8),)
    truth = explain(model, args)
    assert (truth.graph_count, truth.graph_break_count) == (1, 0)
    compiled = {str(n.target) for gm in truth.graphs for n in gm.graph.nodes if n.op == "call_function"}
    assert {"aten.mm.default", "fxviz_test.scaled"} <= compiled
    cmap = compile_map(model, args, backend="aot_eager")
    check_against_explain(cmap, truth)
    assert cmap.assigned["mm"] == "g0" and cmap.assigned["fxviz_test::scaled"] == "g0", cmap.assigned
    # op for op (what numerics compares by): each Dynamo op of torch's graph pairs with its eager op;
    # the map named the dispatcher ops 'default' and 'scaled', which only the line rescued above
    (gm,) = truth.graphs
    records = op_records(gm, {})
    assert [r.name for r in records] == ["linear", "mm", "fxviz_test::scaled", "relu"]
    eager = cmap.graph.ops
    (row,) = pair(eager, [("g0", records)])
    assert [eager[i].name if i is not None else None for i in row] == ["linear", "mm", "fxviz_test::scaled", "relu"]


@pytest.mark.parametrize("factory", ["mlp_factory", "block_factory"])
def test_a_tensor_parallel_model_compiles_whole_its_collectives_included(factory: str) -> None:
    """DTensor's from_local / redistribute are single Dynamo ops whose views and collectives the
    tracer records below them: with one graph and no break (torch's explain), every eager op, the
    all_reduce included, ran in that graph. The map left them 'eager' (under 100% compiled)."""
    from fxviz.torchbridge.distributed import fake_world
    from tests import test_distributed as td

    with fake_world(2):
        model, args = getattr(td, factory)()
        truth = explain(model, args)
        assert (truth.graph_count, truth.graph_break_count) == (1, 0)
        assert any(n.op == "call_method" and n.target == "redistribute" for n in truth.graphs[0].graph.nodes)
        cmap = compile_map(model, args, backend="aot_eager")
    check_against_explain(cmap, truth, comparable=False)
    collectives = [n.name for n in cmap.graph.ops if "c10d" in n.target]
    assert collectives and all(cmap.assigned[c] == "g0" for c in collectives)


def test_cli_compiles_a_model_sharded_in_a_fake_world() -> None:
    """``fxviz compile TARGET --world-size 2``: the factory shards the model in torch's fake process
    group, the compiled run stays in it, and no group is left behind."""
    import torch.distributed as dist

    res = CliRunner().invoke(cli, ["compile", f"{Path(__file__).parent / 'test_distributed.py'}:mlp_factory",
                                   "--world-size", "2", "--backend", "aot_eager"])
    assert res.exit_code == 0, res.output
    assert "1 graph, 0 breaks, 100% of ops compiled (7/7)" in res.output
    assert "_c10d_functional::all_reduce" in res.output
    assert not dist.is_initialized()
