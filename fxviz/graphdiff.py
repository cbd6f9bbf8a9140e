"""Compare two captured graphs: where they agree, where they part, and why.

:func:`diff` aligns two :class:`~fxviz.ir.Graph` s in two steps and classifies what it finds:

1. **module calls**: the key of a call is its full ``stack`` (module path and call index at every
   level), so ``h.0.attn`` in the first call of ``h.0`` meets its counterpart in the other graph
   whatever ran before it;
2. **ops inside each call**, in execution order. Ops are first folded into the torch-level call
   they came from (export's ``attrs["torch_fn"] = [call id, name]``; the eager tracer tags its ATen
   ops the same way), so ``F.linear`` meets ``aten.linear`` whether either side spelt it as one op
   or as ``t, view, mm, _unsafe_view``. The calls are aligned by normalized name with a longest
   common subsequence whose ties are broken by the names themselves, never by which graph came
   first: ``diff(a, b)`` is ``diff(b, a)`` mirrored, by construction.

Kinds of difference (:data:`KINDS`): ``assumption`` (a condition on the inputs one capture took as
given, e.g. ``x.shape[0] > 2`` where the forward branches on a size), ``only_in_a`` / ``only_in_b`` (ops or whole module calls),
``calls`` (a module ran a different number of times), ``shape``, ``dtype``, ``capture_failed`` (one
graph could not be captured: the failure is placed on the other graph at the data-dependent node
behind it), and two informational kinds that do not mean the computations differ: ``decomposed``
(one torch call, different ATen ops) and ``symbolic_shape`` (``s0`` on one side, ``128`` on the
other). Ops that only one side records for bookkeeping (an assert export inserts, a call that hands
its input back) are ``only_in`` with a ``note`` and count as informational too.

Plain data in, plain data out: no torch here, so a diff of two saved JSON graphs runs anywhere.

    >>> d = diff(g, g)
    >>> bool(d), d.summary()
    (False, {})
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fxviz.ir import Attempt, Graph, ModuleCall, Node, SourceLoc, TensorMeta, module_class, view
from fxviz.ops import ASSERTS as _ASSERTS
from fxviz.ops import op_name

DIFF_SCHEMA_VERSION = 1

Stack = tuple[ModuleCall, ...]

#: Every kind of difference, most serious first (the order of the report's summary).
KINDS: tuple[str, ...] = (
    "capture_failed", "assumption", "only_in_a", "only_in_b", "calls", "shape", "dtype", "decomposed",
    "symbolic_shape",
)
#: Kinds that say the two graphs spell the same computation differently.
INFORMATIONAL_KINDS = frozenset({"decomposed", "symbolic_shape"})
#: Notes on ``only_in`` entries that are bookkeeping of one capture method, not computation.
INFORMATIONAL_NOTES = frozenset({"assert", "returns input", "symbolic arithmetic"})

_MAX_CELLS = 4_000_000  # past this an exact alignment of one call's ops costs seconds: use difflib


# ---- names ---------------------------------------------------------------------------------------


def _torch_fn(node: Node) -> tuple[str, str] | None:
    """(call id, call name) of the torch-level call an op came from, when the capture recorded it."""
    fn = node.attrs.get("torch_fn")
    if isinstance(fn, list | tuple) and len(fn) == 2:
        return str(fn[0]), str(fn[1])
    return None


# ---- the result ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Side:
    """One graph's part of a difference: the nodes involved, their short op names, a description
    of their metadata, and where in the user's code they came from."""

    nodes: tuple[str, ...] = ()
    ops: tuple[str, ...] = ()
    meta: str = ""
    source: SourceLoc | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"nodes": list(self.nodes), "ops": list(self.ops)}
        if self.meta:
            d["meta"] = self.meta
        if self.source is not None:
            d["source"] = self.source.to_dict()
        return d

    def mirrored_key(self) -> tuple[Any, ...]:
        return (self.nodes, self.ops, self.meta)


@dataclass(slots=True)
class Difference:
    """One classified difference, placed at a module call and, where known, a source line.

    ``a`` and ``b`` are the two graphs' parts (``None`` for the side that lacks it). ``note`` refines
    an ``only_in`` entry: ``"module call"``, ``"input"``, ``"output"``, or one of
    :data:`INFORMATIONAL_NOTES`. ``detail`` holds a long explanation (the exception of a failed
    capture). ``id`` is stable within one diff and is the anchor the HTML report links to.
    """

    kind: str
    stack: Stack
    message: str
    a: Side | None = None
    b: Side | None = None
    note: str = ""
    detail: str = ""
    id: str = ""

    @property
    def module(self) -> str:
        return self.stack[-1][0] if self.stack else ""

    @property
    def call(self) -> int:
        return self.stack[-1][1] if self.stack else 0

    @property
    def informational(self) -> bool:
        return self.kind in INFORMATIONAL_KINDS or self.note in INFORMATIONAL_NOTES

    @property
    def source(self) -> SourceLoc | None:
        for side in (self.a, self.b):
            if side is not None and side.source is not None:
                return side.source
        return None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id, "kind": self.kind, "module": self.module, "call": self.call,
            "stack": [[p, c] for p, c in self.stack], "message": self.message,
            "informational": self.informational,
        }
        if self.note:
            d["note"] = self.note
        if self.detail:
            d["detail"] = self.detail
        src = self.source
        if src is not None:
            d["source"] = src.to_dict()
        for name, side in (("a", self.a), ("b", self.b)):
            if side is not None:
                d[name] = side.to_dict()
        return d


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the side-by-side view of a module call: nodes of ``a`` against nodes of ``b``
    (either may be empty), ``status`` ``"same"`` or the kind of the difference ``diff`` names."""

    a: tuple[str, ...]
    b: tuple[str, ...]
    status: str = "same"
    diff: str = ""

    def to_json(self) -> list[Any]:
        return [list(self.a), list(self.b), self.status, self.diff]


@dataclass(slots=True)
class ModuleDiff:
    """One module call of either graph and how it fared.

    ``status``: ``"matched"`` (nothing but informational differences inside, children included),
    ``"differs"``, ``"only_in_a"`` or ``"only_in_b"``. ``rows`` align the call's own ops (not its
    children's); ``differences`` are the ids of the differences placed at this call.
    """

    stack: Stack
    cls: str
    status: str
    ops_a: int = 0
    ops_b: int = 0
    rows: list[Row] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    notes: int = 0  # informational differences in this call and its children

    @property
    def path(self) -> str:
        return self.stack[-1][0] if self.stack else ""

    @property
    def call(self) -> int:
        return self.stack[-1][1] if self.stack else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "module": self.path, "call": self.call, "stack": [[p, c] for p, c in self.stack],
            "cls": self.cls, "status": self.status, "ops_a": self.ops_a, "ops_b": self.ops_b,
            "notes": self.notes, "differences": self.differences,
            "rows": [r.to_json() for r in self.rows],
        }


@dataclass(slots=True)
class Diff:
    """The aligned comparison of graph ``a`` with graph ``b``.

    ``labels`` name the two sides in reports (``("export", "eager")``). ``modules`` lists every
    module call of either graph, parents before children, in execution order (the root model is
    the entry with the empty stack). ``seconds`` holds the capture time of each side (``"a"``,
    ``"b"``, when known) and the alignment's (``"align"``). True when there is any difference;
    :attr:`significant` leaves out the informational ones.
    """

    a: Graph
    b: Graph
    labels: tuple[str, str]
    differences: list[Difference] = field(default_factory=list)
    modules: list[ModuleDiff] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.differences)

    def __len__(self) -> int:
        return len(self.differences)

    @property
    def significant(self) -> list[Difference]:
        return [d for d in self.differences if not d.informational]

    def summary(self) -> dict[str, int]:
        """Kind -> number of differences, in :data:`KINDS` order, kinds with none left out."""
        counts = {k: 0 for k in KINDS}
        for d in self.differences:
            counts[d.kind] = counts.get(d.kind, 0) + 1
        return {k: n for k, n in counts.items() if n}

    def by_id(self) -> dict[str, Difference]:
        return {d.id: d for d in self.differences}

    def status_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for m in self.modules:
            if m.stack:
                out[m.status] = out.get(m.status, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        def side(g: Graph, label: str, key: str) -> dict[str, Any]:
            d: dict[str, Any] = {
                "label": label, "name": g.name, "method": g.method, "ops": len(g.ops),
                "attempts": [a.to_dict() for a in g.attempts],
            }
            if key in self.seconds:
                d["seconds"] = round(self.seconds[key], 4)
            return d

        return {
            "schema": DIFF_SCHEMA_VERSION,
            "a": side(self.a, self.labels[0], "a"),
            "b": side(self.b, self.labels[1], "b"),
            "align_seconds": round(self.seconds.get("align", 0.0), 4),
            "summary": self.summary(),
            "significant": len(self.significant),
            "modules_by_status": self.status_counts(),
            "differences": [d.to_dict() for d in self.differences],
            "modules": [m.to_dict() for m in self.modules],
        }

    def to_json(self, *, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    # ---- rendering: fxviz.render registers the renderers in fxviz.ir.VIEWS ---------------------

    def report(self, *, notes: bool = False) -> Any:
        """A rich renderable: summary table, then the module tree of differences."""
        return view("diff_report")(self, notes=notes)

    def __rich__(self) -> Any:
        return self.report()

    def to_html(self, path: str | None = None) -> str:
        """Both graphs side by side per module call, as one self-contained HTML page."""
        return view("diff_html")(self, path)  # type: ignore[no-any-return]

    def _repr_html_(self) -> str:
        return self.to_html()

    def __str__(self) -> str:
        return view("diff_text")(self)  # type: ignore[no-any-return]


# ---- alignment -----------------------------------------------------------------------------------


def align(xs: Sequence[str], ys: Sequence[str]) -> list[tuple[int, int]]:
    """Index pairs of a longest common subsequence of ``xs`` and ``ys``, in order.

    Symmetric: ``align(ys, xs)`` is the same pairs swapped. Equal prefixes and suffixes (most of a
    comparison of two captures of one model) are matched without the quadratic table; when the rest
    is beyond :data:`_MAX_CELLS` cells, difflib's heuristic matcher takes over.
    """
    n, m = len(xs), len(ys)
    lo = 0
    while lo < n and lo < m and xs[lo] == ys[lo]:
        lo += 1
    hi = 0
    while hi < n - lo and hi < m - lo and xs[n - 1 - hi] == ys[m - 1 - hi]:
        hi += 1
    pairs = [(i, i) for i in range(lo)]
    a, b = xs[lo : n - hi], ys[lo : m - hi]
    if a and b:
        if len(a) * len(b) > _MAX_CELLS:
            import difflib

            sm = difflib.SequenceMatcher(None, list(a), list(b), autojunk=False)
            for blk in sm.get_matching_blocks():
                pairs.extend((lo + blk.a + k, lo + blk.b + k) for k in range(blk.size))
        else:
            pairs.extend((lo + i, lo + j) for i, j in _lcs(a, b))
    pairs.extend((n - hi + k, m - hi + k) for k in range(hi))
    return pairs


def _lcs(a: Sequence[str], b: Sequence[str]) -> list[tuple[int, int]]:
    """Exact LCS; when skipping either element keeps the optimum, the smaller *name* is skipped,
    so the result does not depend on which sequence is ``a``."""
    n, m = len(a), len(b)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        row, below, ai = table[i], table[i + 1], a[i]
        for j in range(m - 1, -1, -1):
            if ai == b[j]:
                row[j] = below[j + 1] + 1
            else:
                r, d = row[j + 1], below[j]
                row[j] = r if r > d else d
    out: list[tuple[int, int]] = []
    i = j = 0
    while i < n and j < m:
        if a[i] == b[j]:
            out.append((i, j))
            i += 1
            j += 1
        elif table[i + 1][j] > table[i][j + 1] or (table[i + 1][j] == table[i][j + 1] and a[i] < b[j]):
            i += 1
        else:
            j += 1
    return out


@dataclass(slots=True)
class _Call:
    """A torch-level call: the consecutive ops of one graph that came from it."""

    name: str
    nodes: list[Node]

    @property
    def last(self) -> Node:
        return self.nodes[-1]


def _calls(ops: Iterable[Node]) -> list[_Call]:
    out: list[_Call] = []
    last_id: str | None = None
    for n in ops:
        fn = _torch_fn(n)
        if fn is not None and fn[0] == last_id and out:
            out[-1].nodes.append(n)
            continue
        last_id = fn[0] if fn is not None else None
        out.append(_Call(op_name(fn[1]) if fn is not None else op_name(n.target), [n]))
    return out


def _side(nodes: Sequence[Node], meta: str = "") -> Side:
    source = next((n.source for n in nodes if n.source is not None), None)
    return Side(tuple(n.name for n in nodes), tuple(op_name(n.target) for n in nodes), meta, source)


def _meta_text(m: TensorMeta | None) -> str:
    if m is None:
        return "?"
    return f"{m.shape_str()} {m.dtype}" if m.is_tensor else m.shape_str()


def _only_note(nodes: Sequence[Node]) -> str:
    """Why ops on one side only may be bookkeeping rather than computation."""
    names = [op_name(n.target) for n in nodes]
    if all(x in _ASSERTS for x in names):
        return "assert"
    if all(n.attrs.get("returns_input") for n in nodes):
        return "returns input"
    if all(n.outputs and not any(m.is_tensor for m in n.outputs) and not n.attrs.get("data_dependent")
           for n in nodes):
        return "symbolic arithmetic"
    return ""


def _first_line(text: str) -> str:
    stripped = text.strip()
    return stripped.splitlines()[0] if stripped else ""


class _Differ:
    """One comparison's state: the differences found so far and the symbolic bindings seen."""

    def __init__(self, a: Graph, b: Graph, labels: tuple[str, str]) -> None:
        self.a, self.b, self.labels = a, b, labels
        self.found: list[Difference] = []
        self.rows: dict[Stack, list[Row]] = {}
        # (dim in a, dim in b) -> (count, first place seen)
        self.bindings: dict[tuple[str, str], list[Any]] = {}

    def add(self, d: Difference) -> Difference:
        d.id = f"d{len(self.found)}"
        self.found.append(d)
        return d

    # ---- metadata -------------------------------------------------------------------------------

    def compare_metas(
        self, stack: Stack, na: Sequence[Node], nb: Sequence[Node], ma: TensorMeta | None,
        mb: TensorMeta | None, what: str,
    ) -> str:
        """Classify two values' metadata; returns the row status (``same``, ``shape``, ``dtype``)."""
        if ma is None or mb is None or not (ma.is_tensor and mb.is_tensor):
            return "same"
        status = "same"
        mismatch = len(ma.shape) != len(mb.shape)
        if not mismatch:
            for da, db in zip(ma.shape, mb.shape, strict=True):
                if da == db:
                    continue
                if isinstance(da, int) and isinstance(db, int):
                    mismatch = True
                    break
                entry = self.bindings.setdefault((str(da), str(db)), [0, stack, na, nb, what])
                entry[0] += 1
        if mismatch:
            self.add(Difference(
                "shape", stack, f"{what}: {ma.shape_str()} in {self.labels[0]}, {mb.shape_str()} in "
                f"{self.labels[1]}", _side(na, _meta_text(ma)), _side(nb, _meta_text(mb)),
            ))
            status = "shape"
        if ma.dtype != mb.dtype:
            self.add(Difference(
                "dtype", stack, f"{what}: {ma.dtype} in {self.labels[0]}, {mb.dtype} in {self.labels[1]}",
                _side(na, _meta_text(ma)), _side(nb, _meta_text(mb)),
            ))
            status = "dtype" if status == "same" else status
        return status

    def emit_bindings(self) -> None:
        for (da, db), (count, stack, na, nb, what) in self.bindings.items():
            self.add(Difference(
                "symbolic_shape", stack,
                f"{da} in {self.labels[0]} is {db} in {self.labels[1]} ({count} "
                f"value{'s' if count != 1 else ''}, first: {what})",
                _side(na, da), _side(nb, db),
            ))

    # ---- inputs and outputs -------------------------------------------------------------------

    def compare_io(self, kind: str) -> None:
        """Inputs and outputs are matched by name (argument path or output path)."""
        ga = {n.target or n.name: n for n in self.a.nodes if n.kind == kind}
        gb = {n.target or n.name: n for n in self.b.nodes if n.kind == kind}
        rows = self.rows.setdefault((), [])
        for name in [*ga, *(k for k in gb if k not in ga)]:
            na, nb = ga.get(name), gb.get(name)
            if na is None or nb is None:
                only = "only_in_a" if nb is None else "only_in_b"
                node = na if na is not None else nb
                assert node is not None
                label = self.labels[0] if nb is None else self.labels[1]
                d = self.add(Difference(
                    only, (), f"{kind} {name} only in {label}",
                    _side([node]) if nb is None else None, _side([node]) if na is None else None,
                    note=kind,
                ))
                rows.append(Row((na.name,) if na else (), (nb.name,) if nb else (), only, d.id))
                continue
            ma = na.meta if kind == "input" else self._read_meta(self.a, na)
            mb = nb.meta if kind == "input" else self._read_meta(self.b, nb)
            before = len(self.found)
            status = self.compare_metas((), [na], [nb], ma, mb, f"{kind} {name}")
            rows.append(Row((na.name,), (nb.name,), status, self.found[before].id if status != "same" else ""))

    @staticmethod
    def _read_meta(g: Graph, n: Node) -> TensorMeta | None:
        return g.meta_of(n.inputs[0]) if n.inputs else None

    # ---- ops of one module call ------------------------------------------------------------------

    def compare_ops(self, stack: Stack, ops_a: list[Node], ops_b: list[Node]) -> None:
        ca, cb = _calls(ops_a), _calls(ops_b)
        pairs = align([c.name for c in ca], [c.name for c in cb])
        rows = self.rows.setdefault(stack, [])
        i = j = 0
        for pi, pj in [*pairs, (len(ca), len(cb))]:
            self._unmatched(stack, ca[i:pi], "a", rows)
            self._unmatched(stack, cb[j:pj], "b", rows)
            if pi < len(ca):
                rows.append(self._matched(stack, ca[pi], cb[pj]))
            i, j = pi + 1, pj + 1

    def _matched(self, stack: Stack, x: _Call, y: _Call) -> Row:
        names_x = [op_name(n.target) for n in x.nodes]
        names_y = [op_name(n.target) for n in y.nodes]
        ra, rb = tuple(n.name for n in x.nodes), tuple(n.name for n in y.nodes)
        before = len(self.found)
        if names_x == names_y:
            status = "same"
            for nx, ny in zip(x.nodes, y.nodes, strict=True):
                for k, (mx, my) in enumerate(zip(nx.outputs, ny.outputs, strict=False)):
                    what = f"{op_name(nx.target)}" + (f" output {k}" if k else "")
                    s = self.compare_metas(stack, [nx], [ny], mx, my, what)
                    status = s if status == "same" else status
            return Row(ra, rb, status, self.found[before].id if status != "same" else "")
        d = self.add(Difference(
            "decomposed", stack,
            f"{x.name}: {', '.join(names_x)} in {self.labels[0]}, {', '.join(names_y)} in {self.labels[1]}",
            _side(x.nodes), _side(y.nodes),
        ))
        status = self.compare_metas(stack, [x.last], [y.last], x.last.meta, y.last.meta, f"{x.name} result")
        return Row(ra, rb, "decomposed" if status == "same" else status, d.id)

    def _unmatched(self, stack: Stack, calls: list[_Call], which: str, rows: list[Row]) -> None:
        """Ops of one side only: consecutive calls from one source line make one difference."""
        runs: list[list[Node]] = []
        last: tuple[str, int] | None = None
        for c in calls:
            src = c.nodes[0].source
            key = (src.file, src.line) if src is not None else None
            if runs and key == last and key is not None:
                runs[-1].extend(c.nodes)
            else:
                runs.append(list(c.nodes))
            last = key
        kind = "only_in_a" if which == "a" else "only_in_b"
        label = self.labels[0] if which == "a" else self.labels[1]
        for nodes in runs:
            names = [op_name(n.target) for n in nodes]
            note = _only_note(nodes)
            shown = ", ".join(_compress(names))
            side = _side(nodes, _meta_text(nodes[-1].meta) if nodes[-1].outputs else "")
            d = self.add(Difference(
                kind, stack, f"only in {label}: {shown}" + (f" ({note})" if note else ""),
                side if which == "a" else None, side if which == "b" else None, note=note,
            ))
            names_t = tuple(n.name for n in nodes)
            rows.append(Row(names_t, (), kind, d.id) if which == "a" else Row((), names_t, kind, d.id))


def _compress(names: list[str]) -> list[str]:
    """``unsqueeze, unsqueeze, unsqueeze`` -> ``unsqueeze ×3``."""
    out: list[str] = []
    k = 0
    while k < len(names):
        r = k
        while r + 1 < len(names) and names[r + 1] == names[k]:
            r += 1
        out.append(names[k] + (f" ×{r - k + 1}" if r > k else ""))
        k = r + 1
    return out


def _failed(g: Graph) -> Attempt | None:
    """The attempt that explains an empty graph: its capture failed."""
    if g.ops or any(a.ok for a in g.attempts):
        return None
    return next((a for a in reversed(g.attempts) if not a.ok), None)


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


def _stacks_with_prefixes(g: Graph) -> dict[Stack, list[Node]]:
    """Module call -> its own ops, for every call (including those with only children's ops), in
    order of first appearance."""
    out: dict[Stack, list[Node]] = {(): []}
    for n in g.ops:
        s = n.stack
        if s not in out:
            for k in range(1, len(s)):
                out.setdefault(s[:k], [])
            out[s] = []
        out[s].append(n)
    return out


def _merged_order(xs: list[Stack], ys: list[Stack]) -> list[Stack]:
    """Every key of ``xs`` and ``ys``; keys only in ``ys`` follow the key before them in ``ys``."""
    result = list(xs)
    pos = {k: i for i, k in enumerate(result)}
    extra: dict[Stack, list[Stack]] = {}
    prev: Stack | None = None
    for k in ys:
        if k not in pos:
            extra.setdefault(prev if prev is not None else (), []).append(k)
        else:
            prev = k
    if not extra:
        return result
    out: list[Stack] = []
    for k in result:
        out.append(k)
        out.extend(extra.pop(k, ()))
    for rest in extra.values():
        out.extend(rest)
    # parents before children: a child inserted after its parent's predecessor stays after it
    return out


def diff(a: Graph, b: Graph, *, labels: tuple[str, str] | None = None) -> Diff:
    """Align ``a`` with ``b`` per module call, then per op, and classify every difference.

    ``labels`` name the sides in messages and reports (default: each graph's method, or ``a``/``b``).

        >>> d = fxviz.diff(symbolic, eager, labels=("export", "eager"))
        >>> d.summary()
        {'only_in_a': 1, 'decomposed': 3}
        >>> print(d)   # the terminal report
    """
    t0 = time.perf_counter()
    if labels is None:
        la, lb = a.method or "a", b.method or "b"
        labels = (la, lb) if la != lb else (f"{la} (a)", f"{lb} (b)")
    dd = _Differ(a, b, labels)
    calls_a, calls_b = _stacks_with_prefixes(a), _stacks_with_prefixes(b)

    fa, fb = _failed(a), _failed(b)
    for failure, other, which in ((fa, b, "b"), (fb, a, "a")):
        if failure is None:
            continue
        node = _locate(failure, other)
        stack = node.stack if node is not None else ()
        side = _side([node]) if node is not None else None
        label = labels[0] if which == "b" else labels[1]
        where = f" at {node.source.short()} `{node.source.code}`" if node is not None and node.source else ""
        dd.add(Difference(
            "capture_failed", stack,
            f"{label} failed{where}: {failure.error_type}: {_first_line(failure.message)}",
            side if which == "a" else None, side if which == "b" else None,
            note=failure.method, detail=failure.message,
        ))

    # what one capture took as given about the inputs (a guard on a symbolic size in user code):
    # the graphs agree on these inputs, but the captured program only holds the path they take
    for g, which in ((a, "a"), (b, "b")):
        for assumption in g.assumptions:
            stack = _enclosing_call(assumption.source, a, b)
            side = Side(source=assumption.source)
            label = labels[0] if which == "a" else labels[1]
            dd.add(Difference(
                "assumption", stack,
                f"{label} assumed {assumption.expr}: inputs that break it take a path its graph does not hold",
                side if which == "a" else None, side if which == "b" else None,
            ))

    keys = _merged_order(list(calls_a), list(calls_b))
    one_side_only = fa is not None or fb is not None
    if not one_side_only:
        dd.compare_io("input")

    # module paths called a different number of times
    counts_a: dict[str, set[int]] = {}
    counts_b: dict[str, set[int]] = {}
    for k in calls_a:
        if k:
            counts_a.setdefault(k[-1][0], set()).add(k[-1][1])
    for k in calls_b:
        if k:
            counts_b.setdefault(k[-1][0], set()).add(k[-1][1])
    miscounted: set[str] = set()
    if not one_side_only:
        for path in [*counts_a, *(p for p in counts_b if p not in counts_a)]:
            na, nb = len(counts_a.get(path, ())), len(counts_b.get(path, ()))
            if na and nb and na != nb:
                miscounted.add(path)
                first_extra = min(na, nb)
                # the first call of the path (the earliest stack in sort order, the same for a and b)
                first = min(k for k in keys if k and k[-1] == (path, 0))
                stack = (*first[:-1], (path, first_extra))
                dd.add(Difference(
                    "calls", stack,
                    f"{path} ({module_class(a, path) or module_class(b, path)}) called {na}× in "
                    f"{labels[0]}, {nb}× in {labels[1]}",
                ))

    for k in keys:
        in_a, in_b = k in calls_a, k in calls_b
        if in_a and in_b:
            if not one_side_only:
                dd.compare_ops(k, calls_a[k], calls_b[k])
            continue
        if one_side_only or not k:
            continue
        parent = k[:-1]
        if (parent in calls_a) != (parent in calls_b) or k[-1][0] in miscounted:
            continue  # reported at the outermost call that is missing, or by its "calls" entry
        g, which = (a, "a") if in_a else (b, "b")
        inside = [n for n in g.ops if n.stack[: len(k)] == k]
        side = _side(inside, f"{len(inside)} ops")
        path = k[-1][0]
        cls = module_class(g, path)
        dd.add(Difference(
            "only_in_a" if in_a else "only_in_b", k,
            f"module call {path}{f' ({cls})' if cls else ''} only in {labels[0] if in_a else labels[1]}"
            f" ({len(inside)} ops)",
            side if in_a else None, side if not in_a else None, note="module call",
        ))

    if not one_side_only:
        dd.compare_io("output")
        dd.emit_bindings()

    modules = _module_table(dd, keys, calls_a, calls_b)
    seconds = {"align": time.perf_counter() - t0}
    for key, g in (("a", a), ("b", b)):
        if g.attempts:
            seconds[key] = sum(x.seconds for x in g.attempts)
    return Diff(a, b, labels, dd.found, modules, seconds)


def _module_table(
    dd: _Differ, keys: list[Stack], calls_a: dict[Stack, list[Node]], calls_b: dict[Stack, list[Node]]
) -> list[ModuleDiff]:
    """Status per module call: a significant difference at a call marks it and its ancestors."""
    own: dict[Stack, list[str]] = {}
    bad: set[Stack] = set()
    notes: dict[Stack, int] = {}
    for d in dd.found:
        own.setdefault(d.stack, []).append(d.id)
        for depth in range(len(d.stack) + 1):
            prefix = d.stack[:depth]
            if d.informational:
                notes[prefix] = notes.get(prefix, 0) + 1
            else:
                bad.add(prefix)
    out: list[ModuleDiff] = []
    for k in keys:
        in_a, in_b = k in calls_a, k in calls_b
        if in_a and in_b:
            status = "differs" if k in bad else "matched"
        else:
            status = "only_in_a" if in_a else "only_in_b"
        path = k[-1][0] if k else ""
        cls = module_class(dd.a, path) or module_class(dd.b, path) or (dd.a.name or dd.b.name if not k else "")
        out.append(ModuleDiff(
            k, cls, status, len(calls_a.get(k, ())), len(calls_b.get(k, ())), dd.rows.get(k, []),
            own.get(k, []), notes.get(k, 0),
        ))
    return out


__all__ = [
    "INFORMATIONAL_KINDS", "INFORMATIONAL_NOTES", "KINDS", "Diff", "Difference", "ModuleDiff", "Row",
    "Side", "align", "diff", "op_name",
]
