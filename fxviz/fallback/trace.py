"""``trace_eager``: run the model once under the recording modes and return what it executed as a
graph; set-up (inputs, fake tensors), the run, outputs, restoring the model, and the partial graph a
failing model leaves."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from itertools import chain
from operator import attrgetter, is_not
from typing import Any

import torch
from torch import nn

from fxviz.errors import ModelError, TargetError
from fxviz.fallback.classify import LEVELS, Level
from fxviz.fallback.context import MODEL_CALLERS
from fxviz.fallback.modes import module_hooks, recording
from fxviz.fallback.ownbackward import unseen_note
from fxviz.fallback.recorder import Recorder, TracerFault
from fxviz.fallback.tensors import tensor_meta
from fxviz.ir import Graph
from fxviz.torchbridge.checkpoint import Checkpoints
from fxviz.torchbridge.checks import forget_failed_compiles
from fxviz.torchbridge.distributed import wait_collectives
from fxviz.torchbridge.guard import DynamoCodes, named_modules
from fxviz.torchbridge.normalize import _describe, flatten_inputs, flatten_outputs
from fxviz.torchbridge.run import CAPTURE_LOCK, deep_enough, gc_paused
from fxviz.torchbridge.source import error_location
from fxviz.torchbridge.values import mark_tied, module_infos, output_node

_parameters_of, _buffers_of = attrgetter("_parameters"), attrgetter("_buffers")
_is_meta = attrgetter("is_meta")
_not_none = partial(is_not, None)


def uses_meta(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """True when the model's state or an input lives on ``meta``: real execution is impossible,
    fake tensors are needed."""
    # model.parameters() walks nested generators: the square of the nesting depth; a module met
    # twice is checked twice (cheaper than setting duplicates aside)
    modules = [m for _, m in named_modules(model, remove_duplicate=False)]
    for state in (map(_parameters_of, modules), map(_buffers_of, modules)):
        if any(map(_is_meta, filter(_not_none, chain.from_iterable(map(dict.values, state))))):
            return True
    return any(t.is_meta for t in flatten_inputs(model, args, kwargs).tensors)


def trace_eager(
    model: nn.Module,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    level: str = "function",
    fake: bool | FakeRun = False,
    grad: bool = False,
    watch: Callable[[Recorder], AbstractContextManager[Any]] | None = None,
    checkpoints: Checkpoints | None = None,
) -> Graph:
    """Run ``model(*args, **kwargs)`` once and return the graph of what it executed.

    ``level="function"`` records torch-function calls (``torch.nn.functional.linear``,
    ``Tensor.view``), ``level="aten"`` ATen ops (``aten.addmm.default``). ``fake=True`` runs under
    ``FakeTensorMode``: no real memory or compute, so a model built on ``meta`` traces too (a
:class:`FakeRun` the caller entered: ``args``/``kwargs`` are its, as around a training step). The
    forward runs under ``torch.no_grad()`` unless ``grad=True`` (for a forward that itself takes
    gradients): recording needs no autograd graph, and building one costs time and memory.
    ``watch(recorder)`` is entered inside the recording (:mod:`fxviz.fallback.backward`'s).
    ``torch.utils.checkpoint`` calls are regions (``checkpoints``, or one made here: see
    :mod:`fxviz.torchbridge.checkpoint`).

    The model and torch are left as found. If the model raises, :class:`~fxviz.errors.ModelError`
    carries the graph up to the failure (``err.graph``, failing op marked) and chains the original.

        >>> g = trace_eager(model, (x,))
        >>> g.method, g.ops[0].target
        ('eager', 'torch.nn.functional.linear')
    """
    if level not in LEVELS:
        raise TargetError(f"level {level!r} is not one of 'function', 'aten'")
    with CAPTURE_LOCK, deep_enough():  # one capture at a time: its hooks and modes are process-wide
        codes = DynamoCodes()
        try:
            return _trace(model, args, kwargs, level, fake, grad, watch, checkpoints or Checkpoints())
        finally:
            # ``torch.cond`` compiles its branches through Dynamo even in eager mode; code it marks
            # while our modes are on would make a later export of the model fail
            codes.restore()


def collectives_seen() -> AbstractContextManager[Any]:
    """:func:`fxviz.fallback.comms.collectives_seen` where a process group is initialised; nothing
    elsewhere, without importing it: DTensor's machinery, which it imports, adds hundreds of
    loggers and objects that every later capture of the process walks (~3.7 M instructions a
    capture of a 300-layer stack)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return contextlib.nullcontext()
    from fxviz.fallback.comms import collectives_seen as seen
    from fxviz.fallback.dtensor_calls import user_calls_seen

    stack = contextlib.ExitStack()
    stack.enter_context(seen())
    stack.enter_context(user_calls_seen())  # the model's own redistributions: nodes of their own
    return stack


class FakeRun:
    """The fake tensors a capture runs on: a ``FakeTensorMode`` (no real memory or compute), the
    inputs as its fake tensors (``args``, ``kwargs``; on ``meta`` where the model is) and, for an
    FSDP2 model sharded on ``meta``, its shards swapped for fake ones on the mesh's device while it
    is entered (:func:`fxviz.fallback.fsdp.fake_shards`). Entered once around what must run on them:
    a forward (:func:`trace_eager` makes its own) or a whole training step, forward and backward
    (:func:`fxviz.fallback.backward.trace_backward`); the model is put back on leaving."""

    def __init__(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 named: list[tuple[str, nn.Module]] | None = None) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.named = named if named is not None else named_modules(model, remove_duplicate=False)
        self.mode = FakeTensorMode(allow_non_fake_inputs=True)
        self.shards = _meta_shards(self.named)
        on_meta = not self.shards and any(p.is_meta for _, m in self.named for p in m._parameters.values()
                                          if p is not None)
        flat = flatten_inputs(model, args, kwargs)
        self.tensors = tuple(self.mode.from_tensor(t.to("meta") if on_meta else t) for t in flat.tensors)
        self.args, self.kwargs = flat.rebuild(self.tensors)
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> FakeRun:
        with contextlib.ExitStack() as stack:
            stack.enter_context(self.mode)
            stack.enter_context(_fake_shards(self.named, self.shards))
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc: Any) -> bool | None:
        return self._stack.__exit__(*exc)


def _trace(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None, level: str, fake: bool | FakeRun,
    grad: bool, watch: Callable[[Recorder], AbstractContextManager[Any]] | None = None,
    checkpoints: Checkpoints | None = None,
) -> Graph:
    lvl: Level = "aten" if level == "aten" else "function"
    kwargs = dict(kwargs or {})
    named = named_modules(model, remove_duplicate=False)
    rec = Recorder(model, lvl, snapshot_buffers=not fake, named=named, fake=bool(fake), own_backward=not grad)
    flat = flatten_inputs(model, args, kwargs)
    run: AbstractContextManager[Any] = contextlib.nullcontext()  # the caller's FakeRun, or none
    if fake is True:
        run = fake = FakeRun(model, args, kwargs, named)
        args, kwargs = fake.args, fake.kwargs
    tensors = fake.tensors if isinstance(fake, FakeRun) else flat.tensors
    for name, t in zip(flat.names, tensors, strict=True):
        rec.add_input(name, t)

    method = ("eager" if lvl == "function" else "eager-aten") + (" (fake)" if fake else "")
    graph = Graph(name=type(model).__name__, method=method, modules=module_infos(model, named))
    # a capture observes the forward, it does not train: no autograd graph to build (time and
    # memory the plain forward under no_grad does not spend either)
    grad_mode: Any = contextlib.nullcontext() if grad else torch.no_grad()
    try:
        with run, module_hooks(rec), gc_paused(), forget_failed_compiles(), collectives_seen():
            try:
                with (grad_mode, recording(rec), checkpoints.attach(rec) if checkpoints is not None else contextlib.nullcontext(),
                      watch(rec) if watch is not None else contextlib.nullcontext()):
                    out = model(*args, **kwargs)
            except Exception:
                rec.failed_stack = rec.module_stack.current
                raise
            rec.finish()
            _add_outputs(rec, out)
            wait_collectives(out)
    except TracerFault as e:
        raise (e.__cause__ or e) from None  # a tracer bug: the capture fails, not the model
    except Exception as e:
        if _beyond_the_tracer(e):
            raise
        if rec.may_tie:
            mark_tied(rec.nodes, model, named)
        graph.nodes = rec.nodes
        _note_unseen(graph, rec)
        if checkpoints is not None:
            checkpoints.mark(graph.nodes)
        raise _model_error(graph, rec, e) from e
    finally:
        rec.state.restore()
        rec.close()
    if rec.may_tie:
        mark_tied(rec.nodes, model, named)
    graph.nodes = rec.nodes
    _note_unseen(graph, rec)
    if checkpoints is not None:
        checkpoints.mark(graph.nodes)
    graph.annotations["replay"] = _replay_verdict(rec)
    return graph


def _note_unseen(graph: Graph, rec: Recorder) -> None:
    note = unseen_note(rec.own_backward)
    if note is not None:
        graph.notes.append(note)


def meta_sharded(model: nn.Module) -> bool:
    """True for an FSDP2 model sharded on ``meta``: it captures on fake shards on its mesh's
    device, with the inputs its factory made (:func:`fxviz.fallback.fsdp.fake_shards`)."""
    return bool(_meta_shards(list(model.named_modules(remove_duplicate=False))))


def _meta_shards(named: list[tuple[str, nn.Module]]) -> list[Any]:
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return []
    from fxviz.fallback.fsdp import meta_shards

    return meta_shards(named)


def _fake_shards(named: list[tuple[str, nn.Module]], states: list[Any]) -> AbstractContextManager[Any]:
    if not states:
        return contextlib.nullcontext()
    from fxviz.fallback.fsdp import fake_shards

    return fake_shards(named, states)


def _beyond_the_tracer(exc: BaseException) -> bool:
    """True when the forward failed because it compiles part of itself (``torch.cond`` runs its
    branches through ``torch.compile`` in eager mode) and the compiler cannot trace through a
    recording mode: a limit of this capture method, not an error of the model."""
    return type(exc).__module__.startswith("torch._dynamo") or "HigherOrderOperator" in str(exc)


def _add_outputs(rec: Recorder, out: Any) -> None:
    for path, v in flatten_outputs(out):
        if isinstance(v, torch.Tensor):
            node = output_node(rec.names.unique(path), path, rec.read(v), None)
            where = rec.sharded_attrs(v)
            if where:  # a DTensor: its own (global) shape and placement, not those of the shard it reads
                node.outputs, node.attrs = (tensor_meta(v),), {**node.attrs, **where}
            rec.nodes.append(node)
        else:
            rec.nodes.append(output_node(rec.names.unique(path), path, None, _describe(v)))


def _replay_verdict(rec: Recorder) -> dict[str, Any]:
    if rec.level != "function":
        return {"ok": False, "reason": "replay runs function-level graphs (method 'eager')"}
    if rec.replay_blockers:
        return {"ok": False, "reason": "; ".join(dict.fromkeys(rec.replay_blockers))}
    return {"ok": True}


def _model_error(graph: Graph, rec: Recorder, exc: Exception) -> ModelError:
    failed = rec.failed
    stack = failed.stack if failed is not None else rec.failed_stack
    path, call = stack[-1] if stack else ("", 0)
    cls = graph.modules[path].cls if path in graph.modules else graph.name
    loc = error_location(exc) or (failed.source if failed is not None else None)
    where = f"module '{path}' ({cls})" if path else f"the root module ({cls})"
    if call:
        where += f" call {call}"
    at = f" at {loc} `{loc.code}`" if loc is not None else ""
    message = f"{type(exc).__name__}: {exc} in {where}{at}"
    graph.error = message
    graph.annotations["failure"] = {
        "module": path, "call": call, "node": failed.name if failed is not None else None,
        "source": loc.to_dict() if loc is not None else None,
    }
    graph.annotations["replay"] = {"ok": False, "reason": "the graph is partial: the model raised"}
    return ModelError(f"the model raised during eager capture: {message}", graph=graph)


MODEL_CALLERS.add(trace_eager.__code__)  # an op's line is one inside the model's call

__all__ = ["FakeRun", "meta_sharded", "trace_eager", "uses_meta"]
