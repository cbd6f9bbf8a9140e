"""Graph breaks as the map shows them: one group per cause and user line, with its category, the
eager op it points at and how often the forward passed it. Reads the break records of
:mod:`fxviz.analyze.compilemap.record`."""

from __future__ import annotations

import re
from collections.abc import Sequence

from fxviz.analyze.compilemap.overlay import EAGER
from fxviz.analyze.compilemap.record import BreakRecord
from fxviz.analyze.compilemap.result import BreakGroup, Frame
from fxviz.calls import CallTree
from fxviz.ir import Graph

_LINK = re.compile(r"please visit: (https://\S+)")


def category(gb_type: str, reason: str) -> str:
    """The break's category, from Dynamo's break type and its explanation."""
    t = gb_type.lower()
    m = re.search(r"Explanation: ([^\n]*)", reason)
    said = f"{t} {m.group(1).lower() if m else ''}"
    if "item()" in t or "_local_scalar_dense" in said or "tolist" in t:
        return "item"
    if "data-dependent" in t or "data dependent" in t or "jump with tensorvariable" in reason.lower():
        return "branch"
    if "graph break in loop" in t or ("skip" in t and "frame" in t):
        return "skip"
    if "`print`" in said or "logging" in t or "logger" in t:
        return "print"
    if "subclass" in said or "__torch_function__" in said or "__torch_dispatch__" in said:
        return "subclass"
    if any(w in said for w in ("builtin", "unsupported", "skipped", "c/c++", "extension", "call", "function")):
        return "unsupported"
    return "other"


def _frames(stack: Sequence[tuple[str, int, str, str]]) -> list[Frame]:
    return [Frame(f, line, func, code) for f, line, func, code in stack]


def group_breaks(breaks: Sequence[BreakRecord], graph: Graph, tree: CallTree, assigned: dict[str, str],
                 resumed: dict[tuple[str, int], int] | None = None) -> list[BreakGroup]:
    """One group per cause (break type) and user line, in order of first occurrence. ``count`` is
    how many times the first input set's forward passed the break: the data-dependent ops at the
    line that ran eagerly, or the runs of the function Dynamo resumed after it
    (``resumed[(func, line)]``), at least 1 (Dynamo traces a block's code once however often it
    runs, so its own log counts once)."""
    resumed = resumed or {}
    at_line: dict[tuple[str, int], list[str]] = {}
    for n in graph.ops:
        if n.source is not None:
            at_line.setdefault((n.source.file, n.source.line), []).append(n.name)
    data_dependent = {n.name for n in graph.ops if n.attrs.get("data_dependent")}
    groups: dict[tuple[str, str, int], BreakGroup] = {}
    for b in breaks:
        frames = _frames(b.stack)
        cat = category(b.gb_type, b.reason)
        at = 0 if cat == "skip" else -1  # a skipped function is the break's place, not the break inside it
        where = frames[at] if frames else None
        key = (b.gb_type, where.file if where else "", where.line if where else 0)
        if key in groups:
            continue
        names = at_line.get((where.file, where.line), []) if where else []
        eager_names = [n for n in names if assigned.get(n) == EAGER]
        node = next((n for n in eager_names if n in data_dependent), None) or next(iter(eager_names or names), None)
        link = _LINK.search(b.reason)
        detail = b.reason.split("\n  Developer debug context", 1)[0].strip()
        passes = sum(1 for n in eager_names if n in data_dependent)
        count = max(passes, resumed.get((where.func, where.line), 0) if where else 0, 1)
        groups[key] = BreakGroup(cat, _short_reason(b.gb_type, b.reason), detail, frames, count, node,
                                 tree.of(node).id if node is not None else None, b.input_set,
                                 link.group(1) if link else "", at)
    return list(groups.values())


def _short_reason(gb_type: str, reason: str) -> str:
    """Dynamo's break type, with the call it names when its explanation names one."""
    m = re.search(r"(?:builtin operator|builtin|function|method|call) `([^`]+)`", reason)
    name = m.group(1).rstrip(".") if m else ""
    return f"{gb_type} ({name})" if name and name not in gb_type else gb_type


__all__ = ["category", "group_breaks"]
