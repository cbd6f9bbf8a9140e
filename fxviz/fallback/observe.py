"""The recorder's hot path: one call in, one node out, as a single closure per recorder.

:func:`observer` returns the function the recording mode calls for every call of the forward (at
function level it *is* the mode's ``__torch_function__``: torch calls it with no frame of ours in
between). Everything it reads on every op (the recorder's tables, the module stack, the node list)
is bound once as a closure variable, and reading the arguments, finding the user's line and adding
the node run in this one frame: a 300-layer model runs about a thousand ops per capture, and each
Python call or attribute lookup saved here is saved a thousand times. What is rare (arguments that
are neither tensors nor plain scalars, keyword arguments, a write, a failing call, a sharded value)
goes to the recorder's methods, written for reading.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from math import isfinite
from typing import Any
from weakref import ref as _weakref

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from fxviz.fallback.classify import Action, classify, written_tensors
from fxviz.fallback.context import MODEL_CALLERS
from fxviz.fallback.tensors import CPU_METAS, METAS, tensor_meta, version
from fxviz.ir import Node, Ref
from fxviz.ops import DROPOUTS, RANDOM
from fxviz.torchbridge.distributed import placement_attrs, spec_attrs
from fxviz.torchbridge.source import is_fxviz_file, is_user_file

# Bound once: ``Action.SKIP`` is an attribute lookup on the enum class, ~150 ns on Python 3.11; a
# module global compared with ``is`` costs ~30 ns.
_SKIP, _EXIT = Action.SKIP, Action.EXIT
_PLAIN_TYPES = frozenset({int, bool, str})
#: Tensors that are neither a DTensor nor a shard of one by their type alone (see ``Recorder.read_at``).
PLAIN_TENSORS = frozenset({torch.Tensor, nn.Parameter})
#: the attrs key of positional argument ``i`` when its name is unknown (``arg0``, ...): no f-string per op
_ARG_KEYS = tuple(f"arg{i}" for i in range(16))
#: the kwargs of a call made without any (never written: read, and passed on with ``**``)
_NO_KWARGS: dict[str, Any] = {}


class TracerFault(Exception):
    """Raised when the tracer's own bookkeeping fails, so it is never mistaken for the model's
    error; :func:`~fxviz.fallback.trace.trace_eager` turns it back into the original exception."""


def observer(rec: Any) -> Callable[..., Any]:
    """``rec``'s handler ``(mode, func, types, args=(), kwargs=None)``: run one call and record it,
    at either level (``rec``: a :class:`~fxviz.fallback.recorder.Recorder`). A failure of our own
    bookkeeping is a :class:`TracerFault`, never mistaken for the model's error; an exception
    from the call itself marks the node and propagates unchanged.

    The closure holds ``rec`` (a reference cycle while ``rec`` holds it: ``Recorder.close`` breaks
    it). ``rec.module_stack`` and ``rec.nodes`` must stay the same objects while it records."""
    aten, level = rec.aten, rec.level
    kinds = rec._kinds
    kinds_get = kinds.get
    versions = rec.versions
    values = rec._values._d
    values_get = values.get
    sharded = rec._sharded
    nodes = rec.nodes
    add_node = nodes.append
    names = rec.names
    next_of, taken = names._next, names._taken
    sources = rec.sources
    user_code = sources._user_code
    user_get = user_code.get
    arg_names = rec._arg_names
    stack = rec.module_stack
    state_node, sharded_value, collect_rest = rec._state_node, rec._sharded_value, rec.collect_rest
    blockers = rec.replay_blockers
    metas_get = METAS.get
    cpu_metas = CPU_METAS
    cpu_metas_get = cpu_metas.get
    tensor = torch.Tensor
    getframe = sys._getframe
    placements = rec.placements
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)  # None: no DTensor exists yet
    inner = rec.inner_collectives  # collectives the running call dispatched (a sharded capture's)
    fake = rec.fake  # a run on fake tensors: nn.Parameter's own calls on them are not the model's
    own = rec.own_backward  # a backward the forward runs: the grad_fn of what is recorded under grad
    grad_on = torch.is_grad_enabled

    def observe(
        mode: Any, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        if kwargs is None:
            kwargs = _NO_KWARGS
        try:
            if aten and versions.pending:
                versions.finish_pending()
            kind = kinds_get(func)
            if kind is None:
                kind = kinds[func] = classify(func, level)
            skip = kind.action is _SKIP
            if fake and func in PARAMETER_CALLS and not skip:
                skip = rec.parameters_own(args)
            if not skip:
                # the arguments: tensors become inputs (the common case, read here without a call),
                # plain scalars attrs; anything else from there on is the recorder's (collect_rest)
                arg_keys: Any = _ARG_KEYS
                if aten:
                    arg_keys = arg_names.get(func)
                    if arg_keys is None:
                        arg_keys = arg_names[func] = [a.name for a in func._schema.arguments]
                inputs: list[Ref] = []
                attrs: dict[str, Any] = {}
                seen: list[tuple[torch.Tensor, int]] = []
                i = 0
                for a in args:
                    if isinstance(a, tensor):
                        try:
                            v = a._version
                        except RuntimeError:  # an inference tensor
                            v = 0
                        e = values_get(id(a))
                        if e is not None and e[0]() is a:
                            known = e[1]
                            inputs.append(known[0] if known[1] == v else versions.changed(a, known, v))
                        else:
                            ref = sharded_value(a) if sharded or type(a) not in PLAIN_TENSORS else None
                            inputs.append(ref if ref is not None else state_node(a))
                        seen.append((a, v))
                    elif a is None or type(a) in _PLAIN_TYPES or (type(a) is float and isfinite(a)):
                        attrs[arg_keys[i] if i < len(arg_keys) else f"arg{i}"] = a
                    else:
                        break
                    i += 1
                if kwargs or i < len(args):
                    collect_rest(args, i, kwargs, None if arg_keys is _ARG_KEYS else arg_keys, inputs, attrs, seen)
                # the user's line: the innermost user frame inside the model's call (Sources.find, inlined)
                source = None
                f: Any = getframe(1)
                while f is not None:
                    code = f.f_code
                    c = user_get(id(code))
                    if c is None or c[0] is not code:
                        u = -1 if code in MODEL_CALLERS else int(is_user_file(code.co_filename))
                        c = user_code[id(code)] = (code, u, {}, {})
                    if c[1] < 0:  # the model's caller: the rest is outside the model
                        break
                    if c[1]:
                        source = c[2].get(f.f_lasti)  # by instruction: f_lineno scans the line table
                        if source is None:
                            source = c[2][f.f_lasti] = sources.at(code, f.f_lineno, c[3])
                        break
                    f = f.f_back
                mutated = written_tensors(func, args, kwargs, arg_keys) if aten else ()
                when = kind.writes_when
                if kind.writes or (when is not None and when(args, kwargs)) or (kwargs and "out" in kwargs):
                    rec.before_write(kind, args, kwargs, seen, mutated)
        except Exception as e:
            raise TracerFault(f"tracer failed before {func}") from e
        # ``func(*args, **kwargs)`` builds a new dict even from an empty one: most calls have no kwargs
        if skip:
            return func(*args, **kwargs) if kwargs else func(*args)
        try:
            out = func(*args, **kwargs) if kwargs else func(*args)
        except Exception as e:
            rec.record_failure(kind, inputs, attrs, source, e)
            raise
        try:
            # the node, unless the call computed nothing a graph shows
            action = kind.action
            out_sharded = None
            if isinstance(out, tensor):
                outs: tuple[Any, ...] = (out,)
                metas: tuple[Any, ...] | None
                if type(out) is tensor and out.is_cpu:  # no torch.device made and hashed per op
                    metas = cpu_metas_get((out.shape, out.dtype))  # one outputs tuple per shape, shared
                    if metas is None:
                        metas = cpu_metas[out.shape, out.dtype] = (tensor_meta(out),)
                else:
                    meta = metas_get((out.shape, out.dtype, out.device))  # tensor_meta(), inlined
                    metas = (meta if meta is not None else tensor_meta(out),)
                has_tensor = True
                if type(out) is not tensor:
                    if type(out) is dtensor:  # where it lives, by its spec (placement_attrs's)
                        attrs.update(spec_attrs(out._spec, placements))  # type: ignore[attr-defined]
                        out_sharded = out
                    elif hasattr(out, "placements"):  # a DTensor's subclass
                        attrs.update(placement_attrs(out, placements))
                        out_sharded = out
            else:
                if isinstance(out, (tuple, list)) and action is not _EXIT:
                    outs = tuple(out)
                else:
                    outs = (out,) if out is not None else ()
                has_tensor = any(isinstance(o, tensor) for o in outs)
                metas = ()
            written: list[torch.Tensor] | None = None
            if aten:
                written = [seen[i][0] for i in mutated if i < len(seen)]
            elif seen:
                try:  # the version counters again: a call that moved one wrote that tensor
                    for t, v in seen:
                        if t._version != v:
                            written = [t for t, v in seen if t._version != v]
                            break
                except RuntimeError:  # an inference tensor: no counter, never written
                    written = [t for t, v in seen if version(t) != v] or None
            if kind.schema_op is not None:  # a torch.ops op: what its schema says it wrote
                written = schema_writes(written, kind.schema_op, args, kwargs, seen)
            if inner:  # the collectives it ran filled tensors, moving no version counter (c10d's)
                written = collective_writes(written, inner)
            if not (has_tensor or written or inner or action is _EXIT):
                return out
            short = kind.name
            n = next_of.get(short, 0)  # Names.unique(), inlined for a name not taken yet
            name = short if n == 0 else f"{short}_{n}"
            if name in taken:
                name = names.unique(short)
            else:
                next_of[short] = n + 1
                taken.add(name)
            node = Node(
                name, "op", kind.target, tuple(inputs), stack.current,
                metas or tuple([tensor_meta(o) for o in outs]), source, attrs,
            )
            if action is _EXIT:
                attrs["data_dependent"] = True
            if rec.call is not None:
                attrs["torch_fn"] = rec.call
            elif not written and seen and outs and outs[0] is seen[0][0]:
                # a call that hands back its input (``contiguous()`` on a contiguous tensor, eval-mode
                # dropout): export records nothing for it, and a comparison needs to know why
                attrs["returns_input"] = True
            elif short in RANDOM or (short in DROPOUTS and _dropout_active(attrs)):
                blockers.append(f"{kind.target} draws random numbers")
            add_node(node)
            if own is not None and grad_on():
                own.note(args, outs, name)
            if inner:
                claim(node, inner)
            if metas:
                try:
                    v = out._version
                except RuntimeError:  # an inference tensor
                    v = 0
                values[id(out)] = (_weakref(out), [Ref(name), v])  # TensorMap.__setitem__, inlined
                if out_sharded is not None:
                    rec._note_sharded(out_sharded, Ref(name))
            else:
                for k, o in enumerate(outs):
                    if isinstance(o, tensor):
                        values[id(o)] = (_weakref(o), [Ref(name, k), version(o)])
            if written:
                versions.wrote(node, outs, written, deferred=aten)
        except Exception as e:
            raise TracerFault(f"tracer failed after {func}") from e
        return out

    return observe


#: What ``nn.Parameter(t)`` calls on a tensor of a subclass (``t.detach().requires_grad_()``), at
#: either level; on a plain tensor it calls ``Tensor._make_subclass``, which no mode sees.
PARAMETER_CALLS = frozenset({torch.Tensor.detach, torch.Tensor.requires_grad_, torch.ops.aten.detach.default})
_PARAMETER_NEW = nn.Parameter.__new__.__code__


def made_by_parameter(args: tuple[Any, ...]) -> bool:
    """Whether a :data:`PARAMETER_CALLS` call on ``args`` is ``nn.Parameter``'s own on a fake
    tensor: where the real run makes the parameter of a plain tensor (FSDP2's unsharded parameter,
    made in the step on a model sharded on ``meta``: :func:`fxviz.fallback.fsdp.fake_shards`),
    which runs no op; a fake tensor, a subclass, takes ``Parameter``'s other way, through these
    calls. The run on fake tensors is fxviz's, so they are not recorded: the graph holds the ops
    the real run holds. Decided by the first frame above fxviz's own (the function-level mode's:
    ATen ops ask :meth:`~fxviz.fallback.recorder.Recorder.parameters_own`)."""
    if not args or type(args[0]) is not FakeTensor:
        return False
    f: Any = sys._getframe(2)
    while f is not None and is_fxviz_file(f.f_code.co_filename):
        f = f.f_back
    return f is not None and f.f_code is _PARAMETER_NEW


def schema_writes(
    written: list[torch.Tensor] | None, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
    seen: list[tuple[torch.Tensor, int]],
) -> list[torch.Tensor]:
    """``written`` and the tensor arguments the schema of ``op`` (a ``torch.ops`` overload called
    at function level) says the call wrote."""
    out = list(written or ())
    names = [a.name for a in op._schema.arguments]
    for i in written_tensors(op, args, kwargs, names):
        if i < len(seen) and not any(seen[i][0] is w for w in out):
            out.append(seen[i][0])
    return out


def collective_writes(written: list[torch.Tensor] | None, inner: list[tuple[Any, list[torch.Tensor]]]) -> list[torch.Tensor]:
    """``written`` and the tensors the collectives a call ran filled (``inner``: record and tensors):
    the call is their writer (``dist.all_reduce`` writes its argument, but neither c10d nor its
    schema says so)."""
    out = list(written or ())
    for _, tensors in inner:
        out.extend(t for t in tensors if not any(t is w for w in out))
    return out


def claim(node: Node | None, inner: list[tuple[dict[str, Any], list[torch.Tensor]]]) -> None:
    """The collectives a call ran inside it (``inner``, emptied) belong to its node: the collective
    call itself (``dist.all_reduce``, a functional collective, a ``dist.send`` that returns and
    writes nothing), or the op on DTensors whose redistribution ran them. A failed call's node
    takes them too; without a node they stay records of their module and line."""
    if node is not None:
        for r, _ in inner:
            r["node"] = node.name
    inner.clear()


def _dropout_active(attrs: dict[str, Any]) -> bool:
    training = attrs.get("training", attrs.get("arg2", attrs.get("train", True)))
    p = attrs.get("p", attrs.get("arg1", 0.5))
    return bool(training) and p != 0


__all__ = ["PARAMETER_CALLS", "PLAIN_TENSORS", "TracerFault", "made_by_parameter", "observer"]
