"""fxviz.numerics against ``compile[:backend]``: aot_eager per node, every backend at each graph's
boundary (graph breaks included), the first divergence inside a wrong graph, random ops, in-place
writes after a break, chunks under a small budget, and Dynamo and the model left as found."""

from __future__ import annotations

import json
import operator
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo as dynamo
from click.testing import CliRunner
from torch import nn

from fxviz.analyze.numerics import numerics
from fxviz.analyze.numerics.compiled import compiled_errors
from fxviz.analyze.numerics.keep import Keeper
from fxviz.analyze.numerics.run import run_eager
from fxviz.cli import cli
from fxviz.errors import TargetError
from tests import compile_models as cm
from tests import numerics_models as nm

WRONG = "fxviz_test_wrong_mul"
#: The eager ops of ItemBreak whose values cross between compiled and eager code: relu leaves g0
#: (and enters g1), linear_1 and mean leave g1 (before the .item() break), mul leaves g2, tanh
#: leaves g3 as the model's output. linear, abs and linear_2 stay inside their graphs.
ITEM_BOUNDARY = {"relu", "linear_1", "mean", "mul", "tanh"}


def _wrong_mul(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """A backend that miscompiles: every ``*`` of a graph becomes ``+``."""
    for n in gm.graph.nodes:
        if n.target is operator.mul:
            n.target = operator.add
    gm.recompile()
    return gm.forward


if WRONG not in dynamo.list_backends(exclude_tags=()):
    dynamo.register_backend(_wrong_mul, name=WRONG)


class InplaceAfterBreak(nn.Module):
    """``fc``'s output leaves a graph at a break and is then scaled in place: the eager value it is
    compared with must be the one from before the write."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        torch._dynamo.graph_break()
        h.mul_(2)
        return self.out(h)


@torch._dynamo.disable
def _scale_eagerly(h: torch.Tensor) -> torch.Tensor:
    return h * 3


class EagerFeedsAGraph(nn.Module):
    """A function Dynamo must not trace sits between two graphs: its ``*`` runs eagerly and its
    value enters the second graph."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(_scale_eagerly(self.a(x)))


def inplace_after_break() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return InplaceAfterBreak().eval(), (torch.randn(3, 8),)


def test_aot_eager_compares_every_op() -> None:
    model, args = nm.deterministic()
    r = numerics(model, args, against="compile:aot_eager")
    ops = [n.name for n in r.graph.ops]
    compared = [k for k, e in r.nodes.items() if e.comparable]
    assert set(compared) == set(ops)  # each op, not only the output: layer_norm, gelu, softmax, ...
    assert {"layer_norm", "gelu", "softmax", "mul", "add", "linear_1"} <= set(compared)
    for name, e in r.nodes.items():
        assert e.max_abs <= 1e-6 and not e.exceeds and e.cosine == pytest.approx(1.0), name
    assert r.first is None and r.births == []
    assert {c.path for c in r.graph.calls.walk() if c.id in r.modules} >= {"embed", "blocks.0", "blocks.1", "head"}
    note = r.notes[0]
    assert note.startswith("compile:aot_eager compared per node (1 graph, 0 graph breaks, 1 graph call): 16 ops at the ATen node")
    assert "0 ATen nodes with no eager op" in note
    assert r.graph.annotations["overlays"]["error"]["nodes"]["gelu"] == r.nodes["gelu"].rel_rms


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_break_is_compared_on_both_sides(backend: str) -> None:
    model, args = cm.item_break()
    r = numerics(model, args, against=f"compile:{backend}")
    compared = {k for k, e in r.nodes.items() if e.comparable}
    if backend == "eager":  # a graph is one call: only what crosses its boundary is seen
        assert compared == ITEM_BOUNDARY
        assert "compared per graph boundary (4 graphs, 1 graph break, 4 graph calls): 5 ops where" in r.notes[0]
    else:
        assert compared == {n.name for n in r.graph.ops} - {"item"}  # .item() ran eagerly: a Python float
    assert all(r.nodes[k].max_abs == 0.0 for k in compared)
    assert r.first is None
    # the values at the break: linear_1 leaves g1 (Scale.forward) before .item(), enters g2 (the mul after it)
    assert r.graph.node("linear_1").stack[-1][0] == "scale.proj" and r.graph.node("mul").stack[-1][0] == "scale"


def test_a_miscompiled_graph_is_the_first_divergence() -> None:
    model, args = cm.item_break()
    r = numerics(model, args, against=f"compile:{WRONG}")
    assert r.first == "mul" and r.births == ["mul"]
    assert r.where("mul").startswith(f"mul (Tensor.mul) in scale at compile_models.py:{cm.LINES['item'] + 1}")
    assert all(r.nodes[k].max_abs == 0.0 for k in ("relu", "linear_1", "mean"))  # before the wrong graph
    assert r.nodes["mul"].exceeds and r.nodes["mul"].snr_db < 0
    assert r.nodes["tanh"].exceeds  # after it: carried, not born
    scale = next(c for c in r.graph.calls.walk() if c.path == "scale")
    assert r.modules[scale.id].exceeds
    assert r.graph.annotations["panels"]["divergence"]["rows"][0]["node"] == "mul"


def test_aot_eager_finds_a_wrong_decomposition_per_node() -> None:
    """A decomposition given to AOT Autograd that is wrong (GELU as ReLU): the gelu op inside the
    one graph is the first divergence, which a per-boundary view could not tell from fc2."""
    model, args = nm.gelu_net()
    r = numerics(model, args, against="compile:aot_eager", decompositions={torch.ops.aten.gelu.default: nm.wrong_gelu})
    assert r.first == "gelu" and r.births == ["gelu"]
    assert r.nodes["linear"].max_abs == 0.0 and r.nodes["gelu"].exceeds and r.nodes["linear_1"].exceeds
    assert r.graph.node("gelu").stack[-1][0] == "act"
    with pytest.raises(TargetError, match="decompositions apply to"):
        numerics(model, args, against="compile:eager", decompositions={torch.ops.aten.gelu.default: nm.wrong_gelu})


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_dropout_in_train_mode_is_not_comparable(backend: str) -> None:
    model, args = nm.dropped()
    r = numerics(model, args, against=f"compile:{backend}")
    assert r.not_comparable == ["dropout"] and not r.nodes["dropout"].comparable
    assert r.first is None
    if backend == "aot_eager":  # the ATen node that carries dropout's value is given eager's draw
        assert "given eager's draw" in r.nodes["dropout"].note
        assert r.nodes["linear_1"].comparable and r.nodes["linear_1"].max_abs == 0.0
    else:  # the compiled graph draws its own numbers: what reads them is not comparable either
        assert not r.nodes["linear_1"].comparable and "random op" in r.nodes["linear_1"].note
        assert any("read a random op's draw" in n for n in r.notes)
    assert model.training and all(m.training for m in model.modules())


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_value_written_in_place_after_a_break_is_compared_as_it_left(backend: str) -> None:
    model, args = inplace_after_break()
    r = numerics(model, args, against=f"compile:{backend}")
    assert r.nodes["linear"].comparable and r.nodes["linear"].max_abs == 0.0  # the eager value before mul_
    assert r.first is None and r.nodes["linear_1"].max_abs == 0.0


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_value_made_by_eager_code_is_compared_where_it_enters_a_graph(backend: str) -> None:
    torch.manual_seed(0)
    model = EagerFeedsAGraph().eval()
    r = numerics(model, (torch.randn(3, 8),), against=f"compile:{backend}")
    mul = r.graph.node("mul")
    line = Path(__file__).read_text().splitlines().index("    return h * 3") + 1
    assert mul.source is not None and (Path(mul.source.file).name, mul.source.line) == (Path(__file__).name, line)
    # linear leaves the first graph, mul (eager code) enters the second, linear_1 leaves it
    assert {k for k, e in r.nodes.items() if e.comparable} == {"linear", "mul", "linear_1"}
    assert all(e.max_abs == 0.0 for e in r.nodes.values())
    assert "2 graphs" in r.notes[0]


def test_keeper_copies_a_kept_value_before_an_in_place_write_and_stops_at_its_budget() -> None:
    model, args = inplace_after_break()
    keeper = Keeper(lambda n: "new" if n.name == "linear" else None, budget=1 << 20)
    run_eager(model, args, {}, keeper, seed=0)
    with torch.no_grad():
        expected = model.fc(args[0])
    assert torch.equal(keeper.values["linear"][0], expected)  # not the doubled value mul_ left
    small = Keeper(lambda n: "new", budget=1)
    graph, _ = run_eager(model, args, {}, small, seed=0)
    assert list(small.values) == ["linear"] and small.stopped  # one value: progress, then the budget
    small.drop("linear")
    assert small.values == {} and small.held == 0


def test_chunks_under_a_small_budget_give_the_same_errors() -> None:
    model, args = cm.item_break()
    whole = compiled_errors(model, args, {}, backend="aot_eager", rtol=1e-6, atol=1e-5, seed=0)
    chunked = compiled_errors(model, args, {}, backend="aot_eager", rtol=1e-6, atol=1e-5, seed=0, budget_bytes=1)
    assert chunked.errors == whole.errors and len(whole.errors) == 8
    assert not any("chunks" in n for n in whole.notes)
    assert any(n.startswith("the eager values were kept in ") and "chunks" in n for n in chunked.notes)


def test_a_graph_dynamo_recompiles_as_dynamic_is_still_paired() -> None:
    """Each block's .item() value differs: Dynamo compiles the code after the break again with the
    float as an input, and later runs call that graph where the first run called another."""
    torch.manual_seed(0)
    model = cm.LoopOfBreaks().eval()
    r = numerics(model, (cm.x(),), against="compile:eager")
    assert {"div", "div_1", "div_2", "tanh"} <= {k for k, e in r.nodes.items() if e.comparable}
    assert all(e.max_abs == 0.0 for e in r.nodes.values())
    assert not any("other graphs" in n for n in r.notes)


def test_dynamo_and_the_model_are_left_as_found() -> None:
    def f(t: torch.Tensor) -> torch.Tensor:
        return t.cos() * 2

    users = torch.compile(f, backend="eager")
    users(torch.randn(3))
    dynamo.config.capture_scalar_outputs = False
    before_config = dynamo.config.get_config_copy()
    from torch._dynamo.symbolic_convert import InstructionTranslatorBase
    from torch._dynamo.utils import counters

    before_counters = {k: Counter(v) for k, v in counters.items()}
    hook = InstructionTranslatorBase.log_graph_break
    model, args = nm.dropped()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    numerics(model, args, against="compile:aot_eager", seed=None)
    assert dynamo.config.get_config_copy() == before_config
    assert {k: Counter(v) for k, v in counters.items() if v} == {k: v for k, v in before_counters.items() if v}
    assert InstructionTranslatorBase.log_graph_break is hook
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert all(m.training for m in model.modules()) and type(model) is nm.Dropped
    assert torch.equal(users(torch.ones(3)), torch.ones(3).cos() * 2)  # compiles again, works


def test_cli_compile_side_prints_what_was_observed() -> None:
    target = f"{Path(cm.__file__).parent / 'compile_models.py'}:item_break"
    res = CliRunner().invoke(cli, ["numerics", target, "--against", "compile:eager", "--json", "-"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert set(data["nodes"]) >= ITEM_BOUNDARY and data["first"] is None
    assert "per graph boundary" in data["notes"][0]
    res = CliRunner().invoke(cli, ["numerics", target, "--against", f"compile:{WRONG}", "--fail-above", "40"])
    assert res.exit_code == 1
    assert "first divergence: mul (Tensor.mul) in scale" in res.output
    assert "note: compile:fxviz_test_wrong_mul compared per graph boundary" in res.output


@pytest.mark.slow
def test_inductor_compares_at_each_graph_boundary() -> None:
    torch.manual_seed(0)
    model = cm.PrintBreak().eval()
    r = numerics(model, (cm.x(),), against="compile:inductor")
    assert {k for k, e in r.nodes.items() if e.comparable} == {"linear", "relu", "linear_1"}
    assert all(not e.exceeds and e.snr_db > 100 for e in r.nodes.values())
    assert r.first is None and r.worst_snr() > 100
    assert "compile:inductor compared per graph boundary (3 graphs, 2 graph breaks, 3 graph calls)" in r.notes[0]
    assert "fused kernels have no intermediate values" in r.notes[0]


@pytest.mark.slow
def test_aot_eager_on_gpt2_is_exact_per_op() -> None:
    from tests.transformers_zoo import gpt2

    model, args, kwargs = gpt2(2)
    r = numerics(model, args, kwargs, against="compile:aot_eager")
    compared = [k for k, e in r.nodes.items() if e.comparable]
    assert len(compared) > 0.9 * len(r.graph.ops)
    assert r.first is None and all(r.nodes[k].max_abs <= 1e-5 for k in compared)
    blocks = {c.path for c in r.graph.calls.walk() if c.id in r.modules}
    assert {"transformer.h.0", "transformer.h.1", "transformer.h.0.attn", "lm_head"} <= blocks


# ---- false alarms: run order, uninitialised memory, eager noise ---------------------------------------


def test_ops_of_one_line_run_in_another_order_are_paired_by_what_they_read() -> None:
    """SetOrder iterates set([3, 1]): CPython runs rot for 1 then 3, Dynamo traces 3 then 1
    (torch's own graph says so); paired by order, the cos of one was compared with the other's."""
    model, args = nm.set_order()
    assert list(set(model.kinds)) == [1, 3]  # CPython's order
    gm = dynamo.explain(model)(*args).graphs[0]
    first_mul = next(n for n in gm.graph.nodes if n.op == "call_function" and n.target is operator.mul)
    assert any("f3" in a.name for a in first_mul.all_input_nodes)  # Dynamo's order: 3 first
    r = numerics(model, args, against="compile:aot_eager")
    assert r.graph.node("mul").inputs[1].node == "rot.f1"  # eager's first mul reads f1
    assert {"mul", "cos", "mul_1", "cos_1", "mul_2", "add"} <= {k for k, e in r.nodes.items() if e.comparable}
    assert all(e.max_abs == 0.0 for e in r.nodes.values()) and r.first is None


@pytest.mark.slow
def test_a_modernbert_under_any_hash_seed_shows_no_false_alarm(tmp_path: Path) -> None:
    """ModernBERT computes its rotary embeddings iterating set(layer_types): run in a fresh
    interpreter whose hash seed (PYTHONHASHSEED=1) makes CPython's order not Dynamo's."""
    script = tmp_path / "mb.py"
    script.write_text(
        "import json, math\nfrom tests import numerics_models as nm\nfrom fxviz.analyze.numerics import numerics\n"
        "model, args, kwargs = nm.modernbert()\n"
        "order = list(set(model.config.layer_types)) != list(dict.fromkeys(model.config.layer_types))\n"
        "r = numerics(model, args, kwargs, against='compile:aot_eager')\n"
        "print(json.dumps([order, r.first, sum(e.comparable for e in r.nodes.values()),\n"
        "                  max(e.max_abs for e in r.nodes.values() if e.comparable)]))\n")
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONHASHSEED": "1", "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=root,
                         check=True, timeout=300)
    other_order, first, compared, worst = json.loads(out.stdout.strip().splitlines()[-1])
    assert other_order  # the premise: CPython iterates the set in another order than it was built
    assert first is None and compared > 80 and worst == 0.0


def test_empty_ops_are_not_compared_under_aot_eager_but_their_writes_are() -> None:
    model, args = nm.tiny_moe()
    r = numerics(model, args, against="compile:aot_eager")
    empties = [n.name for n in r.graph.ops if n.target.endswith(("empty_like", "new_empty"))]
    assert len(empties) == 3 and all("uninitialised" in r.nodes[n].note for n in empties)
    assert all(r.nodes[w].comparable and r.nodes[w].max_abs == 0.0 for w in ("setitem", "zero", "index_add", "index_copy"))
    assert r.first is None and all(e.max_abs == 0.0 for e in r.nodes.values() if e.comparable)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_an_unreproducible_op_is_not_flagged_under_compile(backend: str) -> None:
    model, args = nm.jittery()
    r = numerics(model, args, against=f"compile:{backend}")
    assert r.nodes["linear_1"].comparable and r.nodes["linear_1"].rel_rms > 1e-4  # the output differs
    assert r.nodes["linear_1"].floor > 1e-4 and not r.nodes["linear_1"].exceeds
    assert r.first is None and any("not reproducible" in n for n in r.notes)
    if backend == "aot_eager":
        assert r.nodes["linear"].floor == 0.0 and r.nodes["linear"].max_abs == 0.0
