"""The trace being built: one :class:`Recorder` per capture turns each call the modes hand it into a
:class:`~fxviz.ir.Node`.

For one call the recorder reads the tensor arguments' producers (:class:`~fxviz.fallback.tensors.Versions`,
creating parameter, buffer and constant nodes on first read), turns the other arguments into attrs
(:mod:`fxviz.fallback.values`), runs the call, and adds the node with the module stack, the user's
source line and a unique name (:mod:`fxviz.fallback.context`). What runs for every op of the
forward is one closure, :func:`~fxviz.fallback.observe.observer`, written for speed (a 300-layer
model runs about a thousand ops per capture); the recorder's methods it calls for the rare cases
(and everything else here) are written for reading.
"""

from __future__ import annotations

import sys
from math import isfinite
from typing import Any

import torch
from torch import nn

from fxviz.fallback.classify import BACKWARD_CALLS, Action, Kind, Level, kind_of, kinds
from fxviz.fallback.context import ModuleStack, Names, Sources
from fxviz.fallback.fsdp import FsdpParams, name_unsharded
from fxviz.fallback.observe import (
    PARAMETER_CALLS,
    PLAIN_TENSORS,
    TracerFault,
    claim,
    made_by_parameter,
    observer,
)
from fxviz.fallback.ownbackward import OwnBackward
from fxviz.fallback.statevalues import StateValues
from fxviz.fallback.tensors import ModelTensors, Place, Versions, tensor_meta, version
from fxviz.fallback.values import PLAIN_ITEMS, TUPLES, encode, has_opaque
from fxviz.ir import ModuleCall, Node, Ref, SourceLoc
from fxviz.torchbridge.guard import named_modules
from fxviz.torchbridge.walk import is_walk_of, state_of

_SKIP = Action.SKIP
_PLAIN_TYPES = frozenset({int, bool, str})
#: Tensors that are neither a DTensor nor a shard of one by their type alone. A parameter is looked
#: for among the sharded values only in a sharded run: outside one, asking a parameter for its
#: storage (:func:`~fxviz.fallback.tensors.place`) went through ``Parameter.__torch_function__`` on every first read.
_PLAIN_TENSORS = PLAIN_TENSORS


class Recorder(StateValues):
    """The trace being built: ``nodes`` in execution order, and what each records against.

    ``modules`` lists the model's submodules with their first path (one walk serves the recorder,
    the hooks and the graph's module table: a deep model's walk costs as much as hundreds of its
    ops). ``failed`` is the node of the op that raised, ``replay_blockers`` why a replay could not
    reproduce this trace.
    """

    def __init__(
        self, model: nn.Module, level: Level, *, snapshot_buffers: bool,
        named: list[tuple[str, nn.Module]] | None = None, fake: bool = False, own_backward: bool = False,
    ) -> None:
        self.level = level
        self.aten = level == "aten"
        self.fake = fake  #: the run is on fake tensors (:meth:`parameters_own`)
        self._in_parameter = False  # ATen level: nn.Parameter's own call on a fake tensor runs
        self.nodes: list[Node] = []
        named = named if named is not None else named_modules(model, remove_duplicate=False)
        first: dict[int, tuple[str, nn.Module]] = {}
        for path, m in named:
            first.setdefault(id(m), (path, m))  # a shared module keeps its first path
        self.modules = list(first.values())
        #: a module met under two paths: its tensors have two names each (see :attr:`may_tie`)
        self._shared_modules = len(self.modules) < len(named)
        self.module_stack = ModuleStack(self.nodes, self.call_without_ops)
        #: module calls other threads made, ``(stack, thread name)``: appended by those threads,
        #: turned into nodes by the capturing thread (:meth:`flush_elsewhere`)
        self.elsewhere: list[tuple[tuple[ModuleCall, ...] | None, str]] = []
        self._classes: dict[str, str] | None = None
        self.names = Names()
        self.sources = Sources()
        self.versions = Versions()
        self._values = self.versions.values  # every op reads and writes it: one lookup less
        self._sharded: dict[Place, Ref] = {}  # DTensor shards
        #: the storages without data (meta, fake) :attr:`_sharded` is keyed by: held while recording,
        #: so no later storage takes a freed one's address (and its key)
        self._held: list[Any] = []
        self.placements: dict[Any, Any] = {}  # placement_attrs' cache, for this recording only (it holds meshes)
        self._by_path: dict[str, nn.Module] | None = None  # module path -> module, made on first need
        self._fsdp: FsdpParams | None = None  # FSDP2's parameters, looked for on first need
        self.state = ModelTensors(self.modules, snapshot_buffers=snapshot_buffers,  # names: the capture's shared walk
                                  state=state_of(model) if is_walk_of(named, model) else None, made=self._values.get)
        self.failed: Node | None = None
        self.failed_stack: tuple[ModuleCall, ...] = ()
        self.replay_blockers: list[str] = []
        self._kinds = kinds(level)
        # ATen level: the torch-function call running now, and a counter per call name
        self.call: list[str] | None = None
        self._call_ids: dict[str, int] = {}
        self._arg_names: dict[Any, list[str]] = {}  # ATen op -> its schema's argument names
        #: the collectives run inside the call being recorded now (``dist.all_reduce``, DTensor's
        #: redistributions in an op on DTensors), each its record and the tensors it filled: the
        #: call's node takes them (:func:`~fxviz.fallback.observe.claim`)
        self.inner_collectives: list[tuple[dict[str, Any], list[torch.Tensor]]] = []
        #: the hot path: ``observed(mode, func, types, args, kwargs)`` runs one call and records it
        #: (at function level, the recording mode's ``__torch_function__`` itself)
        #: a backward the forward runs itself (a pipeline schedule's step): its autograd nodes
        self.own_backward = OwnBackward(self) if own_backward and not self.aten else None
        self.observed = observer(self)

    def finish(self) -> None:
        """The forward returned: bind its last in-place writes (ATen level) before outputs are read."""
        self.versions.finish_pending()
        self.flush_elsewhere()
        if self._fsdp is not None:
            name_unsharded(self._fsdp.unsharded_dtensors(), self.nodes, self._values, self.names.unique)

    def close(self) -> None:
        """The trace is over: drop the module stack, whose callback into the recorder is a
        reference cycle. The recorder and its map of every tensor the forward made (a tuple, a list
        and a weak reference each: ~4,000 objects for 900 ops) are then freed by reference counting
        when the trace returns, instead of waiting for the collector, whose young generation a
        capture walks when it ends (``capture_session``)."""
        self.module_stack = ModuleStack()
        self.observed = _closed
        if self.own_backward is not None:
            self.own_backward.close()

    # ---- module calls without ops ------------------------------------------------------------

    def module_class(self, path: str) -> str:
        if self._classes is None:
            self._classes = {p: type(m).__name__ for p, m in self.modules}
        return self._classes.get(path, "")

    def call_without_ops(self, stack: tuple[ModuleCall, ...], attrs: dict[str, Any] | None = None) -> None:
        """A module call that recorded nothing (an eval-mode ``Dropout`` at ATen level, an
        ``Identity``) is a node of kind ``call``: every module that ran is in the graph."""
        path = stack[-1][0]
        self.nodes.append(Node(
            self.names.unique(path.rpartition(".")[2] or "call"), "call", target=self.module_class(path),
            stack=stack, attrs=attrs or {},
        ))

    def ran_elsewhere(self, stack: tuple[ModuleCall, ...] | None, thread: str) -> None:
        """Another thread called a module (runs in that thread: only appends)."""
        self.elsewhere.append((stack, thread))

    def flush_elsewhere(self) -> None:
        """Module calls other threads made become ``call`` nodes that say their ops were not seen."""
        while self.elsewhere:
            stack, thread = self.elsewhere.pop(0)
            if stack:
                self.call_without_ops(stack, {
                    "thread": thread, "unseen": "ran in another thread: its ops were not recorded"})
                if not self.replay_blockers or "thread" not in self.replay_blockers[-1]:
                    self.replay_blockers.append("runs modules in another thread, whose ops were not recorded")

    # ---- collectives ---------------------------------------------------------------------------

    def in_recorded_call(self) -> bool:
        """Whether a call the recorder was handed is running now (its frame, the hot path's, is on
        the stack): a collective dispatched then belongs to that call's node. Asked only per
        collective; torch's function-mode stack cannot tell, being empty under any dispatch mode."""
        code = self.observed.__code__
        f: Any = sys._getframe(1)
        while f is not None:
            if f.f_code is code:
                return True
            f = f.f_back
        return False

    def collective(
        self, func: Any, reads: list[torch.Tensor], writes: list[torch.Tensor], attrs: dict[str, Any],
    ) -> Node:
        """A collective dispatched outside every call the recorder was handed (a process group's
        own method, ``group.allreduce([t])``: a ``c10d`` op that no torch-function mode sees; the
        collectives' recorder hands it here once it ran; ``dist.all_reduce`` is a recorded call).
        Its node reads ``reads`` (what it sends) and is the producer of ``writes`` (what it
        filled), so the ops after it read its result."""
        inputs = tuple(self.read_at(t, version(t)) for t in reads)
        node = Node(
            self.names.unique(str(attrs.get("collective") or "collective")), "op",
            target=str(func._overloadpacket), inputs=inputs, stack=self.module_stack.current,
            outputs=tuple(tensor_meta(t) for t in writes), source=self.sources.find(), attrs=attrs,
        )
        self.nodes.append(node)
        for k, t in enumerate(writes):
            self._values[t] = [Ref(node.name, k), version(t)]
        self.versions.wrote(node, tuple(writes), writes, deferred=False)
        self.replay_blockers.append("runs a collective (c10d), which a replay outside the process group cannot repeat")
        return node

    # ---- one call ------------------------------------------------------------------------------

    def observe(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run one call and record it: the handler of the recording mode, at either level
        (:func:`~fxviz.fallback.observe.observer`: the hot path)."""
        return self.observed(None, func, None, args, kwargs)

    def before_write(
        self, kind: Kind, args: tuple[Any, ...], kwargs: dict[str, Any],
        seen: list[tuple[torch.Tensor, int]], mutated: tuple[int, ...],
    ) -> None:
        """A call that may write its arguments is about to run: let the model state copy what of
        the model's it may write (ATen level: exactly what the schema says it writes)."""
        if self.aten:
            self.state.before_write([seen[i][0] for i in mutated if i < len(seen)])
        elif kind.target in BACKWARD_CALLS:
            self.state.before_backward()
            if self.own_backward is not None:
                self.own_backward.before(kind.target, args, kwargs)
        else:
            self.state.before_write(args)
            self.state.before_write(kwargs.values())

    def observe_call(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """ATen level: run a torch-function call with :attr:`call` on it, so each ATen op it runs is
        tagged with it (``torch_fn``, as export tags its nodes) and a comparison can fold them back."""
        try:
            if kind_of(func, "function").target in BACKWARD_CALLS:
                self.state.before_backward()
            own = self.fake and func in PARAMETER_CALLS and made_by_parameter(args)
            call = None if own else self.call_of(func)
        except Exception as e:
            raise TracerFault(f"tracer failed before {func!r}") from e
        if own:
            self._in_parameter = True
            try:
                return func(*args, **kwargs)
            finally:
                self._in_parameter = False
        if call is None:
            return func(*args, **kwargs)
        outer, self.call = self.call, call
        try:
            return func(*args, **kwargs)
        finally:
            self.call = outer

    def parameters_own(self, args: tuple[Any, ...]) -> bool:
        """Whether a :data:`~fxviz.fallback.observe.PARAMETER_CALLS` call is ``nn.Parameter``'s own
        on a fake tensor, not the model's (:func:`~fxviz.fallback.observe.made_by_parameter`): at
        ATen level, whether it runs inside such a call, which the function-level mode saw."""
        return self._in_parameter if self.aten else made_by_parameter(args)

    def call_of(self, func: Any) -> list[str] | None:
        """``[call id, target]`` of a torch-function call about to run, the key its ATen ops are
        grouped by (as export's ``torch_fn``); ``None`` for a metadata query."""
        kind = kind_of(func, "function")
        if kind.action is _SKIP:
            return None
        n = self._call_ids.get(kind.name, 0) + 1
        self._call_ids[kind.name] = n
        return [f"{kind.name}_{n}", kind.target]

    def collect_rest(
        self, args: tuple[Any, ...], start: int, kwargs: dict[str, Any], names: list[str] | None,
        inputs: list[Ref], attrs: dict[str, Any], seen: list[tuple[torch.Tensor, int]],
    ) -> None:
        """The arguments of a call from positional ``start`` on, and its keyword arguments, the
        hot path left (it reads tensors and plain scalars): into ``inputs`` in argument order
        (tensors nested in a list or a dict too), JSON-safe ``attrs``, and ``seen``, the tensor
        arguments with their versions (to see afterwards which ones the call wrote)."""
        exact: dict[str, Any] | None = None
        read: Any = None  # the callback encode() reads nested tensors with: made on first need
        opaque = False  # encode() made an exact form that may hold an opaque value (see has_opaque)
        for i in range(start, len(args)):
            a = args[i]
            if isinstance(a, torch.Tensor):
                v = version(a)
                inputs.append(self.read_at(a, v))
                seen.append((a, v))
                continue
            key = names[i] if names is not None and i < len(names) else f"arg{i}"
            if a is None or type(a) in _PLAIN_TYPES or (type(a) is float and isfinite(a)):  # exact as shown
                attrs[key] = a
                continue
            if type(a) in TUPLES:  # a shape, dims: encode()'s plain tuple, without a reader or a call
                for x in a:
                    if type(x) not in PLAIN_ITEMS:
                        break
                else:
                    items = list(a)
                    attrs[key] = items
                    exact = exact or {}
                    exact[key] = {"tuple": items}
                    continue
            read = read or self._reader(inputs, seen)
            display, ex = encode(a, read)
            attrs[key] = display
            if ex is not None:
                exact = exact or {}
                exact[key] = ex
                opaque = True
        for key, a in kwargs.items():
            if a is None or type(a) in _PLAIN_TYPES or (type(a) is float and isfinite(a)):
                attrs[key] = a
                continue
            if isinstance(a, torch.Tensor):  # layer_norm's weight=: encode()'s tensor case, without a reader
                v = version(a)
                ref = self.read_at(a, v)
                inputs.append(ref)
                seen.append((a, v))
                attrs[key] = f"%{ref.node}"
                exact = exact or {}
                exact[key] = {"tensor": ref.node}
                continue
            read = read or self._reader(inputs, seen)
            display, ex = encode(a, read)
            attrs[key] = display
            if ex is not None:
                exact = exact or {}
                exact[key] = ex
                opaque = True
        if exact is not None:
            attrs["py"] = exact
            # the exact forms made here (a plain tuple, a tensor) hold nothing opaque: only those
            # encode() made are looked into, and a keyword argument called "opaque"
            if (opaque or "opaque" in exact) and has_opaque(exact):
                self.replay_blockers.append("passes a value replay cannot rebuild (a callable?)")

    def _reader(self, inputs: list[Ref], seen: list[tuple[torch.Tensor, int]]) -> Any:
        """The callback :func:`~fxviz.fallback.values.encode` reads the tensors inside an argument
        (a list of tensors, a tensor in a dict) with: each is an input of the call."""

        def read(t: torch.Tensor) -> Ref:
            v = version(t)
            r = self.read_at(t, v)
            inputs.append(r)
            seen.append((t, v))
            return r

        return read

    def record_failure(
        self, kind: Kind, inputs: list[Ref], attrs: dict[str, Any],
        source: SourceLoc | None, exc: BaseException,
    ) -> None:
        if self.call is not None:
            attrs["torch_fn"] = self.call
        node = Node(
            self.names.unique(kind.name), "op", target=kind.target, inputs=tuple(inputs),
            stack=self.module_stack.current, source=source, attrs=attrs,
            error=f"{type(exc).__name__}: {exc}",
        )
        self.nodes.append(node)
        self.failed = node
        if self.inner_collectives:
            claim(node, self.inner_collectives)


__all__ = ["Recorder", "TracerFault"]


def _closed(mode: Any, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
    """What a closed recorder does with a call: run it, record nothing."""
    return func(*args, **(kwargs or {}))
