"""``fxviz compile``: the torch.compile coverage map of a factory's model (a thin shell over
:func:`fxviz.analyze.compilemap.compile_map`)."""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING, Any

import click

from fxviz.cli.base import (
    cli,
    out_console,
    spinner,
    verbose_option,
    with_torch,
    world_size,
    world_size_option,
    write_json,
)
from fxviz.errors import TargetError
from fxviz.targets.parse import recognise
from fxviz.text import NOTE_CHARS, one_line

if TYPE_CHECKING:
    from fxviz.analyze.compilemap.result import CompileMap
    from fxviz.tracefile import Trace

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")




def _input_sets(text: str) -> list[Any]:
    """The input sets a ``pkg.module:factory`` (or ``file.py:factory``) returns: a list of input
    tuples (or ``(args, kwargs)`` pairs)."""
    spec = recognise(text)
    if not spec.captures:
        raise TargetError(f"--inputs {text!r} is {spec.what}: give package.module:factory returning a list of input tuples")
    factory = with_torch(spec)
    module = factory.load_module(spec)
    fn = getattr(module, spec.attr, None)
    if not callable(fn):
        raise TargetError(f"--inputs {text!r}: {spec.attr!r} is not a function of {spec.module or spec.path!r}")
    try:
        sets = fn()
    except Exception as e:  # noqa: BLE001 - the factory is the user's code: report it
        raise TargetError(f"--inputs {text!r} raised {type(e).__name__}: {one_line(str(e))}") from e
    if not isinstance(sets, list | tuple) or not sets:
        raise TargetError(f"--inputs {text!r} returned {type(sets).__name__}: return a non-empty list of input tuples")
    return list(sets)


@cli.command(name="compile")
@click.argument("target", required=False)
@click.option("--backend", "-b", type=click.Choice(["inductor", "aot_eager", "eager"]), default="inductor",
              show_default=True, help="The torch.compile backend the recording backend hands each graph to.")
@click.option("--mode", type=click.Choice(MODES), default=None, help="torch.compile mode (inductor only).")
@click.option("--dynamic/--no-dynamic", default=None, help="torch.compile dynamic= (default: Dynamo decides).")
@click.option("--inputs", "inputs_factory", default=None, metavar="pkg.module:factory",
              help="Further input sets (a factory returning a list of input tuples): each runs the compiled "
                   "model and the recompiles it causes are listed.")
@click.option("--input-shape", "-i", "input_shapes", multiple=True, metavar="1,3,32,32",
              help="Shape of a random input tensor (repeat for several inputs).")
@click.option("--dtype", default="float32", show_default=True, help="dtype of the --input-shape tensors.")
@click.option("--depth", "-d", type=click.IntRange(min=0), default=None, help="Levels of modules to show.")
@click.option("--html", "html_out", type=click.Path(dir_okay=False), default=None,
              help="Write the report here, coloured by compiled graph.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="Write the compile map as JSON here ('-': stdout, instead of the tree).")
@click.option("--fail-on-break", is_flag=True, help="Exit 1 when any graph break occurs (after writing outputs).")
@click.option("--inside", is_flag=True,
              help="Per compiled graph its stages (Dynamo, pre-grad, AOT joint/forward/backward, post-grad, "
                   "kernels), every kernel and extern call with the ops and modules it runs and its time, and the "
                   "compile cost (--backend aot_eager: the AOT stages only).")
@click.option("--backward", "--grad", "grad", is_flag=True,
              help="A training step: the outputs are differentiated once, so the backward compiles; shows the stages "
                   "and kernels (as --inside does) with the backward's, and per compiled graph what the compiled "
                   "backward saves from the forward and recomputes, per module (--grad: the same).")
@click.option("--compiled-autograd", "autograd", is_flag=True,
              help="With --backward: run the backward under compiled autograd (what torch._dynamo.config."
                   "compiled_autograd = True does in a compiled training step) and show the graphs it captured, "
                   "the breaks in the backward and each autograd node's module (any --backend, eager included).")
@click.option("--activation-memory-budget", "budget", type=click.FloatRange(0.0, 1.0), default=None, metavar="F",
              help="With --backward: torch._functorch.config.activation_memory_budget for the run (1.0: torch's "
                   "default; lower: the min-cut partitioner saves less and recomputes more).")
@click.option("--stage", "stage_index", type=click.IntRange(min=0), default=None,
              help="With --inside or --from-trace: print this stage's tree (of --graph), changes marked.")
@click.option("--graph", "graph_id", default=None, metavar="g0",
              help="With --inside or --from-trace: the compiled graph to show (g0, g1, ... or a compile id 0/1).")
@click.option("--from-trace", "from_trace", type=click.Path(exists=True), default=None, metavar="DIR",
              help="Read a saved TORCH_TRACE directory (or one file) instead of compiling: TARGET may be left out; "
                   "given, the kernels are drawn on its module tree.")
@world_size_option
@verbose_option
def compile_cmd(target: str | None, backend: str, mode: str | None, dynamic: bool | None, inputs_factory: str | None,
                input_shapes: tuple[str, ...], dtype: str, depth: int | None, html_out: str | None,
                json_out: str | None, fail_on_break: bool, inside: bool, grad: bool, autograd: bool,
                budget: float | None, stage_index: int | None, graph_id: str | None, from_trace: str | None) -> None:
    """Show which parts of TARGET's forward torch.compile runs compiled: each op and module
    coloured by the Dynamo graph that ran it or marked eager, the share compiled per module, every
    graph break grouped by cause and line with a hint, and the recompiles --inputs cause. The
    forward runs under torch.no_grad(), as inference does (--backward: with grad), so its graphs,
    guards and kernels are those of a call under no_grad.

    With --inside, what Inductor did to each compiled graph; with --backward, a training step's
    backward too and what it saves and recomputes (with --compiled-autograd, the backward as
    compiled autograd captures and breaks it); with --from-trace DIR, the same read from a
    saved TORCH_TRACE directory. Dynamo's caches are reset before and after (the analysis
    runs in its own process here).
    """
    ctx = click.get_current_context()
    from fxviz.cli.inside import check_graph_syntax

    check_graph_syntax(graph_id)
    if from_trace is not None:
        _saved(target, from_trace, input_shapes, dtype, depth, html_out, json_out, stage_index, graph_id, grad)
        return
    if target is None:
        raise TargetError("fxviz compile needs a TARGET (model.py:build or package.module:build), or --from-trace DIR")
    if budget is not None and not grad:
        raise TargetError("--activation-memory-budget changes what the backward saves: add --backward")
    if budget is not None and backend != "inductor":
        raise TargetError(f"--activation-memory-budget steers the min-cut partitioner, which --backend {backend} "
                          "does not use: use --backend inductor")
    if autograd and not grad:
        raise TargetError("--compiled-autograd compiles the backward: add --backward")
    if autograd and (inside or budget is not None or stage_index is not None or graph_id is not None):
        raise TargetError("--compiled-autograd is not covered with --inside, --activation-memory-budget, --stage or "
                          "--graph (Inductor's records of the compiled autograd graph): leave those out")
    if mode is not None and backend != "inductor":
        raise TargetError(f"--mode {mode} applies to the inductor backend only, not {backend!r}: leave --mode out")
    if (inside or grad) and backend == "eager" and not autograd:
        raise TargetError("--inside and --backward read AOT Autograd's records: use --backend inductor or aot_eager")
    inside = inside or (grad and not autograd)
    if (stage_index is not None or graph_id is not None) and not inside:
        raise TargetError("--stage and --graph show Inductor's stages: add --inside (or --from-trace DIR)")
    spec = recognise(target)
    if not spec.captures:
        raise TargetError(f"{target!r} is {spec.what}: fxviz compile runs a model, so give a factory "
                          "(model.py:build or package.module:build)")
    factory = with_torch(spec)
    ranks = world_size(ctx)
    # with --world-size the factory shards the model inside torch's fake process group, and the
    # compiled run stays inside it
    group = factory.fake_world(ranks) if ranks is not None else contextlib.nullcontext()
    with group:
        t = factory.load_factory(spec, input_shapes=input_shapes, dtype=dtype)
        sets = _input_sets(inputs_factory) if inputs_factory else None
        from fxviz.analyze.compilemap import compile_map

        # with --json -, stdout is the JSON: what the model prints goes to stderr
        model_out = contextlib.redirect_stdout(sys.stderr) if json_out == "-" else contextlib.nullcontext()
        with t.runs(), spinner(f"compiling with {backend} …"), model_out:
            cmap = compile_map(t.model, t.args, t.kwargs, backend=backend, mode=mode, dynamic=dynamic, inputs=sets,
                               grad=grad, inside=inside, activation_memory_budget=budget, compiled_autograd=autograd)
    _write(cmap, depth=depth, html_out=html_out, json_out=json_out, stage=stage_index, graph=graph_id)
    if fail_on_break and (cmap.break_count or (cmap.backward is not None and cmap.backward.break_count)):
        ctx.exit(1)


def _saved(target: str | None, path: str, input_shapes: tuple[str, ...], dtype: str, depth: int | None,
           html_out: str | None, json_out: str | None, stage: int | None, graph: str | None, grad: bool) -> None:
    """``--from-trace DIR``: what the saved trace records inside torch.compile, on TARGET's module
    tree when TARGET is given."""
    import json

    from fxviz.analyze.inside.saved import from_trace
    from fxviz.cli.inside import check_selection, print_inside, stage_report
    from fxviz.tracefile import read_trace

    eager = None
    with spinner(f"reading {path} …"):  # read once: the graph check and the stages both use it
        trace = read_trace(path)
    if target is not None and graph is not None:  # a graph the trace does not hold: refused before the model runs
        check_selection(_graphs_only(trace), graph, None)
    if target is not None:
        spec = recognise(target)
        if not spec.captures:
            raise TargetError(f"{target!r} is {spec.what}: give a factory (model.py:build) to draw the trace on its modules")
        factory = with_torch(spec)
        t = factory.load_factory(spec, input_shapes=input_shapes, dtype=dtype)
        from fxviz.fallback.trace import trace_eager

        with t.runs(), spinner("tracing the eager forward …"):
            eager = trace_eager(t.model, t.args, t.kwargs, level="function", grad=grad)
    inside, _ = from_trace(trace, eager)
    check_selection(inside, graph, stage)
    if json_out is not None:
        d = {"format": "fxviz.inside/1", "summary": inside.summary(), **inside.to_dict()}
        if eager is not None:
            d["graph"] = json.loads(eager.to_json())
        write_json(json.dumps(d, indent=1), json_out, what="inside JSON")
    if json_out != "-":
        console = out_console()
        if eager is not None and stage is None:
            console.print(eager.tree(depth=depth, overlay="kernel" if "kernel" in (
                eager.annotations.get("overlays") or {}) else None))
        print_inside(console, inside, stage=stage, graph=graph)
    if html_out is not None:
        if eager is not None and stage is None:
            eager.to_html(html_out, overlay="kernel" if "kernel" in (eager.annotations.get("overlays") or {}) else None)
        else:
            stage_report(inside, graph, stage).to_html(html_out, overlay="pass_change")
        click.echo(f"wrote {html_out}", err=json_out == "-")


def _graphs_only(trace: Trace) -> Any:
    """The compiled graphs a saved trace holds (ids and compile ids, no stages), before the model runs."""
    from fxviz.analyze.inside.result import Inside, InsideGraph
    from fxviz.analyze.pipeline.result import Pipeline

    compiles = [c for c in trace.compiles if c.first("dynamo_output_graph") is not None]
    return Inside(graphs=[InsideGraph(f"g{k}", c.label, Pipeline(f"g{k}")) for k, c in enumerate(compiles)])


def _write(cmap: CompileMap, *, depth: int | None, html_out: str | None, json_out: str | None,
           stage: int | None = None, graph: str | None = None) -> None:
    from fxviz.analyze.compilemap.autograd import backward_lines
    from fxviz.analyze.compilemap.opcount import op_count_lines
    from fxviz.analyze.compilemap.overlay import break_lines, guard_lines, without_panels
    from fxviz.cli.inside import check_selection

    if cmap.inside is not None:  # before anything is written: a graph or stage the run did not produce
        check_selection(cmap.inside, graph, stage)
    if json_out is not None:
        write_json(cmap.to_json(indent=1), json_out, what="compile map JSON")
    if json_out != "-":
        console = out_console()
        console.print(f"{one_line(cmap.graph.name)}  {cmap.headline()}", markup=False)
        for note in cmap.notes:
            console.print(f"note: {one_line(note, limit=NOTE_CHARS)}", markup=False)
        # shapes and guards: a page of them below; graphs: the header counts them; all in --json/--html
        inside = cmap.inside
        have = cmap.graph.annotations.get("overlays") or {}
        overlay = next(o for o in ("backward saves", "kernel time", "kernel", "coverage") if o in have or o == "coverage")
        # the kernels, stages, costs and partition: tables below
        with without_panels(cmap.graph, "shapes", "guards", "graphs", "kernels", "stages", "compile cost", "partition",
                            "compiled autograd"):
            if stage is None:
                console.print(cmap.graph.tree(depth=depth, overlay=overlay))
        for line in break_lines(cmap.breaks):
            console.print(line, markup=False)
        for line in guard_lines(cmap):
            console.print(line, markup=False)
        for line in op_count_lines(cmap.graphs):
            console.print(line, markup=False)
        if cmap.backward is not None:
            for line in backward_lines(cmap.backward):
                console.print(line, markup=False)
        if inside is not None:
            from fxviz.cli.inside import print_inside

            print_inside(console, inside, stage=stage, graph=graph)
    if html_out is not None and stage is not None and cmap.inside is not None:
        from fxviz.cli.inside import stage_report

        stage_report(cmap.inside, graph, stage).to_html(html_out, overlay="pass_change")
        click.echo(f"wrote {html_out}", err=json_out == "-")
    elif html_out is not None:
        have = cmap.graph.annotations.get("overlays") or {}
        cmap.graph.to_html(html_out, overlay="kernel" if "kernel" in have else "compiled")
        click.echo(f"wrote {html_out}", err=json_out == "-")
