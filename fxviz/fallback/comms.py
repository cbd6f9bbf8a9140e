"""Record the collectives a run issues: kind, process group, mesh dimension, bytes, module, line.

DTensor inserts its collectives at dispatch level, below the tracer's torch-function mode, as the
same ``_c10d_functional`` ops a user's functional collectives are; ``dist.all_reduce`` and FSDP2
reach dispatch as ``c10d`` ops. :class:`CommRecorder` is a light dispatch mode that lets DTensor
desugar (it declines DTensor ops, as torch's ``CommDebugMode`` does) and looks at nothing but
those collective ops: the module call and the user's source line come from fxviz's tracer, which
already keeps both (:data:`fxviz.fallback.modes.ACTIVE`). ``CommDebugMode`` installs module hooks
and inspects every op, which made a sharded capture cost several times an unsharded one; it stays
the tests' oracle (same ops counted: :data:`COLLECTIVES`). The records are plain dicts (torch-free)
that :mod:`fxviz.passes.comm` writes onto the graph.
"""

from __future__ import annotations

import contextlib
import traceback
from types import BuiltinFunctionType
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug._comm_mode import NATIVE_TO_PY_MAPPING, c10d_collective_ops
from torch.utils._python_dispatch import TorchDispatchMode

from fxviz.fallback.classify import Action, kind_of
from fxviz.fallback.commfail import first_line
from fxviz.fallback.fsdp import gathered_params, reduced_grads
from fxviz.fallback.modes import ACTIVE, AROUND, around_recordings
from fxviz.torchbridge.source import is_fxviz_file, is_user_file

#: the op packets counted as collectives: exactly ``CommDebugMode``'s (its registry and torch's c10d ops)
COLLECTIVES = frozenset({*NATIVE_TO_PY_MAPPING, *NATIVE_TO_PY_MAPPING.values(), *c10d_collective_ops,
                         torch.ops._dtensor.shard_dim_alltoall})

#: point-to-point ops (``dist.send``/``recv``/``isend``/``irecv``, ``batch_isend_irecv``, a pipeline
#: stage's activations): recorded too, with their peer (``CommDebugMode`` counts none of them)
P2P = frozenset({torch.ops.c10d.send, torch.ops.c10d.recv_, torch.ops.c10d.recv_any_source_})
#: the peer's position among a point-to-point op's arguments (its rank in the op's group)
_PEER = {torch.ops.c10d.send: 2, torch.ops.c10d.recv_: 2}

#: every overload of those packets: what the recorder's dispatch checks each op against
_OVERLOADS = frozenset(getattr(p, name) for p in COLLECTIVES | P2P for name in p.overloads())
#: their ids (an overload is one object per op, held here): ``OpOverload.__hash__`` is Python code,
#: which a set look-up on every op of a sharded forward paid for
_OVERLOAD_IDS = frozenset(map(id, _OVERLOADS))

#: the waits on a functional collective: where one that failed raises (any other op that raises
#: is the model's own error, no collective's)
_WAITS = frozenset(getattr(p, name) for p in (torch.ops._c10d_functional.wait_tensor,) for name in p.overloads())

#: the receives: the tensors they are given are only filled
_RECVS = frozenset({torch.ops.c10d.recv_, torch.ops.c10d.recv_any_source_})

#: op packet -> the position of the tensors each rank sends: ``c10d``'s gathers and scatters take
#: the output first, then the input
SENDS = {p: 1 if p.default._schema.arguments[0].name.startswith("output") else 0 for p in COLLECTIVES | P2P}

#: op name fragments -> collective kind
KINDS = (("all_reduce", "all_reduce"), ("allreduce", "all_reduce"), ("reduce_scatter", "reduce_scatter"),
         ("all_gather", "all_gather"), ("allgather", "all_gather"), ("all_to_all", "all_to_all"),
         ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("send", "send"), ("recv", "recv"))

_HOP = torch._ops.HigherOrderOperator


def _kind(op: str) -> str:
    for frag, kind in KINDS:
        if frag in op:
            return kind
    return op


def _bytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_bytes(y) for y in x)
    return 0


def _tensors(x: Any) -> list[torch.Tensor]:
    """The tensors of an argument: a tensor, or a list of them (of lists: ``allgather_``'s outputs)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    return []


def _writes(func: Any, args: tuple[Any, ...]) -> list[torch.Tensor]:
    """The tensors a ``c10d`` op fills: its first argument, for every op named in place
    (``allreduce_``, ``_allgather_base_``'s output, ``recv_``). Their schemas mark no argument as
    written (:func:`~fxviz.fallback.classify.written_tensors` finds nothing), and their results
    are that argument, returned."""
    name = func._overloadpacket.__name__
    return _tensors(args[0]) if name.endswith("_") and args else []


def _resolve(name: str) -> Any:
    from torch.distributed.distributed_c10d import _resolve_process_group
    return _resolve_process_group(name)  # type: ignore[arg-type]


def _group(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, int]:
    """The process group's name and size: functional collectives take the name (a string, last
    after the reduce op), ``c10d`` ops the group itself (a ``ProcessGroup`` script object)."""
    for a in reversed((*args, *kwargs.values())):
        if isinstance(a, str):
            try:
                return a, _resolve(a).size()
            except Exception:  # noqa: BLE001 - a reduce op or tag, not a group name: look further
                continue
        if isinstance(a, torch.ScriptObject):
            try:
                pg = dist.ProcessGroup.unbox(a)
            except RuntimeError:  # another script object (the reduce op)
                continue
            return str(pg.group_name), int(pg.size())
    return "", 0


def _peer(packet: Any, args: tuple[Any, ...]) -> int:
    """A point-to-point op's peer, as a global rank (the op carries its rank in the group); -1 for a
    receive from any source."""
    at = _PEER.get(packet)
    if at is None or len(args) <= at:
        return -1
    rank = int(args[at])
    try:
        return int(dist.get_global_rank(dist.ProcessGroup.unbox(args[1]), rank))
    except Exception:  # noqa: BLE001 - a group torch's registry does not know: its own rank
        return rank


def _user_line() -> str:
    """The innermost user frame below fxviz's own: frames that called fxviz (the capture's caller)
    are not where the collective came from."""
    for fr in reversed(traceback.extract_stack()[:-3]):
        if is_user_file(fr.filename):
            return f"{fr.filename}:{fr.lineno}"
        if is_fxviz_file(fr.filename):
            return ""
    return ""


def mesh_dims(objs: Any, groups: Any = None) -> dict[str, str]:
    """Process group name -> mesh dimension name, for every named dimension of the device meshes
    (and their root meshes) the DTensors among ``objs`` (parameters, buffers, inputs) live on.

    ``groups``: the group names wanted (those a capture's collectives used); ``objs`` (an iterable,
    read lazily) is read only until each is named: a sharded model's first DTensor parameter
    usually names them all, and walking every parameter of a large model cost more than that."""
    out: dict[str, str] = {}
    wanted = set(groups) if groups is not None else None
    if wanted is not None and not wanted:
        return out
    seen: set[int] = set()
    for t in objs:
        mesh = getattr(t, "device_mesh", None) if isinstance(t, DTensor) else None
        if mesh is None or id(mesh) in seen:
            continue
        for m in (mesh, _root(mesh)):
            if m is None or id(m) in seen:
                continue
            seen.add(id(m))
            for i, name in enumerate(m.mesh_dim_names or ()):
                try:
                    out.setdefault(m.get_group(i).group_name, name)
                except Exception:  # noqa: BLE001 - a dimension without a group of its own (flattened)
                    continue
        if wanted is not None and wanted <= out.keys():
            break
    return out


def unused_ranks(objs: Any, world_size: int) -> str | None:
    """A note when the device mesh of the first DTensor among ``objs`` (its root mesh) holds fewer
    ranks than the world, or has a dimension of one rank: what it shards over that dimension moves
    nothing, and the other ranks hold no shard (a factory's ``(2, world // 2)`` mesh at world size
    3 is ``(2, 1)``: no collective at all, which is torch's answer too, but not the model's)."""
    mesh = next((getattr(t, "device_mesh", None) for t in objs if isinstance(t, DTensor)), None)
    mesh = _root(mesh) or mesh
    if mesh is None:
        return None
    shape, names = tuple(mesh.shape), mesh.mesh_dim_names or tuple(f"dim {i}" for i in range(mesh.ndim))
    text = " x ".join(f"{n}={k}" for n, k in zip(names, shape, strict=True))
    ones = [n for n, k in zip(names, shape, strict=True) if k == 1]
    out = sorted(set(range(world_size)) - {int(r) for r in mesh.mesh.flatten().tolist()})
    if not out and not ones:
        return None
    said = [f"rank{'s' if len(out) > 1 else ''} {', '.join(map(str, out))} hold{'' if len(out) > 1 else 's'} "
            "no shard"] if out else []
    said += [f"{n} has one rank: what is sharded over it moves nothing" for n in ones]
    return f"the device mesh ({text}) covers {world_size - len(out)} of the {world_size} ranks: {'; '.join(said)}"


def _root(mesh: Any) -> Any:
    if mesh is None:
        return None
    try:
        return mesh._get_root_mesh()
    except Exception:  # noqa: BLE001 - an older or newer DeviceMesh without it: the mesh itself
        return None


#: tensors of these types dispatch to ATen's own kernels: no subclass's Python runs under their ops
_PLAIN_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})

#: torch-function callable -> True where it is torch's own op, which dispatches no collective on
#: plain tensors (:func:`_own_op`)
_OWN_OPS: dict[Any, bool] = {}


def _own_op(func: Any) -> bool:
    """A metadata read, a ``Tensor`` method (but ``backward``, whose hooks may communicate),
    ``torch.nn.functional`` or a builtin ``torch.*`` function: its ATen ops on plain tensors are
    ATen's kernels. Not: ``torch.ops`` (the collectives themselves, custom ops with Python
    kernels), ``torch.distributed``, ``torch.autograd``, or anything that takes user code
    (``torch.cond``)."""
    kind = kind_of(func, "function")
    target = kind.target
    if kind.action is Action.SKIP:
        return True
    if "::" in target:
        return False
    if target.startswith("Tensor."):
        return kind.name != "backward"
    if target.startswith(("torch.nn.functional.", "torch.functional.")):
        return True
    return (type(func) is BuiltinFunctionType and target.startswith("torch.")
            and not target.startswith(("torch.distributed", "torch.autograd", "torch._C._distributed")))


def _plain(values: Any) -> bool:
    """No tensor among ``values`` (or in a list or tuple among them) is of a subclass."""
    for a in values:
        if isinstance(a, torch.Tensor):
            if type(a) not in _PLAIN_TENSORS:
                return False
        elif type(a) is list or type(a) is tuple:
            for x in a:
                if isinstance(x, torch.Tensor) and type(x) not in _PLAIN_TENSORS:
                    return False
    return True


def _skip_code() -> Any:
    """``code -> None`` marking a code object for Dynamo to run as it is, and every frame it calls
    (what ``torch._disable_dynamo(recursive=True)`` does per call, set once on the code, read by
    the frame evaluator only while a compiled region runs); ``None`` on a torch without it."""
    try:
        from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy
    except ImportError:  # pragma: no cover - older or newer torch: the wrapper stays
        return None
    skip = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    return lambda code: set_code_exec_strategy(code, skip)


_SKIP_CODE = _skip_code()


class CommRecorder(TorchDispatchMode):
    """A dispatch mode that keeps one record per collective (:attr:`records`), with the module and
    line of the tracer's current op; everything else passes through untouched.

    The function-level tracer turns it off for the calls :meth:`needs` says cannot issue a
    collective (:func:`fxviz.fallback.modes.recording`): torch's own ops on plain tensors, most of
    a tensor-parallel forward outside DTensor's linears; every ATen op paid a call into Python."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No ``torch._disable_dynamo`` wrapper around :meth:`__torch_dispatch__` (what
        ``TorchDispatchMode`` puts around a subclass's): it cost every op of a sharded forward two
        switches of the frame evaluator and a call to ``torch.compiler.is_exporting``; its code is
        marked for Dynamo to skip instead, with what it calls (:data:`_SKIP_CODE`)."""
        return not _SKIP_CODE

    def __init__(self, params: dict[int, str] | None = None) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []
        self.params = params or {}  # id -> name: whose gradient a hook on AccumulateGrad handles

    def needs(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> bool:
        """Whether the torch-function call ``func(*args, **kwargs)`` may dispatch a collective."""
        own = _OWN_OPS.get(func)
        if own is None:
            own = _OWN_OPS[func] = _own_op(func)
        return not (own and _plain(args) and (not kwargs or _plain(kwargs.values())))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # every op of the capture passes here (the model's, DTensor's local ones, the snapshot's):
        # one tuple and one set look-up before the op runs, nothing else for a non-collective
        if DTensor in types and not isinstance(func, _HOP):
            return NotImplemented  # let DTensor desugar into local ops and collectives, seen next
        if kwargs is None:
            kwargs = {}
        if id(func) not in _OVERLOAD_IDS:
            try:
                return func(*args, **kwargs)
            except Exception as e:  # the wait on a collective that failed: the last one issued is marked
                if func in _WAITS and self.records and "error" not in self.records[-1]:
                    self.records[-1]["error"] = first_line(e)
                raise
        args = tuple(args)
        rec = ACTIVE[-1] if ACTIVE and torch._C._current_graph_task_id() == -1 else None
        # the tracer records a forward collective: as the node of the call it runs in (DTensor's
        # inside an op, a functional collective inside its own call; at ATen level, every one), or,
        # called by the model's code itself (c10d ops reach no torch-function mode), as a node of its own
        inside = rec is not None and rec.in_recorded_call()
        writes = _writes(func, args) if rec is not None else []
        if writes:
            rec.state.before_write(writes)  # type: ignore[union-attr]  # the model's own tensors: put back after
        try:
            out = func(*args, **kwargs)
        except Exception as e:  # a collective that failed: recorded, and marked
            self._record(func, args, kwargs)
            self.records[-1].setdefault("error", first_line(e))
            if inside:
                rec.inner_collectives.append((self.records[-1], writes))  # type: ignore[union-attr]
            raise
        record = self._record(func, args, kwargs)
        if inside:
            rec.inner_collectives.append((record, writes))  # type: ignore[union-attr]
        elif rec is not None:
            p = func._overloadpacket
            sends = [] if p in _RECVS else _tensors(args[SENDS[p]])
            node = rec.collective(func, sends, writes, {"collective": record["kind"], "bytes": record["bytes"]})
            record["node"] = node.name
        return out

    def _record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        op = str(func._overloadpacket)
        group, size = _group(args, kwargs)
        module, source = "", ""
        backward = torch._C._current_graph_task_id() != -1  # also in the engine's final callbacks
        node = torch._C._current_autograd_node()
        if ACTIVE and not backward:
            rec = ACTIVE[-1]
            stack = rec.module_stack.current
            module = stack[-1][0] if stack else ""
            loc = rec.sources.find()
            source = f"{loc.file}:{loc.line}" if loc is not None else ""
        else:  # no tracer running (a capture method of its own): the stack says where
            source = _user_line()
        record = {
            "op": op, "kind": _kind(op), "group": group, "group_size": size,
            "bytes": _bytes(args[SENDS[func._overloadpacket]]) if args else 0, "module": module,
            "phase": "backward" if backward else "forward", "source": source,
        }
        if func._overloadpacket in P2P:
            record["peer"] = _peer(func._overloadpacket, args)
            if func._overloadpacket in _RECVS and dist.get_backend() == "fake":
                record["unfilled"] = True  # torch's fake group writes nothing into a receive's buffer
        if backward and record["kind"] == "reduce_scatter":
            grads = reduced_grads(self.params)  # FSDP2's: the gradients of a unit's parameters
            if grads:
                record["grads_of"] = grads
        elif backward and record["kind"] == "all_gather":
            gathered = gathered_params(self.params)  # FSDP2's re-gather of a unit's parameters
            if gathered:
                record["gathers_of"] = gathered
        if node is not None:  # the autograd node running (or about to, in its hooks): placed by the comm pass
            record["autograd_node"] = [type(node).__name__, node._sequence_nr()]
            var = getattr(node, "variable", None)  # AccumulateGrad: a gradient hook on a parameter
            if var is not None and id(var) in self.params:
                record["grad_of"] = self.params[id(var)]
        self.records.append(record)
        return record


if _SKIP_CODE is not None:
    _SKIP_CODE(CommRecorder.__torch_dispatch__.__code__)


def collectives_seen() -> contextlib.AbstractContextManager[Any]:
    """For a recording in a process the caller initialised a process group in (a compile map or a
    numerics run of a sharded model, a capture under ``torchrun``): a collectives' recorder around
    the model's run, unless one is there already (a sharded capture's). The tracer needs it for the
    graph itself: a ``c10d`` collective writes its tensors without moving their version counters
    or saying so in its schema, so only its dispatch tells the tracer that ``dist.all_reduce(y)``
    made a new ``y``."""
    if not dist.is_available() or not dist.is_initialized() or any(isinstance(cm, CommRecorder) for cm in AROUND):
        return contextlib.nullcontext()
    at = torch._C._get_dispatch_stack_at
    if any(isinstance(at(i), CommRecorder) for i in range(torch._C._len_torch_dispatch_stack())):
        return contextlib.nullcontext()  # on for the whole capture (a sharded training step's)
    return around_recordings(CommRecorder())


__all__ = ["COLLECTIVES", "P2P", "CommRecorder", "collectives_seen", "mesh_dims", "unused_ranks"]
