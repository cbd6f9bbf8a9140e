"""Graph breaks as the map shows them: one group per cause and user line, with its category, the
eager op it points at and how often the forward passed it. Reads the break records of
:mod:`fxviz.analyze.compilemap.record`.

The category comes from the break's type (``gb_type``, the field Dynamo's ``Unsupported`` carries)
looked up in torch's own registry of break types (``torch/_dynamo/graph_break_registry.json``: a
stable id per type, ``GB0124``, with every name the type has had), then in :data:`BY_ID`: never from
words of the message. The break's place is the innermost frame of the user's own code; a break
inside library code (the standard library, anything installed, torch itself) keeps that library
frame as detail (:attr:`BreakGroup.library`).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from collections.abc import Sequence
from pathlib import Path

from fxviz.analyze.compilemap.frames import library_of, own_frames
from fxviz.analyze.compilemap.kinds import EAGER
from fxviz.analyze.compilemap.record import BreakRecord, Recording
from fxviz.analyze.compilemap.result import BreakGroup, Frame
from fxviz.calls import CallTree
from fxviz.ir import Graph

_LINK = re.compile(r"please visit: (https://\S+)")
#: The function Dynamo resumes in after a break at ``line`` of ``func``: ``torch_dynamo_resume_in_forward_at_27``.
RESUME = re.compile(r"torch_dynamo_resume_in_(.+)_at_(\d+)")
_CALLED = re.compile(r"(?:builtin operator|builtin|function|method|call) `([^`]+)`")

#: Break type ids of torch's registry -> fxviz category. A type not listed is ``other``.
BY_ID: dict[str, str] = {
    # a tensor's value read as a Python number
    "GB0124": "item", "GB0109": "item",
    # an op whose Python result is read from the data (torch.equal, is_nonzero): not its shape
    "GB0033": "value",
    # an op whose output shape depends on the data
    "GB0036": "shape", "GB0037": "shape", "GB0246": "shape",
    # Python control flow on a tensor's value
    "GB0170": "branch", "GB0035": "branch", "GB0034": "branch", "GB0360": "branch",
    # printing and logging
    "GB0291": "print", "GB0296": "print",
    # calls Dynamo cannot trace: C/C++ builtins and extensions, skipped or disabled functions, ops
    "GB0007": "unsupported", "GB0008": "unsupported", "GB0009": "unsupported", "GB0059": "unsupported",
    "GB0147": "unsupported", "GB0148": "unsupported", "GB0156": "unsupported", "GB0177": "unsupported",
    "GB0213": "unsupported", "GB0005": "unsupported", "GB9198": "unsupported", "GB0098": "unsupported",
    "GB0099": "unsupported", "GB0043": "unsupported", "GB0090": "unsupported", "GB0087": "unsupported",
    # tensor subclasses and __torch_function__
    "GB0000": "subclass", "GB0001": "subclass", "GB0026": "subclass", "GB0103": "subclass",
    "GB0163": "subclass", "GB0164": "subclass", "GB0227": "subclass",
    # Dynamo gave up on a whole frame and ran it eagerly
    "GB7000": "skip", "GB9741": "skip", "GB4297": "skip",
}
#: The op a "Data dependent operator" break (GB0033) names; those that capture_scalar_outputs traces.
_OPERATOR = re.compile(r"Operator `([^`]+)` has a non-Tensor output")
_SCALAR_READS = {"aten.item.default", "aten._local_scalar_dense.default"}
#: Builtins that are printing when Dynamo fails to trace them (GB0059, "Failed to trace builtin operator").
_PRINTING = {"print"}


@functools.cache
def registry() -> dict[str, str]:
    """Every break type name torch's registry knows (current and former) -> its id (``GB0124``);
    empty where this torch has no registry."""
    spec = importlib.util.find_spec("torch")
    roots = list(spec.submodule_search_locations or ()) if spec is not None else []
    out: dict[str, str] = {}
    for root in roots:
        path = Path(root) / "_dynamo" / "graph_break_registry.json"
        if path.is_file():
            for gb_id, entries in json.loads(path.read_text()).items():
                for entry in entries:
                    out.setdefault(str(entry.get("Gb_type", "")), gb_id)
    return out


def category(gb_type: str, reason: str) -> str:
    """The break's category: its type's id in torch's registry, looked up in :data:`BY_ID`
    (``print`` for a builtin ``print`` Dynamo failed to trace, as the message names the call; ``item``
    for a data-dependent operator that is ``.item()`` itself)."""
    gb_id = registry().get(gb_type, "")
    cat = BY_ID.get(gb_id, "other")
    if gb_id == "GB0059" and _called(reason) in _PRINTING:
        return "print"
    op = _OPERATOR.search(reason) if gb_id == "GB0033" else None
    if op is not None and op.group(1) in _SCALAR_READS:  # the op torch's hint sends to capture_scalar_outputs
        return "item"
    return cat


def _called(reason: str) -> str:
    """The call a break's explanation names (``print``, ``zlib.crc32``), or ``""``."""
    m = _CALLED.search(reason)
    return m.group(1).rstrip(".") if m else ""


def _frames(stack: Sequence[tuple[str, int, str, str]]) -> list[Frame]:
    return [Frame(f, line, func, code, library_of(f)) for f, line, func, code in stack]


def place(frames: Sequence[Frame], cat: str) -> tuple[int, int | None]:
    """Which frame is the break's place and which its library detail: the innermost frame of the
    user's code (the outermost for a skipped function: the function Dynamo ran eagerly, the first
    frame where the stack holds no user code), and, when the innermost frame is library code, the
    innermost library frame that is not Dynamo's own substitute (``torch/_dynamo/polyfills``)."""
    if not frames:
        return -1, None
    user = own_frames([f.file for f in frames])
    outer, innermost = (user[0], user[-1]) if user else (0, len(frames) - 1)
    at = outer if cat == "skip" else innermost
    if not frames[-1].library or at == len(frames) - 1:
        return at, None
    inner = [i for i in range(len(frames) - 1, at, -1) if frames[i].library]
    shown = next((i for i in inner if not frames[i].library.startswith("torch/_dynamo/")), inner[0])
    return at, shown


def group_breaks(breaks: Sequence[BreakRecord], graph: Graph, tree: CallTree, assigned: dict[str, str],
                 resumed: dict[tuple[str, int], int] | None = None, *, logged: bool = False,
                 ended: dict[tuple[str, int], int] | None = None) -> list[BreakGroup]:
    """One group per cause (break type) and user line, in order of first occurrence. ``count`` is
    how many times the first input set's forward passed the break. Each of these is a pass, and
    the count is the most any of them shows (at least 1: Dynamo traces a block's code once however
    often it runs, so its own log counts once):

    - the data-dependent ops at the line that ran eagerly;
    - the runs of the function Dynamo resumed after it (``resumed[(func, line)]``);
    - the runs of the graphs Dynamo ended at it (``ended[(file, line)]``, by their compile reason:
      a break under inlined calls ends one graph in each calling frame, so the most of any one
      frame's graphs), which counts a break whose resume function Dynamo ran eagerly;
    - the frame compiles of the first input set that logged it (the most at one depth of frames):
      a function compiled again on each call (a guard on its module argument) passed the break on
      each, though it made no graph to count; calls a compiled version accepted are not counted
      there (a lower bound: nothing in torch's record says how often a graphless frame ran).

    A ``skip`` (a frame Dynamo gave up on and ran eagerly) counts the runs of that frame, not the
    passes through the break inside it, which broke no graph when it ran: a skipped resume
    function ran once for each pass through the break it resumes after; another skipped function
    counts 1 (how often it ran eagerly is not recorded).

    With ``logged`` (the backward under compiled autograd, which the eager graph does not hold),
    ``count`` is how often Dynamo logged the break, as torch's ``counters["graph_break"]`` counts
    it (a hook breaks once in each frame Dynamo inlined it from)."""
    resumed, ended = resumed or {}, ended or {}
    at_line: dict[tuple[str, int], list[str]] = {}
    for n in graph.ops:
        if n.source is not None:
            at_line.setdefault((n.source.file, n.source.line), []).append(n.name)
    data_dependent = {n.name for n in graph.ops if n.attrs.get("data_dependent")}
    groups: dict[tuple[str, str, int], BreakGroup] = {}
    compiles: dict[tuple[str, str, int], dict[int, set[str]]] = {}  # key -> depth of frames -> compile ids
    # a frame whose compile failed (torch's compilation metrics) that a logged break already says was skipped
    told = {(f[0], f[2]) for b in breaks if not b.skipped and category(b.gb_type, b.reason) == "skip" for f in b.stack}
    # a break logged in a frame compile that then failed broke no graph: it is why torch ran the frame
    # eagerly, which the frame's own row says (a comprehension Dynamo cannot trace was listed twice)
    failed = {b.compile_id for b in breaks if b.skipped and b.compile_id and (b.stack[0][0], b.stack[0][2]) not in told}
    for b in breaks:
        if b.skipped and (b.stack[0][0], b.stack[0][2]) in told:
            continue
        if not b.skipped and b.compile_id in failed and category(b.gb_type, b.reason) != "skip":
            continue
        frames = _frames(b.stack)
        cat = "skip" if b.skipped else category(b.gb_type, b.reason)
        at, lib = place(frames, cat)
        where = frames[at] if frames else None
        key = (b.gb_type + " (skipped)" * b.skipped, where.file if where else "", where.line if where else 0)
        if not b.skipped and b.input_set == 0 and b.compile_id:
            compiles.setdefault(key, {}).setdefault(len(frames), set()).add(b.compile_id)
        if key in groups:
            groups[key].count += int(logged)
            continue
        names = at_line.get((where.file, where.line), []) if where else []
        eager_names = [n for n in names if assigned.get(n) == EAGER]
        node = next((n for n in eager_names if n in data_dependent), None) or next(iter(eager_names or names), None)
        link = _LINK.search(b.reason)
        detail = b.reason.split("\n  Developer debug context", 1)[0].strip()
        passes = sum(1 for n in eager_names if n in data_dependent)
        shown = (passes, resumed.get((where.func, where.line), 0), ended.get((where.file, where.line), 0)) \
            if where is not None and cat != "skip" else ()
        count = 1 if logged else max((*shown, 1))
        groups[key] = BreakGroup(cat, _short_reason(b.gb_type, b.reason), detail, frames, count, node,
                                 tree.of(node).id if node is not None else None, b.input_set,
                                 link.group(1) if link else "", at, lib, registry().get(b.gb_type, ""))
    if not logged:  # each frame compile that logged the break passed it at least once (a function
        # compiled again for each module it is called with, breaking each time, though no graph ran:
        # torch's counters["graph_break"]); a break under inlined calls is logged in each calling frame,
        # so the most at any one depth of frames
        for key, depths in compiles.items():
            groups[key].count = max(groups[key].count, *(len(ids) for ids in depths.values()))
    out = list(groups.values())
    if not logged:  # a skipped resume function ran once for each pass through the break before it
        passed = {(b.where.file, b.where.line): b.count for b in out if b.category != "skip" and b.where is not None}
        for g in out:
            m = RESUME.fullmatch(g.where.func) if g.category == "skip" and g.where is not None else None
            if m is not None and g.where is not None:
                g.count = passed.get((g.where.file, int(m.group(2))), g.count)
    return out


def ended_at(rec: Recording) -> dict[tuple[str, int], int]:
    """(file, line) of a break's place -> how often the first input set ran a graph Dynamo ended
    at it (by the graph's compile reason). A break under inlined calls ends a graph in each calling
    frame, each run once per pass: the most of any one depth of frames."""
    by_depth: dict[tuple[str, int, int], int] = {}
    for g, k in rec.runs:
        stack = rec.graphs[g].ended
        if k == 0 and rec.forward(g) and stack:
            frames = _frames(stack)
            where = frames[place(frames, "")[0]]
            key = (where.file, where.line, len(frames))
            by_depth[key] = by_depth.get(key, 0) + 1
    out: dict[tuple[str, int], int] = {}
    for (file, line, _), n in by_depth.items():
        out[(file, line)] = max(out.get((file, line), 0), n)
    return out


def _short_reason(gb_type: str, reason: str) -> str:
    """Dynamo's break type, with the call it names when its explanation names one."""
    name = _called(reason)
    return f"{gb_type} ({name})" if name and name not in gb_type else gb_type


__all__ = ["BY_ID", "RESUME", "category", "ended_at", "group_breaks", "library_of", "place", "registry"]
