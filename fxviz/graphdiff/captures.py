"""Differences about the captures rather than their ops: a capture that failed, placed on the other
graph at the data-dependent node behind the failure, and what a capture assumed about the inputs
(a guard on a symbolic size in user code), placed at the module call that runs the guarded line.
No torch.
"""

from __future__ import annotations

from fxviz.calls import Stack
from fxviz.graphdiff.parts import Difference, Side
from fxviz.graphdiff.result import failed_attempt
from fxviz.ir import Attempt, Graph, Node, SourceLoc


def failure_differences(a: Graph, b: Graph, labels: tuple[str, str]) -> list[Difference]:
    """One ``capture_failed`` difference per graph whose capture failed, placed on the other graph
    at the node where the failing capture's data-dependent value left the graph (the root when
    there is none)."""
    out: list[Difference] = []
    for failure, other, which in ((failed_attempt(a), b, "b"), (failed_attempt(b), a, "a")):
        if failure is None:
            continue
        node = _locate(failure, other)
        stack = node.stack if node is not None else ()
        side = Side.of([node]) if node is not None else None
        label = labels[0] if which == "b" else labels[1]
        where = f" at {node.source.short()} `{node.source.code}`" if node is not None and node.source else ""
        out.append(Difference(
            "capture_failed", stack,
            f"{label} failed{where}: {failure.error_type}: {_first_line(failure.message)}",
            side if which == "a" else None, side if which == "b" else None,
            note=failure.method, detail=failure.message,
        ))
    return out


def assumption_differences(a: Graph, b: Graph, labels: tuple[str, str]) -> list[Difference]:
    """What each capture took as given about the inputs: the graphs agree on these inputs, but the
    captured program only holds the path they take."""
    out: list[Difference] = []
    for g, which in ((a, "a"), (b, "b")):
        for assumption in g.assumptions:
            stack = _enclosing_call(assumption.source, a, b)
            side = Side(source=assumption.source)
            label = labels[0] if which == "a" else labels[1]
            out.append(Difference(
                "assumption", stack,
                f"{label} assumed {assumption.expr}: inputs that break it take a path its graph does not hold",
                side if which == "a" else None, side if which == "b" else None,
            ))
    return out


def _first_line(text: str) -> str:
    stripped = text.strip()
    return stripped.splitlines()[0] if stripped else ""


def _enclosing_call(src: SourceLoc | None, *graphs: Graph) -> Stack:
    """The module call a source line runs in: that of the first op after it in the same function
    (a branch on a shape has no op of its own), else the root."""
    if src is None:
        return ()
    best: tuple[int, int] | None = None
    stack: Stack = ()
    for g in graphs:
        for n in g.ops:
            s = n.source
            if s is None or s.file != src.file or s.func != src.func or s.line < src.line:
                continue
            # the nearest line after the guard; on it, the shallowest call (the module whose
            # forward holds the line, not a child it calls there)
            key = (s.line, len(n.stack))
            if best is None or key < best:
                best, stack = key, n.stack
    return stack


def _locate(failure: Attempt, other: Graph) -> Node | None:
    """The node of ``other`` where the failed capture's data-dependent value left the graph: the
    ``.item()``/``bool()`` at the source line the exception names, else the first one."""
    exits = [n for n in other.ops if n.attrs.get("data_dependent")]
    src = failure.source
    if src is not None:
        for n in exits:
            if n.source is not None and n.source.line == src.line and n.source.file == src.file:
                return n
        for n in exits:  # the same file under another path (a copy, a symlink)
            if n.source is not None and n.source.line == src.line and n.source.short() == src.short():
                return n
    if exits:
        return exits[0]
    if src is not None:
        return next((n for n in other.ops if n.source is not None and n.source.line == src.line
                     and n.source.short() == src.short()), None)
    return None


__all__ = ["assumption_differences", "failure_differences"]
