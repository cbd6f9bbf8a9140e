"""torch's fused fast paths, which no capture can show: in eval mode under ``no_grad``,
``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention`` skip their Python forward and call one
fused op (``aten._transformer_encoder_layer_fwd``, ``aten._native_multi_head_attention``) unless a
tensor argument "has a torch function", which any torch-function mode makes true. So the eager
tracer, ``torch.export`` and fx all record the Python forward's ops, while a plain run of the same
model on the same inputs computes the fused op: the graph is the same function, but not the kernels
a user's inference runs, and its numbers may differ in the last bits.

:func:`fast_path_notes` asks torch itself, for a model that holds such a module in eval mode: one
plain forward under ``no_grad`` (as fxviz runs a capture) with a dispatch mode (it leaves the fast
path on: only torch-function modes turn it off) that records which module called a fused op. The
model, its inputs and the random generators are left as found."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

from fxviz.torchbridge.checks import forked_rng
from fxviz.torchbridge.guard import named_modules

#: The modules with a fused fast path, and the fused ops they call on it.
FAST_PATHS: tuple[type[nn.Module], ...] = (nn.TransformerEncoderLayer, nn.MultiheadAttention)
FUSED_OPS = frozenset({"_transformer_encoder_layer_fwd", "_native_multi_head_attention"})


class _Fused(TorchDispatchMode):
    """Records (module path, fused op) for each fused op a plain run calls."""

    def __init__(self, names: dict[int, str]) -> None:
        super().__init__()
        self.names = names
        self.stack: list[str] = []
        self.seen: dict[str, str] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        op = func.overloadpacket.__name__
        if op in FUSED_OPS:
            self.seen.setdefault(self.stack[-1] if self.stack else "", f"aten.{op}")
        return func(*args, **(kwargs or {}))


def fast_paths(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, str]:
    """Module path -> the fused op a plain run under ``no_grad`` calls there (empty when the model
    holds no module with a fast path in eval mode, or its state or inputs are on ``meta``)."""
    names = {id(m): name for name, m in named_modules(model) if isinstance(m, FAST_PATHS) and not m.training}
    if not names:
        return {}
    tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
    if any(t.is_meta for t in tensors) or any(p.is_meta for p in model.parameters()):
        return {}
    mode = _Fused(names)

    def enter(m: nn.Module, _args: Any) -> None:
        if id(m) in names:
            mode.stack.append(names[id(m)])

    def leave(m: nn.Module, _args: Any, _out: Any) -> None:
        if id(m) in names and mode.stack:
            mode.stack.pop()

    handles = [register_module_forward_pre_hook(enter), register_module_forward_hook(leave)]
    try:
        with torch.no_grad(), forked_rng(tensors), mode:
            model(*args, **kwargs)
    except Exception:  # noqa: BLE001 - the capture reports the model's own errors; this only asks
        return {}
    finally:
        for h in handles:
            h.remove()
    return mode.seen


def fast_path_notes(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    """A note naming the modules whose plain run takes a fused fast path the graph cannot show."""
    seen = fast_paths(model, args, kwargs)
    if not seen:
        return []
    by_op: dict[str, list[str]] = {}
    for path, op in sorted(seen.items()):
        by_op.setdefault(op, []).append(path or "(the model)")
    where = "; ".join(f"{', '.join(paths)}: {op}" for op, paths in by_op.items())
    return [f"fast path: a plain run under no_grad runs {len(seen)} module(s) as one fused op each ({where}); "
            "no capture can take torch's fast path, so the graph shows their Python forward: the same "
            "function, other kernels"]


__all__ = ["FAST_PATHS", "FUSED_OPS", "fast_path_notes", "fast_paths"]
