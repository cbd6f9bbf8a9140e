"""The ``fxviz`` command: a thin shell over the public API.

    fxviz demo                                   # the built-in examples
    fxviz tree path/to/model.py:build --depth 3  # your model
    fxviz tree my_pkg.models:resnet --input-shape 1,3,224,224
    fxviz json path/to/model.py:build -o g.json  # save the graph; then, without torch:
    fxviz tree g.json ; fxviz html g.json -o r.html ; fxviz diff a.json b.json
    fxviz tree model.pt2                         # a program saved by torch.export.save
    fxviz diff path/to/model.py:build --html diff.html   # export against eager

Every outcome of a command is decided in one place, :class:`FxvizGroup`: an error prints one line
(``--verbose`` adds the traceback) and exits with its class's ``exit_code`` (see
:mod:`fxviz.errors`), Ctrl-C exits 130, a bug in fxviz 70. torch is imported only when a target
needs a capture: ``fxviz --help`` and ``fxviz tree g.json`` never import it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from fxviz.errors import CaptureError, FxvizError, ModelError, PassError, RenderError, TargetError
from fxviz.targets.parse import METHODS, TargetSpec, read_graph, recognise
from fxviz.text import clean, one_line

if TYPE_CHECKING:
    from rich.console import Console

    from fxviz.ir import Graph

#: Exit codes that are not an error class's: a bug in fxviz (sysexits' EX_SOFTWARE), Ctrl-C
#: (128 + SIGINT, as a shell reports it), a reader that went away (``fxviz tree g.json | head``:
#: 128 + SIGPIPE, what ``yes | head`` gives).
EXIT_BUG = 70
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

_VERBOSE = "fxviz.verbose"  # key in ctx.meta, which every context of one invocation shares

EXIT_CODES: list[tuple[int, str]] = [
    (0, "done (fxviz diff: whether or not the graphs differ)"),
    (ModelError.exit_code, "the model raised (the partial graph is shown), or --fail-on-diff found a difference"),
    (TargetError.exit_code, "the target, an option or a saved graph is unusable (click's usage errors too)"),
    (CaptureError.exit_code, "no capture method produced a graph"),
    (PassError.exit_code, "an analysis pass failed"),
    (RenderError.exit_code, "the output could not be written"),
    (EXIT_BUG, "a bug in fxviz: re-run with --verbose and report the traceback"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
]


def _console() -> Console:
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal:  # piped or captured: don't wrap trees at 80 columns
        console.width = max(console.width, 140)
    return console


def _text(e: BaseException) -> str:
    """``str(e)``, even for an exception whose ``__str__`` raises (a model's exception can)."""
    try:
        return str(e)
    except Exception:  # noqa: BLE001 - the message is what we are reporting; never fail on it
        return f"<{type(e).__name__} whose message cannot be printed>"


def _echo_err(line: str) -> None:
    click.echo(line, err=True)


class FxvizGroup(click.Group):
    """The one place that turns what a command raised into output and an exit code.

    A :class:`~fxviz.errors.FxvizError` prints ``error: <message>`` on one line (control
    characters escaped, line breaks folded) and exits with the class's ``exit_code``; a
    :class:`~fxviz.errors.ModelError` shows its partial graph first. ``--verbose`` adds the
    traceback and, for a :class:`~fxviz.errors.CaptureError`, each attempt's reason, before that
    line. click's usage errors keep click's handling (exit 2); Ctrl-C prints ``interrupted`` and
    exits 130; anything else is a bug in fxviz: one line that says so, exit 70."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except KeyboardInterrupt:
            _echo_err("interrupted")
            ctx.exit(EXIT_INTERRUPTED)
        except BrokenPipeError:
            # whoever read our output stopped reading: nothing to report, and nothing left to flush
            with contextlib.suppress(OSError, ValueError):  # stdout may have no file descriptor
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(EXIT_BROKEN_PIPE)
        except BaseException as e:  # noqa: BLE001 - every outcome is decided here, SystemExit too
            ctx.exit(report(e, verbose=bool(ctx.meta.get(_VERBOSE))))

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Exit codes"):
            formatter.write_dl([(str(code), meaning) for code, meaning in EXIT_CODES])


def report(e: BaseException, *, verbose: bool) -> int:
    """Print ``e`` as one line on stderr (after the traceback with ``verbose``); its exit code."""
    if verbose:
        _echo_err(clean("".join(traceback.format_exception(e)).rstrip()))
    if not isinstance(e, FxvizError):
        _echo_err(
            f"error: {type(e).__name__}: {one_line(_text(e), limit=500)} (this is a bug in fxviz: "
            "re-run with --verbose and report the traceback)"
        )
        return EXIT_BUG
    graph = getattr(e, "graph", None)
    if graph is not None:  # a partial graph is still worth showing
        with contextlib.suppress(Exception):  # the error must reach the user; the tree is a bonus
            _console().print(graph.tree())
    if verbose and isinstance(e, CaptureError):
        for line in e.details():
            _echo_err(f"  {one_line(line)}")
    _echo_err(f"error: {one_line(_text(e))}")
    return int(e.exit_code)


# ---- options: each declared once, shared by the commands that take it --------------------------


def _set_verbose(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[_VERBOSE] = True


verbose_option = click.option(
    "--verbose", "-v", is_flag=True, expose_value=False, is_eager=True, callback=_set_verbose,
    help="On an error, also show the traceback (and why each capture method failed).",
)


def target_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """How to capture a factory's model: ``--method``, ``--input-shape``, ``--dtype``. A saved
    graph or a ``.pt2`` file was captured already, so they are refused for one."""
    fn = click.option("--method", "-m", type=click.Choice(METHODS), default="auto", show_default=True,
                      help="Capture method; auto tries export, export-strict, fx, then eager.")(fn)
    fn = click.option("--dtype", default="float32", show_default=True,
                      help="dtype of the --input-shape tensors.")(fn)
    fn = click.option("--input-shape", "-i", "input_shapes", multiple=True, metavar="1,3,32,32",
                      help="Shape of a random input tensor (repeat for several inputs).")(fn)
    fn = click.option("--no-validate", is_flag=True, expose_value=False, callback=_set_no_validate,
                      help="Do not run the captured program once on the inputs to confirm they run.")(fn)
    return verbose_option(fn)


_NO_VALIDATE = "fxviz.no_validate"


def _set_no_validate(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[_NO_VALIDATE] = True


_CAPTURE_OPTIONS = ("method", "input_shapes", "dtype", "no_validate")


def _given(ctx: click.Context, names: tuple[str, ...]) -> list[str]:
    """The options among ``names`` that the user gave (not left at their default), as spelled."""
    out = []
    for p in ctx.command.params:
        if p.name in names and ctx.get_parameter_source(p.name) not in (None, ParameterSource.DEFAULT):
            out.append(p.opts[0])
    return out


def _refuse_capture_options(ctx: click.Context, *specs: TargetSpec) -> None:
    given = _given(ctx, _CAPTURE_OPTIONS)
    if given and not any(s.captures for s in specs):
        s, many = specs[0], len(given) > 1
        raise TargetError(
            f"{', '.join(given)} only {'apply' if many else 'applies'} when fxviz captures a model from a "
            f"factory; {s.text!r} is {s.what}, captured already: leave {'them' if many else 'it'} out"
        )


def _graph(spec: TargetSpec, input_shapes: tuple[str, ...], dtype: str, method: str) -> Graph:
    """The graph of one target; torch is imported only for a factory or a ``.pt2`` file."""
    if spec.kind == "graph":
        return read_graph(spec.path)
    validate = not click.get_current_context().meta.get(_NO_VALIDATE, False)
    return _with_torch(spec).load_graph(spec, input_shapes=input_shapes, dtype=dtype, method=method,
                                        validate=validate)


def _has_torch() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def _with_torch(spec: TargetSpec) -> ModuleType:
    """:mod:`fxviz.targets.factory`, which needs torch: without it, say so for this target."""
    try:
        from fxviz.targets import factory
    except ImportError as e:
        if _has_torch():
            raise
        raise TargetError(
            f"{spec.text!r} is {spec.what}: {'capturing its model' if spec.captures else 'loading it'} needs "
            "torch, which is not installed here "
            "(a saved graph, g.json, needs no torch)"
        ) from e
    return factory


def _target_graph(target: str, input_shapes: tuple[str, ...], dtype: str, method: str) -> Graph:
    spec = recognise(target)
    _refuse_capture_options(click.get_current_context(), spec)
    return _graph(spec, input_shapes, dtype, method)


# ---- commands ------------------------------------------------------------------------------------


@click.group(cls=FxvizGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fxviz")
@verbose_option
def cli() -> None:
    """See what a PyTorch model really computes in its forward pass.

    TARGET is path/to/file.py:factory or package.module:factory (the factory returns a model,
    (model, args) or (model, args, kwargs)), a graph saved by `fxviz json TARGET -o g.json`
    (read without torch), or a program saved by torch.export.save (model.pt2).
    """


@cli.command()
@click.argument("target")
@target_options
@click.option("--depth", "-d", type=click.IntRange(min=1), default=None,
              help="Levels of modules to show (1: the model's children, closed).")
@click.option("--unfold", is_flag=True, help="Show every block of a folded run (h.0-11 ×12).")
def tree(target: str, input_shapes: tuple[str, ...], dtype: str, method: str,
         depth: int | None, unfold: bool) -> None:
    """Print the forward graph of TARGET as a tree."""
    graph = _target_graph(target, input_shapes, dtype, method)
    _console().print(graph.tree(depth=depth, unfold=unfold))


@cli.command(name="json")
@click.argument("target")
@target_options
@click.option("--output", "-o", type=click.Path(dir_okay=False, allow_dash=True), default="-",
              show_default=True, help="Where to write the graph JSON ('-': stdout).")
def json_cmd(target: str, input_shapes: tuple[str, ...], dtype: str, method: str, output: str) -> None:
    """Write the graph of TARGET as JSON (fxviz.Graph.from_json and every command read it back)."""
    text = _target_graph(target, input_shapes, dtype, method).to_json(indent=1)
    if output == "-":
        click.echo(text)
        return
    from fxviz.render.files import write_text

    write_text(output, text, what="graph JSON")


@cli.command()
@click.argument("target")
@target_options
@click.option("--output", "-o", type=click.Path(dir_okay=False), default="fxviz-report.html",
              show_default=True, help="Where to write the report.")
def html(target: str, input_shapes: tuple[str, ...], dtype: str, method: str, output: str) -> None:
    """Write an interactive, self-contained HTML report of TARGET."""
    graph = _target_graph(target, input_shapes, dtype, method)
    graph.to_html(output)
    click.echo(f"wrote {output} ({os.path.getsize(output) / 1e6:.2f} MB): open it in a browser")


@cli.command()
@click.argument("target")
@target_options
@click.option("--format", "-f", "fmt", type=click.Choice(["svg", "png", "pdf", "dot"]), default=None,
              help="Image format (default: from the --output suffix, else svg).")
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None,
              help="Where to write the image (default: fxviz-graph.FORMAT).")
@click.option("--depth", "-d", type=click.IntRange(min=0), default=None,
              help="Draw modules as clusters down to this depth; deeper modules become one box.")
def render(target: str, input_shapes: tuple[str, ...], dtype: str, method: str,
           fmt: str | None, output: str | None, depth: int | None) -> None:
    """Draw TARGET's graph as a static SVG, PNG, PDF or DOT file through Graphviz."""
    if fmt is None:
        suffix = os.path.splitext(output or "")[1].lstrip(".").lower()
        fmt = suffix if suffix in ("svg", "png", "pdf", "dot") else "svg"
    output = output or f"fxviz-graph.{fmt}"
    graph = _target_graph(target, input_shapes, dtype, method)
    graph.write_image(output, format=fmt, depth=depth)
    click.echo(f"wrote {output}")


@cli.command(name="diff")
@click.argument("target")
@click.argument("other", required=False)
@target_options
@click.option("--decompose", is_flag=True, help="Compare export after run_decompositions() (core ATen).")
@click.option("--level", type=click.Choice(["function", "aten"]), default=None,
              help="Eager tracer level (default: function, or aten with --decompose).")
@click.option("--notes", is_flag=True, help="Also list informational differences (decompositions, s0 vs 128).")
@click.option("--html", "html_out", type=click.Path(dir_okay=False), default=None,
              help="Write the side-by-side HTML view here.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="Write the differences as JSON here ('-': stdout, instead of the report).")
@click.option("--fail-on-diff", is_flag=True,
              help="Exit 1 when a difference other than an informational one exists (a CI gate).")
def diff_cmd(target: str, other: str | None, input_shapes: tuple[str, ...], dtype: str, method: str,
             decompose: bool, level: str | None, notes: bool, html_out: str | None, json_out: str | None,
             fail_on_diff: bool) -> None:
    """Compare TARGET's symbolic graph (torch.export) with what eager PyTorch runs, or, given
    OTHER, compare two graphs: saved ones (a.json b.json, no torch needed), .pt2 files, or two
    factories' captures.

    Exits 0 whether or not the graphs differ, unless --fail-on-diff is given; 1 when the model
    raised (the comparison of what ran is still shown).
    """
    ctx = click.get_current_context()
    spec = recognise(target)
    if other is not None:
        other_spec = recognise(other)
        compare_only = _given(ctx, ("decompose", "level"))
        if compare_only:
            raise TargetError(
                f"{', '.join(compare_only)} only apply to fxviz diff TARGET (export against eager); "
                "two targets are compared as they are captured"
            )
        _refuse_capture_options(ctx, spec, other_spec)
        from fxviz.graphdiff import diff

        a = _graph(spec, input_shapes, dtype, method)
        b = _graph(other_spec, input_shapes, dtype, method)
        result = diff(a, b, labels=(target, other))
    else:
        if not spec.captures:
            raise TargetError(
                f"{target!r} is {spec.what}: fxviz diff compares two graphs (fxviz diff a.json b.json), "
                "or export against eager for a factory (fxviz diff model.py:build)"
            )
        if _given(ctx, ("method",)):
            raise TargetError(
                "--method does not apply to fxviz diff TARGET, which compares export with eager "
                "(--decompose and --level choose which): give two targets to diff two captures"
            )
        result = _with_torch(spec).compare_target(
            spec, input_shapes=input_shapes, dtype=dtype, decompose=decompose, level=level
        )
    if json_out is not None:
        if json_out == "-":
            click.echo(result.to_json(indent=1))
        else:
            from fxviz.render.files import write_text

            write_text(json_out, result.to_json(indent=1), what="differences JSON")
    if json_out != "-":
        _console().print(result.report(notes=notes))
    if html_out is not None:
        result.to_html(html_out)
        click.echo(f"wrote {html_out}", err=json_out == "-")
    if other is None and result.b.partial:  # the model raised under the eager tracer
        raise ModelError(f"the model raised during eager capture: {result.b.error}")
    if fail_on_diff and result.significant:
        ctx.exit(1)


@cli.command()
@verbose_option
@click.option("--depth", "-d", type=click.IntRange(min=1), default=None,
              help="Levels of modules to show (1: the model's children, closed).")
def demo(depth: int | None) -> None:
    """Show the trees of the built-in example models."""
    from fxviz.api import capture
    from fxviz.examples import EXAMPLES

    console = _console()
    for name, factory in EXAMPLES.items():
        model, args = factory()
        console.rule(f"fxviz.examples:{name}")
        console.print(capture(model, args).tree(depth=depth))
    console.print(
        "\nRun fxviz on your own model: write a factory that returns (model, args), then\n"
        "  fxviz tree path/to/model.py:factory\n"
        "  fxviz tree path/to/model.py:factory --input-shape 1,3,224,224   # if it returns only a model"
    )


def main() -> None:
    cli(prog_name="fxviz")


if __name__ == "__main__":
    main()
