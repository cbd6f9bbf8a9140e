"""The commands that draw one graph or compare two: tree, json, html, render, diff, demo."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import click

from fxviz.cli.base import (
    add_overlays,
    backward_option,
    cli,
    given_options,
    out_console,
    overlay_option,
    refuse_capture_options,
    spec_graph,
    target_graph,
    target_options,
    verbose_option,
    with_torch,
    world_size_option,
)
from fxviz.errors import ModelError, TargetError
from fxviz.targets.parse import recognise
from fxviz.text import ANSWER_CHARS, NOTE_CHARS, one_line

if TYPE_CHECKING:
    from fxviz.ir import Graph

@cli.command()
@click.argument("target")
@target_options
@click.option("--depth", "-d", type=click.IntRange(min=0), default=None,
              help="Levels of modules to show (0: the model's own line; 1: its children, closed).")
@click.option("--unfold", is_flag=True, help="Show every block of a folded run (h.0-11 ×12).")
@click.option("--plumbing", is_flag=True, help="Show each plumbing op (masks, sizes, checks), not one line per module.")
@backward_option
@world_size_option
@overlay_option
def tree(target: str, input_shapes: tuple[str, ...], dtype: str, method: str,
         depth: int | None, unfold: bool, plumbing: bool, overlays_given: tuple[str, ...]) -> None:
    """Print the forward graph of TARGET as a tree; --overlay adds a column of its values."""
    from fxviz.passes.panels import headline
    from fxviz.passes.training import saved_summary

    graph = target_graph(target, input_shapes, dtype, method)
    overlay = add_overlays(graph, overlays_given)
    console = out_console()
    # the answer the report opens with: an analysis's read back (fxviz compile --json) with its
    # notes, as it printed them, or a training step's saved activations
    answer = headline(graph) or saved_summary(graph)
    if answer:
        console.print(one_line(answer, limit=ANSWER_CHARS), markup=False)
        for note in (graph.annotations.get("headline") or {}).get("notes") or ():
            console.print(f"note: {one_line(note, limit=NOTE_CHARS)}", markup=False)
    console.print(graph.tree(depth=depth, unfold=unfold, plumbing=plumbing, overlay=overlay))


@cli.command(name="json")
@click.argument("target")
@target_options
@click.option("--output", "-o", type=click.Path(dir_okay=False, allow_dash=True), default="-",
              show_default=True, help="Where to write the graph JSON ('-': stdout).")
@click.option("--format", "fmt", type=click.Choice(["fxviz", "model-explorer"]), default="fxviz", show_default=True,
              help="fxviz's graph JSON, or Model Explorer's (each overlay's node data in a file next to it).")
@backward_option
@world_size_option
@overlay_option
def json_cmd(target: str, input_shapes: tuple[str, ...], dtype: str, method: str, output: str, fmt: str,
             overlays_given: tuple[str, ...]) -> None:
    """Write the graph of TARGET as JSON (fxviz.Graph.from_json and every command read it back), with
    its overlays; --format model-explorer writes Model Explorer's graph JSON instead."""

    def write(graph: Graph) -> None:
        add_overlays(graph, overlays_given)
        if fmt == "model-explorer":
            from fxviz.render import modelexplorer

            if output == "-":
                click.echo(json.dumps(modelexplorer.to_model_explorer(graph), ensure_ascii=False))
                return
            written = modelexplorer.write_model_explorer(graph, output)
            click.echo(f"wrote {output}" + (f" and node data {', '.join(str(p) for p in written[1:])}"
                                            if written[1:] else ""), err=output == "-")
            return
        text = graph.to_json(indent=1)
        if output == "-":
            click.echo(text)
            return
        from fxviz.render.files import write_text

        write_text(output, text, what="graph JSON")

    write(target_graph(target, input_shapes, dtype, method, write))


@cli.command()
@click.argument("target")
@target_options
@click.option("--output", "-o", type=click.Path(dir_okay=False), default="fxviz-report.html",
              show_default=True, help="Where to write the report.")
@backward_option
@world_size_option
@overlay_option
def html(target: str, input_shapes: tuple[str, ...], dtype: str, method: str, output: str,
         overlays_given: tuple[str, ...]) -> None:
    """Write an interactive, self-contained HTML report of TARGET (opened coloured by the last
    --overlay). When the model raises, the report of the graph up to the failure is written."""

    def write(graph: Graph) -> None:
        # an analysis's graph read back opens coloured as its own report did
        graph.to_html(output, overlay=add_overlays(graph, overlays_given)
                      or (graph.annotations.get("headline") or {}).get("overlay"))
        what = "the partial graph up to where the model raised" if graph.partial else "open it in a browser"
        click.echo(f"wrote {output} ({os.path.getsize(output) / 1e6:.2f} MB): {what}")

    write(target_graph(target, input_shapes, dtype, method, write))


@cli.command()
@click.argument("target")
@target_options
@click.option("--format", "-f", "fmt", type=click.Choice(["svg", "png", "pdf", "dot"]), default=None,
              help="Image format (default: from the --output suffix, else svg).")
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None,
              help="Where to write the image (default: fxviz-graph.FORMAT).")
@click.option("--depth", "-d", type=click.IntRange(min=0), default=None,
              help="Draw modules as clusters down to this depth; deeper modules become one box.")
@click.option("--plumbing", is_flag=True, help="Draw each plumbing op (masks, sizes, checks), not one box per module.")
def render(target: str, input_shapes: tuple[str, ...], dtype: str, method: str,
           fmt: str | None, output: str | None, depth: int | None, plumbing: bool) -> None:
    """Draw TARGET's graph as a static SVG, PNG, PDF or DOT file through Graphviz. When the model
    raises, the image of the graph up to the failure is written."""
    if fmt is None:
        suffix = os.path.splitext(output or "")[1].lstrip(".").lower()
        fmt = suffix if suffix in ("svg", "png", "pdf", "dot") else "svg"
    path = output or f"fxviz-graph.{fmt}"

    def write(graph: Graph) -> None:
        from fxviz.render.dot import write_image

        write_image(graph, path, format=fmt, depth=depth, plumbing=plumbing)
        click.echo(f"wrote {path}" + (": the partial graph up to where the model raised" if graph.partial else ""))

    write(target_graph(target, input_shapes, dtype, method, write))


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
        compare_only = given_options(ctx, ("decompose", "level"))
        if compare_only:
            raise TargetError(
                f"{', '.join(compare_only)} only apply to fxviz diff TARGET (export against eager); "
                "two targets are compared as they are captured"
            )
        refuse_capture_options(ctx, spec, other_spec)
        from fxviz.graphdiff import diff

        a = spec_graph(spec, input_shapes, dtype, method)
        b = spec_graph(other_spec, input_shapes, dtype, method)
        result = diff(a, b, labels=(target, other))
    else:
        if not spec.captures:
            raise TargetError(
                f"{target!r} is {spec.what}: fxviz diff compares two graphs (fxviz diff a.json b.json), "
                "or export against eager for a factory (fxviz diff model.py:build)"
            )
        if given_options(ctx, ("method",)):
            raise TargetError(
                "--method does not apply to fxviz diff TARGET, which compares export with eager "
                "(--decompose and --level choose which): give two targets to diff two captures"
            )
        result = with_torch(spec).compare_target(
            spec, input_shapes=input_shapes, dtype=dtype, decompose=decompose, level=level
        )
    if json_out is not None:
        if json_out == "-":
            click.echo(result.to_json(indent=1))
        else:
            from fxviz.render.files import write_text

            write_text(json_out, result.to_json(indent=1), what="differences JSON")
    if json_out != "-":
        out_console().print(result.report(notes=notes))
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

    console = out_console()
    for name, factory in EXAMPLES.items():
        model, args = factory()
        console.rule(f"fxviz.examples:{name}")
        console.print(capture(model, args).tree(depth=depth))
    console.print(
        "\nRun fxviz on your own model: write a factory that returns (model, args), then\n"
        "  fxviz tree path/to/model.py:factory\n"
        "  fxviz tree path/to/model.py:factory --input-shape 1,3,224,224   # if it returns only a model"
    )
