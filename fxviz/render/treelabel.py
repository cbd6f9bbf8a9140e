"""Pieces of the terminal tree: text made safe for a terminal, shapes as text, a label that breaks
between its fields (never inside a shape) to fit a given width, and the one line that stands for a
call's plumbing ops. No torch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.text import Text

from fxviz.calls import Call
from fxviz.ir import Graph, Node, TensorMeta
from fxviz.passes.structure import Block, Op, Parallel, Step
from fxviz.render.view import bounded
from fxviz.text import clean

#: The style of an overlay's value at the end of a line.
VALUE_STYLE = "bold cyan"

#: Levels of nesting drawn when the width is not known; rich gives each level 4 columns.
MAX_LEVELS = 24
#: Below this many columns for a label, breaking it by hand helps nobody: rich wraps it.
_MIN_WRAP = 24


def levels_for(width: int) -> int:
    """How many levels of nesting fit in ``width`` columns with 30 left for the labels: past that,
    rich would squeeze labels to a few letters and then drop whole levels without a word."""
    return max(4, (width - 30) // 4)


def shown(text: object) -> str:
    """Text from the model or a file, safe for a terminal, on one line, and no longer than a label
    may be (a 100,000-character class name is cut; the JSON and the report's details keep it)."""
    return bounded(clean(str(text), newlines=False))


def meta_text(meta: TensorMeta | None) -> str:
    return shown(meta.shape_str()) if meta is not None else "?"


class Label:
    """One entry of the tree, built from pieces; it breaks only before a piece marked ``brk``
    (between fields, between the shapes of a list, before an arrow), never inside one."""

    __slots__ = ("pieces",)

    def __init__(self, text: str = "", style: str = "") -> None:
        self.pieces: list[tuple[str, str, bool]] = []
        if text:
            self.add(text, style)

    def add(self, text: str, style: str = "", *, brk: bool = False) -> Label:
        self.pieces.append((text, style, brk))
        return self

    def render(self, avail: int | None, value: str = "") -> Text:
        """The label as rich text for ``avail`` columns (``None``: one line, rich wraps it), with
        ``value`` right-aligned at the end of its last line."""
        t = Text()
        col = 0
        for text, style, brk in self.pieces:
            width = cell_len(text)
            if avail is not None and avail >= _MIN_WRAP and brk and col and col + width > avail:
                t.append("\n")
                text = "  " + text.lstrip()
                width = cell_len(text)
                col = 0
            t.append(text, style)
            col += width
        if value:
            gap = (avail - col - cell_len(value)) if avail is not None and avail >= _MIN_WRAP else 2
            if gap < 2:
                t.append("\n")
                gap = max(2, (avail or 0) - cell_len(value))
            t.append(" " * gap + value, VALUE_STYLE)
        return t


#: The colour of the recompute phase (the ``phase`` overlay's).
RECOMPUTE_STYLE = "#f28e2b"


def recompute_mark(node: Node, long: bool) -> tuple[str, str]:
    """The mark of an op ``torch.utils.checkpoint`` ran again in the backward (phase
    ``recompute``), beside its name: `` ↻`` in a chain of ops, spelled out on its own line, where
    ``attrs["stopped"]`` says torch's early stop ended the recomputation during this op's save."""
    if node.phase != "recompute":
        return "", ""
    if not long:
        return " ↻", RECOMPUTE_STYLE
    return ("  ↻ recomputed, early stop here" if node.attrs.get("stopped") else "  ↻ recomputed"), RECOMPUTE_STYLE


def shape_pieces(label: Label, metas: Sequence[TensorMeta | None], style: str, limit: int = 2,
                  prefix: str = "", brk: bool = False, places: Sequence[str] = ()) -> None:
    """``[1, 7, 32], [1, 2, 7, 16], +3``: each shape a piece, so a line breaks between shapes;
    ``prefix`` (``" → "``) goes with the first shape, and a break before it is allowed with ``brk``.
    ``places``: each value's placement on its device mesh where it is a DTensor (``[2, 16, 64] S(1)``)."""
    pairs = list(zip(metas, (*places, *[""] * (len(metas) - len(places))), strict=True))
    tensors = [(m, p) for m, p in pairs if m is None or m.is_tensor] or pairs
    items = [meta_text(m) + (f" {p}" if p else "") for m, p in tensors[:limit]]
    if len(tensors) > limit:
        items.append(f"+{len(tensors) - limit}")
    for k, item in enumerate(items):
        text = (prefix if k == 0 else " ") + item + ("," if k < len(items) - 1 else "")
        label.add(text, style, brk=k > 0 or brk)


@dataclass(eq=False)
class Plumbing:
    """The line that stands for a call's plumbing ops."""

    names: list[str]


def no_outputs(graph: Graph, call: Block, last: bool) -> str:
    """What a module call that hands no value on returns, in the tree: ``✗`` where the partial
    graph's failure (a node's error, or its ``failure`` annotation) is in it or a module under it,
    and it is the ``last`` call of its module;
    ``unread`` where it returned and nothing read its result (a pipeline stage's shape inference
    reads only its output's shape, as metadata)."""
    if graph.error is None or not last:
        return " → unread"
    prefix = f"{call.path}." if call.path else ""
    failed = [n.module for n in graph.nodes if n.error is not None]  # a graph saved without the annotation
    where = (graph.annotations.get("failure") or {}).get("module")
    raised = any(f"{m}.".startswith(prefix) for m in [*failed, *([where] if isinstance(where, str) else [])])
    return " → ✗" if raised else " → unread"


def fold_plumbing(steps: list[Step], call: Call, plumbing: Mapping[str, str]) -> list[Step | Plumbing]:
    """``steps`` of ``call`` with its plumbing ops (two or more) taken out of the series and out of
    parallel branches, and one :class:`Plumbing` line where the first of them stood. A parallel
    group left with one branch becomes a series again; one left with none goes."""
    mine = [x for x in call.ops if x in plumbing]
    if len(mine) < 2:
        return list(steps)
    hidden = set(mine)
    out: list[Step | Plumbing] = []
    placed = False
    for s in steps:
        kept = without(s, hidden)
        if not placed and kept != [s]:
            out.append(Plumbing(mine))
            placed = True
        out.extend(kept)
    if not placed:
        out.insert(0, Plumbing(mine))
    return out


def without(step: Step, hidden: set[str]) -> list[Step]:
    """``step`` without the ops in ``hidden``: ``[step]`` when none is inside it. Parallel groups
    nest at most :data:`fxviz.passes.structure.MAX_NESTING` deep, so this recursion is bounded."""
    if isinstance(step, Op):
        return [] if step.node in hidden else [step]
    if isinstance(step, Block):
        return [step]
    branches = []
    changed = False
    for b in step.branches:
        kept = [x for s in b for x in without(s, hidden)]
        changed = changed or len(kept) != len(b) or any(x is not y for x, y in zip(kept, b, strict=False))
        if kept:
            branches.append(kept)
    if not changed:
        return [step]
    if not branches:
        return []
    if len(branches) == 1 and not step.residual:
        return branches[0]
    return [Parallel(branches, residual=step.residual)]


__all__ = ["MAX_LEVELS", "VALUE_STYLE", "Label", "Plumbing", "fold_plumbing", "levels_for", "meta_text", "shape_pieces",
           "shown", "without"]
