"""The process-wide state a capture attempt may disturb, taken before the first attempt and put
back after every one (:class:`ProcessState`), and the code Dynamo saw during an attempt
(:class:`DynamoCodes`): the process half of :class:`fxviz.torchbridge.guard.Snapshot`, whose
module docstring lists what is kept and why."""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as nn_module

from fxviz.torchbridge.loggers import clear_torch_caches, states, torch_loggers

_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks", "_global_forward_hooks_always_called",
                 "_global_forward_hooks_with_kwargs")


class ProcessState:
    """Process-wide state an attempt may leave changed; :meth:`restore` puts back what differs."""

    def __init__(self) -> None:
        import torch.fx._symbolic_trace as fx_trace

        self._fx = fx_trace
        self.streams = (sys.stdout, sys.stderr)
        self.showwarning = warnings.showwarning
        self.filters = list(warnings.filters)
        self.loggers = torch_loggers()[1]  # each one's level, disabled and propagate, gathered in C
        self.logger_states = states(self.loggers)
        self.function_modes = torch._C._len_torch_function_stack()
        self.dispatch_modes = torch._C._len_torch_dispatch_stack()
        self.module_methods = {k: nn.Module.__dict__[k] for k in ("__call__", "__getattr__", "__setattr__")}
        self.fx_flag = fx_trace._is_fx_tracing_flag
        self.grad = torch.is_grad_enabled()
        self.autocast = torch.is_autocast_enabled("cpu")
        self.default_dtype = torch.get_default_dtype()
        self.recursion_limit = sys.getrecursionlimit()
        self.hooks = {name: dict(getattr(nn_module, name)) for name in _GLOBAL_HOOKS}
        self.rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        self.dynamo = DynamoCodes()

    def restore(self) -> None:
        if (sys.stdout, sys.stderr) != self.streams:
            sys.stdout, sys.stderr = self.streams
        if warnings.showwarning is not self.showwarning:
            warnings.showwarning = self.showwarning
        if warnings.filters != self.filters:
            warnings.filters[:] = self.filters  # type: ignore[index]
            warnings._filters_mutated()  # type: ignore[attr-defined]
        if states(self.loggers) != self.logger_states:
            changed = False
            for lg, level, disabled, propagate in zip(self.loggers, *self.logger_states, strict=True):
                if lg.level != level:
                    lg.level = level  # setLevel clears every logger's cache: once below is enough
                    changed = True
                lg.disabled, lg.propagate = disabled, propagate
            if changed:
                clear_torch_caches()
        _pop_modes(self.function_modes, self.dispatch_modes)
        for k, fn in self.module_methods.items():
            if nn.Module.__dict__[k] is not fn:
                setattr(nn.Module, k, fn)
        self._fx._is_fx_tracing_flag = self.fx_flag
        torch.set_grad_enabled(self.grad)
        if torch.is_autocast_enabled("cpu") != self.autocast:
            torch.set_autocast_enabled("cpu", self.autocast)
        if torch.get_default_dtype() != self.default_dtype:
            torch.set_default_dtype(self.default_dtype)
        if sys.getrecursionlimit() != self.recursion_limit:
            sys.setrecursionlimit(self.recursion_limit)
        for name, saved in self.hooks.items():
            hooks = getattr(nn_module, name)
            if hooks.keys() != saved.keys():
                hooks.clear()
                hooks.update(saved)
        if not torch.equal(torch.get_rng_state(), self.rng):
            torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        self.dynamo.restore()


def _pop_modes(function_modes: int, dispatch_modes: int) -> None:
    """Pop torch modes an attempt left pushed (a mode pushed by another thread cannot be here:
    mode stacks are per thread)."""
    from torch.utils._python_dispatch import _pop_mode

    while torch._C._len_torch_function_stack() > function_modes:
        torch._C._pop_torch_function_stack()
    while torch._C._len_torch_dispatch_stack() > dispatch_modes:
        _pop_mode()


class DynamoCodes:
    """Code objects Dynamo saw during an attempt (compiled, or marked to skip), put back to the
    state of code Dynamo never saw. Only code first seen during the attempt is reset: a user's own
    compiled functions keep their caches. Nothing is done when Dynamo was never imported (an eager
    capture does not load it)."""

    def __init__(self) -> None:
        self.seen = self._seen()
        self.callback = self._callback()

    @staticmethod
    def _callback() -> Any:
        if "torch._dynamo" not in sys.modules:
            return None
        from torch._C._dynamo.eval_frame import get_eval_frame_callback

        return get_eval_frame_callback()

    @staticmethod
    def _trackers() -> list[Any]:
        convert_frame = sys.modules.get("torch._dynamo.convert_frame")
        return [] if convert_frame is None else [convert_frame.input_codes, convert_frame.output_codes]

    def _seen(self) -> set[int]:
        return {i for tracker in self._trackers() for i in tracker.seen_ids}

    def restore(self) -> None:
        trackers = self._trackers()
        if not trackers:
            return
        from torch._C._dynamo.eval_frame import reset_code, set_eval_frame

        if self._callback() is not self.callback:
            set_eval_frame(self.callback)
        for tracker in trackers:
            new = [ref for ref in tracker.seen if id(ref()) not in self.seen]
            for ref in new:
                code = ref()
                if code is not None:
                    reset_code(code)
                    tracker.seen_ids.discard(id(code))
            if new:
                # forgotten with their weak references, whose callbacks then never run (each
                # would remove its id from ``seen_ids`` a second time)
                gone = set(map(id, new))
                tracker.seen[:] = [ref for ref in tracker.seen if id(ref) not in gone]


__all__ = ["DynamoCodes", "ProcessState"]
