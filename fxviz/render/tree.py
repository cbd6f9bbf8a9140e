"""The terminal tree: module calls nested in execution order, ops inside them, parallel branches
as branches, identical consecutive blocks folded to ``h.0-11 ×12``, and the regions that ran
inside a higher-order op (``◇ no_grad``, ``◇ cond: true branch (taken)``) as branches of their call.

    >>> from rich.console import Console
    >>> Console(width=100).print(to_tree(graph, depth=2))

Reads only the IR and what passes put on it (``stats``, ``fold``); the series/parallel structure
is derived by :func:`fxviz.passes.structure.structure`. Every name, path, class, shape and message
comes from a model or a file, so each goes through :func:`fxviz.text.clean` before it reaches the
terminal. Drawing is iterative, and stops at the nesting a terminal of the given width can show,
with a line that says how much is below: a module nested 5,000 levels deep draws as a few lines.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text
from rich.tree import Tree

from fxviz.calls import Call, CallTree
from fxviz.ir import Graph, Node, TensorMeta, module_class
from fxviz.passes.structure import Block, Op, Parallel, Step, step_nodes, structure
from fxviz.render.view import format_count, node_color, node_label
from fxviz.text import clean, one_line

_DIM = "dim"
_SHAPE = "cyan"
_MODULE = "bold"
_ERR = "bold red"

#: Levels of nesting drawn when the width is not known; rich gives each level 4 columns.
MAX_LEVELS = 24


def levels_for(width: int) -> int:
    """How many levels of nesting fit in ``width`` columns with 30 left for the labels: past that,
    rich would squeeze labels to a few letters and then drop whole levels without a word."""
    return max(4, (width - 30) // 4)


def _c(text: object) -> str:
    """Text from the model or a file, safe for a terminal, on one line."""
    return clean(str(text), newlines=False)


def meta_text(meta: TensorMeta | None) -> str:
    return _c(meta.shape_str()) if meta is not None else "?"


@dataclass
class _Ctx:
    graph: Graph
    depth: int | None
    unfold: bool
    calls: CallTree
    stats: dict[str, Any]
    folds: dict[tuple[str, ...], dict[str, Any]]
    main_dtype: str
    base: list[str]  # paths of the calls being drawn, innermost last
    max_levels: int


#: A piece of drawing work: it adds lines and yields the nested pieces to draw next, which
#: :func:`_draw` runs with a stack of its own instead of recursion.
Work = Iterator["Work"]


def to_tree(graph: Graph, *, depth: int | None = None, unfold: bool = False,
            max_levels: int = MAX_LEVELS) -> Tree:
    """A rich :class:`~rich.tree.Tree` of ``graph``.

    ``depth`` limits how many levels of modules are shown: ``depth=1`` lists the model's direct
    children, each on one line; ``depth=2`` opens those and lists theirs.
    ``unfold`` shows every block of a folded run instead of the first one.
    ``max_levels`` is the deepest nesting drawn (modules and branches alike): below it one line
    says how many ops and levels are not drawn (:func:`levels_for` a terminal width).
    """
    stats = graph.annotations.get("stats", {}).get("modules", {})
    folds = {tuple(r["paths"]): r for r in graph.annotations.get("fold", [])}
    calls = graph.calls
    dtypes = [n.meta.dtype for n in graph.inputs if n.meta is not None and n.meta.is_tensor]
    ctx = _Ctx(graph, depth, unfold, calls, stats, folds, dtypes[0] if dtypes else "", [], max(1, max_levels))

    tree = Tree(_header(graph), guide_style="dim")
    for a in graph.attempts:
        if a.skipped:
            tree.add(Text(f"⤼ {_c(a.method)} {_c(a.reason())}", style="dim yellow"))
        elif not a.ok:
            tree.add(Text(f"✗ {_c(a.method)} failed: {_c(a.reason())}", style="yellow"))
    for note in graph.notes:
        tree.add(Text(f"ℹ {_c(note)}", style=_DIM))
    for n in graph.inputs:
        tree.add(_io_line("▶", n))
    _draw(_steps(tree, structure(graph, calls).steps, ctx, level=1, nesting=1))
    for n in graph.outputs:
        tree.add(_io_line("◀", n, graph))
    if graph.error:
        tree.add(Text(f"✗ the model raised: {one_line(graph.error)}", style=_ERR))
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


def tree_text(graph: Graph, *, width: int = 120, depth: int | None = None, unfold: bool = False) -> str:
    """The tree as plain text (``str(graph)``): no colour, ``width`` columns."""
    console = Console(width=width, color_system=None, record=True, file=io.StringIO())
    console.print(to_tree(graph, depth=depth, unfold=unfold, max_levels=levels_for(width)))
    return console.export_text().rstrip("\n")


class TreeView:
    """A renderable for ``rich.print`` / ``Console.print`` with tree options bound."""

    def __init__(self, graph: Graph, *, depth: int | None = None, unfold: bool = False) -> None:
        self.graph, self.depth, self.unfold = graph, depth, unfold

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield to_tree(self.graph, depth=self.depth, unfold=self.unfold, max_levels=levels_for(options.max_width))


def _header(graph: Graph) -> Text:
    stats = graph.annotations.get("stats", {})
    t = Text(_c(graph.name or module_class(graph, "") or "model"), style="bold")
    method = _c(graph.method or "?")
    t.append(f"  captured by {method}", style="green" if not graph.partial else _ERR)
    if graph.partial:
        t.append(" (partial)", style=_ERR)
    if stats:
        t.append(f"  ·  {format_count(stats.get('total_params', 0))} params", style=_DIM)
        t.append(f"  ·  {stats.get('total_ops', 0)} ops", style=_DIM)
    return t


def _io_line(arrow: str, n: Node, graph: Graph | None = None) -> Text:
    t = Text(f"{arrow} ", style=node_color(n))
    t.append(_c(n.target or n.name), style="bold")
    if "value" in n.attrs:
        t.append(f" = {_c(n.attrs['value'])}", style=_DIM)
    elif n.meta is not None:
        t.append(f"  {meta_text(n.meta)}", style=_SHAPE)
        if n.meta.is_tensor:
            t.append(f" {_c(n.meta.dtype)}", style=_DIM)
    return t


def _steps(parent: Tree, steps: list[Step], ctx: _Ctx, level: int, nesting: int) -> Work:
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
                yield from _call(parent, s, ctx, level, nesting, fold=steps[i : i + run])
                i += run
                continue
            yield from _call(parent, s, ctx, level, nesting)
        elif isinstance(s, Op):
            parent.add(_op_line(ctx.graph.node(s.node), ctx))
        else:
            join = steps[i + 1] if i + 1 < len(steps) else None
            yield from _parallel(parent, s, join, ctx, level, nesting)
        i += 1


def _fold_run(steps: list[Step], i: int, ctx: _Ctx) -> int:
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


def _boundary(block: Block, ctx: _Ctx) -> tuple[list[TensorMeta | None], list[TensorMeta | None]]:
    """Metadata of what a call reads from outside and what it hands back (its main result first)."""
    g = ctx.graph
    return [g.meta_of(r) for r in block.call.inputs], [g.meta_of(r) for r in block.call.outputs]


def _shapes(metas: Sequence[TensorMeta | None], limit: int = 2) -> str:
    tensors = [m for m in metas if m is None or m.is_tensor] or metas
    text = ", ".join(meta_text(m) for m in tensors[:limit])
    return text + (f", +{len(tensors) - limit}" if len(tensors) > limit else "")


def _call_label(call: Block, ctx: _Ctx, fold: list[Step] | None) -> Text:
    cls = module_class(ctx.graph, call.path)
    t = Text()
    if fold:
        last = fold[-1]
        assert isinstance(last, Block)
        label = next(r["label"] for p, r in ctx.folds.items() if p[0] == call.path)
        t.append(_c(_relative(label, ctx)), style=_MODULE)
        t.append(f" ×{len(fold)}", style="bold magenta")
    else:
        t.append(_c(_relative(call.path, ctx)), style=_MODULE)
    if cls:
        t.append(f" ({_c(cls)})", style=_DIM)
    total = ctx.calls.count(call.path)
    if total > 1:
        t.append(f" call {call.index + 1}/{total}", style="magenta")
    ins, outs = _boundary(call, ctx)
    if ins or outs:
        # a call that raised hands nothing back
        t.append(f"  {_shapes(ins)} → {_shapes(outs) or '✗'}", style=_SHAPE)
    params = ctx.stats.get(call.path, {}).get("params", 0)
    if params and call.index == 0:
        count = f"{len(fold)} × {format_count(params)}" if fold else format_count(params)
        t.append(f"  {count} params", style=_DIM)
    return t


def _relative(path: str, ctx: _Ctx) -> str:
    """A path relative to the call being drawn (``q`` inside ``blocks.0.attn``), so deep trees
    stay readable; the full path of any line is its ancestors' names joined."""
    base = ctx.base[-1] if ctx.base else ""
    return path[len(base) + 1 :] if base and path.startswith(base + ".") else path


def _single_op(call: Block) -> Op | None:
    return call.steps[0] if len(call.steps) == 1 and isinstance(call.steps[0], Op) else None


def _call(parent: Tree, call: Block, ctx: _Ctx, level: int, nesting: int,
          fold: list[Step] | None = None) -> Work:
    label = _call_label(call, ctx, fold)
    only = _single_op(call)
    if only is not None:
        node = ctx.graph.node(only.node)
        label.append(f"  · {_c(node_label(node))}", style=node_color(node))
        _mark(label, node)
        parent.add(label)
        return
    if (ctx.depth is not None and level >= ctx.depth) or nesting >= ctx.max_levels:
        label.append(f"  … {len(call.nodes)} ops", style=_DIM)
        branch = parent.add(label)
        if nesting >= ctx.max_levels and (ctx.depth is None or level < ctx.depth):
            assert isinstance(call.call, Call)  # a region is drawn by _region
            levels = max(c.depth for c in call.call.walk()) - call.depth
            branch.add(_hidden(len(call.nodes), levels, ctx))
        return
    branch = parent.add(label)
    ctx.base.append(call.path)
    yield _steps(branch, call.steps, ctx, level + 1, nesting + 1)
    ctx.base.pop()


def _region(parent: Tree, block: Block, ctx: _Ctx, level: int, nesting: int) -> Work:
    """A region of a call that ran inside a higher-order op: ``◇ no_grad``, ``◇ cond: true branch
    (taken)``, with what crosses its border, and its steps inside (module levels do not change)."""
    label = Text(f"◇ {_c(block.call.name)}", style="bold cyan")
    ins, outs = [ctx.graph.meta_of(r) for r in block.call.inputs], [ctx.graph.meta_of(r) for r in block.call.outputs]
    if ins or outs:
        label.append(f"  {_shapes(ins)} → {_shapes(outs) or '✗'}", style=_SHAPE)
    count = len(block.nodes)
    label.append(f"  · {count} op{'' if count == 1 else 's'}", style=_DIM)
    branch = parent.add(label)
    if nesting >= ctx.max_levels:
        branch.add(_hidden(len(block.nodes), 0, ctx))
        return
    yield _steps(branch, block.steps, ctx, level, nesting + 1)


def _hidden(ops: int, levels: int, ctx: _Ctx) -> Text:
    """The line that stands for what is nested too deep to draw."""
    what = f"{ops} ops" + (f" in {levels} more levels of modules" if levels else "")
    return Text(f"⋯ {what} not drawn: the tree stops at {ctx.max_levels} levels (a wider terminal "
                "shows more; the HTML report shows all)", style=_DIM)


def _op_line(node: Node, ctx: _Ctx) -> Text:
    t = Text(_c(node_label(node)), style=node_color(node))
    metas = [m for m in node.outputs]
    if metas:
        t.append(f"  → {_shapes(metas, limit=3)}", style=_SHAPE)
        m = metas[0]
        if m.is_tensor and ctx.main_dtype and m.dtype != ctx.main_dtype and _dtype_changed(node, ctx):
            t.append(f" {_c(m.dtype)}", style="yellow")
    _mark(t, node)
    return t


def _dtype_changed(node: Node, ctx: _Ctx) -> bool:
    """Show a dtype only where it changes: an op whose output dtype differs from its first input."""
    if not node.inputs:
        return True
    src = ctx.graph.meta_of(node.inputs[0])
    return src is None or src.dtype != (node.meta.dtype if node.meta else "")


def _mark(t: Text, node: Node) -> None:
    if node.attrs.get("data_dependent"):
        t.append("  ⚠ data-dependent", style="bold yellow")
    if node.error:
        t.append(f"  ✗ {one_line(node.error)}", style=_ERR)


def _is_simple(step: Step) -> bool:
    return isinstance(step, Op) or (isinstance(step, Block) and step.region is None and _single_op(step) is not None)


def _chain_text(steps: list[Step], ctx: _Ctx) -> Text:
    """``initial_conv (Conv2d) → relu → max_pool (MaxPool2d)  → [1, 16, 16, 16]``"""
    t = Text()
    for k, s in enumerate(steps):
        if k:
            t.append(" → ", style=_DIM)
        if isinstance(s, Block):
            t.append(_c(_relative(s.path, ctx)), style=_MODULE)
            cls = module_class(ctx.graph, s.path)
            if cls:
                t.append(f" ({_c(cls)})", style=_DIM)
        else:
            assert isinstance(s, Op)
            node = ctx.graph.node(s.node)
            t.append(_c(node_label(node)), style=node_color(node))
    last = ctx.graph.node(step_nodes(steps[-1])[-1]) if steps else None
    if last is not None and last.meta is not None:
        t.append(f"  → {meta_text(last.meta)}", style=_SHAPE)
    return t


def _parallel(parent: Tree, p: Parallel, join: Step | None, ctx: _Ctx, level: int, nesting: int) -> Work:
    join_name = ""
    if isinstance(join, Op):
        join_name = _c(node_label(ctx.graph.node(join.node)))
    elif isinstance(join, Block):
        join_name = _c(join.call.name if join.region is not None else _relative(join.path, ctx))
    if p.residual:
        label = Text("⤷ residual branch", style="bold blue")
        if join_name:
            label.append(f"  (input skips ahead to {join_name})", style=_DIM)
    else:
        label = Text(f"⑂ {len(p.branches)} parallel branches", style="bold blue")
        if join_name:
            label.append(f"  → join at {join_name}", style=_DIM)
    node = parent.add(label)
    if nesting >= ctx.max_levels:
        node.add(_hidden(len(step_nodes(p)), 0, ctx))
        return
    for k, branch in enumerate(p.branches, 1):
        if all(_is_simple(s) for s in branch) and len(branch) > 0:
            line = Text(f"{k}: ", style=_DIM) if len(p.branches) > 1 else Text()
            line.append_text(_chain_text(branch, ctx))
            node.add(line)
        elif len(p.branches) == 1:
            yield _steps(node, branch, ctx, level, nesting + 1)
        elif nesting + 1 >= ctx.max_levels:
            node.add(_hidden(sum(len(step_nodes(s)) for s in branch), 0, ctx))
        else:
            sub = node.add(Text(f"branch {k}", style=_DIM))
            yield _steps(sub, branch, ctx, level, nesting + 2)
