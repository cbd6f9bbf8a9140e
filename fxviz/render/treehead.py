"""The terminal tree's context and the lines outside its steps: the header, the model's inputs and
outputs, and the overlay's values of nodes and calls (:mod:`fxviz.render.tree` draws the steps)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.tree import Tree

from fxviz.calls import Call, CallTree
from fxviz.ir import Graph, Node, module_class
from fxviz.passes.overlays import reduce_values
from fxviz.render.overlays import format_value
from fxviz.render.treelabel import VALUE_STYLE, meta_text
from fxviz.render.treelabel import Label as _Label
from fxviz.render.treelabel import shown as _c
from fxviz.render.view import captured_by, counted, format_count, node_color, node_placement, value_boxes

DIM = "dim"
SHAPE = "cyan"
MODULE = "bold"
ERR = "bold red"
VALUE = VALUE_STYLE


@dataclass
class Ctx:
    graph: Graph
    depth: int | None
    unfold: bool
    calls: CallTree
    stats: dict[str, Any]
    folds: dict[tuple[str, ...], dict[str, Any]]
    main_dtype: str
    max_levels: int
    width: int | None
    plumbing: dict[str, str]  # node -> category, of the plumbing folded into one line per call
    overlay: dict[str, Any] | None
    unseen: dict[str, str]  # Call.id -> why a module call's ops are not in the graph
    base: list[str] = field(default_factory=list)  # paths of the calls being drawn, innermost last
    #: op -> the parameters whose value it makes (FSDP2's unsharded parameters, views of its all-gather)
    becomes: dict[str, list[str]] = field(default_factory=dict)

    def avail(self, nesting: int) -> int | None:
        """Columns left for a label ``nesting`` levels below the root."""
        return None if self.width is None else self.width - 4 * nesting

    def add(self, parent: Tree, label: _Label, nesting: int, value: Any = None) -> Tree:
        # on a log scale (parameters, FLOPs, bytes) a zero says nothing a blank does not; on a
        # linear one it may be the news (0% of a module compiled)
        shown = "" if self.overlay is None or value is None or (value == 0 and self.overlay.get("scale") == "log") \
            else format_value(self.overlay, value)
        return parent.add(label.render(self.avail(nesting), _c(shown)))


def header(graph: Graph, ctx: Ctx) -> _Label:
    stats = graph.annotations.get("stats", {})
    t = _Label(_c(graph.name or module_class(graph, "") or "model"), "bold")
    t.add(f"  {_c(captured_by(graph.method))}", "green" if not graph.partial else ERR, brk=True)
    if graph.partial:
        t.add(" (partial)", ERR)
    if stats:
        t.add(f"  ·  {format_count(stats.get('total_params', 0))} params", DIM, brk=True)
        t.add(f"  ·  {counted(stats.get('total_ops', 0), 'op')}", DIM, brk=True)
    if ctx.overlay is not None:
        t.add(f"  ·  {_c(ctx.overlay.get('label', ''))}", VALUE, brk=True)
    return t


def io_values(tree: Tree, graph: Graph, kind: str, ctx: Ctx) -> None:
    """The model's inputs or outputs: one line each, and one line per container of three or more
    (``cache``: 96 tensors of a 48-layer cache are one line, as in the report)."""
    arrow = "▶" if kind == "input" else "◀"
    boxes = {names[0]: (container, names) for (k, container), names in value_boxes(graph).items() if k == kind}
    grouped = {n for _, names in boxes.values() for n in names}
    for n in (x for x in graph.nodes if x.kind == kind):
        if n.name in boxes:
            container, names = boxes[n.name]
            metas = [graph.node(x).meta for x in names]
            t = _Label(f"{arrow} ", node_color(n)).add(_c(container), "bold")
            t.add(f"  {len(names)} {kind}s", DIM, brk=True)
            counts: dict[str, int] = {}
            for m in metas:
                key = f"{meta_text(m)} {_c(m.dtype)}" if m is not None and m.is_tensor else meta_text(m)
                counts[key] = counts.get(key, 0) + 1
            for k, (key, count) in enumerate(list(counts.items())[:3]):
                label = key + (f" ×{count}" if count > 1 else "")
                t.add(("  " if k == 0 else ", ") + label, SHAPE, brk=True)
            if len(counts) > 3:
                t.add(f", +{len(counts) - 3} more", SHAPE, brk=True)
            ctx.add(tree, t, 1)
        elif n.name not in grouped:
            ctx.add(tree, io_line(arrow, n), 1, node_value(n.name, ctx))


def io_line(arrow: str, n: Node) -> _Label:
    t = _Label(f"{arrow} ", node_color(n)).add(_c(n.target or n.name), "bold")
    if "value" in n.attrs:
        t.add(f" = {_c(n.attrs['value'])}", DIM, brk=True)
    elif n.meta is not None:
        t.add(f"  {meta_text(n.meta)}", SHAPE, brk=True)
        t.add(f" {node_placement(n)}" if node_placement(n) else "", SHAPE)  # a DTensor: its placement on the mesh
        if n.meta.is_tensor:
            t.add(f" {_c(n.meta.dtype)}", DIM)
    return t


def node_value(name: str, ctx: Ctx) -> Any:
    return None if ctx.overlay is None else (ctx.overlay.get("nodes") or {}).get(name)


def call_value(calls: Sequence[Call], ctx: Ctx) -> Any:
    """A call's value: its own, or made from the nodes inside it; a folded run's, from its calls'."""
    spec = ctx.overlay
    if spec is None:
        return None
    modules, nodes = spec.get("modules") or {}, spec.get("nodes") or {}
    values = []
    for c in calls:
        if c.id in modules:
            values.append(modules[c.id])
        else:
            values.append(reduce_values(spec, (nodes.get(x) for x in [*c.nodes, *c.state])))
    return values[0] if len(values) == 1 else reduce_values(spec, values)
