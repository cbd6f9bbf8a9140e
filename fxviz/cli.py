"""The ``fxviz`` command: a thin shell over the public API.

    fxviz demo                                   # the built-in examples
    fxviz tree path/to/model.py:build --depth 3  # your model
    fxviz tree my_pkg.models:resnet --input-shape 1,3,224,224
    fxviz diff path/to/model.py:build --html diff.html   # export against eager

Errors print one line and exit non-zero; ``--verbose`` adds the traceback.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console

from fxviz.errors import FxvizError

_METHOD_CHOICES = click.Choice(["auto", "export", "export-strict", "fx", "eager", "eager-aten"])


def _console() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal:  # piped or captured: don't wrap trees at 80 columns
        console.width = max(console.width, 140)
    return console


def _errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn every error into one readable line and a non-zero exit (a traceback with --verbose)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        verbose = kwargs.get("verbose", False)
        try:
            return fn(*args, **kwargs)
        except click.exceptions.Exit:
            raise
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except Exception as e:
            if verbose:
                traceback.print_exc()
            graph = getattr(e, "graph", None)
            if graph is not None:  # a partial graph is still worth showing
                _console().print(graph.tree())
            code = e.exit_code if isinstance(e, FxvizError) else 1
            kind = "" if isinstance(e, FxvizError) else f"{type(e).__name__}: "
            click.echo(f"error: {kind}{e}", err=True)
            if not verbose:
                click.echo("(run with --verbose for the traceback)", err=True)
            sys.exit(code)

    return wrapper


def _target_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--verbose", "-v", is_flag=True, help="Show tracebacks on errors.")(fn)
    fn = click.option("--method", "-m", type=_METHOD_CHOICES, default="auto", show_default=True,
                      help="Capture method; auto tries export, export-strict, fx, then eager.")(fn)
    fn = click.option("--dtype", default="float32", show_default=True,
                      help="dtype of the --input-shape tensors.")(fn)
    fn = click.option("--input-shape", "-i", "input_shapes", multiple=True, metavar="1,3,32,32",
                      help="Shape of a random input tensor (repeat for several inputs).")(fn)
    fn = click.argument("target")(fn)
    return fn


def _capture(target: str, input_shapes: tuple[str, ...], dtype: str, method: str) -> Any:
    from fxviz.api import capture
    from fxviz.target import load_target

    t = load_target(target, input_shapes=input_shapes, dtype=dtype)
    return capture(t.model, t.args, t.kwargs, method=method)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fxviz")
def cli() -> None:
    """See what a PyTorch model really computes in its forward pass.

    TARGET is path/to/file.py:factory or package.module:factory; the factory returns a model,
    (model, args) or (model, args, kwargs).
    """


@cli.command()
@_target_options
@click.option("--depth", "-d", type=click.IntRange(min=1), default=None,
              help="Levels of modules to show (1: the model's children, closed).")
@click.option("--unfold", is_flag=True, help="Show every block of a folded run (h.0-11 ×12).")
@_errors
def tree(target: str, input_shapes: tuple[str, ...], dtype: str, method: str, verbose: bool,
         depth: int | None, unfold: bool) -> None:
    """Print the forward graph of TARGET as a tree."""
    graph = _capture(target, input_shapes, dtype, method)
    _console().print(graph.tree(depth=depth, unfold=unfold))


@cli.command(name="json")
@_target_options
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True), default="-",
              show_default=True, help="Where to write the graph JSON.")
@_errors
def json_cmd(target: str, input_shapes: tuple[str, ...], dtype: str, method: str, verbose: bool,
             output: str) -> None:
    """Write the captured graph of TARGET as JSON (fxviz.Graph.from_json reads it back)."""
    graph = _capture(target, input_shapes, dtype, method)
    with click.open_file(output, "w") as f:
        f.write(graph.to_json(indent=1))


@cli.command()
@_target_options
@click.option("--output", "-o", type=click.Path(dir_okay=False), default="fxviz-report.html",
              show_default=True, help="Where to write the report.")
@_errors
def html(target: str, input_shapes: tuple[str, ...], dtype: str, method: str, verbose: bool,
         output: str) -> None:
    """Write an interactive, self-contained HTML report of TARGET."""
    graph = _capture(target, input_shapes, dtype, method)
    graph.to_html(output)
    click.echo(f"wrote {output} ({os.path.getsize(output) / 1e6:.2f} MB): open it in a browser")


@cli.command()
@_target_options
@click.option("--format", "-f", "fmt", type=click.Choice(["svg", "png", "pdf", "dot"]), default=None,
              help="Image format (default: from the --output suffix, else svg).")
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None,
              help="Where to write the image (default: fxviz-graph.FORMAT).")
@click.option("--depth", "-d", type=click.IntRange(min=0), default=None,
              help="Draw modules as clusters down to this depth; deeper modules become one box.")
@_errors
def render(target: str, input_shapes: tuple[str, ...], dtype: str, method: str, verbose: bool,
           fmt: str | None, output: str | None, depth: int | None) -> None:
    """Draw TARGET's graph as a static SVG, PNG, PDF or DOT file through Graphviz."""
    if fmt is None:
        suffix = os.path.splitext(output or "")[1].lstrip(".").lower()
        fmt = suffix if suffix in ("svg", "png", "pdf", "dot") else "svg"
    output = output or f"fxviz-graph.{fmt}"
    graph = _capture(target, input_shapes, dtype, method)
    graph.write_image(output, format=fmt, depth=depth)
    click.echo(f"wrote {output}")


@cli.command(name="diff")
@click.argument("target")
@click.option("--input-shape", "-i", "input_shapes", multiple=True, metavar="1,3,32,32",
              help="Shape of a random input tensor (repeat for several inputs).")
@click.option("--dtype", default="float32", show_default=True, help="dtype of the --input-shape tensors.")
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
@click.option("--verbose", "-v", is_flag=True, help="Show tracebacks on errors.")
@_errors
def diff_cmd(target: str, input_shapes: tuple[str, ...], dtype: str, decompose: bool, level: str | None,
             notes: bool, html_out: str | None, json_out: str | None, fail_on_diff: bool,
             verbose: bool) -> None:
    """Compare TARGET's symbolic graph (torch.export) with what eager PyTorch runs.

    Exits 0 whether or not the graphs differ, unless --fail-on-diff is given.
    """
    from fxviz.api import compare
    from fxviz.target import load_target

    t = load_target(target, input_shapes=input_shapes, dtype=dtype)
    result = compare(t.model, t.args, t.kwargs, decompose=decompose, level=level)
    if json_out is not None:
        with click.open_file(json_out, "w") as f:
            f.write(result.to_json(indent=1))
    if json_out != "-":
        _console().print(result.report(notes=notes))
    if html_out is not None:
        result.to_html(html_out)
        click.echo(f"wrote {html_out}", err=json_out == "-")
    if fail_on_diff and result.significant:
        sys.exit(1)


@cli.command()
@click.option("--depth", "-d", type=click.IntRange(min=1), default=None,
              help="Levels of modules to show (1: the model's children, closed).")
@click.option("--verbose", "-v", is_flag=True, help="Show tracebacks on errors.")
@_errors
def demo(depth: int | None, verbose: bool) -> None:
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
