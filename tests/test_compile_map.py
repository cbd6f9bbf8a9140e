"""The torch.compile coverage map: graph breaks (count, category, line, the eager op and module they
point at), the compiled graph of named ops, per-module coverage, recompiles, torch left as found,
and ``fxviz compile``. Backend ``eager`` (Dynamo only) for speed; ``aot_eager`` and Inductor once."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import compile_models as cm
import pytest
import torch
import torch._dynamo as dynamo
from click.testing import CliRunner

from fxviz.analyze.compilemap import CompileMap, compile_map
from fxviz.analyze.compilemap.record import in_words
from fxviz.analyze.compilemap.run import category
from fxviz.cli import cli
from fxviz.errors import ModelError
from fxviz.passes.overlays import overlays
from fxviz.passes.panels import panels

HERE = str(Path(cm.__file__).resolve())


def run(model: torch.nn.Module, *args: torch.Tensor, backend: str = "eager", **kw: object) -> CompileMap:
    return compile_map(model, args, backend=backend, **kw)  # type: ignore[arg-type]


def cover(cmap: CompileMap, call: str) -> tuple[int, int]:
    m = next(m for m in cmap.modules if m.call == call)
    return m.compiled, m.ops


def test_item_break_splits_the_forward_into_four_graphs() -> None:
    model, (x,) = cm.item_break()
    cmap = run(model, x)
    # before the call of scale (Dynamo breaks the outer frame at the call), scale's own frame up to
    # .item(), scale's resume after it, the outer frame's resume after scale
    assert [g.id for g in cmap.graphs] == ["g0", "g1", "g2", "g3"]
    assert [g.func for g in cmap.graphs] == ["forward", "forward", f"torch_dynamo_resume_in_forward_at_{cm.LINES['item']}",
                                            f"torch_dynamo_resume_in_forward_at_{cm.LINES['nested']}"]
    assert cmap.break_count == 1 and len(cmap.breaks) == 1
    b = cmap.breaks[0]
    assert (b.category, b.where.file, b.where.line) == ("item", HERE, cm.LINES["item"])  # type: ignore[union-attr]
    assert b.where.code == "s = x.abs().mean().item()  # BREAK:item"  # type: ignore[union-attr]
    assert (b.node, b.module, b.count) == ("item", "scale#0", 1)
    assert "capture_scalar_outputs" in b.hint and b.link.startswith("https://docs.pytorch.org/")
    assert cmap.assigned == {"linear": "g0", "relu": "g0", "linear_1": "g1", "abs": "g1", "mean": "g1",
                             "item": "eager", "mul": "g2", "linear_2": "g3", "tanh": "g3"}
    assert (cmap.compiled_ops, cmap.ops) == (8, 9)
    assert cover(cmap, "scale#0") == (4, 5) and cover(cmap, "inp#0") == (1, 1) and cover(cmap, "") == (8, 9)
    assert [m.call for m in cmap.ranking()] == ["scale#0"]
    assert cmap.header().startswith("4 graphs, 1 break (1 cause), 89% of ops compiled (8/9)")


def test_item_break_is_written_on_the_eager_graph() -> None:
    model, (x,) = cm.item_break()
    cmap = run(model, x)
    ov = overlays(cmap.graph)
    assert ov["compiled"]["nodes"]["item"] == "break" and ov["compiled"]["nodes"]["mul"] == "g2"
    assert ov["compiled"]["modules"] == {"": "mixed", "inp#0": "g0", "scale#0": "mixed", "scale.proj#0": "g1",
                                         "out#0": "g3"}
    assert ov["coverage"]["modules"]["scale#0"] == 80.0 and ov["coverage"]["nodes"]["item"] == 0
    p = panels(cmap.graph)
    assert p["breaks"]["rows"] == [{
        "cells": [f"compile_models.py:{cm.LINES['item']}", "data-dependent .item()",
                  "Unsupported Tensor.item() call with capture_scalar_outputs=False", 1, cmap.breaks[0].hint,
                  "s = x.abs().mean().item()  # BREAK:item", cmap.breaks[0].link],
        "node": "item", "module": "scale#0", "level": "error"}]
    assert [r["cells"][:4] for r in p["modules"]["rows"]] == [["scale", "Scale", 1, 5]]
    assert "recompiles" not in p
    # the facts behind the headline's "4 graphs ... (8/9)": one row per graph, with the eager ops
    # it holds (they add up to the compiled ops), its function, and a pointer to its first op;
    # torch's own count of the graphs (explain, on a fresh copy) agrees
    fresh, (x2,) = cm.item_break()
    truth = dynamo.explain(fresh)(x2)
    dynamo.reset()
    rows = p["graphs"]["rows"]
    assert len(rows) == truth.graph_count == 4
    assert [(r["cells"][0], r["cells"][3], r["node"]) for r in rows] == [
        ("g0", 2, "linear"), ("g1", 3, "linear_1"), ("g2", 1, "mul"), ("g3", 2, "linear_2")]
    assert sum(r["cells"][3] for r in rows) == cmap.compiled_ops
    assert [r["cells"][1] for r in rows] == [g.func for g in cmap.graphs]
    again = CompileMap.from_json(cmap.to_json())  # a saved map reads back whole
    assert again.assigned == cmap.assigned and again.header() == cmap.header()
    assert overlays(again.graph)["compiled"] == ov["compiled"]


def test_print_and_logging_breaks() -> None:
    cmap = run(cm.PrintBreak().eval(), cm.x())
    assert [(b.category, b.where.line) for b in cmap.breaks] == [  # type: ignore[union-attr]
        ("print", cm.LINES["print"]), ("print", cm.LINES["log"])]
    assert "print" in cmap.breaks[0].reason and "logging" in cmap.breaks[1].reason
    assert cmap.break_count == 2 and len(cmap.graphs) == 3
    # no op on a print line: every op ran in one of the three graphs
    assert cmap.assigned == {"linear": "g0", "relu": "g1", "linear_1": "g2"}


def test_data_dependent_branch() -> None:
    cmap = run(cm.BranchBreak().eval(), cm.x())
    (b,) = cmap.breaks
    assert (b.category, b.where.line, b.node, b.module) == ("branch", cm.LINES["branch"], "bool", "")  # type: ignore[union-attr]
    assert "torch.cond" in b.hint
    assert cmap.assigned == {"linear": "g0", "sum": "g0", "gt": "g0", "bool": "eager", "relu": "g1", "mul": "g1"}
    assert cover(cmap, "pos#0") == (1, 1)


def test_c_extension_call() -> None:
    cmap = run(cm.ExtensionBreak().eval(), cm.x())
    (b,) = cmap.breaks
    assert (b.category, b.where.line) == ("unsupported", cm.LINES["extension"])  # type: ignore[union-attr]
    assert "zlib.crc32" in b.reason and "custom_op" in b.hint
    assert cmap.assigned == {"linear": "g0", "sigmoid": "g0", "add": "g1"}


def test_breaks_in_a_loop_leave_the_outer_forward_eager() -> None:
    torch.manual_seed(0)
    cmap = run(cm.LoopOfBreaks().eval(), cm.x())
    skip, item = cmap.breaks
    # the loop's frame cannot resume after a break: Dynamo skips it whole and compiles each block
    assert (skip.category, skip.where.line, skip.count) == ("skip", cm.LINES["loop"], 1)  # type: ignore[union-attr]
    assert (item.category, item.where.line, item.count, item.node) == ("item", cm.LINES["block-item"], 3, "item")  # type: ignore[union-attr]
    assert [(g.func, g.runs) for g in cmap.graphs] == [
        ("forward", 3), (f"torch_dynamo_resume_in_forward_at_{cm.LINES['block-item']}", 1),
        (f"torch_dynamo_resume_in_forward_at_{cm.LINES['block-item']}", 2)]
    # one compiled block graph ran for all three blocks; the outer forward's own ops ran eagerly
    assert [cmap.assigned[n] for n in ("linear", "linear_1", "linear_2")] == ["g0", "g0", "g0"]
    assert [cmap.assigned[n] for n in ("add", "linear_3", "tanh")] == ["eager"] * 3
    assert cover(cmap, "blocks.1#0") == (4, 5) and cover(cmap, "head#0") == (0, 1)
    assert [m.call for m in cmap.ranking()] == ["blocks.0#0", "blocks.1#0", "blocks.2#0", "head#0"]
    # the resumed code was specialised on the float from .item(): the second block recompiles it
    (r,) = cmap.recompiles
    assert r.input_set == 0 and r.reason.startswith("___stack0 is no longer ")
    assert r.reason.endswith("the value the graph was specialised on (return x / (1 + s))")


def test_clean_model_is_one_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    import fxviz.analyze.compilemap.skim as skim

    skimmed: list[bool] = []
    traced = skim.trace_eager
    monkeypatch.setattr(skim, "trace_eager", lambda *a, **kw: skimmed.append("watch" in kw) or traced(*a, **kw))
    model, (x,) = cm.clean()
    # the kernels are skipped only where their arithmetic costs more than skipping them adds:
    # never when it costs nothing, always when each multiply-accumulate costs a second
    monkeypatch.setattr(skim, "MAC_S", 0.0)
    run(model, x)
    monkeypatch.setattr(skim, "MAC_S", 1.0)
    cmap = run(model, x)
    assert skimmed == [False, True]
    assert (len(cmap.graphs), cmap.break_count, cmap.share) == (1, 0, 1.0)
    assert set(cmap.assigned.values()) == {"g0"} and cmap.ranking() == []
    assert "breaks" not in panels(cmap.graph) and "modules" not in panels(cmap.graph)
    # no break: the eager graph was traced with its products skipped, and is the real trace's, op for op
    from fxviz.analyze.flops import CAPTURE_PASSES
    from fxviz.fallback.trace import trace_eager
    from fxviz.passes import run_passes

    real = run_passes(trace_eager(model, (x,)), CAPTURE_PASSES)
    assert cmap.graph.method == real.method == "eager"
    assert [(n.name, n.target, n.module, n.source, n.outputs, n.inputs, n.attrs) for n in cmap.graph.nodes] == \
        [(n.name, n.target, n.module, n.source, n.outputs, n.inputs, n.attrs) for n in real.nodes]


def test_recompile_when_the_batch_size_changes() -> None:
    model, (x,) = cm.batch_sized()
    cmap = run(model, x, inputs=cm.more_batches())
    assert cmap.input_sets == 3
    (r,) = cmap.recompiles  # batch 3 recompiles with a dynamic batch size; batch 4 reuses it
    assert (r.input_set, r.func, r.line) == (1, "forward", cm.BatchSized.forward.__code__.co_firstlineno)
    assert r.reason == "x: size of dim 0 is 3, the graph was compiled for 2"
    assert [(g.id, g.input_set, g.runs) for g in cmap.graphs] == [("g0", 0, 1), ("g1", 1, 2)]
    # each graph keeps every guard it was compiled under: the input's tensor check, global state too
    assert "L['x']: TENSOR_MATCH" in cmap.graphs[0].guards and "L['x']: TENSOR_MATCH" in cmap.graphs[1].guards
    assert "GRAD_MODE" in cmap.graphs[0].guards
    assert [g.guards for g in type(cmap).from_json(cmap.to_json()).graphs] == [g.guards for g in cmap.graphs]
    assert cmap.assigned == {"linear": "g0", "div": "g0"}  # the map is of the first input set
    assert panels(cmap.graph)["recompiles"]["rows"][0]["cells"] == [1, f"forward (compile_models.py:{r.line})", "0/1",
                                                                     r.reason, r.advice]
    assert (r.input, r.dim, r.guard) == ("x", 0, "tensor 'x' size mismatch at index 0. expected 2, actual 3")


def test_no_recompile_with_dynamic_shapes() -> None:
    model, (x,) = cm.batch_sized()
    cmap = run(model, x, inputs=cm.more_batches(), dynamic=True)
    assert cmap.recompiles == [] and len(cmap.graphs) == 1 and cmap.graphs[0].runs == 3


def test_a_break_on_the_first_call_only_is_in_the_map() -> None:
    model, (x,) = cm.lazy_scale()
    fresh, _ = cm.lazy_scale()
    seen, params = model.seen, dict(model.named_parameters())
    cmap = run(model, x)
    # the oracle: torch's own explain of a user's first call, on a fresh copy of the same model
    truth = dynamo.explain(fresh)(x)
    dynamo.reset()
    assert truth.graph_break_count == 1
    assert cmap.break_count == truth.graph_break_count and len(cmap.breaks) == 1
    (b,) = cmap.breaks
    line = truth.break_reasons[0].user_stack[-1].lineno
    assert line == cm.LINES["lazy"] and (b.category, b.where.line) == ("item", line)  # type: ignore[union-attr]
    # the eager graph is of the first call too: the .item() of the initialisation ran eagerly
    assert cmap.assigned["item"] == "eager" and cmap.assigned["linear"] == "g0"
    # the model is left as it was found: no scale, the same empty cache, no lazily added buffer
    assert model.scale is None and model.seen is seen and seen == {}
    assert "first" not in model._buffers and dict(model.named_parameters()) == params


def test_buffers_a_forward_writes_are_put_back() -> None:
    class Normed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.bn = torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8)

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return self.bn(self.lin(t))

    torch.manual_seed(0)
    model = Normed().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cmap = run(model, cm.x(4))
    assert cmap.break_count == 0 and cmap.share == 1.0
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items()) and model.training


def test_tensor_attributes_and_nested_caches_are_put_back() -> None:
    """A plain tensor attribute (not a registered buffer) the compiled graph writes in place, and a
    cache two containers deep, are as the user left them after the map (both runs see them so)."""
    class Counting(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.count = torch.zeros(())
            self.cache: dict[str, dict[int, int]] = {"shapes": {}}

        def forward(self, t: torch.Tensor) -> torch.Tensor:
            self.count.add_(1)
            self.cache["shapes"][t.shape[0]] = 1
            return self.lin(t) * self.count

    model = Counting()
    count, inner = model.count, model.cache["shapes"]
    cmap = run(model, cm.x(4))
    assert cmap.share == 1.0 and cmap.assigned["add"] == "g0"
    assert model.count is count and float(count) == 0.0
    assert model.cache["shapes"] is inner and inner == {}


def test_recompile_limit_is_said() -> None:
    model, (x,) = cm.batch_sized()
    sets = cm.eleven_batches()
    assert len(sets) + 1 == 11 and dynamo.config.recompile_limit == 8
    # the oracle: the same model and inputs under torch.compile, read from Dynamo's counters and
    # from a backend that counts its graphs' calls per input set
    from torch._dynamo.utils import counters

    calls = [0]

    def counting(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> object:
        def f(*a: object) -> object:
            calls[0] += 1
            return gm.forward(*a)
        return f

    saved = {k: Counter(v) for k, v in counters.items()}
    counters.clear()
    dynamo.reset()
    compiled, ran, hit_at = torch.compile(model, backend=counting, dynamic=False), [], None
    with torch.no_grad():
        for k, (t,) in enumerate([(x,), *sets]):
            before = calls[0]
            compiled(t)
            ran.append(calls[0] > before)
            if hit_at is None and any("recompile limit" in m for m in counters["unimplemented"]):
                hit_at = k
    graphs = counters["stats"]["unique_graphs"]
    dynamo.reset()
    counters.clear()
    for k, v in saved.items():
        counters[k].update(v)
    eager = [k for k, r in enumerate(ran) if not r]
    assert hit_at == 8 and eager == [8, 9, 10] and graphs == 8

    cmap = run(model, x, inputs=sets, dynamic=False)
    assert len(cmap.graphs) == graphs and cmap.eager_sets == eager
    (lim,) = cmap.limits
    assert (lim.input_set, lim.func, lim.line, lim.limit, lim.config) == (
        hit_at, "forward", cm.BatchSized.forward.__code__.co_firstlineno, dynamo.config.recompile_limit,
        "torch._dynamo.config.recompile_limit")
    # the reasons that led there: each batch size's recompile, the last one refused
    assert lim.reasons == [f"x: size of dim 0 is {b + 1}, the graph was compiled for {b}" for b in range(2, 10)]
    assert [r.input_set for r in cmap.recompiles] == list(range(1, 8))  # the refused one is no recompile
    assert cmap.header().endswith("✗ recompile limit hit (recompile_limit=8): forward ran eagerly on input sets 8-10")
    assert any("torch._dynamo.config.recompile_limit (8)" in n and "input sets 8-10" in n for n in cmap.notes)
    rows = panels(cmap.graph)["recompiles"]["rows"]
    assert [(r["cells"][0], r["level"]) for r in rows if r["level"] == "error"] == [(8, "error"), (9, "error"), (10, "error")]
    assert "recompile_limit (8) reached" in rows[-1]["cells"][3]
    d = json.loads(cmap.to_json())
    assert d["eager_input_sets"] == eager and d["recompile_limits"][0]["config"] == lim.config
    assert CompileMap.from_json(cmap.to_json()).limits == cmap.limits
    # without the limit in the way (dynamic shapes) nothing runs eagerly and nothing is said
    again = run(model, x, inputs=sets)
    assert again.limits == [] and "recompile limit" not in again.header()


def test_optimized_module_is_unwrapped() -> None:
    model, (x,) = cm.item_break()
    compiled = torch.compile(model, backend="eager")
    cmap = run(compiled, x)  # type: ignore[arg-type]
    assert cmap.notes and "ItemBreak" in cmap.notes[0]
    assert cmap.graph.name == "ItemBreak" and cmap.break_count == 1 and cmap.assigned["mul"] == "g2"


def test_torch_is_left_as_found() -> None:
    def f(t: torch.Tensor) -> torch.Tensor:
        return t.sin() + 1

    users = torch.compile(f, backend="eager")
    users(torch.randn(3))  # the user's own compiled function, counted in Dynamo's counters
    dynamo.config.capture_scalar_outputs = False
    before_config = dynamo.config.get_config_copy()
    from torch._dynamo.symbolic_convert import InstructionTranslatorBase
    from torch._dynamo.utils import counters

    before_counters = {k: Counter(v) for k, v in counters.items()}
    hook = InstructionTranslatorBase.log_graph_break
    model, (x,) = cm.item_break()
    model.train()
    run(model, x)
    assert dynamo.config.get_config_copy() == before_config
    assert {k: Counter(v) for k, v in counters.items() if v} == {k: v for k, v in before_counters.items() if v}
    assert InstructionTranslatorBase.log_graph_break is hook
    assert all(m.training for m in model.modules())
    assert torch.equal(users(torch.ones(3)), torch.ones(3).sin() + 1)  # compiles again, works


def test_a_failing_backend_is_a_model_error_and_leaves_torch_as_found() -> None:
    from torch._dynamo.symbolic_convert import InstructionTranslatorBase

    hook = InstructionTranslatorBase.log_graph_break

    def broken(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> None:
        raise RuntimeError("no kernels today")

    model, (x,) = cm.clean()
    with pytest.raises(ModelError, match=r"torch.compile\(backend='broken'\) on input set 0: .*no kernels today") as e:
        compile_map(model, (x,), backend=broken)
    assert isinstance(e.value.__cause__, Exception) and e.value.graph is None
    assert InstructionTranslatorBase.log_graph_break is hook


def test_a_model_that_fails_eagerly_is_the_eager_traces_error() -> None:
    class Fails(torch.nn.Module):
        def forward(self, t: torch.Tensor) -> torch.Tensor:
            return t @ torch.ones(3, 3)  # (2, 8) @ (3, 3): fails eagerly and compiled alike

    with pytest.raises(ModelError, match="during eager capture: RuntimeError") as e:
        run(Fails(), cm.x())
    assert e.value.graph is not None and e.value.graph.error


def test_categories_from_dynamo_text() -> None:
    assert category("Unsupported Tensor.item() call with capture_scalar_outputs=False", "") == "item"
    assert category("Data-dependent branching", "") == "branch"
    assert category("graph break in loop", "") == "skip"
    assert category("Failed to trace builtin operator", "  Explanation: ... builtin operator `print` ...") == "print"
    assert category("Attempted to call function marked as skipped",
                    "  Explanation: the builtin `zlib.crc32.` is a C/C++ extension") == "unsupported"
    assert category("Something new", "  Explanation: nothing we know") == "other"
    assert in_words("tensor 'x' dtype mismatch. expected Float, actual Half") == \
        "x: dtype is Half, the graph was compiled for Float"
    assert in_words("___check_obj_id(L['self'].training)") == "___check_obj_id(L['self'].training)"
    # torch's text of a failed check (a BART decorator's, from compilation metrics), padded to a column
    assert in_words("not args" + " " * 49 + "# return func(*args, **kwargs)  # transformers/utils/deprecation.py:173 "
                    "in wrapped_func") == "not args no longer holds (return func(*args, **kwargs))"


def test_aot_eager_gives_the_same_map() -> None:
    model, (x,) = cm.item_break()
    a = run(model, x, backend="aot_eager")
    assert a.assigned["mul"] == "g2" and a.assigned["item"] == "eager" and len(a.graphs) == 4
    assert a.backend == "aot_eager"


@pytest.mark.slow
def test_a_saved_map_renders_without_torch(tmp_path: Path) -> None:
    model, (x,) = cm.item_break()
    saved = tmp_path / "map.json"
    saved.write_text(run(model, x).to_json())
    code = ("import sys, io; from rich.console import Console; "
            "from fxviz.analyze.compilemap.result import CompileMap; "
            f"m = CompileMap.from_json(open({str(saved)!r}).read()); c = Console(file=io.StringIO(), width=200); "
            "c.print(m.graph.tree(overlay='coverage')); print(m.header()); "
            "print('torch' in sys.modules, 'scale (Scale)' in c.file.getvalue())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout.splitlines()
    assert out[-2].startswith("4 graphs, 1 break (1 cause)") and out[-1] == "False True"


@pytest.mark.slow
def test_inductor_on_a_tiny_model() -> None:
    model, (x,) = cm.clean()
    cmap = run(model, x, backend="inductor")
    assert (len(cmap.graphs), cmap.break_count, cmap.share) == (1, 0, 1.0)
    assert cmap.graphs[0].compile_s > 0 and cmap.graphs[0].runs == 1


@pytest.mark.slow
def test_gpt2_compiles_whole() -> None:
    from transformers_zoo import gpt2

    model, args, kwargs = gpt2()
    cmap = compile_map(model, args, kwargs, backend="eager")
    assert (len(cmap.graphs), cmap.break_count, cmap.recompiles) == (1, 0, [])
    assert cmap.share == 1.0 and cmap.ops > 50
    assert all(m.compiled == m.ops for m in cmap.modules)
    assert cmap.assigned[next(n.name for n in cmap.graph.ops if n.module == "transformer.h.1.attn.c_attn")] == "g0"


# ---- the command ----------------------------------------------------------------------------------

TARGET = f"{Path(cm.__file__).parent / 'compile_models.py'}"


def invoke(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_cli_tree_and_break_list() -> None:
    code, out, _ = invoke("compile", f"{TARGET}:item_break", "--backend", "eager")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("ItemBreak  torch.compile: 4 graphs, 1 break (1 cause), 89% of ops compiled (8/9)")
    assert any(ln.startswith("├── scale (Scale)") and ln.rstrip().endswith("80 %") for ln in lines)
    assert f"✗ compile_models.py:{cm.LINES['item']}  s = x.abs().mean().item()  # BREAK:item" in lines


def test_cli_fail_on_break_writes_outputs_first(tmp_path: Path) -> None:
    html, js = tmp_path / "r.html", tmp_path / "m.json"
    code, out, _ = invoke("compile", f"{TARGET}:item_break", "-b", "eager", "--html", str(html), "--json", str(js),
                          "--fail-on-break")
    assert code == 1 and html.stat().st_size > 1000
    d = json.loads(js.read_text())
    # one break passed; explain's graph_break_count is its 4 graphs less one (the nested break ends a
    # graph in each of the two frames it is under), as test_item_break_is_written_on_the_eager_graph's explain has it
    guard_counts = d["summary"].pop("guards_distinct"), d["summary"].pop("torch_guard_count")
    assert guard_counts == (sum(len(g["guards"]) for g in d["graphs"]), sum(g["torch_guard_count"] for g in d["graphs"]))
    op_counts = d["summary"].pop("torch_graph_op_count"), d["summary"].pop("no_eager_op")
    assert op_counts == (sum(g["torch_op_count"] for g in d["graphs"]), 0)  # the break's item ran eagerly
    assert d["summary"] == {"graphs": 4, "breaks": 1, "causes": 1, "explain_graph_break_count": 3, "recompiles": 0,
                            "ops": 9, "compiled_ops": 8, "share": 8 / 9}
    assert (d["breaks"][0]["category"], d["breaks"][0]["stack"][-1]["line"]) == ("item", cm.LINES["item"])
    assert d["assigned"]["item"] == "eager" and d["graph"]["annotations"]["overlays"]["compiled"]["nodes"]["mul"] == "g2"
    # the answer, once: the terminal's first line (after the name), JSON's headline, the report's
    headline = "torch.compile: 4 graphs, 1 break (1 cause), 89% of ops compiled (8/9)  ·  backend eager"
    assert out.splitlines()[0] == f"ItemBreak  {headline}" and d["headline"] == headline
    assert d["graph"]["annotations"]["headline"] == {"text": headline, "level": "warn", "panel": "breaks", "node": "item",
                                                     "overlay": "compiled"}
    code, _, _ = invoke("compile", f"{TARGET}:clean", "-b", "eager", "--fail-on-break")
    assert code == 0


def test_cli_json_to_stdout_and_inputs() -> None:
    code, out, _ = invoke("compile", f"{TARGET}:batch_sized", "-b", "eager", "--inputs", f"{TARGET}:more_batches",
                          "--json", "-")
    assert code == 0
    d = json.loads(out)
    assert d["input_sets"] == 3 and [r["input_set"] for r in d["recompiles"]] == [1]


def test_cli_json_stdout_stays_json_when_the_model_prints() -> None:
    code, out, err = invoke("compile", f"{TARGET}:PrintBreak", "-i", "2,8", "-b", "eager", "--json", "-")
    assert code == 0 and json.loads(out)["summary"]["breaks"] == 2
    assert "shape (2, 8)" in err


def test_cli_marks_the_recompile_limit() -> None:
    code, out, _ = invoke("compile", f"{TARGET}:batch_sized", "-b", "eager", "--no-dynamic", "--inputs",
                          f"{TARGET}:eleven_batches")
    assert code == 0
    text = " ".join(out.split())  # the terminal wraps long lines
    assert text.startswith("BatchSized torch.compile: 8 graphs,")
    head = text.split(" note: ", 1)[0]
    assert head.endswith("✗ recompile limit hit (recompile_limit=8): forward ran eagerly on input sets 8-10")
    assert "note: Dynamo hit torch._dynamo.config.recompile_limit (8) for forward" in text


def test_cli_refuses_a_saved_graph(tmp_path: Path) -> None:
    g = tmp_path / "g.json"
    g.write_text(run(*cm.clean()[:1], cm.x()).graph.to_json())
    code, _, err = invoke("compile", str(g))
    assert code == 2 and "give a factory" in err
    code, _, err = invoke("compile", f"{TARGET}:clean", "-b", "eager", "--mode", "max-autotune")
    assert code == 2 and "inductor backend only" in err


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("scenario", ["momentum_loop", "momentum_update", "momentum_no_grad"])
def test_parameters_a_compiled_graph_writes_in_place_are_put_back(scenario: str, backend: str) -> None:
    from tests.state_models import SCENARIOS

    model, args, _ = SCENARIOS[scenario]()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # torch's record: the same forward under torch.compile writes the model's parameters
    twin, _, _ = SCENARIOS[scenario]()
    try:
        with torch.no_grad():
            torch.compile(twin, backend=backend)(*args)
    finally:
        dynamo.reset()
    moved = {k for k, v in twin.state_dict().items() if not torch.equal(before[k], v)}
    assert moved
    cmap = compile_map(model, args, backend=backend)
    assert cmap.break_count == 0 and len(cmap.graphs) == 1
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), moved
