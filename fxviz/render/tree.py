"""The terminal tree: module calls nested in execution order, ops inside them, parallel branches
as branches, identical consecutive blocks folded to ``h.0-11 ×12``, the regions that ran inside a
higher-order op (``◇ no_grad``, ``◇ cond: true branch (taken)``) as branches of their call, each
call's plumbing (masks, sizes, export's checks: :mod:`fxviz.passes.plumbing`) folded into one
line, the outputs of one container (a cache) on one line.

    >>> from rich.console import Console
    >>> Console(width=100).print(to_tree(graph, depth=2, width=100))

Reads only the IR and what passes put on it (``stats``, ``fold``, overlays); the series/parallel
structure is derived by :func:`fxviz.passes.structure.structure`. Every name, path, class, shape
and message comes from a model or a file, so each goes through :func:`fxviz.text.clean` before it
reaches the terminal. Given the width, a line that does not fit breaks between its fields (never
inside a shape), and its continuation is indented under it; an overlay's values (``--overlay
flops``) stand in a column at the right edge. Drawing is iterative, and stops at the nesting a
terminal of the given width can show, with a line that says how much is below: a module nested
5,000 levels deep draws as a few lines.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence

from rich.console import Console, ConsoleOptions, RenderResult
from rich.tree import Tree

from fxviz.calls import Call
from fxviz.errors import RenderError
from fxviz.ir import Graph, Node, module_class
from fxviz.passes.overlays import overlays, reduce_values
from fxviz.passes.plumbing import plumbing_of, plumbing_summary
from fxviz.passes.structure import Block, Op, Parallel, Step, step_nodes, structure
from fxviz.render.panels import panel_tables
from fxviz.render.treehead import DIM as _DIM
from fxviz.render.treehead import ERR as _ERR
from fxviz.render.treehead import MODULE as _MODULE
from fxviz.render.treehead import SHAPE as _SHAPE
from fxviz.render.treehead import Ctx, call_value, header, io_values, node_value
from fxviz.render.treelabel import MAX_LEVELS, levels_for, meta_text, no_outputs, recompute_mark
from fxviz.render.treelabel import Label as _Label
from fxviz.render.treelabel import Plumbing as _Plumbing
from fxviz.render.treelabel import fold_plumbing as _fold_plumbing
from fxviz.render.treelabel import shape_pieces as _shape_pieces
from fxviz.render.treelabel import shown as _c
from fxviz.render.view import (
    KIND_COLORS,
    counted,
    format_count,
    node_color,
    node_label,
    node_placement,
    placement,
)
from fxviz.text import one_line

#: A piece of drawing work: it adds lines and yields the nested pieces to draw next, which
#: :func:`_draw` runs with a stack of its own instead of recursion.
Work = Iterator["Work"]


def to_tree(graph: Graph, *, depth: int | None = None, unfold: bool = False,
            max_levels: int = MAX_LEVELS, width: int | None = None, plumbing: bool = False,
            overlay: str | None = None) -> Tree:
    """A rich :class:`~rich.tree.Tree` of ``graph``.

    ``depth`` limits how many levels of modules are shown: ``depth=0`` is the model's own line,
    ``depth=1`` lists the model's direct children, each on one line; ``depth=2`` opens those.
    ``unfold`` shows every block of a folded run instead of the first one. ``plumbing`` shows
    each plumbing op instead of one line per call. ``overlay`` names an overlay whose values
    stand at the end of each line (:func:`fxviz.passes.overlays.overlays`). ``width`` is the
    terminal's: labels that do not fit break between fields, and the overlay's values are
    right-aligned. ``max_levels`` is the deepest nesting drawn (modules and branches alike):
    below it one line says how many ops and levels are not drawn (:func:`levels_for` a width).
    """
    stats = graph.annotations.get("stats", {}).get("modules", {})
    folds = {tuple(r["paths"]): r for r in graph.annotations.get("fold", [])}
    calls = graph.calls
    dtypes = [n.meta.dtype for n in graph.inputs if n.meta is not None and n.meta.is_tensor]
    spec = None
    if overlay is not None:
        found = overlays(graph, calls)
        if overlay not in found:
            raise RenderError(f"graph {graph.name!r} has no overlay {overlay!r}; it has: {', '.join(found) or 'none'}")
        spec = found[overlay]
    unseen = {calls.of(n.name).id: n.attrs["unseen"] for n in graph.nodes
              if n.kind == "call" and isinstance(n.attrs.get("unseen"), str)}
    ctx = Ctx(graph, depth, unfold, calls, stats, folds, dtypes[0] if dtypes else "", max(1, max_levels), width,
               {} if plumbing else plumbing_of(graph), spec, unseen)
    for n in graph.nodes:
        if n.inputs and n.kind == "parameter":
            ctx.becomes.setdefault(n.inputs[0].node, []).append(n.target)

    tree = Tree(header(graph, ctx).render(width), guide_style="dim")
    if depth == 0:
        return tree
    for a in graph.attempts:
        if a.skipped:
            ctx.add(tree, _Label(f"⤼ {_c(a.method)} {one_line(a.reason(), limit=1000)}", "dim yellow"), 1)
        elif not a.ok:
            ctx.add(tree, _Label(f"✗ {_c(a.method)} failed: {one_line(a.reason(), limit=1000)}", "yellow"), 1)
    for note in graph.notes:
        ctx.add(tree, _Label(f"ℹ {one_line(note, limit=1000)}", _DIM), 1)
    io_values(tree, graph, "input", ctx)
    _draw(_steps(tree, _fold_plumbing(structure(graph, calls).steps, calls.root, ctx.plumbing), ctx, level=1, nesting=1))
    io_values(tree, graph, "output", ctx)
    if graph.error:
        ctx.add(tree, _Label(f"✗ the model raised: {one_line(graph.error)}", _ERR), 1)
    return tree


def _draw(work: Work) -> None:
    """Run ``work`` and every piece it yields, depth first, without recursion."""
    stack = [work]
    while stack:
        nested = next(stack[-1], None)
        if nested is None:
            stack.pop()
        else:
            stack.append(nested)


def _console(width: int) -> Console:
    # force_jupyter=False: in a notebook, rich would display the tree itself and `print` would then
    # write it a second time
    return Console(width=width, color_system=None, record=True, file=io.StringIO(), force_jupyter=False)


def tree_text(graph: Graph, *, width: int = 120, depth: int | None = None, unfold: bool = False,
              plumbing: bool = False, overlay: str | None = None) -> str:
    """The tree as plain text (``str(graph)``): no colour, ``width`` columns."""
    console = _console(width)
    console.print(to_tree(graph, depth=depth, unfold=unfold, max_levels=levels_for(width), width=width,
                          plumbing=plumbing, overlay=overlay))
    for table in panel_tables(graph):
        console.print(table)
    return console.export_text().rstrip("\n")


class TreeView:
    """A renderable for ``rich.print`` / ``Console.print`` with tree options bound."""

    def __init__(self, graph: Graph, *, depth: int | None = None, unfold: bool = False, plumbing: bool = False,
                 overlay: str | None = None) -> None:
        self.graph, self.depth, self.unfold, self.plumbing, self.overlay = graph, depth, unfold, plumbing, overlay

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield to_tree(self.graph, depth=self.depth, unfold=self.unfold, max_levels=levels_for(options.max_width),
                      width=options.max_width, plumbing=self.plumbing, overlay=self.overlay)
        yield from panel_tables(self.graph)


# ---- steps ---------------------------------------------------------------------------------------


def _steps(parent: Tree, steps: Sequence[Step | _Plumbing], ctx: Ctx, level: int, nesting: int) -> Work:
    """Draw ``steps`` under ``parent``, which sits ``nesting`` levels below the root; ``level``
    counts module levels only (for ``depth``)."""
    i = 0
    while i < len(steps):
        s = steps[i]
        if isinstance(s, Block) and s.region is not None:
            yield from _region(parent, s, ctx, level, nesting)
        elif isinstance(s, Block):
            run = _fold_run(steps, i, ctx)
            if run > 1 and not ctx.unfold:
                yield from _call(parent, s, ctx, level, nesting, fold=[x for x in steps[i: i + run] if isinstance(x, Block)])
                i += run
                continue
            yield from _call(parent, s, ctx, level, nesting)
        elif isinstance(s, Op):
            node = ctx.graph.node(s.node)
            ctx.add(parent, _op_line(node, ctx), nesting, node_value(s.node, ctx))
        elif isinstance(s, _Plumbing):
            line = _Label(f"… {plumbing_summary(s.names, ctx.plumbing)}", _DIM)
            value = None if ctx.overlay is None else reduce_values(ctx.overlay, [node_value(x, ctx) for x in s.names])
            ctx.add(parent, line, nesting, value)
        else:
            join = steps[i + 1] if i + 1 < len(steps) else None
            yield from _parallel(parent, s, join if isinstance(join, Op | Block) else None, ctx, level, nesting)
        i += 1


def _fold_run(steps: Sequence[Step | _Plumbing], i: int, ctx: Ctx) -> int:
    """Length of the folded run starting at ``steps[i]`` (1 when none starts there)."""
    first = steps[i]
    assert isinstance(first, Block)
    for paths in ctx.folds:
        if paths[0] != first.path:
            continue
        k = len(paths)
        window = steps[i : i + k]
        if len(window) == k and all(isinstance(c, Block) and c.path == p for c, p in zip(window, paths, strict=True)):
            return k
    return 1


def _call_label(call: Block, ctx: Ctx, fold: list[Block] | None) -> _Label:
    cls = module_class(ctx.graph, call.path)
    if fold:
        label = next(r["label"] for p, r in ctx.folds.items() if p[0] == call.path)
        t = _Label(_c(_relative(label, ctx)), _MODULE).add(f" ×{len(fold)}", "bold magenta")
    else:
        t = _Label(_c(_relative(call.path, ctx)), _MODULE)
    if cls:
        t.add(f" ({_c(cls)})", _DIM)
    total = ctx.calls.count(call.path)
    if total > 1:
        t.add(f" call {call.index + 1}/{total}", "magenta", brk=True)
    g = ctx.graph
    ins, outs = [g.meta_of(r) for r in call.call.inputs], [g.meta_of(r) for r in call.call.outputs]
    if ins or outs:
        _shape_pieces(t, ins, _SHAPE, prefix="  ", brk=True, places=[placement(g, r) for r in call.call.inputs])
        if outs:
            _shape_pieces(t, outs, _SHAPE, prefix=" → ", brk=True, places=[placement(g, r) for r in call.call.outputs])
        else:  # a call that raised hands nothing back, as does one whose result nobody reads
            t.add(no_outputs(g, call, call.index + 1 == total), _SHAPE, brk=True)
    params = ctx.stats.get(call.path, {}).get("params", 0)
    if params and call.index == 0:
        count = f"{len(fold)} × {format_count(params)}" if fold else format_count(params)
        t.add(f"  {count} params", _DIM, brk=True)
    if not call.nodes and not fold:  # the module ran and computed nothing (or nothing seen)
        unseen = ctx.unseen.get(call.call.id)
        t.add(f"  · {_c(unseen) if unseen else 'no op'}", _DIM, brk=True)
    return t


def _relative(path: str, ctx: Ctx) -> str:
    """A path relative to the call being drawn (``q`` inside ``blocks.0.attn``), so deep trees
    stay readable; the full path of any line is its ancestors' names joined."""
    base = ctx.base[-1] if ctx.base else ""
    return path[len(base) + 1 :] if base and path.startswith(base + ".") else path


def _single_op(call: Block) -> Op | None:
    return call.steps[0] if len(call.steps) == 1 and isinstance(call.steps[0], Op) else None


def _call(parent: Tree, call: Block, ctx: Ctx, level: int, nesting: int, fold: list[Block] | None = None) -> Work:
    assert isinstance(call.call, Call)  # a region is drawn by _region
    label = _call_label(call, ctx, fold)
    value = call_value([b.call for b in fold if isinstance(b.call, Call)] if fold else [call.call], ctx)
    only = _single_op(call)
    if only is not None:
        node = ctx.graph.node(only.node)
        label.add(f"  · {_c(node_label(node))}", node_color(node), brk=True)
        _mark(label, node)
        ctx.add(parent, label, nesting, value)
        return
    if (ctx.depth is not None and level >= ctx.depth) or nesting >= ctx.max_levels:
        label.add(f"  … {counted(len(call.nodes), 'op')}", _DIM, brk=True)
        branch = ctx.add(parent, label, nesting, value)
        if nesting >= ctx.max_levels and (ctx.depth is None or level < ctx.depth):
            levels = max(c.depth for c in call.call.walk()) - call.depth
            ctx.add(branch, _hidden(len(call.nodes), levels, ctx), nesting + 1)
        return
    branch = ctx.add(parent, label, nesting, value)
    ctx.base.append(call.path)
    yield _steps(branch, _fold_plumbing(call.steps, call.call, ctx.plumbing), ctx, level + 1, nesting + 1)
    ctx.base.pop()


def _region(parent: Tree, block: Block, ctx: Ctx, level: int, nesting: int) -> Work:
    """A region of a call that ran inside a higher-order op: ``◇ no_grad``, ``◇ cond: true branch
    (taken)``, with what crosses its border, and its steps inside (module levels do not change)."""
    label = _Label(f"◇ {_c(block.call.name)}", "bold cyan")
    ins, outs = [ctx.graph.meta_of(r) for r in block.call.inputs], [ctx.graph.meta_of(r) for r in block.call.outputs]
    if ins or outs:
        _shape_pieces(label, ins, _SHAPE, prefix="  ", brk=True)
        if outs:
            _shape_pieces(label, outs, _SHAPE, prefix=" → ", brk=True)
        else:
            label.add(" → ✗", _SHAPE, brk=True)
    count = len(block.nodes)
    label.add(f"  · {count} op{'' if count == 1 else 's'}", _DIM, brk=True)
    branch = ctx.add(parent, label, nesting)
    if nesting >= ctx.max_levels:
        ctx.add(branch, _hidden(len(block.nodes), 0, ctx), nesting + 1)
        return
    yield _steps(branch, block.steps, ctx, level, nesting + 1)


def _hidden(ops: int, levels: int, ctx: Ctx) -> _Label:
    """The line that stands for what is nested too deep to draw."""
    what = counted(ops, "op") + (f" in {counted(levels, 'more level')} of modules" if levels else "")
    return _Label(f"⋯ {what} not drawn: the tree stops at {ctx.max_levels} levels (a wider terminal "
                  "shows more; the HTML report shows all)", _DIM)


def _op_line(node: Node, ctx: Ctx) -> _Label:
    t = _Label(_c(node_label(node)), node_color(node))
    metas = list(node.outputs)
    if metas:
        _shape_pieces(t, metas, _SHAPE, limit=3, prefix="  → ", brk=True, places=[node_placement(node)])
        m = metas[0]
        if m.is_tensor and ctx.main_dtype and m.dtype != ctx.main_dtype and _dtype_changed(node, ctx):
            t.add(f" {_c(m.dtype)}", "yellow")
    _becomes(t, node.name, ctx)
    _mark(t, node)
    return t


def _becomes(t: _Label, name: str, ctx: Ctx) -> None:
    """``= attn.weight``: the parameters an op's value is (an FSDP2 unit's unsharded parameters)."""
    params = ctx.becomes.get(name)
    if params:
        t.add(f"  = {_c(', '.join(_relative(p, ctx) for p in params))}", KIND_COLORS["parameter"], brk=True)


def _dtype_changed(node: Node, ctx: Ctx) -> bool:
    """Show a dtype only where it changes: an op whose output dtype differs from its first input."""
    if not node.inputs:
        return True
    src = ctx.graph.meta_of(node.inputs[0])
    return src is None or src.dtype != (node.meta.dtype if node.meta else "")


def _mark(t: _Label, node: Node) -> None:
    t.add(*recompute_mark(node, long=True), brk=True)
    if node.attrs.get("data_dependent"):
        t.add("  ⚠ data-dependent", "bold yellow", brk=True)
    if node.error:
        t.add(f"  ✗ {one_line(node.error)}", _ERR, brk=True)


def _is_simple(step: Step) -> bool:
    return isinstance(step, Op) or (isinstance(step, Block) and step.region is None and _single_op(step) is not None)


def _chain(t: _Label, steps: list[Step], ctx: Ctx) -> _Label:
    """``initial_conv (Conv2d) → relu → max_pool (MaxPool2d)  → [1, 16, 16, 16]``"""
    for k, s in enumerate(steps):
        if k:
            t.add(" → ", _DIM, brk=True)
        if isinstance(s, Block):
            t.add(_c(_relative(s.path, ctx)), _MODULE)
            cls = module_class(ctx.graph, s.path)
            if cls:
                t.add(f" ({_c(cls)})", _DIM)
        else:
            assert isinstance(s, Op)
            node = ctx.graph.node(s.node)
            t.add(_c(node_label(node)), node_color(node))
            t.add(*recompute_mark(node, long=False))
    last = ctx.graph.node(step_nodes(steps[-1])[-1]) if steps else None
    if last is not None and last.meta is not None:
        t.add(f"  → {meta_text(last.meta)}", _SHAPE, brk=True)
    if last is not None:
        _becomes(t, last.name, ctx)
    return t


def _joins(p: Parallel, join: Op | Block, ctx: Ctx) -> bool:
    """Does ``join`` read what the branches of ``p`` make? (A mask built beside the main path and
    read only deep inside later blocks does not join at the step after it.)"""
    made = set(step_nodes(p))
    names = [join.node] if isinstance(join, Op) else join.nodes
    return any(r.node in made for name in names for r in ctx.graph.node(name).inputs)


def _parallel(parent: Tree, p: Parallel, join: Op | Block | None, ctx: Ctx, level: int, nesting: int) -> Work:
    join_name = ""
    if join is not None and _joins(p, join, ctx):
        if isinstance(join, Op):
            join_name = _c(node_label(ctx.graph.node(join.node)))
        else:
            join_name = _c(join.call.name if join.region is not None else _relative(join.path, ctx))
    if p.residual:
        label = _Label("⤷ residual branch", "bold blue")
        if join_name:
            label.add(f"  (input skips ahead to {join_name})", _DIM, brk=True)
    else:
        label = _Label(f"⑂ {len(p.branches)} parallel branches", "bold blue")
        if join_name:
            label.add(f"  → join at {join_name}", _DIM, brk=True)
    node = ctx.add(parent, label, nesting)
    if nesting >= ctx.max_levels:
        ctx.add(node, _hidden(len(step_nodes(p)), 0, ctx), nesting + 1)
        return
    for k, branch in enumerate(p.branches, 1):
        if all(_is_simple(s) for s in branch) and len(branch) > 0:
            line = _Label(f"{k}: ", _DIM) if len(p.branches) > 1 else _Label()
            ctx.add(node, _chain(line, branch, ctx), nesting + 1)
        elif len(p.branches) == 1:
            yield _steps(node, branch, ctx, level, nesting + 1)
        elif nesting + 1 >= ctx.max_levels:
            ctx.add(node, _hidden(sum(len(step_nodes(s)) for s in branch), 0, ctx), nesting + 1)
        else:
            sub = ctx.add(node, _Label(f"branch {k}", _DIM), nesting + 1)
            yield _steps(sub, branch, ctx, level, nesting + 2)


__all__ = ["MAX_LEVELS", "TreeView", "levels_for", "meta_text", "to_tree", "tree_text"]
