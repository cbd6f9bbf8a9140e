"""The parts of a :class:`~fxviz.graphdiff.result.Diff`, each with its JSON: a classified
:class:`Difference` (placed at a module call, with each graph's part as a :class:`Side`), and per
module call a :class:`ModuleDiff` (its status, its ops aligned row by row as :class:`Row` s);
:class:`Run` groups consecutive matched calls a report may show as one line. No torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fxviz.calls import Stack
from fxviz.errors import GraphFormatError
from fxviz.graphdiff.jsonread import (
    bad,
    read_count,
    read_field,
    read_names,
    read_object,
    read_source,
    read_stack,
)
from fxviz.ir import Node, SourceLoc
from fxviz.ops import op_name

#: Every kind of difference, most serious first (the order of the report's summary).
KINDS: tuple[str, ...] = (
    "capture_failed", "assumption", "only_in_a", "only_in_b", "calls", "shape", "dtype", "decomposed",
    "symbolic_shape",
)
#: Kinds that say the two graphs spell the same computation differently.
INFORMATIONAL_KINDS = frozenset({"decomposed", "symbolic_shape"})
#: Notes on ``only_in`` entries that are bookkeeping of one capture method, not computation.
INFORMATIONAL_NOTES = frozenset({"assert", "returns input", "symbolic arithmetic"})
#: Statuses of a module call, and of a row of ops.
STATUSES = frozenset({"matched", "differs", "only_in_a", "only_in_b"})
ROW_STATUSES = frozenset({"same", "only_in_a", "only_in_b", "shape", "dtype", "decomposed"})


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

    @classmethod
    def of(cls, nodes: Sequence[Node], meta: str = "") -> Side:
        """The part ``nodes`` play: their names and op names, and the first source line among them."""
        source = next((n.source for n in nodes if n.source is not None), None)
        return cls(tuple(n.name for n in nodes), tuple(op_name(n.target) for n in nodes), meta, source)

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Side:
        d = read_object(d, where)
        return cls(
            read_names(d.get("nodes"), f"{where}.nodes"), read_names(d.get("ops"), f"{where}.ops"),
            read_field(d, "meta", str, where, ""), read_source(d.get("source"), f"{where}.source"),
        )

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
        # module, call, informational and source are derived: written for readers of the JSON,
        # not read back
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

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Difference:
        d = read_object(d, where)
        kind = read_field(d, "kind", str, where)
        if kind not in KINDS:
            raise GraphFormatError(f"diff JSON: {where}.kind is {kind!r}, not one of {', '.join(KINDS)}")
        a, b = (Side.from_dict(d[k], f"{where}.{k}") if d.get(k) is not None else None for k in ("a", "b"))
        return cls(
            kind, read_stack(d.get("stack"), f"{where}.stack"), read_field(d, "message", str, where), a, b,
            read_field(d, "note", str, where, ""), read_field(d, "detail", str, where, ""),
            read_field(d, "id", str, where),
        )


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

    @classmethod
    def from_json(cls, v: Any, where: str) -> Row:
        if not (isinstance(v, list) and len(v) == 4 and isinstance(v[0], list) and isinstance(v[1], list)
                and v[2] in ROW_STATUSES and isinstance(v[3], str)):
            raise bad(where, "[nodes of a, nodes of b, status, difference id] with a status in "
                      + ", ".join(sorted(ROW_STATUSES)), v)
        return cls(read_names(v[0], f"{where}[0]"), read_names(v[1], f"{where}[1]"), v[2], v[3])


@dataclass(slots=True)
class ModuleDiff:
    """One module call of either graph and how it fared.

    ``status``: ``"matched"`` (nothing but informational differences inside, children included),
    ``"differs"``, ``"only_in_a"`` or ``"only_in_b"``. ``rows`` align the call's own ops (not its
    children's); ``differences`` are the ids of the differences placed at this call; ``significant``
    and ``notes`` count the significant and the informational differences in this call and its
    children (a call only in one graph can hold significant differences and still not "differ").
    """

    stack: Stack
    cls: str
    status: str
    ops_a: int = 0
    ops_b: int = 0
    rows: list[Row] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    notes: int = 0
    significant: int = 0

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
            "notes": self.notes, "significant": self.significant, "differences": self.differences,
            "rows": [r.to_json() for r in self.rows],
        }

    @classmethod
    def from_dict(cls, d: Any, where: str) -> ModuleDiff:
        d = read_object(d, where)
        status = read_field(d, "status", str, where)
        if status not in STATUSES:
            raise GraphFormatError(
                f"diff JSON: {where}.status is {status!r}, not one of {', '.join(sorted(STATUSES))}"
            )
        return cls(
            read_stack(d.get("stack"), f"{where}.stack"), read_field(d, "cls", str, where), status,
            read_count(d, "ops_a", where), read_count(d, "ops_b", where),
            [Row.from_json(r, f"{where}.rows[{k}]") for k, r in enumerate(read_field(d, "rows", list, where))],
            list(read_names(d.get("differences"), f"{where}.differences")),
            read_count(d, "notes", where), read_count(d, "significant", where),
        )


@dataclass(slots=True)
class Run:
    """Consecutive sibling calls that all matched, of one class, each the first call of a numbered
    module (``h.0`` … ``h.11``): a report may show them as one line, ``h.0-11 ×12``."""

    calls: list[ModuleDiff]

    @property
    def label(self) -> str:
        """``h.0-11``: the first call's path and the last one's number."""
        return f"{self.calls[0].path}-{self.calls[-1].path.rpartition('.')[2]}"

    @property
    def notes(self) -> int:
        return sum(m.notes for m in self.calls)


def same_run(first: ModuleDiff, m: ModuleDiff) -> bool:
    """Does ``m`` continue the run that starts at its sibling ``first``?"""
    return (
        first.status == m.status == "matched" and first.cls == m.cls and first.call == m.call == 0
        and first.path.rpartition(".")[2].isdigit() and m.path.rpartition(".")[2].isdigit()
    )


__all__ = [
    "INFORMATIONAL_KINDS", "INFORMATIONAL_NOTES", "KINDS", "ROW_STATUSES", "STATUSES", "Difference", "ModuleDiff",
    "Row", "Run", "Side", "same_run",
]
