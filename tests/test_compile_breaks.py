"""Graph breaks of the compile map against torch's own record: a break inside library code is
placed at the user's line that called it (as ``torch._dynamo.explain``'s user stack has it), with
the library line as detail; categories come from torch's registry of break types, not the message."""

from __future__ import annotations

import importlib.util
import json
import logging
import re
from pathlib import Path

import compile_models as cm
import torch
import torch._dynamo as dynamo
from torch._logging._internal import trace_log

from fxviz.analyze.compilemap import CompileMap, compile_map
from fxviz.analyze.compilemap.breaks import BY_ID, category, library_of, registry
from fxviz.analyze.compilemap.overlay import break_lines
from fxviz.passes.panels import panels

HERE = str(Path(cm.__file__).resolve())
REGISTRY = json.loads((Path(torch.__file__).parent / "_dynamo" / "graph_break_registry.json").read_text())


def test_a_break_inside_the_standard_library_is_placed_at_the_users_line() -> None:
    torch.manual_seed(0)
    model, x = cm.JsonBreak().eval(), cm.x()
    with torch.no_grad():
        explained = dynamo.explain(model)(x)
    dynamo.reset()
    (reason,) = explained.break_reasons
    torch_stack = reason.user_stack
    # torch's own record: the innermost frame is the json encoder, called from the user's line
    assert torch_stack[-1].filename != HERE and "json" in torch_stack[-2].filename
    user = [f for f in torch_stack if f.filename == HERE]
    assert (user[-1].lineno, user[-1].name) == (cm.LINES["json"], "forward")

    cmap = compile_map(model, (x,), backend="eager")
    (b,) = cmap.breaks
    assert (b.where.file, b.where.line, b.where.func) == (HERE, user[-1].lineno, "forward")  # type: ignore[union-attr]
    lib = b.library
    assert lib is not None and lib.library == "json/encoder.py" and lib.func == "iterencode"
    assert (lib.file, lib.line) in {(f.filename, f.lineno) for f in torch_stack}
    assert [f.library for f in b.stack][:2] == ["", "json/__init__.py"]
    assert b.gb_id in REGISTRY and b.category == BY_ID.get(b.gb_id, "other")
    assert b.line_text() == f"compile_models.py:{cm.LINES['json']}"
    lines = break_lines(cmap.breaks)
    assert lines[0].startswith(f"✗ compile_models.py:{cm.LINES['json']}  meta = json.dumps(")
    assert lines[1].startswith(f"    broke inside json/encoder.py:{lib.line} (iterencode)")
    p = panels(cmap.graph)["breaks"]
    # the panel says what the terminal's lines say: the place and its code, the library line and its
    assert p["columns"][-3:] == ["broke in (library)", "code", "see"]
    assert p["rows"][0]["cells"][0] == f"compile_models.py:{cm.LINES['json']}"
    assert lib.code == next(f.line for f in torch_stack if (f.filename, f.lineno) == (lib.file, lib.line)).strip()
    assert p["rows"][0]["cells"][-3] == f"json/encoder.py:{lib.line} in iterencode: {lib.code}"
    assert lines[0].endswith(f"  {p['rows'][0]['cells'][-2]}") and lines[1].endswith(f": {lib.code}")
    assert lines[2] == f"    see {p['rows'][0]['cells'][-1]}" and b.link
    again = CompileMap.from_json(cmap.to_json()).breaks[0]  # the JSON keeps place and library frame
    assert (again.where, again.library) == (b.where, b.library)


def test_user_breaks_have_no_library_detail() -> None:
    cmap = compile_map(cm.ExtensionBreak().eval(), (cm.x(),), backend="eager")
    (b,) = cmap.breaks
    assert b.library is None and b.where.library == "" and b.gb_id == "GB0007"  # type: ignore[union-attr]
    assert "broke in (library)" not in panels(cmap.graph)["breaks"]["columns"]


def _types(gb_id: str) -> list[str]:
    return [e["Gb_type"] for e in REGISTRY[gb_id]]


def test_categories_come_from_torchs_registry_of_break_types() -> None:
    expected = {"GB0124": "item", "GB0109": "item", "GB0170": "branch", "GB0035": "branch", "GB0033": "value", "GB0036": "shape",
                "GB0291": "print", "GB0007": "unsupported", "GB0147": "unsupported", "GB0103": "subclass",
                "GB0163": "subclass", "GB7000": "skip", "GB0025": "other", "GB0219": "other"}
    for gb_id, cat in expected.items():
        for gb_type in _types(gb_id):  # every name the type has had
            assert category(gb_type, "") == cat, (gb_id, gb_type)
    assert set(BY_ID) <= set(REGISTRY)  # every id fxviz maps is one torch knows


def test_the_words_of_a_message_do_not_make_a_category() -> None:
    # Dynamo's own text for a missing slot of one of its VariableTracker subclasses: not a tensor subclass
    (entry,) = REGISTRY["GB4347"]
    reason = (f"{entry['Gb_type']}\n  Explanation: Dynamo does not support next() on list_iterator. "
              "Add tp_iternext_impl to this VariableTracker subclass.\n")
    assert registry()[entry["Gb_type"]] == "GB4347" and category(entry["Gb_type"], reason) == "other"
    assert category(_types("GB0059")[0], "  Explanation: Dynamo does not know how to trace builtin operator `print`") == "print"
    assert category(_types("GB0059")[0], "  Explanation: Dynamo does not know how to trace builtin operator `divmod`") == "unsupported"
    assert category("a break type torch does not have", "Explanation: `print` item() subclass") == "other"


def test_library_files() -> None:
    assert library_of(json.__file__) == "json/__init__.py"
    assert library_of(torch.nn.functional.__file__) == "torch/nn/functional.py"
    assert library_of(HERE) == ""


def _torchs_passes(model: torch.nn.Module, x: torch.Tensor) -> tuple[dict[int, int], int]:
    """Torch's own record of a first call: each graph's compile reason (``GraphCompileReason``,
    what ``explain``'s ``break_reasons`` are) and how often the graph ran. A graph whose reason's
    stack is one frame deep ended at a break in its own function: each run is one pass through
    that break. -> {line in compile_models.py: passes}, and explain's ``graph_break_count``."""
    ran: list[tuple[object, list[int]]] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> object:
        runs = [0]
        ran.append((gm.compile_subgraph_reason, runs))

        def run(*args: object) -> object:
            runs[0] += 1
            return gm.forward(*args)
        return run

    dynamo.reset()
    try:
        with torch.no_grad():  # as the map runs it
            torch.compile(model, backend=backend)(x)
            dynamo.reset()
            explained = dynamo.explain(model)(x).graph_break_count
    finally:
        dynamo.reset()
    passes: dict[int, int] = {}
    for why, runs in ran:
        stack = why.user_stack or []
        if why.graph_break and len(stack) == 1 and stack[0].filename == HERE:
            passes[stack[0].lineno] = passes.get(stack[0].lineno, 0) + runs[0]
    return passes, explained


def test_a_break_counts_each_pass_even_where_dynamo_ran_the_rest_of_the_function_eagerly() -> None:
    # OLMoE's eager experts: a nonzero break, then a loop with a break that makes Dynamo run the
    # rest of the function eagerly. Two layers pass the nonzero break twice; the old map counted
    # it once (the resume function never compiled, nonzero reads no value into Python) and counted
    # the skipped resume function by the branch inside its loop (8 evaluations, routing-dependent)
    for seed in (0, 1):
        model, (x,) = cm.tiny_moe(seed)
        cmap = compile_map(model, (x,), backend="eager")
        truth, explained = _torchs_passes(model, x)
        assert truth == {cm.LINES["moe-hit"]: 2}, truth
        by_place = {(b.category, b.where.func, b.where.line): b.count for b in cmap.breaks}  # type: ignore[union-attr]
        assert by_place == {
            ("skip", "forward", cm.LINES["moe-layers"]): 1,  # the layers' loop ran eagerly once
            ("shape", "forward", cm.LINES["moe-hit"]): truth[cm.LINES["moe-hit"]],
            # the resume function ran eagerly once per pass through the break it resumes after
            ("skip", f"torch_dynamo_resume_in_forward_at_{cm.LINES['moe-hit']}", cm.LINES["moe-branch"]):
                truth[cm.LINES["moe-hit"]],
        }, by_place
        # explain's graph_break_count is its graphs less one, another count: JSON gives both
        summary = json.loads(cmap.to_json())["summary"]
        assert summary["explain_graph_break_count"] == cmap.explain_break_count == explained
        assert summary["breaks"] == cmap.break_count == 5


class _BreakReasons(logging.Handler):
    """torch's structured trace records of each graph break (``dynamo_graph_break_reason``: the
    user's stack and the exception, whose context names the frame a skip ran eagerly)."""

    def __init__(self) -> None:
        super().__init__()
        self.payloads: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        artifact = (getattr(record, "metadata", None) or {}).get("artifact") or {}
        if artifact.get("name") == "dynamo_graph_break_reason":
            self.payloads.append(str(getattr(record, "payload", "")))


def _installed(path: Path, name: str, text: str) -> object:
    """``text`` as module ``name`` installed in a ``site-packages`` folder under ``path``: library code."""
    lib = path / "site-packages" / f"{name}.py"
    lib.parent.mkdir()
    lib.write_text(text)
    spec = importlib.util.spec_from_file_location(lib.stem, lib)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _mapped(model: torch.nn.Module, x: torch.Tensor) -> tuple[CompileMap, list[str]]:
    """The map under the eager backend, and torch's structured-trace break reasons of that run."""
    reasons = _BreakReasons()
    trace_log.addHandler(reasons)
    try:
        return compile_map(model, (x,), backend="eager"), reasons.payloads
    finally:
        trace_log.removeHandler(reasons)


def test_a_skipped_function_in_library_code_is_placed_at_that_function(tmp_path: Path) -> None:
    # the tiny OLMoE as installed library code (transformers' OLMoE is): no frame of the stack is
    # the user's. torch's record of each skip names the frame it ran eagerly ("frame skipped:
    # forward (…/tinymoe_lib.py line N)"); the old map placed the layers' loop's skip at the
    # innermost frame, the experts' nonzero line
    mod = _installed(tmp_path, "tinymoe_lib", Path(cm.__file__).read_text())
    lib = Path(mod.__file__)  # type: ignore[attr-defined]
    model, (x,) = mod.tiny_moe(0)  # type: ignore[attr-defined]
    cmap, payloads = _mapped(model, x)
    skipped = {(f, file, int(line)) for p in payloads
               for f, file, line in re.findall(r"frame skipped: (\S+) \((.+?) line (\d+)\)", p)}
    assert {(f, file) for f, file, _ in skipped} == {
        ("forward", str(lib)), (f"torch_dynamo_resume_in_forward_at_{cm.LINES['moe-hit']}", str(lib))}
    skips = [b for b in cmap.breaks if b.category == "skip"]
    assert {(b.where.func, b.where.file) for b in skips} == {(f, file) for f, file, _ in skipped}  # type: ignore[union-attr]
    (loop,) = [b for b in skips if b.where.func == "forward"]  # type: ignore[union-attr]
    first = next(line for f, _, line in skipped if f == "forward")
    assert first < loop.where.line == cm.LINES["moe-layers"] and loop.where.library  # type: ignore[union-attr]
    assert loop.library is not None and loop.library.line == cm.LINES["moe-hit"]  # the break inside it, as detail


class _Equal(torch.nn.Module):
    """``torch.equal`` returns a Python bool read from the data: Dynamo breaks (GB0033, "Data
    dependent operator"); the output's shape is not in question."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if torch.equal(y, x):
            y = y + 1
        return y * 2


def test_a_data_dependent_python_value_is_not_called_a_data_dependent_shape() -> None:
    torch.manual_seed(0)
    model, x = _Equal().eval(), torch.randn(2, 4)
    cmap = compile_map(model, (x,), backend="eager")
    (b,) = cmap.breaks
    assert b.gb_id == "GB0033" and "aten.equal.default" in b.detail
    assert b.category == "value" and "capture_dynamic_output_shape_ops" not in b.hint
    # torch's record: the config the "shape" hint named does not remove this break; its own hint is a custom op
    from torch._dynamo.utils import counters

    counters.clear()
    try:
        with dynamo.config.patch(capture_dynamic_output_shape_ops=True), torch.no_grad():
            torch.compile(model, backend="eager")(x)
        assert sum(counters["graph_break"].values()) == 1
        assert any("custom operator" in k for k in counters["graph_break"])
    finally:
        dynamo.reset()
        counters.clear()
    assert "custom op" in b.hint


_PACKAGED = '''from torch import nn


class Hooked(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        handle = self.lin.register_forward_hook(lambda m, i, o: None)  # breaks in torch/utils/hooks.py
        handle.remove()
        return self.lin(x).relu()
'''


def test_a_break_in_torch_called_from_a_packaged_model_is_placed_at_the_models_line(tmp_path: Path) -> None:
    """A model installed as a package (its file under site-packages, as transformers' modeling files
    are) has no frame of the user's own: a break inside torch is placed at the model's line, with
    torch's line as detail, as explain's user stack shows both."""
    mod = _installed(tmp_path, "hooked_pkg", _PACKAGED)
    lib = Path(mod.__file__)  # type: ignore[attr-defined]
    cmap, payloads = _mapped(mod.Hooked().eval(), torch.randn(2, 4))  # type: ignore[attr-defined]
    # torch's record of the break names the model's line and torch's hooks.py line
    frames = re.findall(r'File "([^"]+)", line (\d+)', payloads[0])
    assert (str(lib), "10") in frames and (str(Path(torch.__file__).parent / "utils" / "hooks.py"), "27") in frames
    first = cmap.breaks[0]
    assert first.line_text() == "hooked_pkg.py:10", first.line_text()
    assert first.library is not None and first.library.short() == "torch/utils/hooks.py:27"
