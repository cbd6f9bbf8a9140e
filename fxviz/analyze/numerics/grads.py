"""Gradients for ``numerics(..., backward=True)``: one training step (forward, the loss, backward)
run eagerly in float32 twice (the noise floor: eager's own gradients need not be bitwise
reproducible; where they differ, :data:`~fxviz.analyze.numerics.floor.SPREADS` more runs measure it) and once the other way, each parameter's gradient compared with
:func:`~fxviz.analyze.numerics.metrics.compare` at the side's tolerance. The order parameters'
gradients are finished in is torch's own record (``register_post_accumulate_grad_hook`` on the
first eager run). The model's ``.grad`` are kept: saved before, restored after."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fxviz.analyze.numerics.floor import SPREADS, retake, widest
from fxviz.analyze.numerics.gradresult import Grads
from fxviz.analyze.numerics.metrics import compare
from fxviz.errors import TargetError
from fxviz.torchbridge.training import Loss, check_trainable, step_loss

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _step(model: nn.Module, run: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
          loss: Loss | None, order: list[str] | None = None) -> dict[str, torch.Tensor]:
    """One step's gradients by parameter name (``.grad`` cleared first, copied out after)."""
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    for _, p in params:
        p.grad = None
    handles = [] if order is None else [
        p.register_post_accumulate_grad_hook(lambda _p, n=n: order.append(n)) for n, p in params]
    try:
        step_loss(run(*args, **kwargs), loss).backward()
    finally:
        for h in handles:
            h.remove()
    return {n: p.grad.detach().float().clone() for n, p in params if p.grad is not None}


def _cast(x: Any, dtype: torch.dtype) -> Any:
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.to(dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(v, dtype) for v in x)
    if isinstance(x, dict):
        return {k: _cast(v, dtype) for k, v in x.items()}
    return x


def gradient_errors(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, against: str,
                    rtol: float, atol: float, loss: Loss | None = None, seed: int | None = 0,
                    backend_options: dict[str, Any] | None = None) -> Grads:
    """Each parameter's gradient of one step run ``against`` another way, against eager float32."""
    check_trainable(model, args)
    side, _, detail = against.partition(":")
    saved = {n: p.grad for n, p in model.named_parameters()}
    rng = torch.get_rng_state()

    def seeded(fn: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        if seed is not None:
            torch.manual_seed(seed)
        return fn()

    try:
        order: list[str] = []
        eager1 = seeded(lambda: _step(model, model, args, kwargs, loss, order))
        spreads = [seeded(lambda: _step(model, model, args, kwargs, loss))]
        if any(not torch.equal(g, spreads[0].get(n, g)) for n, g in eager1.items()):
            # not reproducible: the noise is the largest spread of several runs (see floor.py)
            spreads += [seeded(lambda: _step(model, model, args, kwargs, loss)) for _ in range(SPREADS - 1)]
        if side == "compile":
            compiled = torch.compile(model, backend=detail or "inductor", **(backend_options or {}))
            other = seeded(lambda: _step(model, compiled, args, kwargs, loss))
            torch._dynamo.reset()
        elif side in ("dtype", "autocast") and detail in _DTYPES:
            dtype = _DTYPES[detail]
            if side == "autocast":
                def autocast_run(*a: Any, **k: Any) -> Any:
                    with torch.autocast(device_type=next(model.parameters()).device.type, dtype=dtype):
                        return model(*a, **k)
                other = seeded(lambda: _step(model, autocast_run, args, kwargs, loss))
            else:
                low = copy.deepcopy(model).to(dtype)
                other = seeded(lambda: _step(low, low, _cast(args, dtype), _cast(kwargs, dtype), loss))
        elif side in ("export", "decompose"):
            ep = torch.export.export(model, args, kwargs)
            if side == "decompose":
                ep = ep.run_decompositions()
            unlifted = ep.module()
            other = seeded(lambda: _step(unlifted, unlifted, args, kwargs, loss))
        else:
            raise TargetError(f"--backward compares gradients against compile[:backend], export, decompose, "
                              f"dtype:bfloat16, dtype:float16 or autocast:bfloat16, not {against!r}")
    finally:
        for n, p in model.named_parameters():
            p.grad = saved[n]
        torch.set_rng_state(rng)
    grads = Grads(order=[n for n in dict.fromkeys(order) if n in eager1])
    grads.order += [n for n in eager1 if n not in grads.order]  # parameters with no hook call (none expected)
    for name in grads.order:
        if name not in other:
            grads.params[name] = compare(eager1[name], torch.zeros_like(eager1[name]), rtol, atol)
            grads.params[name].note = f"{against} gave no gradient"
            continue
        e = compare(eager1[name], other[name], rtol, atol)
        others = [run[name] for run in spreads if name in run]
        if others:
            retake(e, widest(eager1[name], others), rtol, atol)
        grads.params[name] = e
    grads.settle()
    return grads


__all__ = ["gradient_errors"]
