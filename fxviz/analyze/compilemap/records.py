"""What a compiled run records, as :class:`~fxviz.analyze.compilemap.record.Recorder` keeps it:
each Dynamo graph (:class:`GraphRecord`, its ops :class:`OpRecord`), each graph break Dynamo logged
or frame it failed to compile (:class:`BreakRecord`), each guard that failed (:class:`GuardFailRecord`)
and the order graphs ran in (:class:`Recording`); and the readings of them that need no hook:
torch's compile id of a record (:func:`compile_id`), the guard failure behind each recompile
(:func:`recompile_fails`), a failed guard in words (:func:`in_words`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fxviz.analyze.compilemap.result import CompiledGraph, ShapeGuard, Symbol


def compile_id(value: Any = None) -> str:
    """torch's id of a frame's compile, ``frame/n`` (``n``: the function's compiles before it), as
    the structured trace, tlparse and the compilation metrics number it: ``value``'s, else the
    compile under way's; ``""`` where none."""
    if value is None:
        value = torch._guards.CompileContext.current_compile_id()
    return str(value).strip("[]") if value is not None else ""


@dataclass(slots=True)
class OpRecord:
    """One op of a Dynamo graph: its name (as :func:`fxviz.ops.op_name` spells it), module path
    (``""`` when Dynamo gave none) and the user's line that made it."""

    name: str
    module: str
    file: str
    line: int
    node: str = ""  # the fx node's name in the Dynamo graph (as torch's structured trace prints it)
    # what the call computes, where it is no tensor op of the model's (:func:`~.record.call_kind`):
    # "unpack" (a getitem taking one output of a call that returned several), "no tensor"
    kind: str = ""


@dataclass(slots=True)
class GraphRecord:
    id: str
    func: str
    file: str
    line: int  # its first op's line while the run lasts; then its function's first line (LimitWatch.name_graphs)
    input_set: int
    ops: list[OpRecord]
    compile_id: str = ""  # torch's id of the frame compile that made it (:func:`compile_id`)
    compile_s: float = 0.0
    runs: int = 0
    guards: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    symbols: list[Symbol] = field(default_factory=list)
    shape_guards: list[ShapeGuard] = field(default_factory=list)
    phase: str = "forward"  # "backward": compiled from a compiled autograd graph
    # where the graph ended at a graph break: the user's stack of Dynamo's compile reason
    # (``GraphCompileReason.user_stack``, what ``explain``'s ``break_reasons`` hold), the frame
    # the graph was traced from first; empty where the graph ran to its function's end
    ended: list[tuple[str, int, str, str]] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)  # frame local -> the user's input (shapes.user_names)
    torch_guard_count: int | None = None  # torch's guard_count of the frame compile (LimitWatch.name_graphs)
    torch_op_count: int | None = None  # torch's graph_op_count of the frame compile (LimitWatch.name_graphs)


@dataclass(slots=True)
class BreakRecord:
    gb_type: str
    reason: str
    stack: list[tuple[str, int, str, str]]
    input_set: int
    phase: str = "forward"
    skipped: bool = False  # a frame whose compile failed (torch's compilation metrics' fail_type): it ran eagerly
    compile_id: str = ""  # torch's id of the frame compile it was logged in (or, skipped, that failed)


@dataclass(slots=True)
class GuardFailRecord:
    """A guard of one compiled version of a function failed: Dynamo checks every version it holds
    (the most recently used first) and calls ``guard_fail_fn`` for each before it compiles again,
    so one recompile is several of these, all with the recompile's ``compile_id``; ``checked`` is
    the id of the version whose guard failed."""

    input_set: int
    func: str
    file: str
    line: int
    reason: str
    guard: str = ""  # Dynamo's own text of the failed guard
    input: str = ""
    dim: int | None = None
    advice: str = ""
    lines: frozenset[int] = frozenset()  # the lines of the failing function's code
    compile_id: str = ""
    checked: str = ""


@dataclass
class Recording:
    graphs: list[GraphRecord] = field(default_factory=list)
    runs: list[tuple[int, int]] = field(default_factory=list)  # (graph index, input set), in run order
    breaks: list[BreakRecord] = field(default_factory=list)
    guard_fails: list[GuardFailRecord] = field(default_factory=list)
    input_set: int = 0
    phase: str = "forward"  # "backward" while compiled autograd compiles and runs the backward

    def forward(self, g: int) -> bool:
        """Whether graph ``g`` (an index in :attr:`graphs`) is one of the forward's."""
        return self.graphs[g].phase == "forward"


def compiled_graph(g: GraphRecord) -> CompiledGraph:
    """A recorded Dynamo graph as the map keeps it."""
    return CompiledGraph(g.id, g.func, g.file, g.line, g.input_set, len(g.ops), g.runs, round(g.compile_s, 4),
                         sorted({o.module for o in g.ops if o.module}), list(g.guards), g.inputs, g.symbols,
                         g.shape_guards, g.torch_guard_count, g.compile_id, g.torch_op_count)


def recompile_fails(fails: Sequence[GuardFailRecord]) -> list[GuardFailRecord]:
    """The guard failure behind each recompile, in order: the first of the failures that share a
    compile id (the one torch records as the compile's ``recompile_reason``); where torch gave no
    compile id, the first of each function in each input set."""
    seen: set[object] = set()
    out = []
    for f in fails:
        key = f.compile_id or (f.input_set, f.func, f.file, f.line)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


_GUARD_WORDS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"tensor '(.+)' size mismatch at index (\d+)\. expected (\d+), actual (\d+)"),
     r"\1: size of dim \2 is \4, the graph was compiled for \3"),
    (re.compile(r"tensor '(.+)' stride mismatch at index (\d+)\. expected (\d+), actual (\d+)"),
     r"\1: stride of dim \2 is \4, the graph was compiled for \3"),
    (re.compile(r"tensor '(.+)' dtype mismatch\. expected (\S+), actual (\S+)"),
     r"\1: dtype is \3, the graph was compiled for \2"),
    (re.compile(r"tensor '(.+)' requires_grad mismatch\. expected requires_grad=(\d)"),
     r"\1: requires_grad changed (the graph was compiled for requires_grad=\2)"),
    (re.compile(r"^(\S+) == ([^\s#]+)\s+#\s*(.+?)\s+#\s.*$"),
     r"\1 is no longer \2, the value the graph was specialised on (\3)"),
    (re.compile(r"tensor '(.+)' rank mismatch\. expected (\d+), actual (\d+)"),
     r"\1: has \3 dims, the graph was compiled for \2"),
    # any other check with the code that installed it: ``not args   # return func(*args)  # file:173 in f``
    (re.compile(r"^(\S.*?)\s+#\s*(.+?)\s+#\s\S+:\d+ in \S+.*$"),
     r"\1 no longer holds (\2)"),
]


def in_words(reason: str) -> str:
    """A failed guard as a user reads it: ``x: size of dim 0 is 3, the graph was compiled for 2``
    for Dynamo's ``tensor 'x' size mismatch at index 0. expected 2, actual 3``; other guards as
    Dynamo words them."""
    for pattern, words in _GUARD_WORDS:
        if pattern.search(reason):
            return pattern.sub(words, reason)
    return reason


__all__ = ["BreakRecord", "GraphRecord", "GuardFailRecord", "OpRecord", "Recording", "compile_id", "compiled_graph",
           "in_words", "recompile_fails"]
