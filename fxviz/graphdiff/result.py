"""What a comparison finds: :class:`Diff`, both graphs and everything found between them, as plain
data (its parts are in :mod:`fxviz.graphdiff.parts`).

A Diff answers what a report asks (counts per kind, kinds and statuses in words with the diff's
labels, which side failed to capture, the runs of matched calls a report may fold), so renderers
draw and never analyse. It writes itself as JSON with both graphs in it and reads itself back:
``Diff.from_json(d.to_json())`` rebuilds ``d``. No torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from fxviz.calls import Stack
from fxviz.errors import GraphFormatError, TargetError
from fxviz.graphdiff.jsonread import read_field, read_graph, read_object
from fxviz.graphdiff.parts import KINDS, Difference, ModuleDiff, Run, same_run
from fxviz.ir import Attempt, Graph, view

#: Version of the JSON a :class:`Diff` writes. 2: both graphs are in it (``a.graph``, ``b.graph``),
#: so that it reads back into a Diff; each module call counts its ``significant`` differences.
DIFF_SCHEMA_VERSION = 2
#: What parts the headline's count of significant differences from its count of informational ones.
HEADLINE_SEP = "  ·  "

# kinds and statuses as a report names them; {a} and {b} are the diff's labels
_WORDS = {
    "capture_failed": "capture failed", "assumption": "assumed about the inputs", "only_in_a": "only in {a}",
    "only_in_b": "only in {b}", "calls": "module call counts", "shape": "shape", "dtype": "dtype",
    "decomposed": "decomposed", "symbolic_shape": "symbolic shape", "matched": "matched", "differs": "differs",
    "same": "same",
}


def failed_attempt(g: Graph) -> Attempt | None:
    """The attempt that explains an empty graph: its capture failed (``None`` when the graph has
    ops or an attempt worked)."""
    if g.ops or any(a.ok for a in g.attempts):
        return None
    return next((a for a in reversed(g.attempts) if not a.ok), None)


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

    @property
    def informational(self) -> list[Difference]:
        return [d for d in self.differences if d.informational]

    def summary(self, *, informational: bool | None = None) -> dict[str, int]:
        """Kind -> number of differences, in :data:`KINDS` order, kinds with none left out;
        ``informational=True`` (``False``) counts only the informational (significant) ones."""
        counts = {k: 0 for k in KINDS}
        for d in self.differences:
            if informational is None or d.informational == informational:
                counts[d.kind] = counts.get(d.kind, 0) + 1
        return {k: n for k, n in counts.items() if n}

    def headline(self) -> str:
        """The diff's answer in words, the sentence its terminal report opens with (after the
        model's name) and its page says: ``✗ 2 differences  ·  8 informational``."""
        n, notes = len(self.significant), len(self.informational)
        text = f"✗ {n} difference{'s' if n != 1 else ''}" if n else "✓ no significant differences"
        return f"{text}{HEADLINE_SEP}{notes} informational" if notes else text

    def by_id(self) -> dict[str, Difference]:
        return {d.id: d for d in self.differences}

    def status_counts(self) -> dict[str, int]:
        """Status -> number of module calls (the root model left out)."""
        out: dict[str, int] = {}
        for m in self.modules:
            if m.stack:
                out[m.status] = out.get(m.status, 0) + 1
        return out

    def describe(self, code: str) -> str:
        """A kind of difference or a status in words, with this diff's labels: ``only_in_a`` ->
        ``only in export``, ``symbolic_shape`` -> ``symbolic shape``."""
        return _WORDS.get(code, code).replace("{a}", self.labels[0]).replace("{b}", self.labels[1])

    def failure(self, side: str) -> Attempt | None:
        """The failed attempt that left graph ``side`` (``"a"`` or ``"b"``) empty, if its capture failed."""
        if side not in ("a", "b"):
            raise TargetError(f"side {side!r} is not 'a' or 'b'")
        return failed_attempt(self.a if side == "a" else self.b)

    @property
    def one_sided(self) -> bool:
        """One graph could not be captured: nothing was compared op by op, and every module call
        of the other graph is "only in" it without that being a difference of its own."""
        return self.failure("a") is not None or self.failure("b") is not None

    @property
    def root(self) -> ModuleDiff | None:
        """The entry of the model's own forward (the empty stack)."""
        return next((m for m in self.modules if not m.stack), None)

    def children(self) -> dict[Stack, list[ModuleDiff]]:
        """A call's stack -> the entries of the calls it makes, in report order."""
        out: dict[Stack, list[ModuleDiff]] = {}
        for m in self.modules:
            if m.stack:
                out.setdefault(m.stack[:-1], []).append(m)
        return out

    def runs(self) -> dict[Stack, Run]:
        """Every :class:`Run` of two calls or more, by the stack of its first call."""
        out: dict[Stack, Run] = {}
        for kids in self.children().values():
            i = 0
            while i < len(kids):
                j = i + 1
                while j < len(kids) and same_run(kids[i], kids[j]):
                    j += 1
                if j - i > 1:
                    out[kids[i].stack] = Run(kids[i:j])
                i = j
        return out

    # ---- JSON ------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain data: both graphs, the differences and the module table, and, for readers of the
        JSON (``jq .summary``), counts that :meth:`from_dict` does not read back."""
        def side(g: Graph, label: str, key: str) -> dict[str, Any]:
            d: dict[str, Any] = {"label": label, "name": g.name, "method": g.method, "ops": len(g.ops)}
            if key in self.seconds:
                d["seconds"] = round(self.seconds[key], 4)
            d["graph"] = g.to_dict()
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

    @classmethod
    def from_dict(cls, d: Any) -> Diff:
        """The diff :meth:`to_dict` wrote. Raises :class:`~fxviz.errors.GraphFormatError` naming
        the field that is malformed, or that names a node or a difference that is not there."""
        d = read_object(d, "the top level")
        schema = d.get("schema")
        if schema != DIFF_SCHEMA_VERSION:
            raise GraphFormatError(
                f"diff JSON has schema {schema!r}, this fxviz reads schema {DIFF_SCHEMA_VERSION}: "
                "compare the graphs again with this version"
            )
        graphs: list[Graph] = []
        labels: list[str] = []
        seconds: dict[str, float] = {}
        for key in ("a", "b"):
            s = read_object(read_field(d, key, dict, ""), key)
            labels.append(read_field(s, "label", str, key))
            graphs.append(read_graph(read_field(s, "graph", dict, key), f"{key}.graph"))
            if "seconds" in s:
                seconds[key] = float(read_field(s, "seconds", (int, float), key))
        seconds["align"] = float(read_field(d, "align_seconds", (int, float), "", 0.0))
        differences = [
            Difference.from_dict(x, f"differences[{i}]") for i, x in enumerate(read_field(d, "differences", list, ""))
        ]
        modules = [ModuleDiff.from_dict(x, f"modules[{i}]") for i, x in enumerate(read_field(d, "modules", list, ""))]
        _check_references(differences, modules, graphs[0], graphs[1])
        return cls(graphs[0], graphs[1], (labels[0], labels[1]), differences, modules, seconds)

    @classmethod
    def from_json(cls, text: str | bytes) -> Diff:
        """The diff :meth:`to_json` wrote (``Diff.from_json(d.to_json())`` rebuilds ``d``)."""
        try:
            data = json.loads(text)
        except ValueError as e:
            raise GraphFormatError(f"diff JSON is not JSON: {e}") from e
        return cls.from_dict(data)

    # ---- rendering: fxviz.render registers the renderers in fxviz.ir.VIEWS ---------------------

    def report(self, *, notes: bool = False) -> Any:
        """A rich renderable: summary table, then the module tree of differences."""
        return view("diff_report")(self, notes=notes)

    def __rich__(self) -> Any:
        return self.report()

    def to_html(self, path: str | None = None) -> str:
        """Both graphs drawn side by side, paired nodes linked and differences coloured, with the
        list of differences: one self-contained HTML page (written to ``path`` when given)."""
        return view("diff_html")(self, path)  # type: ignore[no-any-return]

    def _repr_html_(self) -> str:
        """The same page in a notebook cell, isolated in an iframe."""
        return view("diff_repr_html")(self)  # type: ignore[no-any-return]

    def __str__(self) -> str:
        return view("diff_text")(self)  # type: ignore[no-any-return]


def _check_references(differences: list[Difference], modules: list[ModuleDiff], a: Graph, b: Graph) -> None:
    """Every id a module call or a row names is a difference; every node a row names is in its graph."""
    ids: set[str] = set()
    for i, x in enumerate(differences):
        if x.id in ids:
            raise GraphFormatError(f"diff JSON: differences[{i}].id {x.id!r} is not unique")
        ids.add(x.id)
    for i, m in enumerate(modules):
        for did in m.differences:
            if did not in ids:
                raise GraphFormatError(
                    f"diff JSON: modules[{i}].differences names {did!r}, which is not one of the differences"
                )
        for k, r in enumerate(m.rows):
            if r.diff and r.diff not in ids:
                raise GraphFormatError(
                    f"diff JSON: modules[{i}].rows[{k}] names {r.diff!r}, which is not one of the differences"
                )
            for side, g, names in ((0, a, r.a), (1, b, r.b)):
                missing = next((n for n in names if n not in g), None)
                if missing is not None:
                    raise GraphFormatError(
                        f"diff JSON: modules[{i}].rows[{k}][{side}] names node {missing!r}, which graph "
                        f"{'ab'[side]} does not have"
                    )


__all__ = ["DIFF_SCHEMA_VERSION", "Diff", "failed_attempt"]
