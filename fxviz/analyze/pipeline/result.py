"""What a pass pipeline run leaves: its stages and where the numbers first part. No torch.

A :class:`Pipeline` is plain data: each :class:`Stage` holds the fxviz :class:`~fxviz.ir.Graph`
of the program after that pass, what the pass changed against the stage before it, the
provenance of its new nodes, and (when the numbers were checked) how far its outputs are from
eager PyTorch. It renders and serialises without torch; the live ``ExportedProgram`` of each stage
stays on the stage (``stage.program``) for those who run it, and is left out of JSON.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from fxviz.ir import Graph, SourceLoc

#: How a node of a later stage is tied to a node of the stage before it: ``exact`` when torch
#: recorded it (``node.meta["from_node"]``) or the node kept its name, ``inferred`` when fxviz
#: matched it by its neighbours (a pass that built new nodes without meta).
EXACT, INFERRED = "exact", "inferred"


@dataclass
class StageError:
    """A pass that raised: its exception and the frame of the user's pass code that raised it."""

    type: str
    message: str
    frame: SourceLoc | None = None

    def __str__(self) -> str:
        where = f" at {self.frame.file}:{self.frame.line} in {self.frame.func}" if self.frame else ""
        return f"{self.type}: {self.message}{where}"


@dataclass
class OutputError:
    """One output of a stage against eager: the largest absolute and relative differences, and
    whether every element is within ``atol + rtol * |eager|`` (the tolerance of its dtype; ``None``
    in results saved before it was recorded)."""

    name: str
    dtype: str
    max_abs: float
    max_rel: float
    ok: bool
    atol: float | None = None
    rtol: float | None = None


@dataclass
class Numbers:
    """A stage's outputs against eager PyTorch (or why they were not compared: ``note``)."""

    outputs: list[OutputError] = field(default_factory=list)
    note: str = ""
    seconds: float = 0.0

    @property
    def checked(self) -> bool:
        return bool(self.outputs)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)

    @property
    def max_abs(self) -> float | None:
        return max((o.max_abs for o in self.outputs), default=None)

    @property
    def max_rel(self) -> float | None:
        return max((o.max_rel for o in self.outputs), default=None)


@dataclass
class Stage:
    """The program after one pass. ``index`` 0 is the start (``export``, or the program given).

    ``added``: nodes new in this stage that stand for nothing removed; ``replaced``: nodes new in
    this stage (or kept by name with another op) that stand for removed ones; ``removed``: nodes of
    the stage before that are gone, all of them (those that were replaced too). ``changes`` groups
    the same names by module call (:attr:`fxviz.calls.Call.id` of the stage they live in).
    ``links``: each new or replaced node -> the nodes of the stage before it that it comes from.
    ``base``: the stage it is compared with when that is not the one before it (``None``): stages
    may branch (AOT Autograd's forward and backward graphs both come from its joint graph).
    ``moved``: kept nodes the pass put elsewhere in the order (a collective or its wait moved past
    computation: Inductor's communication passes); ``notes``: what torch recorded about the
    stage's passes (the buckets a bucketing pass formed, a scheduler pass's own summary)."""

    index: int
    name: str
    graph: Graph
    seconds: float = 0.0
    kind: str = ""  # what the pass is: export, decompose, graph module, pass result, program
    ops_before: dict[str, int] = field(default_factory=dict)
    ops_after: dict[str, int] = field(default_factory=dict)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    changes: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    changed: bool = True
    error: StageError | None = None
    links: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    numbers: Numbers | None = None
    program: Any = field(default=None, repr=False, compare=False)  # the live ExportedProgram
    base: int | None = None
    moved: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.error is not None

    def origin(self, node: str) -> list[tuple[str, str]]:
        """The nodes of the stage before that ``node`` comes from; a kept node is its own origin."""
        if node in self.links:
            return self.links[node]
        return [(node, EXACT)] if any(n.name == node for n in self.graph.nodes) else []

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("graph", "program", "links", "error", "numbers")}
        out["graph"] = json.loads(self.graph.to_json())
        out["links"] = {k: [list(x) for x in v] for k, v in self.links.items()}
        out["error"] = None if self.error is None else {
            "type": self.error.type, "message": self.error.message,
            "frame": asdict(self.error.frame) if self.error.frame else None}
        out["numbers"] = None if self.numbers is None else {
            "note": self.numbers.note, "seconds": self.numbers.seconds, "ok": self.numbers.ok,
            "outputs": [asdict(o) for o in self.numbers.outputs]}
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Stage:
        error = d.get("error")
        numbers = d.get("numbers")
        fields = {k: v for k, v in d.items() if k not in ("graph", "links", "error", "numbers")}
        return cls(
            **fields,
            graph=Graph.from_json(json.dumps(d["graph"])),
            links={k: [(a, b) for a, b in v] for k, v in d.get("links", {}).items()},
            error=None if error is None else StageError(
                error["type"], error["message"], SourceLoc(**error["frame"]) if error.get("frame") else None),
            numbers=None if numbers is None else Numbers(
                [OutputError(**o) for o in numbers["outputs"]], numbers.get("note", ""), numbers.get("seconds", 0.0)),
        )


@dataclass
class Divergence:
    """Where the numbers first leave tolerance: the stage, and in it the first node whose value
    differs from its counterpart in the stage before (``node`` empty when no node could be
    compared). ``max_abs`` is that node's largest difference (else the stage's outputs'); ``where``
    names the node as the report draws it, with its module and source line."""

    stage: int
    pass_name: str
    node: str = ""
    previous: str = ""
    max_abs: float = 0.0
    note: str = ""
    where: str = ""  # the node as drawn and its origin: "sub (node add) in mlp at m.py:3"

    def __str__(self) -> str:
        at = (f" at {self.where}" if self.where else f" at node {self.node!r}") + (
            f" (was {self.previous!r})" if self.previous and self.previous != self.node else "")
        whose = "that node's" if self.node else "the outputs'"
        return f"stage {self.stage} ({self.pass_name}){at if self.node else ''}: {whose} max abs error {self.max_abs:.3g}"


@dataclass
class Pipeline:
    """Every stage of a pass pipeline, in order, and the first stage whose numbers diverge."""

    name: str
    stages: list[Stage] = field(default_factory=list)
    first_divergence: Divergence | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> Stage | None:
        return next((s for s in self.stages if s.failed), None)

    def visible(self, *, show_unchanged: bool = False) -> list[Stage]:
        """The stages a view shows: the unchanged ones (no-op passes) only when asked."""
        return [s for s in self.stages if show_unchanged or s.changed or s.index == 0 or s.failed]

    def stage(self, index: int) -> Stage:
        if not 0 <= index < len(self.stages):
            raise IndexError(f"stage {index} is out of range: this pipeline has stages 0 to {len(self.stages) - 1}")
        return self.stages[index]

    def before(self, index: int) -> int:
        """The stage that stage ``index`` is compared with: its ``base``, else the one before it."""
        base = self.stages[index].base
        return index - 1 if base is None else base

    def chain(self, index: int) -> list[int]:
        """Stage ``index`` and the stages it comes from, back to stage 0."""
        out = [index]
        while out[-1] > 0 and len(out) <= len(self.stages):
            out.append(self.before(out[-1]))
        return out

    def trace(self, stage: int, node: str) -> list[list[tuple[str, str]]]:
        """The provenance of ``node`` of ``stage`` back to stage 0: one list of (node, link kind)
        per stage of :meth:`chain`, latest first (the first list is ``[(node, "exact")]``)."""
        out = [[(node, EXACT)]]
        names = {node}
        for s in (self.stages[i] for i in self.chain(stage)[:-1]):
            prev: dict[str, str] = {}
            for n in names:
                for src, kind in s.origin(n):
                    if prev.get(src) != EXACT:
                        prev[src] = kind
            out.append(sorted(prev.items()))
            names = set(prev)
        return out

    def headline(self) -> str:
        """The pipeline's answer, as the terminal prints it first and the report and JSON keep it:
        ``CoolCNN: 3 stages (export → decompose → fuse), 15 → 12 ops; numbers first diverge at ...``."""
        passes = " → ".join(s.name for s in self.stages)
        ops = [sum(s.ops_after.values()) for s in self.stages]
        out = f"{self.name}: {len(self.stages)} stage{'s' if len(self.stages) != 1 else ''} ({passes}), "
        out += f"{ops[0]} → {ops[-1]} ops" if len(ops) > 1 else f"{ops[0]} ops" if ops else "no ops"
        failed = self.failed
        if failed is not None and failed.error is not None:
            return out + f"; stage {failed.index} ({failed.name}) failed: {failed.error}"
        if self.first_divergence is not None:
            return out + f"; numbers first diverge at {self.first_divergence}"
        checked = [s.numbers for s in self.stages if s.numbers is not None and s.numbers.checked]
        if not checked:
            return out + "; numbers not compared with eager"
        worst = max(n.max_abs or 0.0 for n in checked)
        return out + f"; every stage's outputs within tolerance of eager (max abs error {worst:.3g})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "headline": self.headline(),
            "name": self.name,
            "stages": [s.to_dict() for s in self.stages],
            "first_divergence": asdict(self.first_divergence) if self.first_divergence else None,
            "notes": list(self.notes),
        }

    def to_json(self, *, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Pipeline:
        d = json.loads(text)
        div = d.get("first_divergence")
        return cls(d["name"], [Stage.from_dict(s) for s in d["stages"]],
                   Divergence(**div) if div else None, list(d.get("notes", [])))


__all__ = ["EXACT", "INFERRED", "Divergence", "Numbers", "OutputError", "Pipeline", "Stage", "StageError"]
