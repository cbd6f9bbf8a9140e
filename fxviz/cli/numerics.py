"""``fxviz numerics``: where another way of running a model (export, decomposition, compile, lower
precision) changes its numbers, per module and per op, against eager float32."""

from __future__ import annotations

import math
from typing import Any

import click

from fxviz.cli.base import cli, out_console, spinner, verbose_option, with_torch, write_json
from fxviz.cli.passes import load_pass
from fxviz.errors import TargetError
from fxviz.targets.parse import recognise
from fxviz.text import ANSWER_CHARS, NOTE_CHARS, one_line

_SIDES = ("export, decompose, compile[:backend] (compile:aot_eager per op; other backends, inductor by default, "
          "where values enter or leave each compiled graph), dtype:bfloat16, dtype:float16, autocast:bfloat16, "
          "stage:N")


@cli.command(name="numerics")
@click.argument("target")
@verbose_option
@click.option("--against", "-a", default="export", show_default=True, metavar="SIDE",
              help=f"What to compare eager float32 with: {_SIDES}.")
@click.option("--rtol", type=float, default=None, help="Relative tolerance (default: by the side's dtype: 4 unit roundoffs of bfloat16 or float16, "
                   "what that dtype is expected to give; torch.testing's for float32 sides).")
@click.option("--atol", type=float, default=None, help="Absolute tolerance (default: 1e-5).")
@click.option("--depth", "-d", type=click.IntRange(min=0), default=None, help="Levels of modules to show.")
@click.option("--unfold", is_flag=True, help="Show every block of a folded run (h.0-11 ×12): each has its own error.")
@click.option("--input-shape", "-i", "input_shapes", multiple=True, metavar="1,3,32,32",
              help="Shape of a random input tensor (repeat for several inputs).")
@click.option("--dtype", default="float32", show_default=True, help="dtype of the --input-shape tensors.")
@click.option("--html", "html_out", type=click.Path(dir_okay=False), default=None,
              help="Write the report here, coloured by the error.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="Write the result as JSON here ('-': stdout, instead of the tree).")
@click.option("--fail-above", "fail_above", type=float, default=None, metavar="DB",
              help="Exit 1 when any module's SNR falls below DB decibels (a CI gate), after writing outputs.")
@click.option("--per-kernel", "per_kernel", is_flag=True,
              help="With --against compile:inductor: compare every Inductor kernel's output buffers with the eager "
                   "values of the ops it replaces, and name the first kernel beyond tolerance (module and line).")
@click.option("--pass", "passes", multiple=True, metavar="FILE.py:FN",
              help="With --against stage:N: the passes of the pipeline, in order (as fxviz passes takes them; "
                   "default: decompose).")
@click.option("--backward", is_flag=True,
              help="Also run one training step (loss: the sum of the outputs) and compare each parameter's gradient: "
                   "per parameter, per module, and the first module in backward order whose gradient diverges.")
def numerics_cmd(target: str, against: str, rtol: float | None, atol: float | None, depth: int | None, unfold: bool,
                 input_shapes: tuple[str, ...], dtype: str, html_out: str | None, json_out: str | None,
                 fail_above: float | None, passes: tuple[str, ...], per_kernel: bool, backward: bool) -> None:
    """Compare TARGET's eager float32 forward with the same model run another way (--against),
    op by op and module by module: max abs and rel error, cosine similarity, SNR, and the first
    divergence (the op where the error is born). TARGET is a factory: the model must run.

    Exits 0 whatever the errors, unless --fail-above is given.
    """
    ctx = click.get_current_context()
    spec = recognise(target)
    if not spec.captures:
        raise TargetError(f"{target!r} is {spec.what}: numerics run the model, give a factory (model.py:build)")
    factory = with_torch(spec)
    from fxviz.analyze.numerics import check_options, numerics

    pass_list = [load_pass(p) for p in passes] or None
    # a combination of options that cannot run is refused before the model is built, exported or compiled
    check_options(against, per_kernel=per_kernel, backward=backward, passes=pass_list, rtol=rtol, atol=atol)
    t = factory.load_factory(spec, input_shapes=input_shapes, dtype=dtype)
    with t.runs(), spinner(f"running {type(t.model).__name__} eagerly and against {against}"):
        result = numerics(t.model, t.args, t.kwargs, against=against, rtol=rtol, atol=atol, passes=pass_list,
                          per_kernel=per_kernel, backward=backward)
    if json_out is not None:
        write_json(result.to_json(indent=1), json_out, what="numerics JSON")
    if json_out != "-":
        console = out_console()
        console.print(one_line(result.headline(), limit=ANSWER_CHARS))
        if result.first is not None:
            console.print(f"first divergence: {one_line(result.where(result.first), limit=400)}  "
                          f"[{result.nodes[result.first].text()}]")
        if result.grads is not None:
            console.print(one_line(result.grads.headline(), limit=NOTE_CHARS))
        for note in result.notes:
            console.print(f"note: {one_line(note, limit=NOTE_CHARS)}")
        if result.kernels is not None:
            _print_kernels(console, result)
        console.print(result.tree(depth=depth, unfold=unfold))
        if result.grads is not None:
            _print_grads(console, result.grads)
    if html_out is not None:
        result.to_html(html_out)
        click.echo(f"wrote {html_out}", err=json_out == "-")
    if fail_above is not None:
        worst = result.worst_snr()
        if worst < fail_above:
            click.echo(f"a module's SNR is {worst:.1f} dB, below --fail-above {fail_above:g} dB", err=True)
            ctx.exit(1)
        if math.isnan(worst):
            ctx.exit(1)


#: How many gradients the terminal lists after the first beyond tolerance.
GRADS_AFTER = 5


def _print_kernels(console: Any, result: Any) -> None:
    """The cause among the kernels (each kernel is a row of the ``kernels`` panel under the tree)."""
    first = result.first_kernel
    if first is None:
        return
    own = first.origin == "own"
    error = first.own_error if own else first.error
    what = "first kernel with its own error beyond tolerance" if own else \
        "first kernel beyond tolerance (its own error not measured)"
    console.print(f"{what}: {one_line(first.where(), limit=400)}  [{error.text() if error is not None else ''}]")


def _print_grads(console: Any, grads: Any) -> None:
    """Each parameter's gradient error, in backward order, up to the first beyond tolerance and a few after."""
    stop = len(grads.order) if grads.first is None else min(
        len(grads.order), grads.order.index(grads.beyond()[0]) + 1 + GRADS_AFTER)
    for name in grads.order[:stop]:
        console.print(f"  grad {name}: {one_line(grads.params[name].text(), limit=300)}")
    if stop < len(grads.order):
        console.print(f"  ... {len(grads.order) - stop} more gradient(s) in --json")
