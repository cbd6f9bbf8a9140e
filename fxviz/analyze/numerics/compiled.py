"""The ``compile[:backend]`` side: the model under ``torch.compile`` against eager.

What can be observed depends on the backend. Every backend: each compiled Dynamo graph's call is
watched (:mod:`~fxviz.analyze.numerics.boundary`), so every value that crosses between compiled
and eager code, where a graph's inputs come in and its outputs go out (a graph break is such a
place), is compared with the eager op's value, and so are the model's outputs. Inductor fuses ops
into kernels whose intermediate values never exist: per graph boundary is all there is, unless
``kernels`` (``--per-kernel``) watches each kernel's output buffers (:mod:`~fxviz.analyze.numerics.kernels`:
after the runs below, one more compiled call).
``aot_eager`` runs AOT Autograd's forward graph (ATen level) in an fx Interpreter: each node that
carries a torch-level op's value is compared too, per node.

The runs, each with the same RNG state (``seed``):

1. the first compiled call: compiles, and records which graph ran when (nothing compared);
2. the eager run (the graph every result lands on), keeping the values the compiled side will ask
   for (:class:`~fxviz.analyze.numerics.keep.Keeper`), at most a budget of bytes, and one more
   eager run: the two give each op's eager noise floor (:mod:`~fxviz.analyze.numerics.floor`);
3. the compiled model again, comparing each value as it is made and freeing the eager one after
   its last use (:class:`~fxviz.analyze.numerics.plan.Pass`);
4. only if the budget was reached: another eager run and compiled run for the values past it, and
   so on (chunks). Memory stays near one forward plus the budget.

Dynamo is left as found (compilemap's :func:`~fxviz.analyze.compilemap.record.dynamo_state`: its
caches are reset before and after, so the user's other compiled functions compile again; config
and counters restored), and the model's buffers and training flags are put back after each run.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fxviz.analyze.compilemap.match import matchable, pair
from fxviz.analyze.compilemap.record import dynamo_state, module_paths
from fxviz.analyze.numerics.boundary import CompiledSide, Observer
from fxviz.analyze.numerics.floor import Prints, settle
from fxviz.analyze.numerics.keep import Keeper, Want
from fxviz.analyze.numerics.kernels import KernelWatch
from fxviz.analyze.numerics.metrics import compare
from fxviz.analyze.numerics.plan import Pass, Plan, record
from fxviz.analyze.numerics.result import Error
from fxviz.analyze.numerics.run import SameRng, Watcher, Watchers, run_eager
from fxviz.analyze.numerics.shadow import UNWRITTEN, is_random, is_uninitialised
from fxviz.errors import ModelError, TargetError
from fxviz.ir import Graph, Node
from fxviz.text import one_line
from fxviz.torchbridge.normalize import flatten_outputs

#: The eager values kept at a time, as a share of the model's parameter and buffer bytes (one
#: forward holds at least those), and never less than ``MIN_BUDGET``.
BUDGET_SHARE = 0.5
MIN_BUDGET = 64 << 20


@dataclass
class CompiledErrors:
    """What :func:`compiled_errors` found: the eager graph, the errors (eager node -> one per
    output), the random ops (not comparable), notes and the time of each part."""

    graph: Graph
    errors: dict[str, list[Error]]
    random: list[str]
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)


def budget(model: nn.Module) -> int:
    """How many bytes of eager values :func:`compiled_errors` keeps at a time for ``model``."""
    size = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    return max(int(size * BUDGET_SHARE), MIN_BUDGET)


def compiled_errors(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                    backend: str | Callable[..., Any], rtol: float, atol: float, seed: int | None,
                    decompositions: Mapping[Any, Any] | None = None, budget_bytes: int | None = None,
                    kernels: KernelWatch | None = None) -> CompiledErrors:
    """Compare ``model`` under ``torch.compile(backend=backend)`` with eager (see the module's
    docstring). ``decompositions`` are given to AOT Autograd (``aot_eager`` only); ``budget_bytes``
    overrides :func:`budget`. ``kernels`` (Inductor only): the compile is recorded for it and the
    compiled model runs once more with it watching each kernel (:mod:`~fxviz.analyze.numerics.kernels`)."""
    per_node = backend == "aot_eager"
    if decompositions and not per_node:
        raise TargetError(f"decompositions apply to --against decompose and compile:aot_eager, not compile:{_name(backend)}")
    tensors: dict[int, str] = {}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        tensors.setdefault(id(t), name)
    side = CompiledSide(backend, module_paths(model), per_node=per_node, decompositions=decompositions,
                        tensors=tensors)
    limit = budget_bytes if budget_bytes is not None else budget(model)
    errors: dict[str, list[Error]] = {}
    notes: list[str] = []
    if kernels is not None:
        kernels.attach(side)
    recording = kernels.recording() if kernels is not None else contextlib.nullcontext()
    with dynamo_state(), recording, _Runs(model, args, kwargs, side, seed, _name(backend)) as runs, \
            side.breaks_logged(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Dynamo warns of graph breaks: the note counts them
        runs.compiled(first=True)
        called = [g for g, _ in side.rec.runs]
        keeper = Keeper(_first_wants(side, per_node), budget=limit)
        prints = Prints(), Prints()  # the eager noise floor: the kept run and one more
        graph, eager_out = runs.eager(Watchers(keeper, prints[0]))
        runs.eager(prints[1])
        recorded = [(side.rec.graphs[g].id, side.rec.graphs[g].ops) for g in called]
        plan = Plan(graph, side.specs, [g.ops for g in side.rec.graphs], called, pair(graph.ops, recorded))
        wanted = set(plan.uses())
        for name in [n for n in keeper.values if n not in wanted | plan.given]:
            keeper.drop(name)
        remaining = wanted - plan.given
        boundary: set[str] = set()
        per_node_seen: set[str] = set()
        chunks = 0
        while True:
            chunks += 1
            remaining -= set(keeper.values)
            p = Pass(plan, keeper, errors, rtol=rtol, atol=atol)
            out = runs.compiled(observer=p)
            boundary |= p.boundary
            per_node_seen |= p.per_node
            if eager_out is not None:  # the model's outputs: where the last value leaves
                boundary |= _compare_outputs(graph, eager_out, out, errors, rtol, atol)
                eager_out = None
            if p.off or p.run != len(plan.runs):
                why = p.off or f"{p.run} graph calls, not {len(plan.runs)}"
                notes.append(f"the compiled model ran other graphs than on its first call ({why}): "
                             "the values after that are not compared")
                break
            del out, keeper, p
            if not remaining:
                break
            keeper = Keeper(_later_wants(remaining, plan.given), budget=limit)
            again, _ = runs.eager(keeper)
            if [n.name for n in again.nodes] != [n.name for n in graph.nodes] or not set(keeper.values) & remaining:
                notes.append(f"the eager model ran differently the second time: {len(remaining)} value(s) not compared")
                break
        if kernels is not None:  # one more compiled call, each kernel's buffers compared as it writes them
            runs.compiled(observer=kernels)
        notes.extend(settle(errors, *prints, runs.eager, budget=limit, rtol=rtol, atol=atol))
    random = [n.name for n in graph.ops if is_random(n)]
    tainted = _taint(graph, set(random) - plan.given, errors)
    for name in random:
        errors[name] = [Error(comparable=False, note="random op: " + (
            "the compiled side is given eager's draw" if name in plan.given else "the compiled code draws its own numbers"))]
    for name in plan.unwritten:
        errors[name] = [Error(comparable=False, note=UNWRITTEN)]
    seen = {name for name, errs in errors.items() if any(e.comparable for e in errs)}
    notes.insert(0, _note(_name(backend), side, plan, boundary & seen, per_node_seen & seen, per_node,
                          kernels is not None))
    if tainted:
        notes.append(f"{tainted} value(s) read a random op's draw that the compiled code makes itself: not comparable")
    if chunks > 1:
        notes.append(f"the eager values were kept in {chunks} chunks of at most {limit / 2**20:.3g} MB "
                     "(one more eager run and compiled run each)")
    return CompiledErrors(graph, errors, random, notes, runs.seconds)


class _Runs:
    """The model's runs, each from the same RNG state (``seed``, or the state found) and each
    followed by putting the model's buffers (BatchNorm's statistics) and training flags back: a
    compiled run is a real forward. ``seconds`` adds up the time of each kind of run."""

    def __init__(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], side: CompiledSide,
                 seed: int | None, name: str) -> None:
        self.model, self.args, self.kwargs, self.side, self.name = model, args, kwargs, side, name
        self._same_rng = SameRng(seed)
        self.seconds: dict[str, float] = {"compile": 0.0, "eager": 0.0, "compare": 0.0}

    def __enter__(self) -> _Runs:
        self.training = [(m, m.training) for m in self.model.modules()]
        self.buffers = [(b, b.detach().clone()) for b in self.model.buffers() if not b.is_meta]
        self.compiled_model = self.side.compile(self.model)
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

    def _restore(self) -> None:
        with torch.no_grad():
            for b, copy in self.buffers:
                if b.shape == copy.shape:
                    b.copy_(copy)
        for m, flag in self.training:
            m.training = flag

    def compiled(self, *, first: bool = False, observer: Observer | None = None) -> Any:
        """One call of the compiled model (the first compiles), watched by ``observer``."""
        t0 = time.perf_counter()
        self._same_rng()
        self.side.observer = observer
        try:
            with torch.no_grad():
                return self.compiled_model(*self.args, **self.kwargs)
        except Exception as e:  # the eager forward runs: this is torch.compile's failure on it
            if first:  # unless it does not: then the model's own failure is the one to report
                self.eager(Keeper(lambda n: None, budget=0))
            raise ModelError(f"the model raised under torch.compile(backend={self.name!r}): "
                             f"{type(e).__name__}: {one_line(str(e), limit=300)}") from e
        finally:
            self.side.observer = None
            self._restore()
            self.seconds["compile" if first else "compare"] += time.perf_counter() - t0

    def eager(self, keeper: Watcher) -> tuple[Graph, Any]:
        t0 = time.perf_counter()
        self._same_rng()
        try:
            return run_eager(self.model, self.args, self.kwargs, keeper, seed=None)
        finally:
            self.seconds["eager"] += time.perf_counter() - t0


def _first_wants(side: CompiledSide, per_node: bool) -> Callable[[Node], Want]:
    """Before the match, what the eager run keeps, by (file, line, op name): the values of ops
    that may make a graph's output (with aot_eager: any op's value, and random ops' draws, which
    the compiled side is given); when the forward broke into several graphs, of ops that ran
    eagerly too (they may feed a graph). What the match does not ask for is dropped after it."""
    feeders = len(side.rec.runs) > 1 or bool(side.rec.breaks)
    dynamo: set[tuple[str, int, str]] = set()
    wanted: set[tuple[str, int, str]] = set()
    for g, spec in zip(side.rec.graphs, side.specs, strict=True):
        keys = [(o.file, o.line, o.name) for o in g.ops]
        dynamo.update(keys)
        wanted.update(keys[o[0]] for o in spec.outputs if o is not None)
        wanted.update(keys[j] for j in spec.values.values())

    def want(node: Node) -> Want:
        if is_random(node):
            return "carry" if per_node else None
        return "new" if matchable(node, wanted) or (feeders and not matchable(node, dynamo)) else None

    return want


def _later_wants(remaining: set[str], given: set[str]) -> Callable[[Node], Want]:
    def want(node: Node) -> Want:
        return "new" if node.name in remaining else "carry" if node.name in given else None

    return want


def _compare_outputs(graph: Graph, eager: Any, other: Any, errors: dict[str, list[Error]], rtol: float,
                     atol: float) -> set[str]:
    """Compare the model's outputs; the eager ops that made them."""
    seen = set()
    eager_leaves = [v for _, v in flatten_outputs(eager)]
    other_leaves = [v for _, v in flatten_outputs(other)]
    outputs = [n for n in graph.nodes if n.kind == "output"]
    for node, a, b in zip(outputs, eager_leaves, other_leaves, strict=False):
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and node.inputs:
            ref = node.inputs[0]
            made = graph.node(ref.node)
            if made.kind == "op" and not is_random(made) and not is_uninitialised(made):
                record(errors, ref.node, ref.index, ref.index + 1, compare(a, b, rtol, atol))
                seen.add(ref.node)
    return seen


def _taint(graph: Graph, random: set[str], errors: dict[str, list[Error]]) -> int:
    """Mark what reads (at any distance) a random op's own draw not comparable; how many were."""
    tainted = set(random)
    count = 0
    for n in graph.ops:
        if n.name in tainted or not any(r.node in tainted for r in n.inputs):
            continue
        tainted.add(n.name)
        if n.name in errors:
            count += 1
            errors[n.name] = [Error(comparable=False, note="reads a random op's draw the compiled code makes itself")
                              for _ in errors[n.name]]
    return count


def _note(backend: str, side: CompiledSide, plan: Plan, boundary: set[str], per_node: set[str], aten: bool,
          kernels: bool = False) -> str:
    """What was observed: per node or per graph boundary, how many graphs, breaks and calls."""
    # Dynamo logs a break inside a nested call once per frame it leaves: count user lines
    breaks = len({b.stack[-1][:2] if b.stack else (b.gb_type, 0) for b in side.rec.breaks})
    what = f"{_n(len(side.specs), 'graph')}, {_n(breaks, 'graph break')}, {_n(len(plan.runs), 'graph call')}"
    crossing = f"{_n(len(boundary), 'op')} where a value enters or leaves compiled code (the model's outputs included)"
    if aten:
        return (f"compile:{backend} compared per node ({what}): {_n(len(per_node), 'op')} at the ATen node of AOT "
                f"Autograd's forward graph that carries its value, {crossing}; not compared: "
                f"{_n(plan.inside, 'ATen node')} inside decomposed ops, {_n(plan.unaligned, 'ATen node')} "
                "with no eager op")
    if kernels:
        return f"compile:{backend} compared per graph boundary ({what}): {crossing}; inside each graph, per kernel"
    inside = ("fused kernels have no intermediate values" if backend == "inductor" else
              "each compiled graph runs as one call")
    return f"compile:{backend} compared per graph boundary ({what}): {crossing}; {inside}, so the ops inside a graph are not observable"


def _n(k: int, word: str) -> str:
    return f"{k} {word}{'' if k == 1 else 's'}"


def _name(backend: str | Callable[..., Any]) -> str:
    return backend if isinstance(backend, str) else str(getattr(backend, "__name__", "custom"))


__all__ = ["BUDGET_SHARE", "MIN_BUDGET", "CompiledErrors", "budget", "compiled_errors"]
