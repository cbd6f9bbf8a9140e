"""The comparison itself: :func:`diff` walks the module calls of both graphs and, inside each call
both make, aligns and classifies their ops.

Ops are first folded into the torch-level call they came from (export's ``attrs["torch_fn"] =
[call id, name]``; the eager tracer tags its ATen ops the same way), so ``F.linear`` meets
``aten.linear`` whether either side spelt it as one op or as ``t, view, mm, _unsafe_view``. The
torch-level calls are aligned by normalized name (:func:`~fxviz.graphdiff.align.align`); a matched
pair is ``decomposed`` when its ops differ, and its results are compared (``shape``, ``dtype``,
``symbolic_shape``); ops of one side only are ``only_in_a`` / ``only_in_b``, one difference per
source line, with a ``note`` when they are bookkeeping of one capture method. No torch.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from fxviz.calls import Stack
from fxviz.graphdiff.align import align
from fxviz.graphdiff.captures import assumption_differences, failure_differences
from fxviz.graphdiff.modules import call_count_differences, merged_calls, missing_call, module_table
from fxviz.graphdiff.parts import Difference, Row, Side
from fxviz.graphdiff.result import Diff, failed_attempt
from fxviz.ir import Graph, Node, TensorMeta
from fxviz.ops import ASSERTS, op_name


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
    ta, tb = a.calls, b.calls
    for d in [*failure_differences(a, b, labels), *assumption_differences(a, b, labels)]:
        dd.add(d)
    keys = merged_calls(ta, tb)
    # with one graph empty (its capture failed) there is nothing to compare op by op: every call
    # of the other graph is only in it, and that is what the failure already says
    if failed_attempt(a) is None and failed_attempt(b) is None:
        dd.compare_io("input")
        counted, miscounted = call_count_differences(ta, tb, a, b, labels)
        for d in counted:
            dd.add(d)
        for k in keys:
            ca, cb = ta.by_stack.get(k), tb.by_stack.get(k)
            if ca is not None and cb is not None:
                dd.compare_ops(k, [a.node(n) for n in ca.ops], [b.node(n) for n in cb.ops])
                continue
            missing = missing_call(k, ta, tb, a, b, labels, miscounted)
            if missing is not None:
                dd.add(missing)
        dd.compare_io("output")
        dd.emit_bindings()

    modules = module_table(dd.found, keys, ta, tb, a, b, dd.rows)
    seconds = {"align": time.perf_counter() - t0}
    for key, g in (("a", a), ("b", b)):
        if g.attempts:
            seconds[key] = sum(x.seconds for x in g.attempts)
    return Diff(a, b, labels, dd.found, modules, seconds)


# ---- torch-level calls -------------------------------------------------------------------------------


@dataclass(slots=True)
class _Call:
    """A torch-level call: the consecutive ops of one graph that came from it."""

    name: str
    nodes: list[Node]

    @property
    def last(self) -> Node:
        return self.nodes[-1]


def _torch_fn(node: Node) -> tuple[str, str] | None:
    """(call id, call name) of the torch-level call an op came from, when the capture recorded it."""
    fn = node.attrs.get("torch_fn")
    if isinstance(fn, list | tuple) and len(fn) == 2:
        return str(fn[0]), str(fn[1])
    return None


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


def _meta_text(m: TensorMeta | None) -> str:
    if m is None:
        return "?"
    return f"{m.shape_str()} {m.dtype}" if m.is_tensor else m.shape_str()


def _only_note(nodes: Sequence[Node]) -> str:
    """Why ops on one side only may be bookkeeping rather than computation."""
    names = [op_name(n.target) for n in nodes]
    if all(x in ASSERTS for x in names):
        return "assert"
    if all(n.attrs.get("returns_input") for n in nodes):
        return "returns input"
    if all(n.outputs and not any(m.is_tensor for m in n.outputs) and not n.attrs.get("data_dependent")
           for n in nodes):
        return "symbolic arithmetic"
    return ""


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


# ---- one comparison --------------------------------------------------------------------------------


class _Differ:
    """One comparison's state: the differences found so far, the rows of each module call, and the
    symbolic bindings seen."""

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
                f"{self.labels[1]}", Side.of(na, _meta_text(ma)), Side.of(nb, _meta_text(mb)),
            ))
            status = "shape"
        if ma.dtype != mb.dtype:
            self.add(Difference(
                "dtype", stack, f"{what}: {ma.dtype} in {self.labels[0]}, {mb.dtype} in {self.labels[1]}",
                Side.of(na, _meta_text(ma)), Side.of(nb, _meta_text(mb)),
            ))
            status = "dtype" if status == "same" else status
        return status

    def emit_bindings(self) -> None:
        for (da, db), (count, stack, na, nb, what) in self.bindings.items():
            self.add(Difference(
                "symbolic_shape", stack,
                f"{da} in {self.labels[0]} is {db} in {self.labels[1]} ({count} "
                f"value{'s' if count != 1 else ''}, first: {what})",
                Side.of(na, da), Side.of(nb, db),
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
                    Side.of([node]) if nb is None else None, Side.of([node]) if na is None else None,
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
            Side.of(x.nodes), Side.of(y.nodes),
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
            side = Side.of(nodes, _meta_text(nodes[-1].meta) if nodes[-1].outputs else "")
            d = self.add(Difference(
                kind, stack, f"only in {label}: {shown}" + (f" ({note})" if note else ""),
                side if which == "a" else None, side if which == "b" else None, note=note,
            ))
            names_t = tuple(n.name for n in nodes)
            rows.append(Row(names_t, (), kind, d.id) if which == "a" else Row((), names_t, kind, d.id))


__all__ = ["diff"]
