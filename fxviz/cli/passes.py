"""``fxviz passes TARGET``: the program after every compiler pass, as a stage table; one stage's
tree with what its pass changed; the whole pipeline as JSON; one stage's HTML report."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from fxviz.cli.base import cli, out_console, refuse_capture_options, spinner, verbose_option, write_json
from fxviz.errors import PassError, TargetError
from fxviz.targets.parse import recognise
from fxviz.text import ANSWER_CHARS, clean, one_line

if TYPE_CHECKING:
    from rich.table import Table

    from fxviz.analyze.pipeline import Pipeline


def import_object(text: str, what: str) -> Any:
    """``package.module:name`` or ``file.py:name`` (as a target names its factory; dots in ``name``
    walk attributes) -> the object."""
    mod_name, sep, attr = text.partition(":")
    if not sep or not mod_name or not attr:
        raise TargetError(f"{what} {text!r} is not file.py:name or package.module:name (e.g. my_passes:fuse_linear_relu)")
    if "" not in sys.path:
        sys.path.insert(0, "")  # a module next to where the user runs fxviz, as python -m does
    from fxviz.targets import factory

    try:  # a file is loaded as a factory's file is (it said "No module named '/x/p'")
        obj: Any = factory.load_module(recognise(f"{mod_name}:{attr.split('.')[0]}"))
    except TargetError as e:
        raise TargetError(f"{e} (for {what} {text!r})") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TargetError(f"{mod_name!r} has no attribute {attr!r} (for {what} {text!r})")
        obj = getattr(obj, part)
    return obj


def load_pass(text: str) -> Any:
    """A pass named on the command line: ``decompose``, or ``file.py:fn`` / ``pkg.module:fn`` (a factory without
    arguments, such as one that builds a PassManager, is called)."""
    if text == "decompose":
        return text
    obj = import_object(text, "--pass")
    # a factory of a PassManager (a function without arguments that returns one) is called
    if callable(obj) and getattr(obj, "__code__", None) is not None and obj.__code__.co_argcount == 0:
        obj = obj()
    return obj


def stage_table(p: Pipeline, *, show_unchanged: bool, stages: range) -> Table:
    from rich.table import Table

    from fxviz.analyze.pipeline.views import COLUMNS, stage_cells

    table = Table(title=f"{one_line(p.name)}: {len(p.stages)} stages", title_justify="left")
    # no stage's numbers were compared (Inductor's stages, --no-check): no column of dashes
    columns = COLUMNS if any(s.numbers is not None for s in p.stages) else COLUMNS[:-1]
    for c in columns:
        table.add_column(c, justify="left" if c == "pass" else "right")
    div = p.first_divergence
    for s in p.visible(show_unchanged=show_unchanged):
        if s.index not in stages:
            continue
        style = "red" if s.failed or (div is not None and div.stage == s.index) else "dim" if not s.changed else ""
        table.add_row(*(clean(str(c)) for c in stage_cells(s)[:len(columns)]), style=style)
    return table


def _summary(p: Pipeline, show_unchanged: bool) -> list[str]:
    from fxviz.analyze.pipeline.views import summary_lines

    return summary_lines(p, show_unchanged)


@cli.command()
@click.argument("target")
@verbose_option
@click.option("--input-shape", "-i", "input_shapes", multiple=True, metavar="1,3,32,32",
              help="Shape of a random input tensor (repeat for several inputs).")
@click.option("--dtype", default="float32", show_default=True, help="dtype of the --input-shape tensors.")
@click.option("--pass", "passes", multiple=True, metavar="FILE.py:FN",
              help="A pass to run after export, in order (repeatable; file.py:fn or package.module:fn): a function on a GraphModule or an "
                   "ExportedProgram, a PassBase, a PassManager (or a function returning one), or 'decompose'. "
                   "Default: decompose.")
@click.option("--decompose-table", metavar="FILE.py:TABLE", default=None,
              help="The decomposition table for run_decompositions (adds a decompose stage if none is given).")
@click.option("--from-stage", type=click.IntRange(min=0), default=0, help="First stage to show.")
@click.option("--to-stage", type=click.IntRange(min=0), default=None, help="Last stage to show.")
@click.option("--stage", "stage_index", type=click.IntRange(min=0), default=None,
              help="Print this stage's tree, its pass's changes marked (added, replaced, kept).")
@click.option("--all", "show_all", is_flag=True, help="Show the stages whose pass changed nothing too.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="Write the whole pipeline as JSON ('-': stdout).")
@click.option("--html", "html_out", type=click.Path(dir_okay=False), default=None,
              help="Write the selected stage's report (default: the last), changes coloured.")
@click.option("--before-after", "before_after", type=click.Path(dir_okay=False), default=None,
              help="Write the selected stage (default: the last) and the one before it side by side (HTML).")
@click.option("--numbers/--no-numbers", default=True, show_default=True,
              help="Run each stage on the inputs and compare its outputs with eager PyTorch.")
def passes(target: str, input_shapes: tuple[str, ...], dtype: str, passes: tuple[str, ...],
           decompose_table: str | None, from_stage: int, to_stage: int | None, stage_index: int | None,
           show_all: bool, json_out: str | None, html_out: str | None, before_after: str | None,
           numbers: bool) -> None:
    """Run compiler passes on TARGET's exported program and show the graph after each: a stage table
    (pass, time, ops before -> after, nodes added and removed, max error against eager). A pass that
    raises ends the pipeline: the stages before it are shown, and the exit code is 4."""
    ctx = click.get_current_context()
    spec = recognise(target)
    refuse_capture_options(ctx, spec)
    if spec.kind == "graph":
        raise TargetError(f"{target!r} is a saved graph: passes run on a program; give a factory or a .pt2 file")
    from fxviz.analyze.pipeline.views import annotate

    pass_list: list[Any] | None = [load_pass(p) for p in passes] or None
    table = import_object(decompose_table, "--decompose-table") if decompose_table else None
    if table is not None and "decompose" not in (pass_list or ["decompose"]):
        pass_list = [*(pass_list or []), "decompose"]
    _check_stage(pass_list, table, stage_index, before_after is not None, from_stage, to_stage)
    with spinner(f"running {len(pass_list or ['decompose']) + 1} stages on {one_line(target)}"):
        p = _run(spec, pass_list, table, numbers, input_shapes, dtype)
    last = len(p.stages) - 1
    shown = range(from_stage, (last if to_stage is None else min(to_stage, last)) + 1)
    console = out_console()
    to_stdout = json_out != "-"
    if stage_index is not None and stage_index > last:
        raise TargetError(f"--stage {stage_index}: the pipeline has stages 0 to {last}")
    if to_stdout:  # the answer first, as the report opens with it (annotate writes the same sentence)
        console.print(one_line(p.headline(), limit=ANSWER_CHARS), markup=False, soft_wrap=True)
    if to_stdout and stage_index is None:
        console.print(stage_table(p, show_unchanged=show_all, stages=shown))
    elif to_stdout and stage_index is not None:  # the tree prints the stage table under it, as its panel
        g = annotate(p, stage_index, show_unchanged=show_all, stages=shown)
        console.print(g.tree(overlay="pass_change"))
    if to_stdout:
        for line in _summary(p, show_all):
            console.print(line, markup=False, soft_wrap=True)
    if html_out is not None:
        for path in _write_reports(p, html_out, last if stage_index is None else stage_index, show_all, shown):
            click.echo(f"wrote {path}", err=not to_stdout)
    if before_after is not None:
        _write_before_after(p, last if stage_index is None else stage_index, before_after)
        click.echo(f"wrote {before_after}", err=not to_stdout)
    if json_out is not None:
        write_json(p.to_json(indent=1), json_out, what="pipeline JSON")
    if p.failed is not None:  # what ran is written; the exit says a pass failed
        ctx.exit(PassError.exit_code)




def _check_stage(pass_list: list[Any] | None, table: Any, stage_index: int | None, before_after: bool,
                 from_stage: int = 0, to_stage: int | None = None) -> None:
    """Refuse ``--stage``, ``--from-stage`` or ``--to-stage`` beyond the stages the passes make
    (export, then one per pass, a PassManager's each), a range that shows nothing, and
    ``--before-after`` of stage 0, before anything is exported."""
    from fxviz.analyze.pipeline.run import DEFAULT_PASSES
    from fxviz.analyze.pipeline.steps import steps_of

    if to_stage is not None and to_stage < from_stage:
        raise TargetError(f"--from-stage {from_stage} --to-stage {to_stage} shows no stage: give --to-stage "
                          f"{from_stage} or more")
    if stage_index is None and from_stage == 0 and to_stage is None:
        return
    last = len(steps_of(DEFAULT_PASSES if pass_list is None else pass_list, decompose_table=table))
    for option, value in (("--from-stage", from_stage), ("--to-stage", to_stage)):
        if value is not None and value > last:
            raise TargetError(f"{option} {value}: the pipeline has stages 0 to {last}")
    if stage_index is None:
        return
    if stage_index > last:
        raise TargetError(f"--stage {stage_index}: the pipeline has stages 0 to {last}")
    if stage_index == 0 and before_after:
        raise TargetError("--before-after: stage 0 has no stage before it; pick a later one with --stage")


def _write_before_after(p: Pipeline, index: int, path: str) -> None:
    """The diff page (as ``fxviz diff --html`` writes it) of stage ``index`` against the one before."""
    from fxviz.graphdiff import diff

    if index == 0:
        raise TargetError("--before-after: stage 0 has no stage before it; pick a later one with --stage")
    before, after = p.stage(p.before(index)), p.stage(index)
    diff(before.graph, after.graph, labels=(f"stage {before.index} ({before.name})",
                                            f"stage {after.index} ({after.name})")).to_html(path)


def _run(spec: Any, pass_list: list[Any] | None, table: Any, numbers: bool, input_shapes: tuple[str, ...],
         dtype: str) -> Pipeline:
    from fxviz.analyze.pipeline import load_program, pipeline
    from fxviz.targets import factory

    if spec.kind == "pt2":
        return pipeline(load_program(spec.path), passes=pass_list, decompose_table=table, numbers=numbers)
    t = factory.load_factory(spec, input_shapes=input_shapes, dtype=dtype)
    with t.runs():
        return pipeline(t.model, t.args, t.kwargs, passes=pass_list, decompose_table=table, numbers=numbers)


def _write_reports(p: Any, html_out: str, selected: int, show_all: bool, shown: range) -> list[str]:
    """The selected stage's report at ``html_out`` and every other shown stage's beside it
    (``report.stage-2.html``), each with the stage table whose rows open the others: the pass list
    of the report."""
    from pathlib import Path

    from fxviz.analyze.pipeline.views import annotate

    out = Path(html_out)
    visible = [s.index for s in p.visible(show_unchanged=show_all) if s.index in shown and s.graph is not None]
    if selected not in visible:
        visible.append(selected)
    pages = {i: out.name if i == selected else f"{out.stem}.stage-{i}{out.suffix or '.html'}" for i in visible}
    written = []
    for i in sorted(visible, key=lambda i: i != selected):  # the selected stage's file first
        g = annotate(p, i, show_unchanged=show_all, stages=shown, pages=pages)
        path = out.with_name(pages[i])
        g.to_html(str(path), overlay="pass_change")
        written.append(str(path))
    return written
