"""Which eager value each value of the compiled run is compared with (:class:`Plan`), and the
observer that compares them while the compiled model runs (:class:`Pass`).

The plan is made once, after the first compiled call (which compiles, and records which graph ran
when) and the eager run: compilemap's matching (:func:`~fxviz.analyze.compilemap.match.pair`)
pairs each Dynamo op of each graph run with an eager op (ops of one source line told apart by what they
read, :mod:`~fxviz.analyze.numerics.pairing`, not by order alone), so a graph's output is the value of the
eager op that makes it, a graph's input the eager value the matched op reads at that position, and
with ``aot_eager`` each ATen node that carries an op's value that op's eager value. Every value is
put on the eager node it belongs to, so module calls, the first divergence and the overlays read
them as they read every other side's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from fxviz.analyze.compilemap.match import DynamoOp, op_key, pair
from fxviz.analyze.numerics.boundary import GraphSpec
from fxviz.analyze.numerics.keep import Keeper
from fxviz.analyze.numerics.metrics import compare
from fxviz.analyze.numerics.pairing import Reads, ambiguous_ops, consistent, refine
from fxviz.analyze.numerics.result import Error
from fxviz.analyze.numerics.shadow import is_random, is_uninitialised
from fxviz.ir import Graph

#: The note of an output of an eager op that the compiled side never showed.
UNSEEN = "not observed: this output does not cross a compiled graph's boundary"


@dataclass(slots=True)
class Entry:
    """What one call of a compiled graph is compared with: ``inputs`` (input position, eager op,
    output index), ``outputs`` (flat output position, eager op, output index), ``width`` (the
    number of flat outputs), ``aten`` (ATen node -> eager op)."""

    inputs: list[tuple[int, str, int]]
    outputs: list[tuple[int, str, int]]
    width: int
    aten: dict[str, str]


class Plan:
    """The :class:`Entry` of each graph call, in the order of the first compiled call (``runs``:
    the graph index of each call; ``pairs``: per call, per Dynamo op, the index in ``graph.ops``
    of its eager op). ``given``: random eager ops whose draw the compiled side is given (an ATen
    node carries their value); ``unaligned``: ATen nodes not compared (no eager op), ``inside``:
    ATen nodes inside a decomposed op. Random ops' values are never compared (each side draws its
    own), nor uninitialised memory (``unwritten``: ``empty_like``; what writes it is).

    A later run may call another graph compiled from the same code where the first called one
    (Dynamo compiles a dynamic version when a specialised value changes, and prefers it from then
    on): with the same ops, the call is paired as the first one was."""

    def __init__(self, graph: Graph, specs: Sequence[GraphSpec], ops: Sequence[Sequence[DynamoOp]],
                 runs: Sequence[int], pairs: Sequence[Sequence[int | None]]) -> None:
        self.specs, self.graph_ops, self.runs = specs, ops, list(runs)
        self.ops = graph.ops
        self.reads = Reads.of_eager(graph)
        self.keys = [op_key(n) for n in self.ops]
        self.ambiguous = ambiguous_ops(self.keys)
        self.pairs = [self._refine(g, row) for g, row in zip(self.runs, pairs, strict=True)]
        self.kind = {n.name: n.kind for n in graph.nodes}
        self.random = {n.name for n in self.ops if is_random(n)}
        self.unwritten = {n.name for n in self.ops if is_uninitialised(n)}  # never compared
        self.given: set[str] = set()
        self.unaligned = self.inside = 0
        self._entries: dict[tuple[int, int], Entry] = {}
        self.entries = [self._make(r, g) for r, g in enumerate(self.runs)]
        for r, g in enumerate(self.runs):
            spec = self.specs[g]
            self.unaligned += spec.orphans + sum(1 for j in spec.values.values() if self.pairs[r][j] is None)
            self.inside += spec.inside
            self.given.update(name for name in self.entries[r].aten.values() if name in self.random)

    def entry(self, r: int, g: int) -> Entry | None:
        """Call ``r`` ran graph ``g``: its entry (``None`` past the first run's calls). Where the
        first run called another graph with other ops, ``g``'s ops are matched afresh, from the eager
        op after the last one the calls before matched."""
        if r >= len(self.runs):
            return None
        found = self._entries.get((r, g))
        if found is not None:
            return found
        row = None
        if g != self.runs[r] and _keys(self.graph_ops[g]) != _keys(self.graph_ops[self.runs[r]]):
            start = max((i for p in self.pairs[:r] for i in p if i is not None), default=-1) + 1
            row = self._refine(g, pair(self.ops, [("", self.graph_ops[g])], start=start)[0])
        return self._make(r, g, row)

    def _refine(self, g: int, row: Sequence[int | None]) -> list[int | None]:
        """``row`` with ops of one source line told apart by what they read (:func:`refine`)."""
        ops = self.graph_ops[g]
        refined = refine(row, _keys(ops), [o.module for o in ops], self.specs[g].reads, self.ops, self.reads)
        twice = ambiguous_ops(_keys(ops))  # a line that runs more than once compiled
        kept = consistent({j: e for j, e in enumerate(refined) if e is not None}, self.reads, self.specs[g].reads,
                          self.ambiguous | {e for j, e in enumerate(refined) if j in twice and e is not None},
                          keys=(_keys(ops), self.keys))
        return [kept.get(j) for j in range(len(refined))]

    def uses(self) -> Counter[str]:
        """How often each eager op's value is asked for: it is freed after the last time."""
        c: Counter[str] = Counter()
        for e in self.entries:
            c.update(name for _, name, _ in e.inputs)
            c.update(name for _, name, _ in e.outputs)
            c.update(e.aten.values())
        return c

    def _make(self, r: int, g: int, row: Sequence[int | None] | None = None) -> Entry:
        spec, ops = self.specs[g], self.ops
        pair = self.pairs[r] if row is None else row
        ins = []
        for p, j, k in spec.inputs:
            e = pair[j]
            if e is None or len(ops[e].inputs) != spec.arity[j]:
                continue
            ref = ops[e].inputs[k]
            if self.kind.get(ref.node) == "op" and ref.node not in self.random | self.unwritten:
                ins.append((p, ref.node, ref.index))
        outs = []
        for pos, o in enumerate(spec.outputs):
            e = pair[o[0]] if o is not None else None
            if o is not None and e is not None and ops[e].name not in self.random | self.unwritten:
                outs.append((pos, ops[e].name, o[1]))
        aten = {a: ops[e].name for a, j in spec.values.items()
                if (e := pair[j]) is not None and ops[e].name not in self.unwritten}
        entry = self._entries[(r, g)] = Entry(ins, outs, len(spec.outputs), aten)
        return entry


class Pass:
    """One run of the compiled model, compared with the values ``keeper`` kept: the
    :class:`~fxviz.analyze.numerics.boundary.Observer` of :class:`~fxviz.analyze.numerics.boundary.CompiledSide`.
    ``errors`` (eager node -> one :class:`Error` per output) is added to; each kept value is
    dropped after its last use. ``off`` says why the run stopped being compared (the compiled model
    ran other graphs than the first time)."""

    def __init__(self, plan: Plan, keeper: Keeper, errors: dict[str, list[Error]], *,
                 rtol: float, atol: float) -> None:
        self.plan, self.keeper, self.errors = plan, keeper, errors
        self.rtol, self.atol = rtol, atol
        self.uses = Counter({k: v for k, v in plan.uses().items() if k in keeper.values})
        self.run = 0
        self.aten_map: dict[str, str] | None = None
        self.off = ""
        self.boundary: set[str] = set()  # eager ops compared where a value crosses a graph's boundary
        self.per_node: set[str] = set()  # eager ops compared at an ATen node

    # ---- the observer --------------------------------------------------------------------------

    def graph_call(self, index: int, call: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        r = self.run
        self.run += 1
        entry = None if self.off else self.plan.entry(r, index)
        if entry is None:
            self.off = self.off or f"call {r} ran graph g{index}, not the graph the first compiled call ran"
            return call(*args, **kwargs)
        boxed = getattr(call, "_boxed_call", False) and len(args) == 1 and isinstance(args[0], list)
        values = args[0] if boxed else args
        for p, name, k in entry.inputs:
            self._check(name, [(k, values[p])], self.boundary)
        self.aten_map = entry.aten or None
        try:
            out = call(*args, **kwargs)
        finally:
            self.aten_map = None
        leaves = pytree.tree_leaves(out)
        if len(leaves) == entry.width:
            for pos, name, k in entry.outputs:
                self._check(name, [(k, leaves[pos])], self.boundary)
        return out

    def watching_aten(self) -> bool:
        return self.aten_map is not None

    def aten_value(self, node: torch.fx.Node, value: Any) -> Any:
        name = self.aten_map.get(node.name) if self.aten_map is not None else None
        if name is None:
            return value
        if name in self.plan.given:  # eager's draw, in the graph's own structure
            kept = self.keeper.values.get(name)
            if kept is not None:
                value = _given(value, kept)
            self._used(name)
            return value
        leaves = [v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]
        kept = self.keeper.values.get(name)
        if kept is not None and len(leaves) != sum(1 for o in kept if o is not None):
            leaves = leaves[:1]  # one side spells the op with extra outputs: the result leads on both
        self._check(name, list(enumerate(leaves)), self.per_node)
        return value

    # ---- comparing -----------------------------------------------------------------------------

    def _check(self, name: str, values: list[tuple[int, Any]], seen: set[str]) -> None:
        kept = self.keeper.values.get(name)
        if kept is None:
            return
        for k, v in values:
            a = kept[k] if k < len(kept) else None
            if a is not None and isinstance(v, torch.Tensor):
                record(self.errors, name, k, len(kept), compare(a, v, self.rtol, self.atol))
                seen.add(name)
        self._used(name)

    def _used(self, name: str) -> None:
        self.uses[name] -= 1
        if self.uses[name] <= 0:
            self.keeper.drop(name)


def _keys(ops: Sequence[DynamoOp]) -> list[tuple[str, int, str]]:
    return [(o.file, o.line, o.name) for o in ops]


def record(errors: dict[str, list[Error]], name: str, k: int, width: int, e: Error) -> None:
    """Put ``e`` as output ``k`` of ``name`` (of ``width`` outputs); a value compared twice (where
    it leaves one graph and enters the next) keeps the worse error."""
    errs = errors.setdefault(name, [])
    while len(errs) < max(width, k + 1):
        errs.append(Error(comparable=False, note=UNSEEN))
    old = errs[k]
    errs[k] = e if not old.comparable else (Error.worst([old, e]) or e)


def _given(value: Any, kept: list[torch.Tensor | None]) -> Any:
    if isinstance(value, torch.Tensor):
        return kept[0] if kept and kept[0] is not None and kept[0].shape == value.shape else value
    if isinstance(value, (tuple, list)) and len(value) == len(kept):
        return type(value)(k if k is not None else v for v, k in zip(value, kept, strict=True))
    return value


__all__ = ["UNSEEN", "Entry", "Pass", "Plan", "record"]
