"""The pass pipeline analyzer: stages, what each pass changed, provenance, numbers, failures, CLI.

The passes are hand-written in tests/pipeline_passes.py, one of each kind ``fxviz.pipeline`` takes.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import fxviz
from fxviz.analyze.pipeline import Pipeline, load_program, pipeline
from fxviz.analyze.pipeline.result import EXACT, INFERRED
from fxviz.analyze.pipeline.views import OVERLAY, PANEL, annotate, summary_lines
from fxviz.cli import cli
from fxviz.errors import PassError
from fxviz.examples import cnn
from tests import pipeline_passes as pp

EXAMPLES = str(Path(fxviz.examples.__file__))  # type: ignore[attr-defined]
FC1_LINE = 32  # x = torch.relu(self.fully_connected1(x)) in fxviz/examples.py


@pytest.fixture(scope="module")
def default_cnn() -> Pipeline:
    model, args = cnn()
    return pipeline(model, args)


def test_the_default_pipeline_exports_then_decomposes(default_cnn: Pipeline) -> None:
    p = default_cnn
    assert [(s.index, s.name, s.kind) for s in p.stages] == [(0, "export", "export"), (1, "decompose", "decompose")]
    export, decompose = p.stages
    assert export.ops_after["aten.linear.default"] == 2 and export.ops_after["aten.conv2d.default"] == 3
    assert "aten.linear.default" not in decompose.ops_after and decompose.ops_before == export.ops_after
    assert decompose.ops_after["aten.addmm.default"] == 2 and decompose.ops_after["aten.permute.default"] == 2
    assert decompose.ops_after["aten.convolution.default"] == 3
    assert set(decompose.removed) == {"conv2d", "conv2d_1", "conv2d_2", "max_pool2d", "max_pool2d_1", "max_pool2d_2",
                                      "linear", "linear_1"}
    assert set(decompose.replaced) == {"convolution", "convolution_1", "convolution_2", "max_pool2d_with_indices",
                                       "max_pool2d_with_indices_1", "max_pool2d_with_indices_2", "permute", "addmm",
                                       "permute_1", "addmm_1"}
    assert decompose.added == [] and decompose.changed
    # grouped by the module call they belong to
    assert decompose.changes["fully_connected1#0"] == {"replaced": ["permute", "addmm"], "removed": ["linear"]}
    assert decompose.changes["max_pool#2"] == {"replaced": ["max_pool2d_with_indices_2"], "removed": ["max_pool2d_2"]}


def test_decomposed_ops_link_back_exactly_with_module_path_and_line(default_cnn: Pipeline) -> None:
    decompose = default_cnn.stages[1]
    assert decompose.links["addmm"] == [("linear", EXACT)] and decompose.links["permute"] == [("linear", EXACT)]
    assert decompose.links["convolution_1"] == [("conv2d_1", EXACT)]
    assert decompose.origin("relu_3") == [("relu_3", EXACT)]  # kept: its own origin
    addmm = decompose.graph.node("addmm")
    assert addmm.stack == (("fully_connected1", 0),)
    assert addmm.source is not None and (addmm.source.file, addmm.source.line) == (EXAMPLES, FC1_LINE)
    assert default_cnn.trace(1, "addmm") == [[("addmm", EXACT)], [("linear", EXACT)]]


def test_numbers_of_a_faithful_pipeline_stay_within_tolerance(default_cnn: Pipeline) -> None:
    for s in default_cnn.stages:
        assert s.numbers is not None and [o.name for o in s.numbers.outputs] == ["output"]
        assert s.numbers.ok and s.numbers.max_abs is not None and s.numbers.max_abs < 1e-5
    assert default_cnn.first_divergence is None


def test_a_fusion_into_a_custom_op_is_one_replaced_node_inferred_from_two() -> None:
    model, args = cnn()
    p = pipeline(model, args, passes=[pp.fuse_linear_relu, "decompose"])
    fuse = p.stages[1]
    assert (fuse.name, fuse.kind) == ("fuse_linear_relu", "graph module")
    assert fuse.replaced == ["linear_relu_default"] and fuse.added == []
    assert fuse.removed == ["linear", "relu_3"]
    assert fuse.links == {"linear_relu_default": [("linear", INFERRED), ("relu_3", INFERRED)]}
    assert fuse.ops_after["fxviz_test::linear_relu.default"] == 1
    assert sum(fuse.ops_before.values()) - sum(fuse.ops_after.values()) == 1
    fused = fuse.graph.node("linear_relu_default")
    assert fused.outputs[0].shape == (1, 128)
    assert fuse.numbers is not None and fuse.numbers.ok
    # the custom op survives decomposition; the provenance of its node goes back through both stages
    decompose = p.stages[2]
    assert decompose.ops_after["fxviz_test::linear_relu.default"] == 1
    # (run_decompositions renames the node it retraces)
    assert p.trace(2, "linear_relu") == [
        [("linear_relu", EXACT)], [("linear_relu_default", EXACT)], [("linear", INFERRED), ("relu_3", INFERRED)]]
    assert p.first_divergence is None


def test_a_pass_that_changes_nothing_is_marked_and_hidden() -> None:
    model, args = cnn()
    p = pipeline(model, args, passes=[pp.do_nothing, pp.fuse_linear_relu], numbers=False)
    noop = p.stages[1]
    assert noop.name == "do_nothing" and not noop.changed
    assert (noop.added, noop.removed, noop.replaced) == ([], [], [])
    assert [s.name for s in p.visible()] == ["export", "fuse_linear_relu"]
    assert [s.name for s in p.visible(show_unchanged=True)] == ["export", "do_nothing", "fuse_linear_relu"]
    assert all(s.numbers is None for s in p.stages)


def test_a_pass_that_raises_keeps_the_stages_before_and_shows_its_frame() -> None:
    model, args = cnn()
    p = pipeline(model, args, passes=[pp.fuse_linear_relu, pp.raise_on_add, pp.do_nothing])
    assert [s.name for s in p.stages] == ["export", "fuse_linear_relu", "raise_on_add"]  # nothing after it runs
    failed = p.stages[2]
    assert p.failed is failed and failed.error is not None
    assert (failed.error.type, failed.error.message) == ("Broken", "cannot handle add")
    raise_line = next(i for i, line in enumerate(inspect.getsource(pp).splitlines(), 1) if "raise Broken(" in line)
    frame = failed.error.frame
    assert frame is not None and (Path(frame.file).name, frame.line, frame.func) == ("pipeline_passes.py", raise_line,
                                                                                     "raise_on_add")
    assert frame.code.startswith("raise Broken(")
    # the graph it was given, like print-after-failure; the stages before are whole
    assert failed.graph is p.stages[1].graph and not failed.changed
    assert p.stages[1].program is not None and p.stages[1].numbers is not None and p.stages[1].numbers.ok


def test_the_first_divergence_names_the_pass_and_the_node() -> None:
    model, args = cnn()
    p = pipeline(model, args, passes=["decompose", pp.swap_add_for_sub, pp.do_nothing])
    swap = p.stages[2]
    assert swap.kind == "graph module" and swap.replaced == ["add"] and swap.removed == ["add"]
    assert swap.links == {"add": [("add", EXACT)]}  # the same node, given another op
    assert swap.ops_after["aten.sub.Tensor"] == 1 and "aten.add.Tensor" not in swap.ops_after
    assert p.stages[1].numbers is not None and p.stages[1].numbers.ok
    # the pass ran on a copy: the stage before still adds
    assert [n.target for n in p.stages[1].program.graph.nodes if n.name == "add"] == [torch.ops.aten.add.Tensor]
    assert swap.numbers is not None and not swap.numbers.ok and swap.numbers.max_abs is not None
    # eager's output against the wrong program's, computed here independently
    with torch.no_grad():
        want = model(*args)
        got = swap.program.module()(*args)  # the program returns the flat dict of outputs by path
    (got,) = got.values() if isinstance(got, dict) else got
    assert swap.numbers.max_abs == pytest.approx(float((got - want).abs().max()), rel=1e-6)
    div = p.first_divergence
    assert div is not None and (div.stage, div.pass_name, div.node, div.previous) == (2, "swap_add_for_sub", "add", "add")
    # main_path + parallel_path became main_path - parallel_path: the node differs by 2 * parallel_path
    assert div.max_abs > swap.numbers.max_abs
    # one error measure, named: the column is the outputs' max abs error, ✗ beyond the tolerance
    # torch.testing's float32 check uses too (atol + rtol·|eager|), which the note states
    g = annotate(p, 2)
    panel = g.annotations["panels"][PANEL]
    assert panel["columns"][-1] == "outputs' max abs error"
    assert panel["rows"][-1]["cells"][-1] == f"{swap.numbers.max_abs:.3g} ✗"
    # the report sorts the text cells by the numbers behind them ("50.5 ms" before "2.1 s")
    assert panel["rows"][-1]["sort"] == [2, None, swap.seconds, 17, 1, 1, swap.numbers.max_abs]
    (out,) = swap.numbers.outputs
    assert (out.atol, out.rtol) == (1e-4, 1e-4)
    assert not torch.allclose(got, want, atol=out.atol, rtol=out.rtol)  # torch's own check agrees with ✗
    assert "✗: an element beyond atol + rtol·|eager| (float32: atol 0.0001, rtol 0.0001)" in panel["note"]
    assert "at sub (node add) in the model itself at examples.py:" in panel["note"]  # as drawn, where from
    assert f": that node's max abs error {div.max_abs:.3g}" in panel["note"]  # not "max error"
    # every pass, in order, in the stage's capture method (the report's badge) and the answer
    assert [s.graph.method for s in p.stages] == [
        "export", "export + decompose", "export + decompose + swap_add_for_sub",
        "export + decompose + swap_add_for_sub + do_nothing"]
    # under it, what the terminal prints under the stage table (the hidden stage, the tolerance)
    notes = [line.removeprefix("note: ") for line in summary_lines(p, False)]
    assert notes[0] == "1 stage without changes hidden (--all shows them)" and "rtol 0.0001" in notes[1]
    assert g.annotations["headline"] == {
        "text": p.headline(), "panel": PANEL, "level": "error", "node": "add", "notes": notes, "overlay": OVERLAY}
    assert p.headline().startswith("CoolCNN: 4 stages (export → decompose → swap_add_for_sub → do_nothing), ")
    assert p.headline().endswith(f"numbers first diverge at {div}")
    assert json.loads(p.to_json())["headline"] == p.headline()


def test_a_pass_that_edits_a_constant_changes_the_node() -> None:
    model, args = cnn()
    p = pipeline(model, args, passes=[pp.divide_by_four])
    edit = p.stages[1]
    assert edit.changed and edit.replaced == ["div"] and edit.removed == ["div"] and edit.added == []
    assert edit.links == {"div": [("div", EXACT)]}
    assert edit.graph.node("div").attrs["other"] == 4
    div = p.first_divergence
    assert div is not None and (div.stage, div.node) == (1, "div")


def test_a_pass_manager_is_one_stage_per_pass() -> None:
    model, args = cnn()
    p = pipeline(model, args, passes=[pp.three_passes()])
    assert [s.name for s in p.stages] == ["export", "DoubleRelu", "drop_double_relu", "scale_by_one"]
    double, drop, scale = p.stages[1:]
    assert double.added == ["relu_default", "relu_default_1", "relu_default_2", "relu_default_3"]
    assert double.removed == [] and double.links == {}
    assert drop.removed == double.added and drop.added == []
    assert scale.added == ["mul_tensor"] and scale.ops_after["aten.mul.Tensor"] == 1
    assert scale.graph.node("mul_tensor").outputs[0].shape == (1, 2048)  # its value made on fake tensors
    assert all(s.numbers is not None and s.numbers.ok for s in p.stages)


def test_a_pass_on_the_whole_program() -> None:
    model, args = cnn()
    p = pipeline(model, args, passes=[pp.decompose_program], numbers=False)
    assert (p.stages[1].name, p.stages[1].kind) == ("decompose_program", "program")
    assert p.stages[1].links["addmm"] == [("linear", EXACT)]


def test_a_pipeline_from_a_pt2_file(tmp_path: Path) -> None:
    model, args = cnn()
    path = tmp_path / "cnn.pt2"
    torch.export.save(torch.export.export(model, args), str(path))
    p = pipeline(load_program(path))
    assert [s.name for s in p.stages] == ["program", "decompose"] and p.name == "CoolCNN"
    first, decompose = p.stages
    assert first.numbers is not None and first.numbers.max_abs == 0.0  # the program is its own reference
    assert decompose.numbers is not None and decompose.numbers.ok
    assert decompose.links["addmm"] == [("linear", EXACT)]
    assert decompose.graph.node("addmm").stack == (("fully_connected1", 0),)


def test_meta_inputs_skip_the_numbers_with_a_note() -> None:
    with torch.device("meta"):
        model, args = fxviz.examples.CoolCNN(), (torch.randn(1, 3, 32, 32),)  # type: ignore[attr-defined]
    p = pipeline(model, args)
    assert [s.name for s in p.stages] == ["export", "decompose"]
    assert all(s.numbers is None for s in p.stages) and p.first_divergence is None
    assert p.notes == ["inputs or weights are on the meta device: no numbers to compare"]


def test_json_round_trip_keeps_stages_links_and_errors() -> None:
    model, args = cnn()
    p = pipeline(model, args, passes=[pp.fuse_linear_relu, pp.swap_add_for_sub])
    back = Pipeline.from_json(p.to_json())
    assert [s.name for s in back.stages] == ["export", "fuse_linear_relu", "swap_add_for_sub"]
    assert back.stages[1].links == p.stages[1].links and back.stages[1].removed == ["linear", "relu_3"]
    assert back.first_divergence == p.first_divergence and back.first_divergence is not None
    assert back.stages[2].numbers == p.stages[2].numbers
    assert [n.name for n in back.stages[2].graph.nodes] == [n.name for n in p.stages[2].graph.nodes]
    failed = pipeline(model, args, passes=[pp.raise_on_add], numbers=False)
    back = Pipeline.from_json(failed.to_json())
    assert back.stages[1].error == failed.stages[1].error and back.stages[1].error is not None
    assert back.failed is back.stages[1]


def test_the_change_overlay_and_the_stage_panel() -> None:
    model, args = cnn()
    p = pipeline(model, args, passes=[pp.do_nothing, pp.fuse_linear_relu])
    g = annotate(p, 2)
    spec = g.annotations["overlays"][OVERLAY]
    assert spec["nodes"]["linear_relu_default"] == "replaced" and spec["nodes"]["conv2d"] == "kept"
    panel = g.annotations["panels"][PANEL]
    assert [r["cells"][1] for r in panel["rows"]] == ["export", "fuse_linear_relu"]  # the no-op is hidden
    assert panel["rows"][1]["node"] == "linear_relu_default"
    assert panel["rows"][1]["cells"][3:6] == ["15 → 14", "+1", "-2"]
    assert "1 stage without changes hidden" in panel["note"]
    assert g.node("linear_relu_default").attrs["provenance"] == (
        "stage 2 linear_relu_default <- stage 1 linear (inferred), relu_3 (inferred) <- stage 0 linear, relu_3")


def test_unknown_pass_kinds_are_refused() -> None:
    model, args = cnn()
    with pytest.raises(fxviz.TargetError, match="'fold' is not one fxviz knows"):
        pipeline(model, args, passes=["fold"])
    with pytest.raises(fxviz.TargetError, match="not a pass"):
        pipeline(model, args, passes=[3])


@pytest.mark.slow
def test_default_pipeline_on_gpt2_decomposes_layer_norm_and_linear() -> None:
    from tests.transformers_zoo import gpt2

    model, args, kwargs = gpt2()
    p = pipeline(model, args, kwargs)
    export, decompose = p.stages
    assert export.ops_after["aten.layer_norm.default"] == 5 and export.ops_after["aten.linear.default"] == 1
    assert "aten.layer_norm.default" not in decompose.ops_after
    assert decompose.ops_after["aten.native_layer_norm.default"] == 5
    ln = [n for n, srcs in decompose.links.items()
          if decompose.graph.node(n).target == "aten.native_layer_norm.default"
          and srcs == [("layer_norm", EXACT)]]
    assert len(ln) == 1
    node = decompose.graph.node(ln[0])
    assert node.stack[-1] == ("transformer.h.0.ln_1", 0)
    assert node.source is not None and "self.ln_1(" in node.source.code
    assert node.source.file.endswith("modeling_gpt2.py")
    assert all(s.numbers is not None and s.numbers.ok for s in p.stages) and p.first_divergence is None


# ---- the CLI ---------------------------------------------------------------------------------------

CNN = "fxviz.examples:cnn"


def test_cli_prints_the_stage_table() -> None:
    r = CliRunner().invoke(cli, ["passes", CNN, "--pass", "tests.pipeline_passes:fuse_linear_relu",
                                 "--pass", "tests.pipeline_passes:do_nothing", "--pass", "decompose"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    # the answer first (the report opens with the same sentence), then the table; every pass named in order
    assert lines[0] == ("CoolCNN: 4 stages (export → fuse_linear_relu → do_nothing → decompose), 15 → 15 ops; "
                        "every stage's outputs within tolerance of eager (max abs error 0)")
    assert lines[1].strip() == "CoolCNN: 4 stages"
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in lines if line.startswith("│")]
    assert [row[:2] for row in rows] == [["0", "export"], ["1", "fuse_linear_relu"], ["3", "decompose"]]
    assert rows[1][3:6] == ["15 → 14", "+1", "-2"]
    assert "1 stage without changes hidden (--all shows them)" in r.output
    r = CliRunner().invoke(cli, ["passes", CNN, "--pass", "tests.pipeline_passes:do_nothing", "--all",
                                 "--no-numbers"])
    assert "do_nothing (no change)" in r.output and "hidden" not in r.output


def test_cli_stage_tree_marks_changes_and_shows_the_table_as_a_panel() -> None:
    r = CliRunner().invoke(cli, ["passes", CNN, "--pass", "tests.pipeline_passes:fuse_linear_relu", "--stage", "1"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0].startswith("CoolCNN: 2 stages (export → fuse_linear_relu), 15 → 14 ops;")
    assert "change in stage 1 (fuse_linear_relu)" in r.output.splitlines()[1]
    line = next(x for x in r.output.splitlines() if x.startswith("├── fxviz_test::linear_relu"))  # the fused op
    assert line.rstrip().endswith("replaced")
    assert "pass pipeline" in r.output and "showing stage 1 (fuse_linear_relu)" in r.output


def test_cli_reports_the_divergence_and_a_failing_pass(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    r = CliRunner().invoke(cli, ["passes", CNN, "--pass", "tests.pipeline_passes:swap_add_for_sub",
                                 "--pass", "tests.pipeline_passes:raise_on_add", "--pass", "decompose",
                                 "--json", str(out)])
    # the node as the report draws it (the pass made it a sub), and where it comes from
    assert "numbers first diverge at stage 1 (swap_add_for_sub) at sub (node add) in the model itself at examples.py:" in r.output
    # no add left after the swap: raise_on_add finds nothing; now make it fail
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["passes", CNN, "--pass", "tests.pipeline_passes:raise_on_add", "--json", str(out)])
    assert r.exit_code == PassError.exit_code
    assert "stage 1 (raise_on_add) failed: Broken: cannot handle add at " in r.output
    assert 'raise Broken(f"cannot handle {node.name}")' in r.output
    data = json.loads(out.read_text())
    assert [s["name"] for s in data["stages"]] == ["export", "raise_on_add"]
    assert data["stages"][1]["error"]["type"] == "Broken"


def test_cli_json_to_stdout_html_and_stage_range(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["passes", CNN, "--json", "-"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert [s["name"] for s in data["stages"]] == ["export", "decompose"]
    assert data["stages"][1]["links"]["addmm"] == [["linear", "exact"]]
    html = tmp_path / "r.html"
    r = CliRunner().invoke(cli, ["passes", CNN, "--html", str(html), "--from-stage", "1", "--no-numbers"])
    assert r.exit_code == 0, r.output
    rows = [line for line in r.output.splitlines() if line.startswith("│")]
    assert len(rows) == 1 and "decompose" in rows[0]
    text = html.read_text()
    assert OVERLAY in text and "pass pipeline" in text
    side = tmp_path / "side.html"
    r = CliRunner().invoke(cli, ["passes", CNN, "--before-after", str(side), "--no-numbers"])
    assert r.exit_code == 0, r.output
    assert "stage 0 (export)" in side.read_text() and "stage 1 (decompose)" in side.read_text()
    r = CliRunner().invoke(cli, ["passes", CNN, "--before-after", str(side), "--stage", "0", "--no-numbers"])
    assert r.exit_code == fxviz.TargetError.exit_code and "stage 0 has no stage before it" in r.output


def test_cli_runs_on_a_pt2_file_and_refuses_bad_passes(tmp_path: Path) -> None:
    model, args = cnn()
    path = tmp_path / "cnn.pt2"
    torch.export.save(torch.export.export(model, args), str(path))
    r = CliRunner().invoke(cli, ["passes", str(path)])
    assert r.exit_code == 0, r.output
    assert "CoolCNN: 2 stages" in r.output and "program" in r.output
    r = CliRunner().invoke(cli, ["passes", CNN, "--pass", "tests.pipeline_passes:nope"])
    assert r.exit_code == fxviz.TargetError.exit_code
    assert "has no attribute 'nope'" in r.output
    r = CliRunner().invoke(cli, ["passes", str(path), "--input-shape", "1,3,32,32"])
    assert r.exit_code == fxviz.TargetError.exit_code


def test_cli_html_writes_every_stage_and_the_stage_table_links_them(tmp_path: Path) -> None:
    import re

    out = tmp_path / "r.html"
    r = CliRunner().invoke(cli, ["passes", CNN, "--pass", "tests.pipeline_passes:fuse_linear_relu",
                                 "--pass", "tests.pipeline_passes:swap_add_for_sub", "--html", str(out), "--no-numbers"])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "r.stage-0.html", "r.stage-1.html"]
    for page, me in (("r.html", 2), ("r.stage-0.html", 0), ("r.stage-1.html", 1)):
        data = json.loads(re.search(r'<script type="application/json" id="fxviz-data">(.*?)</script>',
                                    (tmp_path / page).read_text(), re.S).group(1))  # type: ignore[union-attr]
        (panel,) = data["panels"]
        links = [row.get("h") for row in panel["rows"]]
        want = {0: "r.stage-0.html", 1: "r.stage-1.html", 2: "r.html"}
        assert links == [None if i == me else want[i] for i in range(3)], page
        assert data["overlay"] == "pass_change"
