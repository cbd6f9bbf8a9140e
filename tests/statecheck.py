"""The state harness: everything a capture could change, taken before and compared after.

``take(model, args, kwargs)`` records

* the model: every module's ``vars()`` (parameters, buffers and submodules by identity and value,
  hooks, the training flag, Python attributes the forward may assign, containers such as a dict
  cache walked into), each parameter's ``.grad`` by identity and value and its ``requires_grad``,
  the ``state_dict`` by identity and value;
* the inputs: every container and tensor of ``args``/``kwargs``, by identity and value;
* the process: ``sys.stdout``/``sys.stderr``, warning hooks and filters, every ``torch*`` logger
  (level, handlers, propagation), torch's function and dispatch mode stacks and the dispatch key
  sets, ``nn.Module.__call__``/``__getattr__``, ``is_fx_tracing()``, grad, inference and autocast
  modes, the default dtype, global module hooks, the SIGINT handler, the garbage collector, the
  random states, Dynamo's configuration, its code caches and frame callback, torch's tracing
  contexts.

``changes(before, after)`` lists what differs, one line per difference, so a failing test says
exactly what a capture left behind.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import random
import signal
import sys
import threading
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as nn_module

_MAX_ITEMS = 10_000  # a guard against walking a huge Python structure


@dataclass(eq=False)
class TensorFP:
    """A tensor by identity, metadata and value (a copy: an in-place write shows)."""

    tensor: torch.Tensor
    value: torch.Tensor | None
    meta: tuple[Any, ...]

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorFP:
        value = None
        if not t.is_meta and not _is_fake(t):
            with torch.no_grad():
                value = t.detach().clone()
        grad = t.grad if isinstance(t, nn.Parameter) or t.is_leaf else None
        meta = (type(t), t.dtype, tuple(t.shape), t.stride(), t.device, t.requires_grad, id(grad),
                None if grad is None else _value(grad))
        return cls(t, value, meta)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorFP) or self.tensor is not other.tensor:
            return False
        if not _meta_equal(self.meta, other.meta):
            return False
        if self.value is None or other.value is None:
            return self.value is other.value
        return _same_values(self.value, other.value)

    def __repr__(self) -> str:
        return f"<tensor {id(self.tensor):#x} {self.meta[1]} {list(self.meta[2])}>"


def _value(t: torch.Tensor) -> Any:
    if t.is_meta or _is_fake(t):
        return ("fake", type(t).__name__)
    return t.detach().clone()


def _meta_equal(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    if a[:-1] != b[:-1]:
        return False
    ga, gb = a[-1], b[-1]
    if isinstance(ga, torch.Tensor) and isinstance(gb, torch.Tensor):
        return _same_values(ga, gb)
    return bool(ga == gb) if not isinstance(ga, torch.Tensor) and not isinstance(gb, torch.Tensor) else False


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b) or (
        a.is_floating_point() and torch.equal(a.nan_to_num(), b.nan_to_num())))


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def fingerprint(v: Any, seen: dict[int, Any] | None = None, budget: list[int] | None = None) -> Any:
    """A comparable picture of a Python value: containers by identity and content, tensors by
    :class:`TensorFP`, modules and other objects by identity."""
    seen = {} if seen is None else seen
    budget = [_MAX_ITEMS] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0:
        return ("...",)
    if isinstance(v, torch.Tensor):
        return TensorFP.of(v)
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
        return ("value", type(v), v)
    if isinstance(v, nn.Module):
        return ("module", id(v))
    if id(v) in seen:
        return ("seen", id(v))
    seen[id(v)] = v
    if isinstance(v, Mapping):
        return ("map", id(v), type(v), [(_key(k), fingerprint(x, seen, budget)) for k, x in v.items()])
    if isinstance(v, (list, tuple)):
        return ("seq", id(v), type(v), [fingerprint(x, seen, budget) for x in v])
    if isinstance(v, (set, frozenset)):
        return ("set", id(v), type(v), sorted(_key(k) for k in v))
    return ("object", id(v), type(v))


def _key(k: Any) -> Any:
    if k is None or isinstance(k, (bool, int, float, str, bytes)):
        return ("value", type(k), k)
    return ("object", id(k), type(k))


# ---- the model, the inputs, the process ---------------------------------------------------------------


@dataclass
class State:
    modules: dict[int, tuple[str, nn.Module, dict[str, Any]]]  # id -> (first path, module, vars)
    state_dict: dict[str, Any]
    inputs: Any
    process: dict[str, Any]


def take(model: nn.Module, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> State:
    modules: dict[int, tuple[str, nn.Module, dict[str, Any]]] = {}
    for path, m in model.named_modules(remove_duplicate=False):
        if id(m) not in modules:
            modules[id(m)] = (path, m, {k: fingerprint(v) for k, v in vars(m).items()})
    sd = {k: fingerprint(v) for k, v in model.state_dict(keep_vars=True).items()}
    return State(modules, sd, [fingerprint(args), fingerprint(kwargs)], process())


def changes(before: State, after: State) -> list[str]:
    """What differs between two states, one line each (empty when nothing does)."""
    out: list[str] = []
    for key, (path, m, attrs) in before.modules.items():
        now = after.modules.get(key)
        where = f"module '{path}' ({type(m).__name__})"
        if now is None:
            out.append(f"{where} is no longer in the model")
            continue
        for name in sorted(set(attrs) | set(now[2])):
            if name not in now[2]:
                out.append(f"{where}: attribute {name!r} was removed")
            elif name not in attrs:
                out.append(f"{where}: attribute {name!r} was added ({_short(now[2][name])})")
            else:
                out += _diff(attrs[name], now[2][name], f"{where}: {name}")
    for key in after.modules.keys() - before.modules.keys():
        path, m, _ = after.modules[key]
        out.append(f"module '{path}' ({type(m).__name__}) was added to the model")
    for name in sorted(set(before.state_dict) | set(after.state_dict)):
        out += _diff(before.state_dict.get(name), after.state_dict.get(name), f"state_dict[{name!r}]")
    out += _diff(before.inputs[0], after.inputs[0], "args")
    out += _diff(before.inputs[1], after.inputs[1], "kwargs")
    for k in sorted(set(before.process) | set(after.process)):
        a, b = before.process.get(k), after.process.get(k)
        if k == "torch loggers":  # loggers torch creates as it imports more of itself are not a change
            a, b = _lazy_trace_gone(a), _lazy_trace_gone({name: v for name, v in b.items()
                                                          if name in a or v[0] == logging.CRITICAL})
        if k == "dynamo codes seen" and b <= a:  # strict export itself calls torch._dynamo.reset()
            continue
        if k == "threads":  # a thread an earlier test started may end meanwhile: only new ones count
            b = sorted(set(b) - set(a))
            a = []
        if not _equal(a, b):
            out.append(f"process: {k} changed: {_short(a)} -> {_short(b)}")
    return out


def _lazy_trace_gone(loggers: dict[str, Any]) -> dict[str, Any]:
    """``loggers`` without torch's ``LazyTraceHandler`` on its structured-trace logger: with no
    trace directory, torch removes it on the process's first trace record (its first compile or
    export), as a bare ``torch.compile`` would; whichever test compiles first sees it go."""
    trace = loggers.get("torch.__trace")
    if trace is None:
        return loggers
    handlers = tuple(h for h in trace[3] if type(h).__name__ != "LazyTraceHandler")
    return {**loggers, "torch.__trace": (*trace[:3], handlers, *trace[4:])}


def _diff(a: Any, b: Any, where: str) -> list[str]:
    """Where two fingerprints differ: the first path into a container that differs, or the value."""
    if a == b:
        return []
    if (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 4 and a[0] == b[0]
            and a[0] in ("map", "seq") and a[1:3] == b[1:3]):
        if a[0] == "map":
            ka, kb = dict(a[3]), dict(b[3])
            out = [f"{where}[{_show_key(k)}] was added ({_short(kb[k])})" for k in kb.keys() - ka.keys()]
            out += [f"{where}[{_show_key(k)}] was removed" for k in ka.keys() - kb.keys()]
            for k in ka.keys() & kb.keys():
                out += _diff(ka[k], kb[k], f"{where}[{_show_key(k)}]")
            return out
        if len(a[3]) == len(b[3]):
            return [line for i, (x, y) in enumerate(zip(a[3], b[3], strict=True)) for line in _diff(x, y, f"{where}[{i}]")]
        return [f"{where}: {len(a[3])} items -> {len(b[3])} items ({_short(b[3][len(a[3]):])} added)"
                if len(b[3]) > len(a[3]) else f"{where}: {len(a[3])} items -> {len(b[3])} items"]
    if isinstance(a, TensorFP) and isinstance(b, TensorFP) and a.tensor is b.tensor:
        if not _meta_equal(a.meta, b.meta):
            what = "grad" if a.meta[:-2] == b.meta[:-2] else "metadata"
            return [f"{where}: the tensor's {what} changed"]
        return [f"{where}: the tensor's values changed"]
    if isinstance(a, TensorFP) and isinstance(b, TensorFP):
        return [f"{where}: another tensor object now ({_short(a)} -> {_short(b)})"]
    return [f"{where} changed: {_short(a)} -> {_short(b)}"]


def _show_key(k: Any) -> str:
    return repr(k[2]) if k[0] == "value" else f"<{k[2].__name__} object>"


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return bool(torch.equal(a, b))
    try:
        return bool(a == b)
    except Exception:
        return a is b


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) < 160 else text[:157] + "..."


def process() -> dict[str, Any]:
    """The process-wide state a capture touches or could touch."""
    import torch._dynamo
    import torch._dynamo.convert_frame as convert_frame
    import torch.fx._symbolic_trace as fx_trace
    from torch._C._dynamo.eval_frame import get_eval_frame_callback

    registry = logging.Logger.manager.loggerDict
    loggers = {
        name: (lg.level, lg.disabled, lg.propagate, tuple(lg.handlers), tuple(lg.filters))
        for name, lg in sorted(registry.items())
        if (name == "torch" or name.startswith("torch.")) and isinstance(lg, logging.Logger)
    }
    root = logging.getLogger()
    hooks = {name: dict(getattr(nn_module, name)) for name in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
        "_global_backward_pre_hooks", "_global_forward_hooks_always_called",
        "_global_forward_hooks_with_kwargs", "_global_module_registration_hooks",
        "_global_parameter_registration_hooks", "_global_buffer_registration_hooks")
        if hasattr(nn_module, name)}
    state: dict[str, Any] = {
        "sys.stdout": sys.stdout, "sys.stderr": sys.stderr,
        "warnings.showwarning": warnings.showwarning, "warnings.filters": list(warnings.filters),
        "torch loggers": loggers,
        "root logger": (root.level, tuple(root.handlers), root.disabled),
        "logging.disable": logging.root.manager.disable,
        "torch function mode stack": torch._C._len_torch_function_stack(),
        "torch dispatch mode stack": torch._C._len_torch_dispatch_stack(),
        "torch function enabled": torch._C._is_torch_function_enabled(),
        "dispatch include set": str(torch._C._dispatch_tls_local_include_set()),
        "dispatch exclude set": str(torch._C._dispatch_tls_local_exclude_set()),
        "nn.Module.__call__": nn.Module.__call__,
        "nn.Module.__getattr__": nn.Module.__getattr__,
        "nn.Module.__setattr__": nn.Module.__setattr__,
        "is_fx_symbolic_tracing()": fx_trace.is_fx_symbolic_tracing(),
        "fx tracing flag": fx_trace._is_fx_tracing_flag,
        "grad mode": torch.is_grad_enabled(),
        "inference mode": torch.is_inference_mode_enabled(),
        "autocast cpu": (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")),
        "default dtype": torch.get_default_dtype(),
        "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
        "jit tracing state": torch._C._get_tracing_state(),
        "global module hooks": hooks,
        "gc enabled": gc.isenabled(),
        "sys trace/profile": (sys.gettrace(), sys.getprofile()),
        "recursion limit": sys.getrecursionlimit(),
        "torch random state": torch.get_rng_state(),
        "python random state": random.getstate(),
        "dynamo frame callback": get_eval_frame_callback(),
        "dynamo config": torch._dynamo.config.get_config_copy(),
        "dynamo codes seen": len(convert_frame.input_codes.seen) + len(convert_frame.output_codes.seen),
        "fx wrapped functions": list(getattr(fx_trace, "_wrapped_fns_to_patch", {}).items()),
        # daemon threads some libraries start on first use (tqdm's monitor) are not a capture's
        "threads": sorted(t.name for t in threading.enumerate() if not t.daemon),
    }
    if threading.current_thread() is threading.main_thread():
        state["SIGINT handler"] = signal.getsignal(signal.SIGINT)
    from torch._guards import TracingContext
    from torch.fx.experimental import proxy_tensor

    state["tracing context"] = TracingContext.try_get()
    state["make_fx tracer"] = proxy_tensor._CURRENT_MAKE_FX_TRACER
    state["compiler.is_exporting()"] = torch.compiler.is_exporting()
    return state


def assert_unchanged(before: State, after: State) -> None:
    diffs = changes(before, after)
    assert not diffs, "the capture left behind:\n  " + "\n  ".join(diffs)


@contextlib.contextmanager
def kept(model: nn.Module, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Iterator[State]:
    """Assert that the block leaves the model, the inputs and the process as it found them."""
    before = take(model, args, kwargs)
    yield before
    assert_unchanged(before, take(model, args, kwargs))


__all__ = ["State", "TensorFP", "assert_unchanged", "changes", "fingerprint", "kept", "process", "take"]
