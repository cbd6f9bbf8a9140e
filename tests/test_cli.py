"""The CLI, driven through click's CliRunner: what the user reads and the exact exit code of every
outcome. Subprocesses (marked slow) check what needs a fresh interpreter: torch blocked, start-up
imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fxviz import Graph
from fxviz.cli import cli
from fxviz.targets.parse import METHODS
from tests.test_layers import _NO_TORCH
from tests.viewmodel import page_data

REPO = Path(__file__).resolve().parents[1]



def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input)


def error_line(r: Result) -> str:
    """The one line an error prints: stderr holds it and nothing else, and it is clean text."""
    assert r.stderr.count("\n") == 1 and r.stderr.endswith("\n"), r.stderr
    assert "\x1b" not in r.stderr and "Traceback" not in r.output
    assert r.stderr.startswith("error: ")
    return r.stderr.rstrip("\n")


# ---- live targets ---------------------------------------------------------------------------------


def test_tree_of_a_hand_written_file(model_file: str) -> None:
    r = run("tree", f"{model_file}:build")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("Net  captured by torch.export")
    assert "fc (Linear)  [2, 4] → [2, 3]  15 params  · linear" in r.output
    assert "relu  → [2, 3]" in r.output
    assert r.stderr == ""


def test_tree_of_a_package_target_with_depth() -> None:
    r = run("tree", "fxviz.examples:transformer", "--depth", "1")
    assert r.exit_code == 0, r.output
    assert "blocks.0-1 ×2 (Block)" in r.output
    assert "… " in r.output and "ln1" not in r.output  # blocks stay closed at depth 1


def test_input_shape_and_kwargs_factories(model_file: str) -> None:
    r = run("tree", f"{model_file}:bare", "--input-shape", "7,4")
    assert r.exit_code == 0, r.output
    assert "[7, 4] → [7, 3]" in r.output
    r = run("tree", f"{model_file}:kw")
    assert r.exit_code == 0, r.output
    assert "▶ x  [5, 4] float32" in r.output


@pytest.mark.parametrize(("method", "words"), [("fx", "torch.fx symbolic tracing"),
                                               ("export-decomposed", "torch.export, decomposed to core ATen"),
                                               ("eager-aten", "the eager tracer at ATen level")])
def test_method_option_forces_one_method(model_file: str, method: str, words: str) -> None:
    r = run("tree", f"{model_file}:build", "--method", method)
    assert r.exit_code == 0, r.output
    assert f"captured by {words}" in r.output


def test_method_choices_are_the_apis() -> None:
    """The CLI knows the methods without importing torch; fxviz.api is where they are defined."""
    pytest.importorskip("torch")
    from fxviz.api import METHODS as API_METHODS

    assert METHODS == API_METHODS
    method = next(p for p in cli.commands["tree"].params if p.name == "method")
    assert tuple(method.type.choices) == API_METHODS  # type: ignore[attr-defined]


def test_json_round_trips(model_file: str, tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    r = run("json", f"{model_file}:build", "-o", str(out))
    assert r.exit_code == 0, r.output
    g = Graph.from_json(out.read_text())
    assert g.name == "Net" and [n.target for n in g.ops] == ["aten.linear.default", "aten.relu.default"]
    r = run("json", f"{model_file}:build")  # stdout by default
    assert r.exit_code == 0
    assert [n.target for n in Graph.from_json(r.stdout).ops] == [n.target for n in g.ops]


def test_demo_shows_both_examples_and_how_to_go_on() -> None:
    r = run("demo")
    assert r.exit_code == 0, r.output
    assert "CoolCNN  captured by torch.export" in r.output
    assert "TinyTransformer  captured by torch.export" in r.output
    assert "2 parallel branches" in r.output
    assert "fxviz tree path/to/model.py:factory" in r.output


# ---- saved graphs ---------------------------------------------------------------------------------


def test_a_saved_graph_draws_the_same_tree_as_the_live_capture(saved: dict[str, str]) -> None:
    r = run("tree", saved["cnn"])
    assert r.exit_code == 0, r.output
    assert r.output == run("tree", "fxviz.examples:cnn").output
    r = run("tree", saved["transformer"], "--depth", "1")
    assert r.exit_code == 0
    assert r.output == run("tree", "fxviz.examples:transformer", "--depth", "1").output


def test_every_verb_reads_a_saved_graph(saved: dict[str, str], tmp_path: Path) -> None:
    r = run("html", saved["cnn"], "-o", str(tmp_path / "r.html"))
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"wrote {tmp_path / 'r.html'} (")
    assert "CoolCNN" in (tmp_path / "r.html").read_text()
    r = run("render", saved["cnn"], "-o", str(tmp_path / "g.dot"))
    assert r.exit_code == 0, r.output
    assert (tmp_path / "g.dot").read_text().lstrip().startswith(("digraph", "strict digraph"))
    r = run("json", saved["cnn"], "-o", str(tmp_path / "again.json"))
    assert r.exit_code == 0, r.output
    assert Graph.from_json((tmp_path / "again.json").read_text()).to_json() == \
        Graph.from_json(Path(saved["cnn"]).read_text()).to_json()


def test_a_saved_graph_on_stdin(saved: dict[str, str]) -> None:
    r = run("tree", "-", input=Path(saved["cnn"]).read_text())
    assert r.exit_code == 0, r.output
    assert r.output.startswith("CoolCNN  captured by torch.export")


def test_diff_of_two_saved_graphs(saved: dict[str, str], tmp_path: Path) -> None:
    a, b = saved["cnn"], saved["transformer"]
    r = run("diff", a, a, "--fail-on-diff")
    assert r.exit_code == 0, r.output
    assert "no significant differences" in r.output
    r = run("diff", a, b)
    assert r.exit_code == 0, r.output  # differing graphs are a result, not an error
    assert a in r.output and b in r.output  # the sides are named as given
    r = run("diff", a, b, "--fail-on-diff", "--json", str(tmp_path / "d.json"))
    assert r.exit_code == 1
    assert json.loads((tmp_path / "d.json").read_text())


@pytest.mark.parametrize("verb", ["tree", "json", "html", "render"])
@pytest.mark.parametrize(
    ("options", "named"),
    [(["--method", "fx"], "--method only applies"), (["-i", "1,3"], "--input-shape only applies"),
     (["--dtype", "float16", "-m", "eager"], "--dtype, --method only apply")],
    ids=["method", "input-shape", "two"],
)
def test_capture_options_are_refused_for_a_saved_graph(
    saved: dict[str, str], tmp_path: Path, verb: str, options: list[str], named: str
) -> None:
    r = run(verb, saved["cnn"], *options, "-o" if verb != "tree" else "--unfold", *(
        [str(tmp_path / f"out.{'svg' if verb == 'render' else verb}")] if verb != "tree" else []))
    assert r.exit_code == 2
    line = error_line(r)
    assert named in line and f"{saved['cnn']!r} is a saved graph, captured already" in line
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_diff_arguments_that_do_not_fit(saved: dict[str, str], model_file: str) -> None:
    r = run("diff", saved["cnn"])
    assert r.exit_code == 2
    assert "is a saved graph: fxviz diff compares two graphs (fxviz diff a.json b.json)" in error_line(r)
    r = run("diff", saved["cnn"], saved["cnn"], "--decompose")
    assert r.exit_code == 2
    assert "--decompose only apply to fxviz diff TARGET" in error_line(r)
    r = run("diff", f"{model_file}:build", "--method", "fx")
    assert r.exit_code == 2
    assert "--method does not apply to fxviz diff TARGET" in error_line(r)
    r = run("diff", saved["cnn"], saved["cnn"], "--method", "fx")
    assert r.exit_code == 2
    assert "--method only applies when fxviz captures a model" in error_line(r)


def test_diff_of_a_factory_against_a_saved_graph(saved: dict[str, str]) -> None:
    r = run("diff", "fxviz.examples:cnn", saved["cnn"], "--fail-on-diff")
    assert r.exit_code == 0, r.output
    assert "no significant differences" in r.output


# ---- fresh interpreters: no torch, and what start-up imports -------------------------------------------


def _fresh(args: list[str], tmp_path: Path, *, block_torch: bool) -> dict[str, object]:
    """Run ``fxviz ARGS`` in a new interpreter (torch blocked by a meta-path finder if asked); its
    exit code, output and which heavy modules it imported."""
    code = (_NO_TORCH if block_torch else "") + textwrap.dedent(f"""
        import json, sys
        from fxviz.cli import cli
        try:
            cli.main({args!r}, prog_name="fxviz")
        except SystemExit as e:
            code = e.code
        print("\\n@@" + json.dumps({{"code": code, "imported": sorted(
            m for m in ("torch", "jinja2", "fxviz.graphdiff", "rich") if m in sys.modules)}}))
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300)
    out, _, result = proc.stdout.rpartition("\n@@")
    return {**json.loads(result), "stdout": out, "stderr": proc.stderr}


@pytest.mark.slow
def test_saved_graphs_need_no_torch(saved: dict[str, str], tmp_path: Path, model_file: str) -> None:
    tree = _fresh(["tree", saved["cnn"]], tmp_path, block_torch=True)
    assert tree["code"] == 0, tree["stderr"]
    assert tree["stdout"] == run("tree", saved["cnn"]).output
    assert tree["imported"] == ["rich"]  # neither torch nor the report's or the diff's code

    d = _fresh(["diff", saved["cnn"], saved["transformer"]], tmp_path, block_torch=True)
    assert d["code"] == 0, d["stderr"]
    assert "CoolCNN" in str(d["stdout"]) and "torch" not in d["imported"]

    page = _fresh(["html", saved["cnn"], "-o", str(tmp_path / "r.html")], tmp_path, block_torch=True)
    assert page["code"] == 0, page["stderr"]
    assert "CoolCNN" in (tmp_path / "r.html").read_text()

    live = _fresh(["tree", f"{model_file}:build"], tmp_path, block_torch=True)
    assert live["code"] == 2
    assert str(live["stderr"]).splitlines() == [
        f"error: '{model_file}:build' is a factory: capturing its model needs torch, which is not installed "
        "here (a saved graph, g.json, needs no torch)"
    ]


@pytest.mark.slow
def test_help_imports_neither_torch_nor_rich(tmp_path: Path) -> None:
    r = _fresh(["--help"], tmp_path, block_torch=False)
    assert r["code"] == 0
    assert "Usage: fxviz" in str(r["stdout"])
    assert r["imported"] == []


# ---- a model that raises: every writer writes what ran -------------------------------------------------


@pytest.mark.parametrize(("verb", "out", "extra"), [
    ("html", "r.html", []), ("render", "g.dot", []), ("json", "g.json", []),
    ("json", "me.json", ["--format", "model-explorer"]),
])
def test_a_model_that_raises_gets_its_partial_output_written(
        model_file: str, tmp_path: Path, verb: str, out: str, extra: list[str]) -> None:
    path = tmp_path / out
    r = run(verb, f"{model_file}:bare", "-i", "2,5", "-o", str(path), *extra)
    assert r.exit_code == 1, r.output
    assert path.exists()
    text = path.read_text(encoding="utf-8")
    assert "mat1 and mat2 shapes cannot be multiplied" in error_line(r)
    assert "captured by" not in r.stdout  # the tree is not printed: the file was asked for
    if verb == "html":
        assert r.stdout.startswith(f"wrote {path}") and "the partial graph up to where the model raised" in r.stdout
        assert "mat1 and mat2" in text
    elif verb == "render":
        assert "the model raised during the eager capture" in text
    elif extra:
        assert json.loads(text)["graphs"][0]["groupNodeAttributes"][""]["error (the model raised)"]
    else:
        assert Graph.from_json(text).partial


def test_tree_depth_zero_plumbing_and_an_overlay_column(model_file: str, tmp_path: Path) -> None:
    r = run("tree", f"{model_file}:build", "--depth", "0")
    assert r.exit_code == 0 and r.stdout.strip().splitlines() == ["Net  captured by torch.export  ·  15 params  ·  2 ops"]
    data = tmp_path / "speed.json"
    data.write_text(json.dumps({"fc": 2.5, "relu": "x"}))
    r = run("tree", f"{model_file}:build", "--overlay", str(data))
    assert r.exit_code == 2 and "mixes numbers and other values" in error_line(r)
    data.write_text(json.dumps({"fc": 2.5, "relu": 1.0, "nothing": 3}))
    r = run("tree", f"{model_file}:build", "--overlay", str(data), "--plumbing")
    assert r.exit_code == 0, r.output
    assert r.stderr == f"note: 1 of the keys in {data} name no node or module of Net (first: 'nothing')\n"
    lines = r.stdout.splitlines()
    assert lines[0].endswith("·  speed") and next(x for x in lines if "fc (Linear)" in x).endswith("2.5")
    r = run("tree", f"{model_file}:build", "--overlay", "heat")
    assert r.exit_code == 2 and "'heat' is neither a JSON file nor an overlay of 'Net'; its overlays: " in error_line(r)


def test_html_opens_with_an_overlay_and_json_keeps_it(model_file: str, tmp_path: Path) -> None:
    data = tmp_path / "latency.json"
    data.write_text(json.dumps({"results": {"linear": {"value": 1.5}}}))  # Model Explorer's node data
    r = run("html", f"{model_file}:build", "-o", str(tmp_path / "r.html"), "--overlay", str(data))
    assert r.exit_code == 0, r.output
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    embedded = page_data(page)
    assert embedded["overlay"] == "latency"
    latency = next(o for o in embedded["overlays"] if o["name"] == "latency")
    names = embedded["nodes"]["n"]
    assert latency["nodes"][names.index("linear")] == 1.5
    r = run("json", f"{model_file}:build", "-o", str(tmp_path / "g.json"), "--overlay", str(data))
    assert r.exit_code == 0
    saved = Graph.from_json((tmp_path / "g.json").read_text())
    assert saved.annotations["overlays"]["latency"]["nodes"] == {"linear": 1.5}
    assert "flops" in saved.annotations["overlays"]  # computed at capture, kept without torch


def test_json_for_model_explorer_writes_the_graph_and_node_data(model_file: str, tmp_path: Path) -> None:
    r = run("json", f"{model_file}:build", "--format", "model-explorer", "-o", str(tmp_path / "g.json"))
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"wrote {tmp_path / 'g.json'} and node data ")
    graph = json.loads((tmp_path / "g.json").read_text())["graphs"][0]
    assert {n["id"] for n in graph["nodes"]} >= {"x", "linear", "relu"}
    flops = json.loads((tmp_path / "g.nodedata.flops.json").read_text())
    assert flops["results"]["linear"]["value"] == 2 * 2 * 4 * 3
