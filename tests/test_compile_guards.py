"""Guards and dynamic shapes of the compile map, against torch's own record of the same run: the
structured trace (what TORCH_TRACE writes and tlparse reads) captured in-process with a handler on
torch's ``trace_structured`` logger: ``create_symbol`` and ``guard_added_fast`` from the ShapeEnv,
``dynamo_cpp_guards_str`` (the guard manager Dynamo built) and ``recompile_reasons``."""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import compile_models as cm
import pytest
import torch
import torch._dynamo as dynamo
from torch import nn
from torch._logging._internal import trace_log

from fxviz.analyze.compilemap import CompileMap, compile_map
from fxviz.analyze.compilemap.frames import library_of
from fxviz.analyze.compilemap.overlay import guard_lines
from fxviz.passes.panels import panels

HERE = str(Path(cm.__file__).resolve())
BRANCH = cm.LINES["size-branch"]


class Trace(logging.Handler):
    """torch's structured trace of a run: ``(kind, metadata, payload)`` per record, with the
    interned file names resolved. torch writes a ``str`` record once per process for each name it
    interns: names an earlier run of the process interned come from its intern table."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[str, dict[str, Any], Any]] = []
        self.strings: dict[int, str] = {i: s for s, i in torch._logging.structured.INTERN_TABLE.items()}

    def emit(self, record: logging.LogRecord) -> None:
        md = record.metadata  # type: ignore[attr-defined]
        kind = next(k for k in md if k not in ("frame_id", "frame_compile_id", "attempt", "rank"))
        if kind == "str":
            self.strings[md["str"][1]] = md["str"][0]
        if kind == "artifact":
            kind = md["artifact"]["name"]
        self.records.append((kind, md.get(kind, md), record.payload))  # type: ignore[attr-defined]

    def of(self, kind: str) -> list[tuple[dict[str, Any], Any]]:
        return [(md, p) for k, md, p in self.records if k == kind]

    def stack(self, md: dict[str, Any]) -> list[tuple[str, int]]:
        return [(self.strings[f["filename"]], f["line"]) for f in md["user_stack"]]


@pytest.fixture
def trace() -> Iterator[Trace]:
    h = Trace()  # torch's structured trace stays at DEBUG while fxviz quiets torch's other loggers
    trace_log.addHandler(h)
    try:
        yield h
    finally:
        trace_log.removeHandler(h)


def _cpp_shape_checks(text: str) -> list[str]:
    """The symbolic-shape checks of a ``dynamo_cpp_guards_str``: root-level lambda guards on sizes."""
    return [m.group(1) for m in re.finditer(r"^\+- LAMBDA_GUARD: (.*?\.size\(\).*?)  # ", text, re.M)]


def _cpp_sources(text: str) -> set[str]:
    """Sources whose guard manager holds leaf guards of its own (a generic dict's ``.__dict__``
    manager checks its owner's attributes: Dynamo's guard names the owner)."""
    out, lines = set(), text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^((?:\| )*)\+- GuardManager: source=(.*?), accessed_by=", line)
        if m and i + 1 < len(lines):
            child = lines[i + 1]
            depth = len(m.group(1)) // 2 + 1
            if child.startswith("| " * depth + "+- ") and "GuardManager" not in child.split(":", 1)[0]:
                out.add(m.group(2).removesuffix(".__dict__"))
    return out


def test_dynamic_shapes_symbols_and_guards_match_torchs_record(trace: Trace) -> None:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    hook = ShapeEnv._get_sloc
    model, (x,) = cm.batch_branch()
    cmap = compile_map(model, (x,), backend="eager", dynamic=True)
    assert ShapeEnv._get_sloc is hook  # the recorder's hook is taken off again
    (g,) = cmap.graphs
    # symbols: torch's create_symbol records, one for one (name, source, the size traced with)
    created = {md["symbol"]: md for md, _ in trace.of("create_symbol")}
    assert {s.name: (s.source, s.value) for s in g.symbols} == {
        k: (md["source"], int(md["val"])) for k, md in created.items()}
    batch = next(s for s in g.symbols if s.source == "L['x'].size()[0]")
    feat = next(s for s in g.symbols if s.source == "L['x'].size()[1]")
    assert (batch.input, batch.dim, batch.lo, batch.hi, batch.value, batch.specialised) == ("x", 0, 2, 4, 2, None)
    assert (feat.input, feat.dim, feat.specialised) == ("x", 1, 8)
    assert g.inputs == [f"x: ({batch.name}, 8)"]
    # shape guards: torch's guard_added_fast records, each with the user's stack at the guard: the
    # guard's line is the innermost frame of the user's code, the library line inside it is kept
    added = {md["expr"]: trace.stack(md) for md, _ in trace.of("guard_added_fast")}
    assert {sg.expr: (sg.file, sg.line) for sg in g.shape_guards} == {
        e: next((f, n) for f, n in reversed(st) if not library_of(f)) for e, st in added.items()}
    assert added[f"{batch.name} <= 4"][-1] == (HERE, BRANCH)
    spec = next(sg for sg in g.shape_guards if sg.expr == f"Eq({feat.name}, 8)")
    assert added[spec.expr][-1][0].endswith("torch/nn/modules/linear.py")  # torch: inside nn.Linear ...
    assert (spec.file, spec.code) == (HERE, "x = self.lin(x)")  # ... called from the user's line
    assert spec.via == f"torch/nn/modules/linear.py:{added[spec.expr][-1][1]}"
    assert (feat.file, feat.line) == (spec.file, spec.line)
    assert (batch.file, batch.line) == (HERE, BRANCH) and batch.code.startswith("if x.shape[0] > 4:")
    # every guard: the shape checks and every guarded source of the guard manager torch built
    (cpp,) = [p for _, p in trace.of("dynamo_cpp_guards_str")]
    ours = [t.split(": ", 1)[1] for t in g.guards if t.startswith("SHAPE_ENV: ")]
    assert len(ours) == len(_cpp_shape_checks(cpp)) == 1
    assert "2 <= L['x'].size()[0] <= 4" in cpp and ours[0] in ("2 <= L['x'].size()[0] <= 4",
                                                           "2 <= L['x'].size()[0] and L['x'].size()[0] <= 4")
    sources = {t.rsplit(": ", 1)[0] for t in g.guards}
    assert _cpp_sources(cpp) <= sources and "L['x']" in sources
    # advice: the batch is held to one side of the branch, the feature size must stay static
    assert "mark_dynamic does not avoid" in batch.advice and f"compile_models.py:{BRANCH}" in batch.advice
    assert "leave it static" in feat.advice and "mark_dynamic(x, 1)" in feat.advice
    rows = panels(cmap.graph)["shapes"]["rows"]
    assert ["g0", batch.text(), f"compile_models.py:{BRANCH}"] in [r["cells"][:3] for r in rows]
    again = CompileMap.from_json(cmap.to_json()).graphs[0]
    assert (again.symbols, again.shape_guards, again.guards) == (g.symbols, g.shape_guards, g.guards)


def test_specialised_dimension_cannot_be_marked_dynamic() -> None:
    """The advice "leave it static" is torch's own behaviour: marking the specialised dim raises."""
    from torch.fx.experimental.symbolic_shapes import ConstraintViolationError

    model, (x,) = cm.batch_branch()
    x = x.clone()
    dynamo.mark_dynamic(x, 1)
    f = torch.compile(model, backend="eager")
    try:
        with pytest.raises(ConstraintViolationError, match=r"specialized it to be a constant \(8\)"), torch.no_grad():
            f(x)
    finally:
        dynamo.reset()


def test_recompile_on_a_new_batch_size_names_the_dimension_and_the_guard(trace: Trace) -> None:
    model, (x,) = cm.batch_branch()
    cmap = compile_map(model, (x,), backend="eager", inputs=cm.wide_batches())
    reasons = [p for _, p in trace.of("recompile_reasons")]
    torch_reasons = [re.sub(r"^\d+/\d+: ", "", (r[0] if isinstance(r, list) else r.strip("[]\n \"")).split("\n")[0])
                     for r in reasons]
    first, second = cmap.recompiles
    # batch 3: the static graph's size check; Dynamo compiles a dynamic batch next (automatic dynamic)
    assert (first.input_set, first.input, first.dim) == (1, "x", 0)
    assert first.guard == torch_reasons[0] == "tensor 'x' size mismatch at index 0. expected 2, actual 3"
    assert first.reason == "x: size of dim 0 is 3, the graph was compiled for 2"
    assert "torch._dynamo.mark_dynamic(x, 0)" in first.advice
    # batch 6: the dynamic graph's guard from the branch on the batch size
    assert (second.input_set, second.input, second.dim) == (2, "x", 0)
    g1_batch = cmap.graphs[1].symbols[0].name  # the symbol of the graph whose guard failed
    assert torch_reasons[1].startswith(second.guard.split("  # ", 1)[0]) and "x.size()[0]" in second.guard
    # the failed guard does not say the size: the graph compiled next was traced with it
    assert second.reason.startswith(f"x dim 0 is 6 ({g1_batch}), outside [2, 4], the range the graph was compiled for")
    assert f"compile_models.py:{BRANCH}" in second.reason
    assert "mark_dynamic does not avoid" in second.advice
    g1, g2 = cmap.graphs[1:]
    assert [s.text().split(" = ", 1)[1] for s in g1.symbols] == ["x dim 0 in [2, 4]"]
    assert [s.text().split(" = ", 1)[1] for s in g2.symbols] == ["x dim 0 in [5, ∞)"]
    lines = guard_lines(cmap)
    assert any(ln.startswith("recompile (input set 2, forward, compile 0/2): x dim 0") for ln in lines)


def test_a_recompile_is_explained_by_its_own_functions_graph_not_a_namesake(trace: Trace) -> None:
    """Every module's ``forward`` is a ``forward``: the outer one's recompile must be read on the
    outer frame's graph (its branch, its range), not on the inner ``forward`` compiled after it."""
    model, sets = cm.two_forwards()
    cmap = compile_map(model, sets[0], backend="eager", inputs=sets[1:])
    reasons = [re.sub(r"^\d+/\d+: ", "", (r[0] if isinstance(r, list) else r.strip("[]\n \"")).split("\n")[0])
               for _, r in trace.of("recompile_reasons")]
    last = [r for r in cmap.recompiles if r.input_set == 2]
    assert [r.func for r in last] == ["forward"] and last[0].line == cm.TwoForwards.forward.__code__.co_firstlineno
    (r,) = last
    # torch's record of the failed guard: the outer frame's range, from its branch
    assert reasons[-1].startswith(r.guard.split("  # ", 1)[0]) and "<= 5" in r.guard
    assert r.reason.startswith("x dim 0 is 7 (") and "outside [2, 5]" in r.reason, r.reason
    assert f"compile_models.py:{cm.LINES['outer-branch']}" in r.reason
    assert "mark_dynamic does not avoid" in r.advice, r.advice


def test_mark_dynamic_advice_avoids_the_recompile() -> None:
    """Following the advice given for BatchSized's recompile: torch compiles once for every batch."""
    model, (x,) = cm.batch_sized()
    cmap = compile_map(model, (x,), backend="eager", inputs=cm.more_batches())
    (r,) = cmap.recompiles
    assert (r.input, r.dim) == ("x", 0) and "mark_dynamic(x, 0)" in r.advice
    from torch._dynamo.utils import counters

    counters.clear()
    x = x.clone()
    dynamo.mark_dynamic(x, 0)
    f = torch.compile(model, backend="eager")
    try:
        with torch.no_grad():
            for batch in (x, *(b for (b,) in cm.more_batches())):
                f(batch)
        assert counters["stats"]["unique_graphs"] == 1
    finally:
        dynamo.reset()
        counters.clear()


def _deep() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(4, 4) for _ in range(30))).eval()


def test_every_guard_is_kept(trace: Trace) -> None:
    model = _deep()
    cmap = compile_map(model, (torch.randn(2, 4),), backend="eager")
    (g,) = cmap.graphs
    (cpp,) = [p for _, p in trace.of("dynamo_cpp_guards_str")]
    assert len(g.guards) > 200  # fxviz cut them at 200 before
    sources = {t.rsplit(": ", 1)[0] for t in g.guards}
    assert _cpp_sources(cpp) <= sources
    assert sum(1 for s in sources if s.endswith("._parameters['weight']")) == 30
    assert len(panels(cmap.graph)["guards"]["rows"]) == len(g.guards)  # the report's panel: every one
    text = str(cmap.graph)  # the tree prints a page of them
    assert f"... {len(g.guards) - 20} more rows (the report and the JSON list all)" in text
    # a page of guards, and g0's own row in the compiled-graphs table above them
    assert sum(1 for ln in text.splitlines() if ln.startswith("│ g0 ")) == 20 + 1
    assert any(ln.startswith(f"distinct guards: g0 {len(g.guards)} (torch ") for ln in guard_lines(cmap))


def test_the_terminal_pages_shape_guards() -> None:
    model, (x,) = cm.batch_branch()
    cmap = compile_map(model, (x,), backend="eager", dynamic=True)
    full = guard_lines(cmap, limit=100)
    short = guard_lines(cmap, limit=2)
    assert len(full) > 4 and short[1:3] == full[1:3]
    shown = sum(1 for ln in full[1:] if ln.startswith("  "))  # the lines of g0's symbols and guards
    assert short[3] == f"  ... {shown - 2} more (--json and --html keep every one)"



def _keeps_args(fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:  # as transformers' deprecate_kwarg wraps every forward
        return fn(*args, **kwargs)
    return wrapped


class Decorated(nn.Module):
    """A forward behind a ``*args, **kwargs`` decorator: Dynamo's frame is the decorator's, whose
    locals are ``args`` (``args[0]`` the module, ``args[1]`` the tokens) and ``kwargs``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    @_keeps_args
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lin(tokens).sum(1)


def test_a_decorated_forwards_recompiles_name_the_users_input_not_the_decorators_local(trace: Trace) -> None:
    torch.manual_seed(0)
    model = Decorated().eval()
    sets = [(torch.randn(2, n, 8),) for n in (5, 7, 1)]
    cmap = compile_map(model, sets[0], backend="eager", inputs=sets[1:])
    reasons = [re.sub(r"^\d+/\d+: ", "", (r[0] if isinstance(r, list) else r.strip("[]\n \"")).split("\n")[0])
               for _, r in trace.of("recompile_reasons")]
    # torch's record names the decorator's local: the static size check, then the 0/1 specialisation
    assert reasons[0] == "tensor 'args[1]' size mismatch at index 1. expected 5, actual 7"
    assert reasons[1].startswith("2 <= args[1].size()[1]")
    first, second = cmap.recompiles
    assert first.guard == reasons[0] and reasons[1].startswith(second.guard.split("  # ", 1)[0])
    assert (first.input, first.dim, second.input, second.dim) == ("tokens", 1, "tokens", 1)
    assert first.reason == "tokens: size of dim 1 is 7, the graph was compiled for 5"
    assert "mark_dynamic(tokens, 1)" in first.advice
    assert second.reason.startswith("tokens dim 1 is 1 (") and "mark_unbacked(tokens, 1)" in second.advice
    # the graphs' inputs are the user's tensor, not the module's parameters reached through args[0]
    g0, g1 = cmap.graphs[:2]
    assert g0.inputs == ["tokens: (2, 5, 8)"]
    (sym,) = g1.symbols
    assert (sym.input, sym.dim, sym.source) == ("tokens", 1, "L['args'][1].size()[1]")
    assert g1.inputs == [f"tokens: (2, {sym.name}, 8)"]
    # the advice, followed on the sizes above 1: torch compiles one graph
    from torch._dynamo.utils import counters

    counters.clear()
    f = torch.compile(model, backend="eager")
    try:
        with torch.no_grad():
            for n in (5, 7, 9):
                t = torch.randn(2, n, 8)
                dynamo.mark_dynamic(t, 1)
                f(t)
        assert counters["stats"]["unique_graphs"] == 1
    finally:
        dynamo.reset()
        counters.clear()


def test_a_decorated_forwards_recompile_limit_names_the_users_input(trace: Trace) -> None:
    torch.manual_seed(0)
    model = Decorated().eval()
    sets = [(torch.randn(2, n, 8),) for n in range(2, 12)]
    cmap = compile_map(model, sets[0], backend="eager", inputs=sets[1:], dynamic=False)
    reasons = [re.sub(r"^\d+/\d+: ", "", (r[0] if isinstance(r, list) else r.strip("[]\n \"")).split("\n")[0])
               for _, r in trace.of("recompile_reasons")]
    # torch: 8 graphs for sizes 2-9, then the limit; its last failed guard names args[1]
    assert len(cmap.graphs) == dynamo.config.recompile_limit == 8
    assert "tensor 'args[1]' size mismatch at index 1. expected 9, actual 10" in reasons[-1]
    (lim,) = cmap.limits
    assert lim.eager_sets == [8, 9]
    assert lim.reasons[-1] == "tokens: size of dim 1 is 10, the graph was compiled for 9"
    assert "args[1]" not in lim.note()


class Parity(nn.Module):
    """Branches on the parity of half its sequence length: under dynamic shapes the guard is
    ``((s // 2) % 2) == 0``, not a bound, so a size inside the symbol's range can fail it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if (x.shape[1] // 2) % 2 == 0:  # parity-branch
            return y * 2
        return y - 1


def test_a_failed_guard_that_is_no_bound_is_not_called_a_size_outside_the_range() -> None:
    sets = [(torch.randn(2, n, 4),) for n in (6, 8, 10)]
    model = Parity().eval()
    # torch's own record, a plain run: the failed guards as compilation metrics keep them
    from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

    dynamo.reset()
    clear_compilation_metrics()
    compiled = torch.compile(model, backend="eager")
    with torch.no_grad():
        for s in sets:
            compiled(*s)
    reasons = [re.sub(r"^\d+/\d+: ", "", m.recompile_reason or "") for m in get_compilation_metrics()]
    dynamo.reset()
    assert len(reasons) == 3 and reasons[2].startswith("((x.size()[1] // 2) % 2) == 0  # ")

    cmap = compile_map(model, sets[0], backend="eager", inputs=sets[1:])
    first, second = cmap.recompiles
    # the guard as torch wrote it, its location (torch's frame, not fxviz's wrapper) included
    assert (first.guard, second.guard) == (reasons[1], reasons[2])
    (sym,) = cmap.graphs[1].symbols
    assert sym.lo is not None and sym.lo <= 10 and (sym.hi is None or sym.hi >= 10)  # 10 is inside its range
    line = next(n for n, t in enumerate(Path(__file__).read_text().splitlines(), 1) if t.endswith("# parity-branch"))
    assert "outside" not in second.reason, second.reason
    assert second.reason.startswith(f"x dim 1 is 10 ({sym.name}), which does not satisfy the guard "
                                    "((x.size()[1] // 2) % 2) == 0"), second.reason
    assert f"test_compile_guards.py:{line}" in second.reason
    assert "mark_dynamic does not avoid" in second.advice and "0 or 1" not in second.advice
    # the branch guard is the symbol's branch, not a specialisation: the symbol's advice names it
    assert f"test_compile_guards.py:{line}" in sym.advice, sym.advice


def test_a_guard_in_a_packaged_models_call_to_torch_nn_is_on_the_models_line() -> None:
    """A transformers model has no frame of the user's own: a guard torch.nn's batch norm installs
    is at the model's line that called the layer (``modeling_resnet.py``), torch's line its ``via``."""
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(0)
    model = ResNetModel(ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8], depths=[1],
                                     layer_type="basic")).eval()
    sets = [(torch.randn(1, 3, n, n),) for n in (32, 48)]
    cmap = compile_map(model, sets[0], backend="eager", inputs=sets[1:])
    g1 = cmap.graphs[1]
    assert {(s.input, s.dim) for s in g1.symbols} == {("pixel_values", 2), ("pixel_values", 3)}
    by_torch = [g for g in g1.shape_guards if g.via.startswith("torch/nn/modules/batchnorm.py")]
    assert by_torch, [(g.file, g.line, g.via) for g in g1.shape_guards]
    for g in by_torch:  # the model's own line, read back from its file
        assert library_of(g.file).startswith("transformers/models/resnet/modeling_resnet.py"), g.file
        assert "self.normalization(" in g.code and Path(g.file).read_text().splitlines()[g.line - 1].strip() == g.code
    assert all(library_of(s.file).startswith("transformers/") for s in g1.symbols)
