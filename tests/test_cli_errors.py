"""The CLI's errors, driven through click's CliRunner: each bad input or failure is one clean line on
stderr with its own exit code, a traceback only with ``--verbose``. Split from ``test_cli`` (its
helpers and fixtures)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fxviz.cli.base as cli_module
from fxviz import Graph
from fxviz.cli import EXIT_BROKEN_PIPE, EXIT_BUG, EXIT_INTERRUPTED
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
from tests.test_cli import REPO, error_line, run

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
