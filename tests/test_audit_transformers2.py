"""A fifth audit of ``fxviz compile`` on transformers architectures the rest of the suite leaves
out (Mixtral's eager experts loop, Whisper, Swin, Mamba, T5), each fact checked against torch's own
record of the same run: the structured trace (what TORCH_TRACE writes and tlparse reads) taken
in-process from torch's ``trace_structured`` logger, ``torch._dynamo.explain`` and the compilation
metrics."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch._logging._internal import trace_log

from fxviz.analyze.compilemap import compile_map
from fxviz.analyze.compilemap.overlay import guard_lines


class Trace(logging.Handler):
    """torch's structured trace records of a run: ``(kind, metadata)``."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[str, dict[str, Any]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        md = record.metadata  # type: ignore[attr-defined]
        kind = next(k for k in md if k not in ("frame_id", "frame_compile_id", "attempt", "rank"))
        body = md.get(kind)
        if isinstance(body, dict):
            self.records.append((kind, {**body, "compile_id": f"{md.get('frame_id')}/{md.get('frame_compile_id')}",
                                        "payload": getattr(record, "payload", None)}))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [md for k, md in self.records if k == kind]


@pytest.fixture
def trace() -> Iterator[Trace]:
    h = Trace()
    trace_log.addHandler(h)
    try:
        yield h
    finally:
        trace_log.removeHandler(h)


class Act(nn.Module):
    """What Mixtral's eager experts loop does to its activation: each expert's tokens arrive as a
    non-contiguous half of ``gate_up`` (``chunk(2, -1)``), a new count each call, so the second call
    recompiles with a symbolic size and a symbolic stride (the view's row stride, which its sizes do
    not give)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.silu(x) * 2


def test_every_symbol_torch_created_is_listed_strides_included(trace: Trace) -> None:
    first, then = torch.randn(3, 128).chunk(2, -1)[0], torch.randn(5, 128).chunk(2, -1)[0]
    cmap = compile_map(Act(), (first,), backend="eager", inputs=[(then,)])
    g = cmap.graphs[-1]
    created = {md["symbol"]: (md["source"], int(md["val"])) for md in trace.of("create_symbol")}
    stride = next(k for k, (src, _) in created.items() if src == "L['x'].stride()[0]")
    # torch's record: the recompile made a stride symbol, and a guard reads it
    assert any(stride in md["expr"] for md in trace.of("guard_added_fast"))
    # fxviz: every symbol torch created, one for one (before: the stride symbol was left out, and the
    # guard Ne(s.., 64) named a symbol the map never defined)
    assert {s.name: (s.source, s.value) for s in g.symbols} == created
    assert {x for sg in g.shape_guards for x in sg.symbols} <= {s.name for s in g.symbols}
    sym = next(s for s in g.symbols if s.name == stride)
    assert (sym.kind, sym.input, sym.dim, sym.value) == ("stride", "x", 0, 128)
    assert sym.text().startswith(f"{stride} = x stride 0 in [")
    assert not sym.advice  # mark_dynamic marks sizes, not strides
    # the terminal, the JSON and the panel the report draws say the same
    assert any(sym.text() in line for line in guard_lines(cmap, limit=50))
    back = type(cmap).from_json(cmap.to_json())
    assert [s.text() for s in back.graphs[-1].symbols] == [s.text() for s in g.symbols]
    rows = cmap.graph.annotations["panels"]["shapes"]["rows"]
    assert any(sym.text() in str(r) for r in rows)


class Steps(nn.Module):
    """An int input under dynamic=True is a symbol of its own (torch's source ``L['n']``)."""

    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x * n + n


def test_an_int_inputs_symbol_is_listed(trace: Trace) -> None:
    cmap = compile_map(Steps(), (torch.randn(4), 3), backend="eager", dynamic=True)
    (g,) = cmap.graphs
    created = {md["symbol"]: (md["source"], int(md["val"])) for md in trace.of("create_symbol")}
    ranges = {md["source"]: md["vr"] for md in trace.of("create_symbol")}
    assert ranges["L['n']"] == "[-int_oo, int_oo]"
    assert {s.name: (s.source, s.value) for s in g.symbols} == created
    n = next(s for s in g.symbols if s.source == "L['n']")
    assert (n.kind, n.input, n.value) == ("value", "n", 3) and n.text() == f"{n.name} = n in (-∞, ∞)"


class InPlace(nn.Module):
    """T5's relative position buckets (``relative_buckets += ...``) and a tensor ``__setitem__``:
    Dynamo keeps them as ``operator.iadd``/``operator.setitem`` nodes, which fx prints as the
    statement and then the node (``h += s;  h_1 = h``, ``h_1[0] = 1.0;  setitem = h_1``)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        h += self.b(x).sigmoid()
        h *= 2
        h[0] = 1.0
        h[:, 1] = x[:, 2]
        return torch.tanh(h)


def test_dynamo_graphs_with_in_place_operators_are_read_node_for_node() -> None:
    from fxviz.tracefile.fxtext import parse_graph

    seen: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example: Any) -> Any:
        seen.append(gm)
        return gm.forward

    torch._dynamo.reset()
    try:
        torch.compile(InPlace(), backend=keep)(torch.randn(4, 8))
    finally:
        torch._dynamo.reset()
    (gm,) = seen
    g = parse_graph(gm.print_readable(print_output=False), name="g0")  # before: TraceFileError at 'h += ...'
    ops = {n.name: n for n in g.nodes if n.kind == "op"}
    theirs = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")]
    assert list(ops) == [n.name for n in theirs]
    for n in theirs:
        assert ops[n.name].target.rpartition(".")[2] == (n.target if n.op == "call_method" else n.target.__name__)
        assert {r.node for r in ops[n.name].inputs} == {a.name for a in n.all_input_nodes}
    assert [ops[n].target for n in ("h_1", "h_2", "setitem", "setitem_1")] == [
        "operator.iadd", "operator.imul", "operator.setitem", "operator.setitem"]


def test_inside_reads_the_dynamo_graph_of_a_model_with_in_place_operators() -> None:
    cmap = compile_map(InPlace(), (torch.randn(4, 8),), backend="aot_eager", grad=True, inside=True)
    assert cmap.inside is not None
    # before: 'g0 Dynamo graph not read: TraceFileError ... cannot read this statement: h += sigmoid'
    assert not [n for n in cmap.inside.notes if "not read" in n]


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).sigmoid()


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.gate = nn.Linear(8, 8), Gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        h += self.gate(x)
        return torch.tanh(h) * 2


def _results_saved_by_eager(model: nn.Module, x: torch.Tensor) -> set[str]:
    """The ops whose own output eager autograd saves (``grad_fn._saved_result``): torch's record."""
    out, seen, todo = set(), set(), [model(x).grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if hasattr(fn, "_saved_result"):
            out.add(type(fn).__name__.removesuffix("Backward0").lower())
        todo += [f for f, _ in fn.next_functions]
    return out


def test_aot_eager_partition_saves_are_on_the_op_that_made_them() -> None:
    torch.manual_seed(0)
    model, x = Gated(), torch.randn(4, 8)
    cmap = compile_map(model, (x,), backend="aot_eager", grad=True, inside=True)
    assert cmap.inside is not None
    (part,) = [g.partition for g in cmap.inside.graphs if g.partition is not None]
    made = {(s.eager, s.module) for s in part.saved if not s.shares}
    # AOT Autograd saves detach(detach(tanh)) and detach(sigmoid); before, the first was put on the
    # mul printed after it on the same line (eager 'mul'), the second on no module at all
    assert {e for e, _ in made} == _results_saved_by_eager(model, x) == {"tanh", "sigmoid"}
    assert made == {("tanh", ""), ("sigmoid", "gate")}


class Masked(nn.Module):
    """Mixtral's eager experts build their mask under ``with torch.no_grad():``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            mask = x > 0
        return self.lin(x) * mask


def test_the_forward_is_compiled_as_a_call_under_no_grad_as_the_help_says() -> None:
    from click.testing import CliRunner

    from fxviz.cli import cli

    model, x = Masked(), torch.randn(2, 4)
    cmap = compile_map(model, (x,), backend="eager")
    torch._dynamo.reset()
    with torch.no_grad():
        under = torch._dynamo.explain(model)(x)
    torch._dynamo.reset()
    plain = torch._dynamo.explain(model)(x)
    torch._dynamo.reset()

    def calls(e: Any) -> list[int]:
        return [sum(1 for n in g.graph.nodes if n.op.startswith("call_")) for g in e.graphs]

    # torch's record: grad mode changes the graph (two _set_grad_enabled nodes with grad on)
    assert calls(plain) == [c + 2 for c in calls(under)]
    assert [g.ops for g in cmap.graphs] == calls(under)
    assert "torch.no_grad()" in CliRunner().invoke(cli, ["compile", "--help"]).output


class Options(nn.Module):
    """transformers' forwards take ``**kwargs`` and look keys up (``return_dict``, ``output_attentions``):
    Dynamo guards each absent key on its own."""

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        if "scale" in kwargs:
            x = x * kwargs["scale"]
        if "shift" in kwargs:
            x = x + kwargs["shift"]
        if hasattr(self, "bias"):
            x = x + 1
        return x.relu()


def test_guards_that_differ_by_their_argument_are_each_kept(trace: Trace) -> None:
    import re

    cmap = compile_map(Options(), (torch.randn(3),), backend="eager")
    (g,) = cmap.graphs
    (text,) = [str(md["payload"]) for md in trace.of("dynamo_cpp_guards_str")]
    absent = set(re.findall(r"not ___dict_contains\('(\w+)', L\['kwargs'\]\)", text))
    assert absent == {"scale", "shift"}  # torch's guard manager: one check per key
    # before: both were the one line "L['kwargs']: DICT_NOT_CONTAINS"
    mine = {t for t in g.guards if t.startswith("L['kwargs']: DICT_NOT_CONTAINS")}
    assert mine == {f"L['kwargs']: DICT_NOT_CONTAINS (key={k!r})" for k in absent}


def test_values_on_no_module_are_counted_and_explained() -> None:
    """Mamba's selective scan under aot_eager: AOT Autograd gives some saved values the source line of
    a torch function (``F.pad`` inside the scan), which no Dynamo op with a module has. The live run
    now records torch's own module of each AOT node (``nn_module_stack``), so none is left on '?'
    (the audit found 8 of 54, 51.5 KB); the summary's "on no module ('?')" clause counts only what a
    record leaves without one, and says so in the report's panel note too."""
    from transformers import MambaConfig, MambaForCausalLM

    from fxviz.analyze.inside.partition import Partition, SavedValue, summary

    torch.manual_seed(0)
    cfg = MambaConfig(vocab_size=96, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4)
    model = MambaForCausalLM(cfg).eval()
    cmap = compile_map(model, (torch.randint(0, 96, (1, 7)),), backend="aot_eager", grad=True, inside=True)
    assert cmap.inside is not None
    parts = [g.partition for g in cmap.inside.graphs if g.partition is not None]
    assert sum(len(p.saved) for p in parts) == 54
    assert [s for p in parts for s in p.saved if s.module is None] == []
    assert [c for p in parts for c in p.recomputed if c.module is None] == []
    text = summary(parts)
    assert "on no module" not in text
    left = Partition([SavedValue("a", None, 2048, [512], "float32"), SavedValue("b", "m", 4, [1], "float32")])
    assert "; 1 saved value(s) (2.0 KB) and 0 recomputed op(s) on no module ('?')" in summary([left])
    note = cmap.graph.annotations["panels"]["partition"]["note"]
    assert text in note
