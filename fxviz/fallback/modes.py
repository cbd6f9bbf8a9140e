"""What feeds the recorder while the forward runs: torch modes that see each call, and module hooks
that keep its module stack.

* A ``TorchFunctionMode`` sees each call a user writes (``F.linear``, ``Tensor.view``,
  ``Tensor.__setitem__``); torch hides the mode while it handles a call, so only outermost calls are
  seen and nothing nests. A ``TorchDispatchMode`` sees ATen ops instead, the level export's graphs
  are at. :func:`mode` makes either, around a handler: the modes themselves know nothing of
  recording, which is :class:`~fxviz.fallback.recorder.Recorder`'s.
* Two global forward hooks keep ``Recorder.module_stack`` in step with the model's module calls.
"""

from __future__ import annotations

import contextlib
import threading
from _thread import get_ident
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from fxviz.fallback.classify import Action, Level, kind_of, kinds
from fxviz.fallback.recorder import Recorder

#: ``handler(func, args, kwargs)`` runs the call ``func(*args, **kwargs)`` and returns its result.
Handler = Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]

#: the recorders whose modes are on now, innermost last: what a mode outside the tracer (the
#: collectives' :class:`~fxviz.fallback.comms.CommRecorder`) asks for the current module and line
ACTIVE: list[Recorder] = []

#: context managers every recording enters first, beneath its own modes, for the model's run only
#: (a sharded capture's :class:`~fxviz.fallback.comms.CommRecorder`): see :func:`around_recordings`
AROUND: list[contextlib.AbstractContextManager[Any]] = []


class _FunctionMode(TorchFunctionMode):
    def __init__(self, handler: Handler) -> None:
        super().__init__()
        self.handler = handler

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        return self.handler(func, args, kwargs or {})


class _DispatchMode(TorchDispatchMode):
    def __init__(self, handler: Handler) -> None:
        super().__init__()
        self.handler = handler

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        return self.handler(func, args, kwargs or {})


def mode(level: Level, handler: Handler) -> TorchFunctionMode | TorchDispatchMode:
    """A torch mode that hands every call at ``level`` to ``handler``. The two classes behind it
    differ only in the protocol torch calls them by (``__torch_function__`` or
    ``__torch_dispatch__``); what a call does to the trace is the handler's."""
    return _DispatchMode(handler) if level == "aten" else _FunctionMode(handler)


@contextlib.contextmanager
def recording(rec: Recorder) -> Iterator[None]:
    """The modes that feed ``rec``, entered for the block. Function level: one mode that records
    each call. ATen level: a function mode that tags the ATen ops of each torch call with it
    (``torch_fn``), around a dispatch mode that records the ATen ops."""
    with contextlib.ExitStack() as stack:
        for cm in AROUND:
            stack.enter_context(cm)
        if rec.aten:
            stack.enter_context(mode("function", rec.observe_call))
        handler: Handler = rec.observe
        watchers = [cm for cm in AROUND if getattr(cm, "needs", None) is not None]
        direct = type(rec).observe is Recorder.observe  # the handler is the hot path itself
        if watchers and not rec.aten and direct:
            # the mode's __torch_function__ is the watcher's switch, calling the hot path itself:
            # one frame of ours per metadata read and two per call (a sharded forward's DTensor
            # code reads metadata about twice per recorded call)
            _direct_mode(stack, _switch(watchers[-1], rec.observed))
        elif rec.aten or watchers or not direct:
            if watchers and not rec.aten:
                handler = _hidden_from(watchers[-1], handler)
            stack.enter_context(mode(rec.level, handler))
        else:  # the recorder's hot path is the mode's __torch_function__: no frame of ours between
            _direct_mode(stack, rec.observed)
        ACTIVE.append(rec)
        stack.callback(ACTIVE.pop)
        yield


def _direct_mode(stack: contextlib.ExitStack, fn: Callable[..., Any]) -> None:
    """Enter a torch-function mode whose ``__torch_function__`` is ``fn`` itself (called as
    ``fn(mode, func, types, args, kwargs)``), for ``stack``: no frame of ours between."""
    cls = type("_RecordingMode", (TorchFunctionMode,), {"__torch_function__": fn})
    # once the mode is off (this runs after its exit), the class, a cycle of its own that only the
    # collector frees, lets go of the recorder: reference counting frees it
    stack.callback(delattr, cls, "__torch_function__")
    stack.enter_context(cls())


def _hidden_from(watcher: Any, handler: Handler) -> Handler:
    """``handler`` behind :func:`_switch` (a mode's handler, not its ``__torch_function__``)."""
    switch = _switch(watcher, lambda _mode, func, _types, args, kwargs: handler(func, args, kwargs))
    return lambda func, args, kwargs: switch(None, func, None, args, kwargs)


def _switch(watcher: Any, observed: Callable[..., Any]) -> Callable[..., Any]:
    """``observed`` (called as a torch-function mode's ``__torch_function__``: ``(mode, func, types,
    args, kwargs)``, which the recorder's hot path is) with the dispatch mode ``watcher`` (one of
    :data:`AROUND`) off for the calls ``watcher.needs(func, args, kwargs)`` says it need not see: a
    dispatch mode costs every ATen op a call into Python, and the collectives' recorder looks at
    none but collectives, which a call of torch's own ops on plain tensors never issues. Off only
    while ``watcher`` is the innermost dispatch mode (a mode the model entered stays as it is). A
    metadata read (``x.requires_grad``: most of the calls DTensor's and the parallel styles' own code
    makes) dispatches nothing and records nothing: it runs at once, without ``observed``. Used as
    the mode's ``__torch_function__`` itself, no frame of ours lies between: a sharded forward's
    DTensor code reads metadata about twice per recorded call."""
    needs = watcher.needs
    table, skip = kinds("function"), Action.SKIP
    depth, at = torch._C._len_torch_dispatch_stack, torch._C._get_dispatch_stack_at
    pop, push = torch._C._pop_torch_dispatch_stack, torch._C._push_on_torch_dispatch_stack

    def switch(mode: Any, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kind = table.get(func)
        if kind is None:
            kind = kind_of(func, "function")
        if kind.action is skip:
            return func(*args, **kwargs) if kwargs else func(*args)
        if needs(func, args, kwargs):  # None for no keyword arguments, as the hot path takes them
            return observed(mode, func, types, args, kwargs)
        n = depth()
        if not n or at(n - 1) is not watcher:
            return observed(mode, func, types, args, kwargs)
        pop(None)
        try:
            return observed(mode, func, types, args, kwargs)
        finally:
            push(watcher)

    return switch


@contextlib.contextmanager
def around_recordings(cm: contextlib.AbstractContextManager[Any]) -> Iterator[None]:
    """Enter ``cm`` around the model's run in each recording made in the block (beneath the
    tracer's modes, as if entered before the capture), not around the rest of the capture: a
    dispatch mode there would see every op of the snapshot and the passes' too."""
    AROUND.append(cm)
    try:
        yield
    finally:
        AROUND.remove(cm)


@contextlib.contextmanager
def module_hooks(rec: Recorder) -> Iterator[None]:
    """Keep ``rec.module_stack`` in step with the model's module calls; removed however the block
    exits.

    Two global hooks serve every submodule (registering two hooks per module costs more than the
    ops of a deep model). Module calls a worker thread makes are noted apart (the recording modes
    are per thread: that thread's ops are not seen), so they never wrap this thread's ops. Global pre-hooks run before a module's own, so the ops of a user's
    pre-hook belong to the module; global forward hooks run before a module's own too, so a
    module with forward hooks of its own gets its exit hook appended after them instead.
    """
    paths = {id(m): (m, path) for path, m in rec.modules if path}
    stack = rec.module_stack
    own_exit: dict[int, str] = {}
    handles = []
    main = get_ident()  # the capturing thread: the only one whose ops the modes see

    # the hooks run on every module call: the capturing thread's case is inlined, with
    # ModuleStack.enter and .leave (their state bound once: the stack's own methods are for
    # the other threads' calls and for reading)
    calls, frames, nodes, on_empty = stack._calls, stack._frames, rec.nodes, stack._on_empty
    calls_get, push, pop = calls.get, frames.append, frames.pop

    def pre(module: nn.Module, args: Any) -> None:
        e = paths.get(id(module))
        if e is not None and e[0] is module:
            thread = get_ident()
            if thread == main:
                if rec.elsewhere:
                    rec.flush_elsewhere()
                path = e[1]  # ModuleStack.enter, inlined
                n = calls_get(path, 0)
                calls[path] = n + 1
                current = stack.current
                push((path, current, len(nodes)))
                stack.current = (*current, (path, n))
            else:  # a call in a worker thread: noted, never wrapped around this thread's ops
                rec.ran_elsewhere(stack.elsewhere(thread, e[1], True), threading.current_thread().name)

    def leave(path: str) -> None:
        thread = get_ident()
        if thread == main:
            stack.leave(path)
        else:
            stack.elsewhere(thread, path, False)

    def post(module: nn.Module, args: Any, output: Any) -> None:
        e = paths.get(id(module))
        if e is not None and e[0] is module and id(module) not in own_exit:
            if get_ident() == main:
                path = e[1]  # ModuleStack.leave, inlined for a call that returned normally
                if frames and frames[-1][0] == path:
                    _, outer, recorded = pop()
                    if recorded == len(nodes) and on_empty is not None:
                        on_empty(stack.current)
                    stack.current = outer
                else:
                    stack.leave(path)
            else:
                leave(e[1])

    try:
        for key, (m, path) in paths.items():
            if m._forward_hooks:
                own_exit[key] = path
                handles.append(m.register_forward_hook(lambda mod, a, o, p=path: leave(p)))
        handles.append(register_module_forward_pre_hook(pre))
        handles.append(register_module_forward_hook(post))
        yield
    finally:
        for h in handles:
            h.remove()


__all__ = ["ACTIVE", "AROUND", "Handler", "around_recordings", "mode", "module_hooks", "recording"]
