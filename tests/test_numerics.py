"""fxviz.numerics and `fxviz numerics`: per-op and per-module error against eager float32, the
first divergence, random ops, real inputs only, the overlay and panel on the eager graph, the CLI."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import fxviz
from fxviz.analyze.numerics import Numerics, numerics
from fxviz.cli import cli
from fxviz.errors import InputError, TargetError
from tests import numerics_models as nm

HERE = Path(__file__).resolve().parent


def test_export_of_a_deterministic_model_is_exact() -> None:
    model, args = nm.deterministic()
    r = numerics(model, args, against="export")
    ops = [n.name for n in r.graph.ops]
    assert set(r.nodes) == set(ops)  # every op compared: export spells each the same way
    for name, e in r.nodes.items():
        assert e.comparable and e.max_abs == 0.0 and e.rel_rms == 0.0 and e.snr_db == math.inf, name
        assert e.cosine == pytest.approx(1.0) and not e.exceeds
    assert r.first is None and r.births == []
    assert {c.path for c in r.graph.calls.walk() if c.id in r.modules} >= {"embed", "blocks.0", "blocks.1", "head"}
    assert all(e.rel_rms == 0.0 for e in r.modules.values())
    assert r.worst_snr() == math.inf


def test_decompose_of_a_deterministic_model_is_within_tolerance() -> None:
    model, args = nm.deterministic()
    r = numerics(model, args, against="decompose")
    assert r.first is None
    assert len(r.nodes) >= 14 and all(not e.exceeds for e in r.nodes.values())


def test_wrong_decomposition_is_the_first_divergence() -> None:
    model, args = nm.gelu_net()
    r = numerics(model, args, against="decompose", decompositions={torch.ops.aten.gelu.default: nm.wrong_gelu})
    assert r.first == "gelu"
    node = r.graph.node("gelu")
    assert node.stack[-1][0] == "act" and node.source is not None and node.source.line > 0
    assert r.nodes["linear"].rel_rms == 0.0  # before it: exact
    assert r.nodes["gelu"].exceeds and r.nodes["gelu"].snr_db < 20
    assert r.nodes["linear_1"].exceeds  # after it: carried, not born
    assert r.births == ["gelu"]
    assert "in act at" in r.where("gelu")


@pytest.mark.parametrize("against", ["export", "decompose", "dtype:bfloat16", "autocast:bfloat16"])
def test_dropout_in_train_mode_is_not_comparable(against: str) -> None:
    model, args = nm.dropped()
    assert model.training
    r = numerics(model, args, against=against)
    assert r.not_comparable == ["dropout"]
    assert not r.nodes["dropout"].comparable and "random" in r.nodes["dropout"].note
    assert r.first is None  # the other side was given eager's draw: no false divergence after it
    assert r.nodes["linear_1"].comparable and not r.nodes["linear_1"].exceeds
    assert model.training  # left as found


def test_meta_inputs_are_refused() -> None:
    with torch.device("meta"):
        model = nm.GeluNet()
    with pytest.raises(InputError, match="numerics need real inputs"):
        numerics(model, (torch.randn(3, 8, device="meta"),), against="dtype:bfloat16")
    from torch._subclasses.fake_tensor import FakeTensorMode

    real, _ = nm.gelu_net()
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.randn(3, 8))
    with pytest.raises(InputError, match="fake tensors"):
        numerics(real, (fake,), against="export")


def test_unknown_side_is_refused() -> None:
    model, args = nm.gelu_net()
    with pytest.raises(TargetError, match="is not one of"):
        numerics(model, args, against="onnx")
    with pytest.raises(TargetError, match="dtype:bfloat16"):
        numerics(model, args, against="dtype:int8")


def test_results_are_written_on_the_eager_graph() -> None:
    model, args = nm.gelu_net()
    r = numerics(model, args, against="dtype:bfloat16")
    g = r.graph
    assert g.method == "eager"
    overlay = g.annotations["overlays"]["error"]
    assert overlay["scale"] == "log" and overlay["reduce"] == "max"
    assert overlay["nodes"]["linear"] == pytest.approx(r.nodes["linear"].rel_rms) and overlay["nodes"]["linear"] > 0
    fc2 = next(c for c in g.calls.walk() if c.path == "fc2")
    assert overlay["modules"][fc2.id] == pytest.approx(r.modules[fc2.id].rel_rms)
    assert g.node("linear").attrs["numerics"].startswith("SNR ")
    panel = g.annotations["panels"]["divergence"]
    assert panel["columns"][0] == "what" and panel["rows"] and panel["rows"][0]["module"] in {c.id for c in g.calls.walk()}
    back = Numerics.from_json(r.to_json())
    assert back.nodes == r.nodes and back.modules == r.modules and back.first == r.first
    assert back.graph.annotations["overlays"]["error"] == overlay
    assert "error vs dtype:bfloat16" in _text(r.tree())
    # the answer, once: the sentence the terminal prints first is the report's headline and JSON's
    assert g.annotations["headline"]["text"] == r.headline() and g.annotations["headline"]["panel"] == "divergence"
    assert json.loads(r.to_json())["headline"] == r.headline()


def test_report_carries_overlay_panel_and_metrics(tmp_path: Path) -> None:
    model, args = nm.gelu_net()
    r = numerics(model, args, against="decompose", decompositions={torch.ops.aten.gelu.default: nm.wrong_gelu})
    path = tmp_path / "r.html"
    r.to_html(str(path))
    page = path.read_text()
    assert '"divergence"' in page and '"error"' in page and "first divergence" in page
    assert r.nodes["gelu"].text() in page  # the details panel's attrs["numerics"]
    panel = r.graph.annotations["panels"]["divergence"]
    assert panel["rows"][0]["node"] == "gelu" and panel["rows"][0]["level"] == "error"


def test_lazy_public_names() -> None:
    assert fxviz.numerics is numerics and fxviz.Numerics is Numerics


@pytest.mark.slow
def test_bfloat16_gpt2_error_is_born_in_the_first_block_and_grows() -> None:
    from tests.transformers_zoo import gpt2

    model, args, kwargs = gpt2(4)
    r = numerics(model, args, kwargs, against="dtype:bfloat16", seed=0, rtol=2.0**-8)  # one rounding's worth
    blocks = {c.path: r.modules[c.id] for c in r.graph.calls.walk() if c.path.count(".") == 2
              and c.path.startswith("transformer.h.")}
    assert sorted(blocks) == [f"transformer.h.{i}" for i in range(4)]
    assert all(e.rel_rms > 0 and math.isfinite(e.snr_db) for e in blocks.values())  # errors in every block
    assert r.first is not None
    assert r.graph.node(r.first).stack[1][0] == "transformer.h.0"
    snr = [blocks[f"transformer.h.{i}"].snr_db for i in range(4)]
    assert snr[0] > snr[-1] + 2  # the error grows from the first block to the last (fixed seed)
    assert all(e.snr_db > 30 for e in blocks.values())  # but bfloat16 stays bfloat16, not noise


# ---- CLI ----------------------------------------------------------------------------------------------


def _text(renderable: object) -> str:
    from rich.console import Console

    console = Console(width=160, color_system=None, record=True)
    console.print(renderable)
    return console.export_text()


@pytest.fixture
def models_py(tmp_path: Path) -> str:
    path = tmp_path / "numerics_models.py"
    shutil.copy(HERE / "numerics_models.py", path)
    return str(path)


def test_cli_export_exact(models_py: str, tmp_path: Path) -> None:
    out = tmp_path / "n.json"
    res = CliRunner().invoke(cli, ["numerics", f"{models_py}:deterministic", "--against", "export",
                                   "--json", str(out), "--fail-above", "200"])
    assert res.exit_code == 0, res.output
    assert "against export" in res.output and "0 beyond tolerance" in res.output and "every module exact" in res.output
    data = json.loads(out.read_text())
    assert data["first"] is None and data["against"] == "export"
    assert all(e["rel_rms"] == 0 and e["snr_db"] == "inf" for e in data["nodes"].values())


def test_cli_first_divergence_and_fail_above(models_py: str, tmp_path: Path) -> None:
    html = tmp_path / "r.html"
    res = CliRunner().invoke(cli, ["numerics", f"{models_py}:deterministic", "--against", "dtype:bfloat16",
                                   "--rtol", "1e-4", "--html", str(html), "--fail-above", "200"])
    assert res.exit_code == 1, res.output
    assert "first divergence: linear (torch.nn.functional.linear) in embed" in res.output
    assert "below --fail-above 200 dB" in res.output
    assert html.exists() and html.stat().st_size > 10_000  # written before the exit


def test_cli_json_to_stdout(models_py: str) -> None:
    res = CliRunner().invoke(cli, ["numerics", f"{models_py}:gelu_net", "-a", "dtype:float16", "--json", "-"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["against"] == "dtype:float16" and data["rtol"] == 4 * 2.0**-11 and data["expected"] == "float16"
    assert set(data["nodes"]) == {"linear", "gelu", "linear_1"}


def test_cli_refuses_bad_side_and_saved_graph(models_py: str, tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["numerics", f"{models_py}:gelu_net", "--against", "tflite"])
    assert res.exit_code == TargetError.exit_code and "is not one of" in res.output
    g = tmp_path / "g.json"
    model, args = nm.gelu_net()
    g.write_text(fxviz.capture(model, args).to_json())
    res = CliRunner().invoke(cli, ["numerics", str(g)])
    assert res.exit_code == TargetError.exit_code and "give a factory" in res.output


def test_a_stage_of_the_pass_pipeline_is_a_side() -> None:
    """stage:N runs stage N of fxviz.pipeline: stage 0 (the export) is exact; a pass that swaps
    add for sub is the first divergence at the add, with what it reads exact."""
    from fxviz.examples import EXAMPLES
    from tests.pipeline_passes import swap_add_for_sub

    model, args = EXAMPLES["cnn"]()
    r0 = numerics(model, args, against="stage:0", passes=[swap_add_for_sub])
    assert r0.first is None and all(e.max_abs == 0.0 for e in r0.nodes.values())
    r1 = numerics(model, args, against="stage:1", passes=[swap_add_for_sub])
    assert r1.first == "add" and r1.births == ["add"]
    assert r1.nodes["add"].exceeds and all(r1.nodes[x.node].max_abs == 0.0 for x in r1.graph.node("add").inputs
                                           if x.node in r1.nodes)
    assert any("swap_add_for_sub" in n for n in r1.notes)
    with pytest.raises(TargetError, match="stages 0 to 1"):
        numerics(model, args, against="stage:5", passes=[swap_add_for_sub])
    with pytest.raises(TargetError, match="give stage:N"):
        numerics(model, args, against="stage:last")


def test_cli_stage_side_takes_the_passes() -> None:
    r = CliRunner().invoke(cli, ["numerics", "fxviz.examples:cnn", "--against", "stage:1",
                                 "--pass", "tests.pipeline_passes:swap_add_for_sub", "--fail-above", "200"])
    assert r.exit_code == 1, r.output  # the swapped add drifts: its SNR is far below 200 dB
    assert r.output.splitlines()[1].startswith("first divergence: add (Tensor.add) in the model itself at examples.py:")
    assert "note: stage 1 of the pass pipeline: swap_add_for_sub" in r.output
    r = CliRunner().invoke(cli, ["numerics", "fxviz.examples:cnn", "--pass", "tests.pipeline_passes:swap_add_for_sub"])
    assert r.exit_code == 2 and "--pass applies to --against stage:N" in r.output


# ---- false alarms: uninitialised memory, eager noise, run order ---------------------------------------

EMPTIES = {"empty_like", "new_empty", "empty_like_1"}
#: TinyMoE's in-place writes that fill what its empty ops made: each is compared.
WRITES = {"setitem", "zero", "index_add", "index_copy"}


@pytest.mark.parametrize("against", ["export", "dtype:bfloat16"])
def test_values_of_empty_ops_are_compared_once_written(against: str) -> None:
    """torch.empty_like's value is whatever was in memory: never compared; the in-place write that
    fills it is, and what reads it agrees (export: exactly)."""
    model, args = nm.tiny_moe()
    r = numerics(model, args, against=against)
    assert {n.name for n in r.graph.ops if n.target.endswith(("empty_like", "new_empty"))} == EMPTIES
    for name in EMPTIES:
        assert not r.nodes[name].comparable and "uninitialised memory" in r.nodes[name].note
    assert all(r.nodes[w].comparable for w in WRITES)
    assert r.graph.node("setitem").inputs[0].node == "empty_like"  # the write reads the empty value
    if against == "export":
        assert all(e.max_abs == 0.0 for e in r.nodes.values() if e.comparable) and r.first is None
        assert r.worst_snr() == math.inf
    else:
        assert r.nodes["setitem"].max_abs == 0.0  # integers: exact in any dtype
        assert all(r.nodes[w].snr_db > 30 for w in WRITES)


def test_an_unreproducible_op_gets_its_eager_noise_as_floor_and_is_not_flagged() -> None:
    """jitter adds noise no seed reproduces: torch itself gives two outputs that differ; numerics
    measures that difference as each value's floor and flags none of them."""
    model, args = nm.jittery()
    with torch.no_grad():
        a, b = model(*args), model(*args)
    spread = float((a - b).norm() / a.norm())
    assert spread > 1e-4  # the premise: eager is not reproducible, far beyond float32's tolerance
    r = numerics(model, args, against="export")
    jitter = next(n.name for n in r.graph.ops if "jitter" in n.target)
    assert r.graph.node(jitter).inputs[0].node == "linear"
    assert r.nodes["linear"].floor == 0.0 and r.nodes["linear"].max_abs == 0.0  # before it: reproducible, exact
    for name in (jitter, "relu", "linear_1"):
        e = r.nodes[name]
        assert e.comparable and e.rel_rms > 1e-4 and not e.exceeds, name  # it differs, within its noise
        assert e.floor > 1e-4 and "eager noise" in e.text()
    assert 0.2 * spread < r.nodes["linear_1"].floor < 5 * spread  # the floor is eager's own spread
    assert r.first is None and any("not reproducible" in n for n in r.notes)


def test_the_noise_floor_is_the_largest_spread_of_several_runs() -> None:
    """One pair of eager runs is a poor estimate of a few-element value's noise (the jittery model's
    12-element output was flagged in 1 of 40 compiled runs): the floor is the largest spread of
    several runs from the kept one."""
    from fxviz.analyze.numerics import floor
    from fxviz.ir import Node, TensorMeta

    node = Node("noisy", "op", target="aten.add.Tensor", outputs=(TensorMeta((4,), "float32"),))
    offsets = iter([0.0, 1.0, 5.0, 2.0])  # the kept run, then each spread run's

    def run(watcher: Any) -> None:
        watcher.after(node, torch.ops.aten.add.Tensor, (), {}, torch.ones(4) + next(offsets), None)

    floors = floor.measure(run, {"noisy"}, budget=1 << 20)
    assert floor.SPREADS == 3 and next(offsets, None) is None  # a kept run and three spreads, no more
    assert floors["noisy"][0] is not None and floors["noisy"][0].spread == pytest.approx(10.0)  # ‖(5, 5, 5, 5)‖


def test_a_real_divergence_is_found_beside_eager_noise() -> None:
    """The floor is no blanket: relu decomposed wrongly (×2) after the noisy op is still the first
    divergence, far past twice its eager noise."""
    model, args = nm.jittery()
    r = numerics(model, args, against="decompose",
                 decompositions={torch.ops.aten.relu.default: lambda x: torch.clamp(x, min=0) * 2})
    assert r.nodes["relu"].floor > 0 and r.nodes["relu"].exceeds and r.first == "relu"
    assert r.nodes["linear_1"].exceeds


@pytest.mark.parametrize("against", ["export", "compile:aot_eager", "dtype:bfloat16"])
def test_each_analysis_gives_the_same_answer_every_time(against: str) -> None:
    model, args = nm.tiny_moe()
    answers = []
    for _ in range(4):
        r = numerics(model, args, against=against)
        flagged = sorted(k for k, e in r.nodes.items() if e.comparable and e.exceeds)
        worst = min(r.modules.items(), key=lambda kv: (kv[1].snr_db, kv[0]))
        answers.append((flagged, r.first, worst[0], worst[1].snr_db, sorted(r.nodes)))
    assert all(a == answers[0] for a in answers), against
    if against != "dtype:bfloat16":
        assert answers[0][0] == [] and answers[0][3] == math.inf  # export and aot_eager: exact
    else:
        assert answers[0][3] < 100  # bfloat16 does drift: the same drift each time


@pytest.mark.slow
@pytest.mark.parametrize("against", ["export", "compile:aot_eager"])
def test_qwen2_moe_shows_no_false_alarm(against: str) -> None:
    model, args, kwargs = nm.qwen2_moe()
    r = numerics(model, args, kwargs, against=against)
    empties = [n.name for n in r.graph.ops if n.target.endswith("empty_like")]
    assert len(empties) == 2 and all(not r.nodes[n].comparable for n in empties)
    writes = [n.name for n in r.graph.ops if n.target.endswith("__setitem__")]
    assert writes and all(r.nodes[w].comparable and r.nodes[w].max_abs == 0.0 for w in writes)
    assert r.first is None and not any(e.exceeds for e in r.nodes.values())


@pytest.mark.parametrize("against", ["export", "dtype:bfloat16"])
def test_a_buffer_filled_expert_by_expert_is_compared_where_written_the_same_way_every_time(against: str) -> None:
    """``out = torch.empty_like(x)`` then ``out[rows] = expert(...)`` per expert: until the last
    write part of ``out`` is memory nobody wrote, different on each side and in each run (here
    freed 1e30). Those elements are no error and no eager noise."""
    model, args = nm.expert_rows()
    # torch's record: two plain forwards agree (what nobody wrote is overwritten before it is read)
    with torch.no_grad():
        assert torch.equal(model(*args), model(*args))
    answers = []
    for _ in range(3):
        r = numerics(model, args, against=against)
        writes = [n.name for n in r.graph.ops if n.target.endswith("__setitem__")]
        assert len(writes) == 3 and all(r.nodes[w].comparable and math.isfinite(r.nodes[w].max_abs) for w in writes)
        assert all(e.floor == 0 for e in r.nodes.values())  # no op looks non-reproducible
        answers.append((sorted((k, e.max_abs, e.exceeds) for k, e in r.nodes.items()), r.first))
    assert all(a == answers[0] for a in answers) and answers[0][1] is None
    # the eager graph is the tracer's own: zeroing what an empty op returned records no op
    assert [n.target for n in r.graph.ops] == [n.target for n in fxviz.capture(model, args, method="eager").ops]


class _WritesThroughData(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.lin.weight.data.add_(1.0)  # export refuses this (a fake tensor among its constants)
        return self.lin(x)


def test_a_model_export_refuses_is_one_line_that_says_what_to_do() -> None:
    model, x = _WritesThroughData(), torch.randn(2, 4)
    with pytest.raises(RuntimeError):  # torch's own record: export raises on this forward
        torch.export.export(model, (x,), strict=False)
    with pytest.raises(TargetError, match=r"^--against export: torch\.export cannot export _WritesThroughData \(RuntimeError: "
                                          r".*compile:aot_eager"):
        numerics(model, (x,), against="export")
