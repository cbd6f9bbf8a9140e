"""fxviz.compare / fxviz.diff: models whose differences are known by construction, properties of
the alignment on random graphs, the CLI, and a golden terminal report on hand-built IR."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import fxviz
from fxviz import examples
from fxviz.cli import cli
from fxviz.graphdiff import Diff, Difference, align, diff
from fxviz.ir import Attempt, Graph, ModuleInfo, Node, SourceLoc, TensorMeta
from fxviz.ops import op_name
from fxviz.render.diff import report_text
from tests.irbuild import GraphBuilder, stack_graph
from tests.models import called_twice, data_dependent
from tests.test_ir import graphs
from tests.test_tree import check_golden, render

warnings.filterwarnings("ignore", category=FutureWarning)


def kinds(d: Diff, *, significant: bool = False) -> list[str]:
    return [x.kind for x in (d.significant if significant else d.differences)]


# ---- names and alignment --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "name"),
    [
        ("aten.add_.Tensor", "add"), ("aten.add.Tensor", "add"), ("Tensor.__iadd__", "add"),
        ("torch.nn.functional.linear", "linear"), ("aten.linear.default", "linear"),
        ("Tensor.__getitem__", "getitem"), ("method_descriptor.view", "view"),
        ("OpOverload._assert_tensor_metadata.default", "_assert_tensor_metadata"),
        ("Tensor.__truediv__", "div"), ("Tensor.T.__get__", "T"),
    ],
)
def test_op_names_are_normalized(target: str, name: str) -> None:
    assert op_name(target) == name


def test_align_is_an_lcs_and_symmetric() -> None:
    xs = ["view", "linear", "relu", "add", "view"]
    ys = ["linear", "contiguous", "relu", "view"]
    pairs = align(xs, ys)
    assert [xs[i] for i, _ in pairs] == ["linear", "relu", "view"]
    assert align(ys, xs) == [(j, i) for i, j in pairs]


# ---- hand-built graphs ------------------------------------------------------------------------------


def _block_graph(*, extra_relu: bool = False, shape: int = 4, dtype: str = "float32", calls: int = 1,
                 sym: bool = False) -> Graph:
    b = GraphBuilder("Net", {"fc": "Linear", "act": "ReLU", "head": "Linear"})
    n = "s0" if sym else 2
    b.param("fc.weight", (4, 4))
    x = b.input("x", (n, 4))
    src = SourceLoc("/src/net.py", 10, "forward", "h = self.fc(x)")
    for k in range(calls):
        x = b.op(f"linear_{k}", "aten.linear.default", [x, "fc.weight"], (n, shape), (("fc", k),), dtype=dtype)
        b.g.nodes[-1].source = src
    r = b.op("relu", "aten.relu.default", [x], (n, shape), (("act", 0),))
    if extra_relu:
        r = b.op("relu_1", "aten.relu.default", [r], (n, shape))
        b.g.nodes[-1].source = SourceLoc("/src/net.py", 12, "forward", "h = torch.relu(h)")
    out = b.op("head", "aten.linear.default", [r, "fc.weight"], (n, shape), (("head", 0),))
    b.output("output", out)
    return b.build()


def test_diff_of_a_graph_with_itself_is_empty() -> None:
    g = _block_graph()
    d = diff(g, g)
    assert not d and d.summary() == {} and d.significant == []
    assert {m.status for m in d.modules} == {"matched"}
    json.loads(d.to_json())


@pytest.mark.parametrize(
    ("other", "kind", "module"),
    [
        ({"extra_relu": True}, "only_in_b", ""),
        ({"shape": 5}, "shape", "fc"),
        ({"dtype": "float16"}, "dtype", "fc"),
        ({"calls": 2}, "calls", "fc"),
    ],
    ids=["only_in", "shape", "dtype", "calls"],
)
def test_each_kind_is_found_where_it_is(other: dict[str, Any], kind: str, module: str) -> None:
    d = diff(_block_graph(), _block_graph(**other), labels=("old", "new"))
    found = [x for x in d.differences if x.kind == kind]
    assert found, d.summary()
    assert found[0].module == module
    assert not found[0].informational
    mirrored = diff(_block_graph(**other), _block_graph())
    assert sorted(kinds(mirrored)) == sorted(k.replace("_b", "_x").replace("_a", "_b").replace("_x", "_a")
                                             for k in kinds(d))


def test_extra_op_names_its_source_line() -> None:
    d = diff(_block_graph(), _block_graph(extra_relu=True), labels=("old", "new"))
    (x,) = d.significant
    assert x.kind == "only_in_b" and x.source is not None and x.source.line == 12
    assert x.message == "only in new: relu"


def test_symbolic_dims_are_informational() -> None:
    d = diff(_block_graph(sym=True), _block_graph())
    assert d and not d.significant
    (x,) = d.differences
    assert x.kind == "symbolic_shape" and "s0" in x.message and "2" in x.message


# ---- properties on random graphs ---------------------------------------------------------------------


def _canonical(d: Diff, *, mirror: bool) -> list[tuple[Any, ...]]:
    swap = {"only_in_a": "only_in_b", "only_in_b": "only_in_a"}
    out = []
    for x in d.differences:
        kind = swap.get(x.kind, x.kind) if mirror else x.kind
        a, b = (x.b, x.a) if mirror else (x.a, x.b)
        if x.kind == "symbolic_shape":  # one entry per binding; where it is first seen depends on order
            out.append((kind, a.meta if a else "", b.meta if b else "", x.message.split("(")[1].split()[0]))
            continue
        out.append((kind, x.stack, a.mirrored_key() if a else None, b.mirrored_key() if b else None))
    return sorted(out, key=repr)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_diff_of_any_graph_with_itself_is_empty(g: Graph) -> None:
    if not g.ops and not any(a.ok for a in g.attempts) and any(not a.ok for a in g.attempts):
        return  # a failed capture is a difference even against itself: there is nothing to compare
    assert not diff(g, g)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), graphs())
def test_diff_is_symmetric_up_to_direction(a: Graph, b: Graph) -> None:
    assert _canonical(diff(a, b), mirror=False) == _canonical(diff(b, a), mirror=True)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.data())
def test_a_renamed_op_shows_on_both_sides(g: Graph, data: st.DataObject) -> None:
    ops = g.ops
    if not ops:
        return
    victim = data.draw(st.sampled_from(ops))
    other = Graph.from_json(g.to_json())
    other.node(victim.name).target = "aten.something_else.default"
    d = diff(g, other)
    assert {"only_in_a", "only_in_b"} <= set(kinds(d))
    assert _canonical(d, mirror=False) == _canonical(diff(other, g), mirror=True)
    report_text(d)  # renders without raising


# ---- real models ------------------------------------------------------------------------------------


class Branchy(nn.Module):
    """Branches on a static shape: both captures run only the taken branch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 2:  # noqa: SIM108 (a statement, as users write it)
            x = x * 2
        else:
            x = x + 1
        return self.fc(x)


class Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.fc(self.ln(x)).view(2, 4, 2, 4).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q, q)


def test_same_model_twice_gives_no_significant_difference() -> None:
    model, args, kwargs = called_twice()
    d = fxviz.compare(model, args, kwargs)
    assert d.labels == ("export", "eager")
    assert not d.significant, [x.message for x in d.significant]
    statuses = {(m.path, m.call): m.status for m in d.modules}
    assert statuses[("shared", 0)] == statuses[("shared", 1)] == "matched"


def test_branch_on_a_static_shape_names_the_specialisation_and_its_line() -> None:
    # both captures run only the taken branch (the mul, never the add); compare exports with
    # symbolic sizes, so export's decision on `x.shape[0] > 2` is a guard fxviz reports as what
    # the exported graph assumes, at the line of the `if`
    d = fxviz.compare(Branchy(), (torch.randn(4, 8),))
    assumptions = [x for x in d.differences if x.kind == "assumption"]
    assert [x.message.split(":")[0] for x in assumptions] == ["export assumed x.shape[0] > 2"]
    src = assumptions[0].source
    assert src is not None and src.file == __file__ and src.code.startswith("if x.shape[0] > 2:")
    assert assumptions[0].stack == ()  # Branchy.forward itself, not the fc it calls
    assert d.summary().get("only_in_a", 0) == d.summary().get("only_in_b", 0) == 0
    rows = next(m for m in d.modules if not m.stack).rows
    ops = [(d.a.node(r.a[0]).target, d.b.node(r.b[0]).target) for r in rows if r.a and r.b and d.a.node(r.a[0]).kind == "op"]
    assert ("aten.mul.Tensor", "Tensor.mul") in ops
    assert not any("add" in t for pair in ops for t in pair)
    assert "export assumed x.shape[0] > 2" in str(d) and "test_compare.py:" in str(d)


def test_a_model_that_needs_static_sizes_is_still_compared() -> None:
    # view(-1, 2048) pins the sizes: export with symbolic sizes specialises them and still works;
    # the graphs agree and nothing is assumed in user code
    model, args = examples.cnn()
    d = fxviz.compare(model, args)
    assert d.a.method == "export" and d.a.ops
    assert not [x for x in d.differences if x.kind in ("assumption", "only_in_a", "only_in_b")]


def test_dynamic_shapes_give_symbols_against_sizes() -> None:
    from torch.export import Dim

    d = fxviz.compare(Branchy(), (torch.randn(4, 8),), dynamic_shapes=({0: Dim("batch", min=3)},))
    assert not d.significant
    sym = [x for x in d.differences if x.kind == "symbolic_shape"]
    assert len(sym) == 1 and sym[0].a is not None and sym[0].b is not None
    assert sym[0].a.meta.startswith("s") and sym[0].b.meta == "4"


def test_branch_on_data_places_the_failure_on_the_eager_graph() -> None:
    model, args, kwargs = data_dependent()
    d = fxviz.compare(model, args, kwargs)
    (x,) = [x for x in d.differences if x.kind == "capture_failed"]
    assert x.b is not None and x.source is not None
    assert x.source.code == "n = int(y.sum().item() > 0) + 1"
    assert d.b.node(x.b.nodes[0]).attrs["data_dependent"] is True
    assert "data-dependent" in x.message and x.detail
    assert not d.a.ops and d.b.ops
    assert "capture failed" in report_text(d)


def test_decompositions_fold_back_to_their_torch_call() -> None:
    model, x = Attn().eval(), torch.randn(2, 4, 8)
    before = fxviz.capture(model, (x,), method="export")
    after = fxviz.capture(model, (x,), method="export-decomposed")
    d = diff(before, after)
    assert not d.significant, [x.message for x in d.significant]
    decomposed = {x.message.split(":")[0]: x for x in d.differences if x.kind == "decomposed"}
    assert {"layer_norm", "linear", "scaled_dot_product_attention"} <= set(decomposed)
    assert decomposed["linear"].b is not None and "addmm" in decomposed["linear"].b.ops
    assert decomposed["linear"].module == "fc"
    # against eager at the ATen level: the same torch calls, also when both sides are decomposed
    cmp = fxviz.compare(model, (x,), decompose=True)
    assert cmp.labels == ("export-decomposed", "eager-aten")
    assert not cmp.significant, [x.message for x in cmp.significant]


def test_a_module_called_a_different_number_of_times() -> None:
    class Loop(nn.Module):
        def __init__(self, n: int) -> None:
            super().__init__()
            self.n, self.fc = n, nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(self.n):
                x = self.fc(x)
            return x

    x = torch.randn(2, 4)
    d = diff(fxviz.capture(Loop(2), (x,), method="export"), fxviz.capture(Loop(3), (x,), method="export"))
    (c,) = d.significant
    assert c.kind == "calls" and c.module == "fc" and c.call == 2
    assert "called 2× in export (a), 3× in export (b)" in c.message


@pytest.mark.parametrize("name", ["gpt2", pytest.param("t5", marks=pytest.mark.slow)])
def test_transformers_blocks_match_and_the_mask_code_differs(name: str) -> None:
    from tests import transformers_zoo

    model, args, kwargs = getattr(transformers_zoo, name)()
    d = fxviz.compare(model, args, kwargs)
    statuses = [m.status for m in d.modules if m.stack]
    assert statuses.count("matched") >= 0.75 * len(statuses), d.status_counts()
    blocks = [m for m in d.modules if m.cls in ("GPT2Block", "T5LayerFF", "T5LayerNorm")]
    assert blocks and all(m.status == "matched" for m in blocks)
    masks = [x for x in d.significant if x.source is not None and "mask" in x.source.code]
    assert masks, [x.message for x in d.significant]
    text = report_text(d)
    assert "mask" in text and "matched" in text


# ---- renderers and the CLI ---------------------------------------------------------------------------


def _golden_diff() -> Diff:
    d = diff(_block_graph(sym=True), _block_graph(extra_relu=True, dtype="float16"), labels=("export", "eager"))
    d.seconds = {"a": 0.5, "b": 0.05, "align": 0.001}
    return d


def test_report_golden() -> None:
    check_golden("diff_report.txt", render(_golden_diff().report(), width=100))


def test_report_with_notes_lists_informational_differences() -> None:
    d = _golden_diff()
    assert "symbolic shape" in render(d.report(notes=True))
    assert "s0 in export is 2 in eager" not in render(d.report())
    assert "s0 in export is 2 in eager" in render(d.report(notes=True))


def test_report_folds_a_run_of_matched_calls_the_diff_found() -> None:
    a = stack_graph(4)
    b = Graph.from_json(a.to_json())
    b.node("fc_3").target = "aten.matmul.default"
    d = diff(a, b, labels=("old", "new"))
    runs = d.runs()
    assert [[m.path for m in r.calls] for r in runs.values()] == [["h.0", "h.1", "h.2"]]
    assert [r.label for r in runs.values()] == ["h.0-2"]
    text = render(d.report())
    assert "✓ h.0-2 ×3 (Block)  matched" in text
    assert "✗ h.3 (Block)  differs" in text and "only in new: matmul" in text
    assert "h.0-2" not in render(d.report(notes=True))  # with notes every call shows its own


def test_report_cleans_what_the_model_named() -> None:
    a = _block_graph()
    b = _block_graph(extra_relu=True)
    evil = "\x1b]0;PWNED\x07"
    for g in (a, b):
        g.modules["fc"] = ModuleInfo(f"Linear{evil}")
        g.name = "Net\u202e"
    b.node("relu_1").source = SourceLoc("/src/net.py", 12, "forward", f"h = torch.relu(h)  # {evil}")
    b.node("linear_0").outputs = (TensorMeta((2, 4), "float16"),)
    d = diff(a, b, labels=(f"export{evil}", "eager"))
    for text in (report_text(d), render(d.report(notes=True))):
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
        assert "\\x1b]0;PWNED\\x07" in text and "Net⟨U+202E⟩" in text


MODEL_FILE = '''
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
    def forward(self, x):
        return torch.relu(self.fc(x))

class Data(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x

def build():
    return Net(), (torch.randn(2, 4),)

def data():
    return Data(), (torch.ones(2, 4),)
'''


@pytest.fixture
def model_file(tmp_path: Path) -> str:
    p = tmp_path / "my_model.py"
    p.write_text(MODEL_FILE)
    return str(p)


def test_cli_diff_report_json_html_and_exit_codes(model_file: str, tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(cli, ["diff", f"{model_file}:build"])
    assert r.exit_code == 0, r.output
    assert "no significant differences" in r.output
    r = runner.invoke(cli, ["diff", f"{model_file}:build", "--json", "-", "--fail-on-diff"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["significant"] == 0 and data["a"]["method"] == "export"

    html = tmp_path / "d.html"
    r = runner.invoke(cli, ["diff", f"{model_file}:data", "--html", str(html)])
    assert r.exit_code == 0, r.output
    assert "capture failed" in r.output and "if x.sum() > 0:" in r.output
    assert html.exists()
    r = runner.invoke(cli, ["diff", f"{model_file}:data", "--fail-on-diff"])
    assert r.exit_code == 1


def test_cli_diff_of_a_missing_target_is_one_line(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["diff", f"{tmp_path}/nope.py:build"])
    assert r.exit_code == 2
    assert "error:" in r.output


def _failed_diff() -> Diff:
    failed = Graph(name="Net", attempts=[Attempt("export", False, 0.1, "UserError", "nope\nmore")])
    return diff(failed, _block_graph())


def _check_round_trip(d: Diff) -> Diff:
    d.seconds = {k: round(v, 4) for k, v in d.seconds.items()}  # what JSON keeps of a timing
    back = Diff.from_json(d.to_json())
    assert back.labels == d.labels
    assert back.differences == d.differences
    assert back.modules == d.modules
    assert back.a.to_dict() == d.a.to_dict() and back.b.to_dict() == d.b.to_dict()
    assert back.seconds == d.seconds
    assert back.to_json() == d.to_json()
    return back


@pytest.mark.parametrize(
    "make",
    [_golden_diff, _failed_diff, lambda: diff(_block_graph(calls=2), _block_graph(shape=5), labels=("x", "y"))],
    ids=["golden", "failed", "calls-and-shape"],
)
def test_difference_json_round_trips_through_json(make: Any) -> None:
    d = make()
    data = json.loads(d.to_json())
    assert data["summary"] == d.summary()
    assert [x["id"] for x in data["differences"]] == [x.id for x in d.differences]
    back = _check_round_trip(d)
    assert d.differences and back.differences[0] is not d.differences[0]
    assert report_text(back) == report_text(d)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), graphs())
def test_any_diff_round_trips_through_json(a: Graph, b: Graph) -> None:
    _check_round_trip(diff(a, b))


def _break(path: str, value: Any) -> Any:
    """The golden diff's JSON with the field at ``path`` (``a.b.0.c``) set to ``value`` (deleted when
    ``value`` is ``...``)."""
    data = json.loads(_golden_diff().to_json())
    *head, last = path.split(".")
    node = data
    for key in head:
        node = node[int(key)] if isinstance(node, list) else node[key]
    key: Any = int(last) if isinstance(node, list) else last
    if value is ...:
        del node[key]
    else:
        node[key] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("schema", 1, "schema 1"),
        ("a.graph", ..., "a.graph is missing"),
        ("b.graph.nodes.0.kind", "tensor", "b.graph"),
        ("a.label", 3, "a.label"),
        ("differences.0.kind", "oops", "differences[0].kind"),
        ("differences.1.stack", [["fc"]], "differences[1].stack[0]"),
        ("differences.1.a.source", {"line": 3}, "differences[1].a.source"),
        ("modules.1.status", "fine", "modules[1].status"),
        ("modules.0.rows.0", ["x"], "modules[0].rows[0]"),
        ("modules.0.rows.0.0", ["no_such_node"], "no_such_node"),
        ("modules.1.differences", ["d99"], "modules[1].differences"),
        ("modules.1.notes", -1, "modules[1].notes"),
        ("differences", {}, "differences must be"),
    ],
)
def test_malformed_diff_json_names_the_field(path: str, value: Any, named: str) -> None:
    with pytest.raises(fxviz.GraphFormatError, match=re.escape(named)):
        Diff.from_dict(_break(path, value))


def test_diff_json_that_is_not_json_or_not_an_object_is_a_format_error() -> None:
    with pytest.raises(fxviz.GraphFormatError, match="not JSON"):
        Diff.from_json("{")
    with pytest.raises(fxviz.GraphFormatError, match="top level must be an object"):
        Diff.from_json("[]")


def test_failed_capture_without_a_data_dependent_node_still_reports() -> None:
    d = _failed_diff()
    (x,) = d.differences
    assert isinstance(x, Difference) and x.kind == "capture_failed" and "UserError: nope" in x.message
    assert isinstance(d.b.node("relu"), Node)
