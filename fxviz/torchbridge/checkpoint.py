"""``torch.utils.checkpoint`` regions, shared by the export path and the eager tracer: one ``checkpoint``
region (``attrs["region"]``, :class:`fxviz.calls.Region`) per checkpoint call, around that call's
forward ops, their recomputations and their backward ops.

Each path says which call an op belongs to in ``attrs["checkpoint"]`` (the call's number, from 0);
:func:`one_region_per_call` draws the regions from it. The export path reads torch's tags
(``ac_graph_id``, :mod:`fxviz.symbolic.checkpoint`): its backward ops by ``seq_nr`` from their forward
op. The eager tracer sees the calls run (:class:`Checkpoints`): the ops recorded while a call's
function runs, the autograd nodes its forward made (autograd's sequence numbers, ``seq_nr`` of a
backward op) and, in the backward, the call whose function runs again (the recomputation).
"""

from __future__ import annotations

import bisect
import contextlib
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from fxviz.ir import ModuleCall, Node

Stack = tuple[ModuleCall, ...]


def common_depth(a: Stack, b: Stack) -> int:
    """How many module calls two stacks share from the outside in."""
    k = 0
    while k < len(a) and k < len(b) and a[k] == b[k]:
        k += 1
    return k


def add_region(nodes: Sequence[Node], run: Sequence[Node], rid: str, label: str) -> None:
    """Put the ops of ``run`` (among ``nodes``, the whole graph's) in a new region ``rid`` around the
    whole calls the run covers: the deepest call every op is in, lifted while the run holds every op
    of that call."""
    names = {n.name for n in run}
    depth = min(common_depth(run[0].stack, n.stack) for n in run)
    while depth > 0:
        prefix = run[0].stack[:depth]
        if any(n.kind == "op" and n.stack[:depth] == prefix and n.name not in names for n in nodes):
            break
        depth -= 1
    entry = [depth, rid, label]
    for n in run:
        regions = n.attrs.get("region", [])
        at = next((i for i, x in enumerate(regions) if x[0] > depth), len(regions))
        n.attrs["region"] = [*regions[:at], list(entry), *regions[at:]]


def one_region_per_call(nodes: list[Node]) -> None:
    """One ``checkpoint`` region per checkpoint call (``attrs["checkpoint"]``) around its forward ops,
    their recomputations and the backward ops of those forward ops (``attrs["checkpoint"]`` where the
    path set it, else by ``seq_nr`` from the forward op), in place of any ``checkpoint`` region drawn
    before (the stack traces' regions on the export path; this one's own: it can run again)."""
    of_seq = {n.attrs["seq_nr"]: n.attrs["checkpoint"] for n in nodes
              if n.phase == "forward" and "checkpoint" in n.attrs and "seq_nr" in n.attrs}
    members: dict[int, list[Node]] = {}
    for n in nodes:
        if n.kind != "op":
            continue
        if n.attrs.get("region"):
            n.attrs["region"] = [list(x) for x in n.attrs["region"] if x[2] != "checkpoint"] or []
            if not n.attrs["region"]:
                del n.attrs["region"]
        call = n.attrs.get("checkpoint")
        if call is None and n.phase == "backward":
            call = of_seq.get(n.attrs.get("seq_nr", -1))
        if call is not None:
            members.setdefault(call, []).append(n)
    for call, run in members.items():
        add_region(nodes, run, f"checkpoint{call}", "checkpoint")


#: The FX node meta key that says which checkpoint call made a node (non-strict export).
STAMP = "fxviz_checkpoint"


def _traced_graph() -> tuple[Any, set[Any]] | None:
    """The FX graph make_fx traces into now (non-strict export), and its nodes so far."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    mode = get_proxy_mode()
    graph = getattr(getattr(mode, "tracer", None), "graph", None)
    return (graph, set(graph.nodes)) if graph is not None else None


class Checkpoints:
    """The ``torch.utils.checkpoint`` calls of one eager run, seen where ``checkpoint`` hands over to its
    two implementations (module globals it looks up at each call, however the model imported it):
    which recorded ops each call's forward made, which autograd nodes (sequence numbers), and which
    call's function runs again in the backward (:meth:`current`)."""

    def __init__(self) -> None:
        self.kinds: list[str] = []  # per call: "non-reentrant" / "reentrant"
        self.parents: list[int | None] = []  # per call: the call whose function made it (nested), if any
        self.runs = 0  # recomputations started (each call of a function checkpoint runs again)
        self._runs: list[int] = []  # the recomputations running now, innermost last
        #: per call: the module that called checkpoint (its path), which runs while checkpoint saves the
        #: region's inputs (what it keeps to run the region again): torch's module of those saved tensors
        self.callers: list[str] = []
        self.firsts: dict[int, str] = {}  # call -> the first op its forward recorded
        #: entered around each call's saving of its inputs (the call's number): the eager path's watch
        self.saving: Callable[[int], contextlib.AbstractContextManager[Any]] | None = None
        #: entered around each non-reentrant call's forward, inside checkpoint's own saved-tensor hooks
        #: (which keep a placeholder for what the region's ops save): the eager path's watch
        self.inside: Callable[[int], contextlib.AbstractContextManager[Any]] | None = None
        self._paths: dict[int, str] = {}  # module -> path, for a run without a recorder (see _caller)
        self.members: dict[str, int] = {}  # forward op -> innermost call that recorded it
        self.spans: list[tuple[int, int, int]] = []  # (first, end) sequence numbers a call's forward made, call
        self._open: list[int] = []  # calls whose function runs now, innermost last (forward or recomputation)
        self._frames: list[tuple[int, int, int]] = []  # forward calls running: (call, nodes recorded, sequence nr)
        self._nodes: list[Node] | None = None
        self._rec: Any = None
        self._stamp = False
        self._traced: list[tuple[Any, set[Any]] | None] = []  # per forward call running: FX graph traced, nodes before

    def current(self) -> int | None:
        """The innermost call whose function runs now (in the backward: the one recomputed)."""
        return self._open[-1] if self._open else None

    def run(self) -> int | None:
        """The recomputation running now (a number per run: an inner call's ops run again in each
        recomputation of a call around it, and in their own), if any."""
        return self._runs[-1] if self._runs else None

    def nested(self, call: int) -> Iterator[int]:
        """The calls made inside ``call``'s function, any depth, in the order they were made: an outer
        call's recomputation runs their functions as forwards again."""
        inside = {call}
        for c, parent in enumerate(self.parents):
            if parent in inside:
                inside.add(c)
                yield c

    @contextlib.contextmanager
    def attach(self, rec: Any = None, *, stamp: bool = False, model: Any = None) -> Iterator[None]:
        """Watch the calls while ``rec`` (a recorder: its ``nodes``, appended as ops run) records; with
        no ``rec``, only which calls ran (:attr:`kinds`) and, with ``model``, the path of the module of
        ``model`` that made each call (:attr:`callers`). ``stamp``: while non-strict export traces,
        each FX node a non-reentrant call's function makes gets ``meta[STAMP]`` (the call), which the
        exported program keeps (a reentrant call is export's ``no_grad`` region already)."""
        import torch.utils.checkpoint as cp

        self._nodes = rec.nodes if rec is not None else None
        self._rec = rec
        self._paths = {id(m): p for p, m in model.named_modules(remove_duplicate=False)} if model is not None else {}
        self._stamp = stamp
        generator, function = cp._checkpoint_without_reentrant_generator, cp.CheckpointFunction
        me = self

        def non_reentrant(fn: Any, *args: Any, **kwargs: Any) -> Iterator[None]:
            call = me._new("non-reentrant")
            inner = generator(me._again(fn, call), *args, **kwargs)
            with me._saving(call):  # saves the inputs
                next(inner)  # before the forward: checkpoint() runs the function itself after this
            me._enter(call, me._stamp)
            try:
                with me.inside(call) if me.inside is not None else contextlib.nullcontext():
                    yield
            except BaseException as e:
                me._leave()
                try:
                    inner.throw(e)
                except StopIteration:
                    return
                raise
            me._leave()
            yield from inner

        def apply(fn: Any, *args: Any) -> Any:
            call = me._new("reentrant")
            with me._saving(call):  # saves the inputs once its forward has run
                me._enter(call)
                try:
                    return function.apply(me._again(fn, call), *args)
                finally:
                    me._leave()

        # torch calls only ``CheckpointFunction.apply``; a class made per attach would be a
        # reference cycle (a class refers to itself) holding ``me``, and through it the recording
        Reentrant = types.SimpleNamespace(apply=apply)

        cp._checkpoint_without_reentrant_generator = non_reentrant  # type: ignore[assignment]
        cp.CheckpointFunction = Reentrant  # type: ignore[assignment,misc]
        try:
            yield
        finally:
            cp._checkpoint_without_reentrant_generator = generator
            cp.CheckpointFunction = function  # type: ignore[misc]
            self._nodes = self._rec = None

    def _new(self, kind: str) -> int:
        self.kinds.append(kind)
        self.parents.append(self.current())
        self.callers.append(self._caller())
        return len(self.kinds) - 1

    def _saving(self, call: int) -> contextlib.AbstractContextManager[Any]:
        return self.saving(call) if self.saving is not None else contextlib.nullcontext()

    def _caller(self) -> str:
        """The path of the innermost module running now (checkpoint is being called): the recorder's
        module stack, else the innermost Python frame of a method of a module of the model."""
        if self._rec is not None:
            stack = self._rec.module_stack.current
            return str(stack[-1][0]) if stack else ""
        if not self._paths:
            return ""
        import sys

        frame: Any = sys._getframe(1)
        while frame is not None:
            path = self._paths.get(id(frame.f_locals.get("self")))
            if path is not None:
                return path
            frame = frame.f_back
        return ""

    def _again(self, fn: Callable[..., Any], call: int) -> Callable[..., Any]:
        """``fn`` as checkpoint runs it again in the backward: the call is :meth:`current` meanwhile."""

        def again(*args: Any, **kwargs: Any) -> Any:
            self._open.append(call)
            self.runs += 1
            self._runs.append(self.runs)
            try:
                return fn(*args, **kwargs)
            finally:
                self._open.pop()
                self._runs.pop()

        return again

    def _enter(self, call: int, stamp: bool = False) -> None:
        import torch

        self._open.append(call)
        self._frames.append((call, len(self._nodes or ()), torch._C._autograd._get_sequence_nr()))
        self._traced.append(_traced_graph() if stamp else None)

    def _leave(self) -> None:
        import torch

        self._open.pop()
        call, start, first = self._frames.pop()
        traced = self._traced.pop()
        if traced is not None:
            graph, known = traced
            for n in graph.nodes:
                if n not in known:
                    n.meta.setdefault(STAMP, call)  # an inner call's nodes are the inner call's
        for n in (self._nodes or [])[start:]:
            if n.kind == "op":
                self.members.setdefault(n.name, call)  # an inner call's ops are the inner call's
                self.firsts.setdefault(call, n.name)
        bisect.insort(self.spans, (first, torch._C._autograd._get_sequence_nr(), call))

    def _call_of_seq(self, seq: int) -> int | None:
        """The innermost call whose forward made autograd node ``seq``."""
        i = bisect.bisect_right(self.spans, (seq, float("inf"), 0))
        while i > 0:
            i -= 1
            first, end, call = self.spans[i]
            if first <= seq < end:
                return call
        return None

    def mark(self, nodes: list[Node]) -> None:
        """Each op of a call: a forward op it recorded, a backward op of an autograd node its forward
        made (``attrs["checkpoint"]``, recompute nodes have theirs); then its region."""
        if not self.kinds:
            return
        for n in nodes:
            if n.kind != "op":
                continue
            if n.phase == "forward" and n.name in self.members:
                n.attrs["checkpoint"] = self.members[n.name]
            elif n.phase == "backward" and "seq_nr" in n.attrs:
                call = self._call_of_seq(n.attrs["seq_nr"])
                if call is not None:
                    n.attrs["checkpoint"] = call
        one_region_per_call(nodes)


__all__ = ["STAMP", "Checkpoints", "add_region", "common_depth", "one_region_per_call"]
