"""The compile map as plain data: what torch.compile did to one forward, laid over its eager graph.
No torch: a saved map (``CompileMap.to_json``) reads back and renders on a machine without torch.

A :class:`CompileMap` holds the eager graph (the tracer's, with the overlays and panels
:mod:`fxviz.analyze.compilemap.overlay` writes on it), the Dynamo graphs that ran, the graph
breaks grouped by cause and line, and the recompiles with the guard that failed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from fxviz.analyze.compilemap.kinds import CATEGORIES, EAGER, HINTS, UNRUN
from fxviz.analyze.inside.result import Inside
from fxviz.ir import Graph


@dataclass(slots=True)
class Frame:
    """One frame of the stack at a break; ``library`` is the file's path under the library root it
    lies in (``json/encoder.py``), ``""`` for the user's own code."""

    file: str
    line: int
    func: str = ""
    code: str = ""
    library: str = ""

    def short(self) -> str:
        return f"{self.library or self.file.rsplit('/', 1)[-1]}:{self.line}"


@dataclass(slots=True)
class BreakGroup:
    """Every graph break of one cause at one source line (tlparse lists each; they are one fix).

    ``count`` is how many times the forward passed it (a break in a block called 12 times counts
    12); ``node`` is the eager op at the line (the
    ``.item()`` itself when there is one) and ``module`` its module call id."""

    category: str
    reason: str
    detail: str
    stack: list[Frame]
    count: int = 1
    node: str | None = None
    module: str | None = None
    input_set: int = 0
    explained: str = ""  # Dynamo's own page for this break type, when its message names one
    frame: int = -1  # which frame of ``stack`` is the break's place: the innermost user frame, or the skipped function's
    library_frame: int | None = None  # the library frame it broke in, when the innermost frame is library code
    gb_id: str = ""  # the break type's id in torch's registry (``GB0124``)

    @property
    def where(self) -> Frame | None:
        return self.stack[self.frame] if self.stack else None

    @property
    def library(self) -> Frame | None:
        """The library line the break happened at, when that is not the user's own code."""
        return self.stack[self.library_frame] if self.library_frame is not None and self.stack else None

    @property
    def hint(self) -> str:
        return HINTS.get(self.category, ("", ""))[0]

    @property
    def link(self) -> str:
        """The PyTorch page for the category's remedy, else Dynamo's page for the break type."""
        return HINTS.get(self.category, ("", ""))[1] or self.explained

    def line_text(self) -> str:
        w = self.where
        return w.short() if w is not None else "?"


@dataclass(slots=True)
class ShapeGuard:
    """A guard on symbolic sizes, as the ShapeEnv recorded it: ``expr`` over the symbols
    (``s77 <= 4``) and the user line that installed it (``file``/``line``/``code``), or
    ``framework``: torch's note where torch installed it itself; ``via``: the library line inside
    the call from the user's line that installed it (``nn/modules/linear.py:134``); ``check``: the
    guard as Dynamo's guard code writes it, over the symbols (``((s27 // 2) % 2) == 0``), which is
    how a recompile's failed guard is found among them."""

    expr: str
    symbols: list[str] = field(default_factory=list)
    file: str = ""
    line: int = 0
    code: str = ""
    framework: str = ""
    via: str = ""
    check: str = ""


@dataclass(slots=True)
class Symbol:
    """A symbolic size of a compiled graph: ``s77`` is dim ``dim`` of input ``input`` (``source``
    ``L['x'].size()[0]``), valid for ``lo``..``hi`` (``None``: unbounded), traced with ``value``;
    ``specialised`` is the constant it was specialised to. ``file``/``line``/``code``: the user line
    that guarded it (the specialising one first); ``advice``: whether to mark it dynamic."""

    name: str
    source: str
    input: str
    dim: int | None
    lo: int | None = None
    hi: int | None = None
    value: int | None = None
    specialised: int | None = None
    file: str = ""
    line: int = 0
    code: str = ""
    advice: str = ""
    zero_one: bool = False  # the lower bound 2 is torch's 0/1 specialisation
    kind: str = "size"  # or "stride" (dim: its index), "storage_offset", "value" (an int input)

    def text(self) -> str:
        """``s77 = x dim 0 in [2, 4]`` (``x stride 0``, ``x storage offset``, ``n``; or ``= 8 (specialised)``)."""
        what = {"size": f" dim {self.dim}", "stride": f" stride {self.dim}", "storage_offset": " storage offset"}
        where = f"{self.name} = {self.input}{what.get(self.kind, '')}"
        if self.specialised is not None:
            return f"{where} = {self.specialised} (specialised)"
        lo = "(-∞" if self.lo is None else f"[{self.lo}"
        hi = "∞)" if self.hi is None else f"{self.hi}]"
        return f"{where} in {lo}, {hi}"


@dataclass(slots=True)
class CompiledGraph:
    """One Dynamo graph: ``id`` (``g0``, ``g1``, … in compile order), the function it came from
    (``func``, ``file``, ``line``: its code's name, file and first line, as torch's compilation
    metrics and tlparse name the frame and the recompiles name the same function; an op keeps its
    own line),
    the input set that compiled it, how many ops it holds (``ops``: every call node of Dynamo's graph,
    torch's ``graph_op_count``; ``explain``'s ``op_count`` counts its ``call_function`` nodes only,
    not a method call such as ``y.unflatten(...)``), how often it ran, and every guard that
    must hold for it to be reused (``L['x']: TENSOR_MATCH``, ``GRAD_MODE``, ``SHAPE_ENV: 5 <=
    L['x'].size()[0]``; each distinct guard once, a ShapeEnv check by check); ``torch_guard_count``
    what torch's compilation metrics call the frame compile's ``guard_count`` (its ``Guard`` objects:
    a check Dynamo installed 51 times counts 51 times, the ShapeEnv's checks as one; ``None``
    where torch recorded none); ``inputs`` its inputs' shapes as traced (``x: (s77, 8)``), ``symbols`` the
    symbolic sizes in them and ``shape_guards`` the guards on those, each with its user line.
    ``torch_op_count`` is torch's ``graph_op_count`` of the frame compile (compilation metrics;
    ``None`` where torch recorded none), ``eager_ops`` how many of the eager graph's ops ran in it
    (``None`` for a graph the first input set did not run) and ``no_eager_op`` its Dynamo ops that
    are no eager op (``"getitem (unpacks a tuple) modeling_gpt2.py:187"``, :mod:`.opcount`)."""

    id: str
    func: str
    file: str
    line: int
    input_set: int
    ops: int
    runs: int = 0
    compile_s: float = 0.0
    modules: list[str] = field(default_factory=list)
    guards: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    symbols: list[Symbol] = field(default_factory=list)
    shape_guards: list[ShapeGuard] = field(default_factory=list)
    torch_guard_count: int | None = None
    compile_id: str = ""  # torch's id of the frame compile that made it (``0/0``, as tlparse names it)
    torch_op_count: int | None = None
    eager_ops: int | None = None
    no_eager_op: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Recompile:
    """A function compiled again: which input set caused it and the guard that failed, in words;
    ``guard`` is Dynamo's own text of it, ``input``/``dim`` the input dimension it checks, ``advice``
    how to avoid the recompile (``mark_dynamic`` or not), ``compile_id`` torch's id of the compile
    (``frame/n``: the function's ``n``-th recompile, as TORCH_TRACE and tlparse number it). One per
    compile: a function called with new shapes twice in one input set recompiles twice."""

    input_set: int
    func: str
    file: str
    line: int
    reason: str
    guard: str = ""
    input: str = ""
    dim: int | None = None
    advice: str = ""
    compile_id: str = ""


@dataclass(slots=True)
class RecompileLimit:
    """Dynamo stopped compiling a function: it had compiled it ``limit`` times (the setting
    ``torch._dynamo.config.<setting>``, ``recompile_limit`` unless the process-wide
    ``accumulated_recompile_limit`` was reached first: its compile and ``limit - 1`` recompiles),
    so from input set ``input_set`` on, the function runs eagerly on every call no compiled version
    accepts. ``eager_sets``: the input sets in which it is known to have: ``input_set`` (the refused
    call ran eagerly) and each later one in which it ran no compiled graph or some of its calls
    missed every compiled version (Dynamo's guard-complete hook; while two functions are past
    their limits such a call is not told to either).
    ``reasons``: the guard that failed at each recompile that led there, in order, the last one the
    recompile Dynamo refused (``compile_id``: torch's id of that refused compile)."""

    input_set: int
    func: str
    file: str
    line: int
    setting: str
    limit: int
    eager_sets: list[int] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    compile_id: str = ""

    @property
    def config(self) -> str:
        return f"torch._dynamo.config.{self.setting}"

    def where(self) -> str:
        return f"{self.func} ({self.file.rsplit('/', 1)[-1]}:{self.line})" if self.file else self.func

    def note(self) -> str:
        """The finding in one sentence, with what to change."""
        sets = _sets(self.eager_sets)
        last = f" (last guard failed: {self.reasons[-1]})" if self.reasons else ""
        return (f"Dynamo hit {self.config} ({self.limit}) for {self.where()} at input set {self.input_set}: "
                f"it compiles that function no more and ran it eagerly on input {sets}{last}; from then on it "
                f"runs eagerly on every call no compiled version accepts; "
                f"raise {self.config} or remove the recompiles' cause (dynamic=True, torch._dynamo.mark_dynamic)")


def _sets(ks: list[int]) -> str:
    """``set 3``, ``sets 8-10``, ``sets 2, 5``."""
    if not ks:
        return "no set"
    if len(ks) == 1:
        return f"set {ks[0]}"
    if ks == list(range(ks[0], ks[-1] + 1)):
        return f"sets {ks[0]}-{ks[-1]}"
    return "sets " + ", ".join(map(str, ks))


@dataclass(slots=True)
class ModuleCoverage:
    """One module call: its ops, how many ran inside a compiled graph, and which graphs."""

    call: str
    path: str
    cls: str
    ops: int
    compiled: int
    graphs: list[str] = field(default_factory=list)

    @property
    def eager(self) -> int:
        return self.ops - self.compiled

    @property
    def share(self) -> float | None:
        return self.compiled / self.ops if self.ops else None


@dataclass(slots=True)
class NodeCall:
    """One autograd node a compiled autograd graph runs: its name (``AddmmBackward0``), the engine's
    call index and the modules whose forward it differentiates (empty for the engine's own nodes)."""

    name: str
    call: int
    modules: list[str] = field(default_factory=list)


@dataclass(slots=True)
class AutogradGraph:
    """One graph compiled autograd captured (``compiled_autograd_id``), its node calls in order."""

    id: int
    calls: list[NodeCall]


@dataclass
class CompiledBackward:
    """The backward as compiled autograd ran it: the graphs it captured (``autograd``), the Dynamo
    graphs compiled from them (``graphs``, ``b0``, ``b1``, ...) and the breaks in them, grouped by
    cause and line (each group's ``count``: how often Dynamo broke there, as torch counts them in
    ``counters["graph_break"]``)."""

    autograd: list[AutogradGraph]
    graphs: list[CompiledGraph]
    breaks: list[BreakGroup]

    @property
    def break_count(self) -> int:
        return sum(b.count for b in self.breaks)

    def summary(self) -> str:
        """``backward (compiled autograd): 1 graph captured, 3 Dynamo graphs, 3 breaks (1 cause)``."""
        causes = f" ({plural(len(self.breaks), 'cause')})" if self.breaks else ""
        return (f"backward (compiled autograd): {plural(len(self.autograd), 'graph')} captured, "
                f"{plural(len(self.graphs), 'Dynamo graph')}, {plural(self.break_count, 'break')}{causes}")

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary(), "autograd": [asdict(g) for g in self.autograd],
                "graphs": [asdict(g) for g in self.graphs],
                "breaks": [{**asdict(b), "hint": b.hint, "link": b.link} for b in self.breaks]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompiledBackward:
        breaks = []
        for b in d["breaks"]:
            b = {k: v for k, v in b.items() if k not in ("hint", "link")}
            b["stack"] = [Frame(**f) for f in b["stack"]]
            breaks.append(BreakGroup(**b))
        return cls(autograd=[AutogradGraph(g["id"], [NodeCall(**c) for c in g["calls"]]) for g in d["autograd"]],
                   graphs=[_graph(g) for g in d["graphs"]], breaks=breaks)


@dataclass(slots=True)
class CompileMap:
    """What torch.compile did to one forward. ``graph`` is the eager graph with the overlays
    ``compiled`` and ``coverage`` and the panels ``breaks``, ``modules`` and ``recompiles``;
    ``assigned`` maps each op (node name) to the id of the compiled graph that ran it, :data:`EAGER`, or
    :data:`UNRUN` (not run under torch.compile: the forward took a path only eager takes)."""

    graph: Graph
    backend: str
    mode: str | None
    dynamic: bool | None
    graphs: list[CompiledGraph]
    breaks: list[BreakGroup]
    recompiles: list[Recompile]
    assigned: dict[str, str]
    modules: list[ModuleCoverage]
    input_sets: int = 1
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    limits: list[RecompileLimit] = field(default_factory=list)
    inside: Inside | None = None  # with inside=True: Inductor's stages, kernels and compile costs
    backward: CompiledBackward | None = None  # with compiled_autograd=True: the backward as it compiled

    @property
    def eager_sets(self) -> list[int]:
        """The input sets in which a function Dynamo stopped recompiling ran eagerly."""
        return sorted({k for lim in self.limits for k in lim.eager_sets})

    @property
    def break_count(self) -> int:
        """How many times the first input set's forward passed a graph break (each group's
        ``count``): the header's "N breaks"."""
        return sum(b.count for b in self.breaks)

    @property
    def explain_break_count(self) -> int:
        """What ``torch._dynamo.explain`` calls ``graph_break_count`` for the first input set: its
        graphs less one. That counts every graph Dynamo compiled, so a frame compiled on its own
        (a function called from code that ran eagerly) and a recompile count as breaks too, and a
        break passed twice by one compiled graph counts once: it is not :attr:`break_count`."""
        first = sum(1 for g in self.graphs if g.input_set == 0)
        return first - 1 if first else 0

    @property
    def ops(self) -> int:  # the ops that ran under torch.compile: not those only eager runs (UNRUN)
        return sum(1 for g in self.assigned.values() if g != UNRUN)

    @property
    def compiled_ops(self) -> int:
        return sum(1 for g in self.assigned.values() if g not in (EAGER, UNRUN))

    @property
    def share(self) -> float:
        """The share of the eager graph's ops that ran inside a compiled graph (1.0 for none)."""
        return self.compiled_ops / self.ops if self.ops else 1.0

    def ranking(self) -> list[ModuleCoverage]:
        """Module calls by ops left outside graphs (their own ops and their children's), most first;
        calls with none left out are not listed."""
        return sorted((m for m in self.modules if m.eager and m.call), key=lambda m: (-m.eager, m.call))

    def header(self) -> str:
        """``3 graphs, 2 breaks (1 cause), 1 recompile, 91% of ops compiled (aot_eager)`` (the breaks
        the forward passed, :attr:`break_count`; JSON's summary gives explain's count beside it), and a
        mark for each function Dynamo stopped recompiling (``✗ recompile limit hit
        (recompile_limit=8): forward ran eagerly on input sets 8-10``; the share compiled is of the
        first input set)."""
        def n(k: int, word: str) -> str:
            return f"{k} {word}{'' if k == 1 else 's'}"

        causes = f" ({n(len(self.breaks), 'cause')})" if self.breaks else ""
        parts = [n(len(self.graphs), "graph"), n(self.break_count, "break") + causes]
        if self.recompiles or self.input_sets > 1:
            parts.append(n(len(self.recompiles), "recompile"))
        parts.append(f"{_percent(self.share)} of ops compiled ({self.compiled_ops}/{self.ops})")
        out = ", ".join(parts) + f"  ·  backend {self.backend}" + (f", mode {self.mode}" if self.mode else "")
        for lim in self.limits:
            out += (f"  ·  ✗ recompile limit hit ({lim.setting}={lim.limit}): {lim.func} ran eagerly on input "
                    f"{_sets(lim.eager_sets)}")
        return out

    def headline(self) -> str:
        """The answer, as the terminal prints it after the model's name and the report (the graph's
        ``headline`` annotation) and JSON keep it: ``torch.compile: 1 graph, 0 breaks, ...``."""
        inside = f"  ·  inside: {self.inside.summary()}" if self.inside is not None else ""
        back = f"  ·  {self.backward.summary()}" if self.backward is not None else ""
        return f"torch.compile: {self.header()}{inside}{back}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": "fxviz.compile_map/1", "headline": self.headline(),
            "backend": self.backend, "mode": self.mode, "dynamic": self.dynamic, "input_sets": self.input_sets,
            "summary": {"graphs": len(self.graphs), "breaks": self.break_count, "causes": len(self.breaks),
                        "explain_graph_break_count": self.explain_break_count,
                        "recompiles": len(self.recompiles), "ops": self.ops,
                        "guards_distinct": sum(len(g.guards) for g in self.graphs),
                        "torch_guard_count": torch_guard_count(self.graphs), "compiled_ops": self.compiled_ops,
                        "torch_graph_op_count": torch_op_count(self.graphs),
                        "no_eager_op": sum(len(g.no_eager_op) for g in self.graphs),
                        "share": self.share},
            "graphs": [asdict(g) for g in self.graphs],
            "breaks": [{**asdict(b), "hint": b.hint, "link": b.link} for b in self.breaks],
            "recompiles": [asdict(r) for r in self.recompiles],
            "recompile_limits": [{**asdict(lim), "config": lim.config} for lim in self.limits],
            "eager_input_sets": self.eager_sets,
            "modules": [asdict(m) for m in self.modules],
            "assigned": self.assigned, "notes": self.notes, "timings": self.timings,
            "graph": json.loads(self.graph.to_json()),
        } | (self.inside.to_dict() if self.inside is not None else {}) \
          | ({"compiled_autograd": self.backward.to_dict()} if self.backward is not None else {})

    def to_json(self, *, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str | bytes) -> CompileMap:
        d = json.loads(text)
        breaks = []
        for b in d["breaks"]:
            b = {k: v for k, v in b.items() if k not in ("hint", "link")}
            b["stack"] = [Frame(**f) for f in b["stack"]]
            breaks.append(BreakGroup(**b))
        return cls(
            graph=Graph.from_json(json.dumps(d["graph"])), backend=d["backend"], mode=d["mode"],
            dynamic=d["dynamic"], graphs=[_graph(g) for g in d["graphs"]], breaks=breaks,
            recompiles=[Recompile(**r) for r in d["recompiles"]], assigned=d["assigned"],
            modules=[ModuleCoverage(**m) for m in d["modules"]], input_sets=d["input_sets"],
            notes=d["notes"], timings=d["timings"],
            limits=[RecompileLimit(**{k: v for k, v in lim.items() if k != "config"})
                    for lim in d.get("recompile_limits", [])],
            inside=Inside.from_dict(d) if "stages" in d else None,
            backward=CompiledBackward.from_dict(d["compiled_autograd"]) if "compiled_autograd" in d else None,
        )


def _graph(d: dict[str, Any]) -> CompiledGraph:
    d = dict(d)
    d["symbols"] = [Symbol(**x) for x in d.get("symbols", ())]
    d["shape_guards"] = [ShapeGuard(**x) for x in d.get("shape_guards", ())]
    return CompiledGraph(**d)


def torch_guard_count(graphs: list[CompiledGraph]) -> int | None:
    """torch's ``guard_count`` summed over ``graphs`` (their frame compiles'; a frame compile that
    made two graphs counted once); ``None`` where torch recorded it for none."""
    counts = {g.compile_id or g.id: g.torch_guard_count for g in graphs if g.torch_guard_count is not None}
    return sum(counts.values()) if counts else None


def torch_op_count(graphs: list[CompiledGraph]) -> int | None:
    """torch's ``graph_op_count`` summed over ``graphs`` (as :func:`torch_guard_count`)."""
    counts = {g.compile_id or g.id: g.torch_op_count for g in graphs if g.torch_op_count is not None}
    return sum(counts.values()) if counts else None


def plural(k: int, word: str) -> str:
    return f"{k} {word}{'' if k == 1 else 's'}"


def _percent(share: float) -> str:
    """``91%``; never rounds a partial coverage up to 100% or down to 0%."""
    p = share * 100
    if 99 < p < 100:
        return f"{p:.1f}%"
    if 0 < p < 1:
        return f"{p:.1f}%"
    return f"{p:.0f}%"


def percent(share: float | None) -> str:
    return "" if share is None else _percent(share)


__all__ = ["CATEGORIES", "HINTS", "AutogradGraph", "BreakGroup", "CompiledBackward", "NodeCall", "CompileMap", "CompiledGraph", "Frame", "ModuleCoverage",
           "Recompile", "RecompileLimit", "ShapeGuard", "Symbol", "percent", "plural", "torch_guard_count",
           "torch_op_count"]
