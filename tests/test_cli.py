"""The CLI, driven through click's CliRunner: what the user reads and the exact exit code of every
outcome. Subprocesses (marked slow) check what needs a fresh interpreter: torch blocked, start-up
imports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import fxviz.cli.base as cli_module
from fxviz import Graph
from fxviz.cli import EXIT_BROKEN_PIPE, EXIT_BUG, EXIT_INTERRUPTED, cli
from fxviz.errors import (
    CaptureError,
    FxvizError,
    GraphFormatError,
    InputError,
    ModelError,
    PassError,
    RenderError,
    TargetError,
)
from fxviz.targets.parse import METHODS
from tests.test_layers import _NO_TORCH
from tests.viewmodel import page_data

REPO = Path(__file__).resolve().parents[1]



@pytest.fixture
def model_file(tmp_path: Path) -> str:
    p = tmp_path / "my_model.py"
    shutil.copy(REPO / "tests" / "cli_models.py", p)
    return str(p)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Graphs saved by ``fxviz json``: the example CNN and the example transformer."""
    d = tmp_path_factory.mktemp("saved")
    out = {}
    for name in ("cnn", "transformer"):
        path = str(d / f"{name}.json")
        r = run("json", f"fxviz.examples:{name}", "-o", path)
        assert r.exit_code == 0, r.output
        out[name] = path
    return out


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


# ---- errors: one line, one exit code each -----------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "extra", "code", "message"),
    [
        ("missing.py:build", [], 2, "file 'missing.py' does not exist"),
        ("{dir}/:build", [], 2, "'{dir}/' is a directory: give the Python file that defines 'build' "
                                "({dir}/model.py:build) or its module (package.module:build)"),
        ("{file}:nope", [], 2, "has no attribute 'nope'; it defines: Boom, ExitsInForward, Hostile, Net, Unprintable, bare, boom"),
        ("{file}:broken", [], 2, "factory '{file}:broken' raised ValueError: no config file found"),
        ("{file}:not_a_model", [], 2, "returned dict, not a torch.nn.Module"),
        ("{file}:bare", [], 2, "returned a model without inputs: pass --input-shape"),
        ("{file}:bare", ["--input-shape", "2,x4"], 2, "--input-shape '2,x4' is not a list of positive integers"),
        ("{file}:bare", ["-i", "99999999999999999999999,3"], 2,
         "--input-shape '99999999999999999999999,3': size 99999999999999999999999 does not fit in a tensor"),
        ("{file}:bare", ["-i", "4294967296,4294967296,4"], 2, "73786976294838206464 elements does not fit"),
        ("{file}:bare", ["--input-shape", "2,5"], 1,
         "the model raised during eager capture: RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
        ("{file}:bare", ["--input-shape", "2,4", "--dtype", "floaty"], 2, "--dtype 'floaty' is not a torch dtype"),
        ("no_colon", [], 2, "target 'no_colon' is not one fxviz knows: give path/to/file.py:factory"),
        ("no_such_pkg.models:build", [], 2, "cannot import module 'no_such_pkg.models'"),
        ("{file}:exits", [], 2, "factory '{file}:exits' called sys.exit(3): a factory returns a model"),
        ("{file}:boom", [], 2, "factory '{file}:boom' raised Boom: the factory gave up"),
        ("{file}:exits_in_forward", [], 1, "the model called sys.exit(4) during capture"),
        ("{file}:two_lines", [], 2, "raised ValueError: first line ⏎ second line"),
        ("{file}:hostile", [], 1, "ValueError: \\x1b]0;PWNED\\x07\\x1b[2J in the root module (Hostile)"),
        ("{file}:unprintable", [], 2, "raised Unprintable: (its message cannot be printed)"),
    ],
    ids=["missing-file", "directory", "missing-attr", "factory-raises", "not-a-module", "no-inputs",
         "bad-shape", "size-too-big", "numel-too-big", "model-rejects-shape", "bad-dtype", "no-colon",
         "missing-module", "factory-exits", "factory-base-exception", "forward-exits", "two-line-message",
         "escape-codes", "unprintable-message"],
)
def test_bad_input_is_one_clear_line(
    model_file: str, target: str, extra: list[str], code: int, message: str
) -> None:
    fmt = {"file": model_file, "dir": os.path.dirname(model_file)}
    r = run("tree", target.format(**fmt), *extra)
    assert r.exit_code == code, r.output
    assert message.format(**fmt) in error_line(r)


def test_importing_a_target_that_exits(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text("import sys\nsys.exit(5)\n")
    r = run("tree", f"{tmp_path / 'script.py'}:build")
    assert r.exit_code == 2
    assert error_line(r) == (f"error: importing {str(tmp_path / 'script.py')!r} called sys.exit(5) "
                             '(put the file\'s script part under `if __name__ == "__main__":`)')


def test_ctrl_c_in_a_factory(model_file: str) -> None:
    r = run("tree", f"{model_file}:interrupted")
    assert r.exit_code == EXIT_INTERRUPTED == 130
    assert r.stderr == "interrupted\n"


def test_a_model_error_shows_the_partial_graph_then_one_line(model_file: str) -> None:
    r = run("tree", f"{model_file}:bare", "-i", "2,5")
    assert r.exit_code == 1
    assert r.stdout.startswith("Net  captured by the eager tracer (partial)")
    assert "mat1 and mat2 shapes cannot be multiplied (2x5 and 4x3) in module 'fc' (Linear)" in error_line(r)


def test_diff_reports_a_model_that_raises(model_file: str) -> None:
    r = run("diff", f"{model_file}:bare", "-i", "2,5")
    assert r.exit_code == 1
    assert "Net" in r.stdout  # the comparison of what ran is still shown
    assert "the model raised during eager capture: RuntimeError: mat1 and mat2 shapes" in error_line(r)


@pytest.mark.parametrize(
    ("content", "code", "message"),
    [
        (None, 2, "saved graph {name} does not exist: write one with fxviz json TARGET -o"),
        ("not json at all", 2, "{name} is not a saved fxviz graph: graph JSON is not valid JSON: Expecting value"),
        ("[1, 2]", 2, "{name} is not a saved fxviz graph: "),
        ('{"hello": "world"}', 2, "{name} is not a saved fxviz graph: "),
        (b"\xff\xfe\x00", 2, "{name} is not a saved graph: not UTF-8 text"),
    ],
    ids=["missing", "not-json", "a-list", "not-a-graph", "binary"],
)
def test_a_json_that_is_not_a_graph(tmp_path: Path, content: str | bytes | None, code: int, message: str) -> None:
    path = tmp_path / "g.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    for verb in ("tree", "html", "render"):
        r = run(verb, str(path))
        assert r.exit_code == code
        assert message.format(name=repr(str(path))) in error_line(r)
    r = run("diff", str(path), str(path))
    assert r.exit_code == code


def test_render_error_when_the_output_cannot_be_written(saved: dict[str, str], tmp_path: Path) -> None:
    r = run("html", saved["cnn"], "-o", str(tmp_path / "no" / "such" / "dir" / "r.html"))
    assert r.exit_code == RenderError.exit_code == 5
    assert "cannot write" in error_line(r)
    r = run("json", saved["cnn"], "-o", str(tmp_path / "no" / "g.json"))
    assert r.exit_code == 5
    assert "cannot write the graph JSON" in error_line(r)


def test_a_capture_error_lists_every_attempt_with_verbose() -> None:
    target = f"{REPO / 'tests' / 'fallback_models.py'}:DataDependentIf"
    r = run("tree", target, "-i", "2,8", "--method", "fx")
    assert r.exit_code == CaptureError.exit_code == 3
    assert "could not capture DataDependentIf: every method failed (fx: TraceError:" in error_line(r)
    r = run("tree", target, "-i", "2,8", "--method", "fx", "--verbose")
    assert r.exit_code == 3
    lines = r.stderr.splitlines()
    assert lines[-2].startswith("  fx: TraceError: symbolically traced variables cannot be used as inputs")
    assert lines[-1].startswith("error: could not capture DataDependentIf")


@pytest.mark.parametrize("where", [["tree", "{t}", "--verbose"], ["-v", "tree", "{t}"], ["tree", "-v", "{t}"]],
                         ids=["after", "on-the-group", "before-target"])
def test_verbose_shows_the_traceback(model_file: str, where: list[str]) -> None:
    r = run(*(w.format(t=f"{model_file}:broken") for w in where))
    assert r.exit_code == 2
    assert "Traceback" in r.stderr and "ValueError: no config file found" in r.stderr
    assert r.stderr.splitlines()[-1] == f"error: factory '{model_file}:broken' raised ValueError: no config file found"


def test_verbose_traceback_is_clean_text(model_file: str) -> None:
    r = run("tree", f"{model_file}:hostile", "--verbose")
    assert r.exit_code == 1
    assert "Traceback" in r.stderr and "\x1b" not in r.stderr


@pytest.mark.parametrize(
    "error",
    [ModelError("m"), TargetError("t"), InputError("i"), GraphFormatError("g"), CaptureError("c"),
     PassError("p"), RenderError("r")],
    ids=lambda e: type(e).__name__,
)
def test_each_error_class_exits_with_its_code(
    monkeypatch: pytest.MonkeyPatch, saved: dict[str, str], error: FxvizError
) -> None:
    def fail(_path: str) -> Graph:
        raise error

    monkeypatch.setattr(cli_module, "read_graph", fail)
    r = run("tree", saved["cnn"])
    assert r.exit_code == type(error).exit_code
    assert error_line(r) == f"error: {error}"
    assert {ModelError: 1, TargetError: 2, InputError: 2, GraphFormatError: 2, CaptureError: 3, PassError: 4,
            RenderError: 5}[type(error)] == r.exit_code


@pytest.mark.parametrize(
    ("raised", "code", "line"),
    [
        (ZeroDivisionError("division by zero"), EXIT_BUG,
         "error: ZeroDivisionError: division by zero (this is a bug in fxviz: re-run with --verbose and "
         "report the traceback)"),
        (KeyboardInterrupt(), EXIT_INTERRUPTED, "interrupted"),
        (SystemExit(9), EXIT_BUG, "error: SystemExit: 9 (this is a bug in fxviz"),
    ],
    ids=["bug", "ctrl-c", "stray-exit"],
)
def test_unexpected_outcomes(
    monkeypatch: pytest.MonkeyPatch, saved: dict[str, str], raised: BaseException, code: int, line: str
) -> None:
    def fail(_path: str) -> Graph:
        raise raised

    monkeypatch.setattr(cli_module, "read_graph", fail)
    r = run("tree", saved["cnn"])
    assert r.exit_code == code
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(line)
    assert (EXIT_BUG, EXIT_INTERRUPTED) == (70, 130)


def test_a_reader_that_goes_away(monkeypatch: pytest.MonkeyPatch, saved: dict[str, str]) -> None:
    def fail(_path: str) -> Graph:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli_module, "read_graph", fail)
    r = run("tree", saved["cnn"])
    assert r.exit_code == EXIT_BROKEN_PIPE == 141
    assert r.stderr == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [(["tree"], "Missing argument 'TARGET'"), (["tree", "x.json", "--method", "nope"], "'nope' is not one of"),
     (["nope"], "No such command 'nope'")],
    ids=["missing-argument", "bad-choice", "bad-command"],
)
def test_usage_errors_keep_clicks_exit_code(args: list[str], message: str) -> None:
    r = run(*args)
    assert r.exit_code == 2
    assert message in r.stderr


def test_help_lists_the_exit_codes() -> None:
    r = run("--help")
    assert r.exit_code == 0
    codes = [line.split()[0] for line in r.output.split("Exit codes:")[1].splitlines() if line[:4].strip().isdigit()]
    assert codes == ["0", "1", "2", "3", "4", "5", "70", "130"]
    assert "a graph saved by\n  `fxviz json TARGET -o g.json`" in r.output


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
