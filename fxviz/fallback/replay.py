"""Replay: run a function-level eager graph again, the fidelity oracle of the tracer.

An interpreter over the IR: inputs come from the example inputs by name, parameters and buffers from
the model by state-dict name, each op's target resolves back to the torch callable
(``torch.nn.functional.linear``, ``Tensor.view``) and its arguments are rebuilt from the node's
inputs and exact attrs (:mod:`fxviz.fallback.values`). If the graph is faithful, the replayed
outputs equal the model's. The model is not changed: buffers are copied before an op may write them.

    >>> g = trace_eager(model, (x,))
    >>> out = replay(g, model, (x,))
    >>> torch.testing.assert_close(out["output"], model(x))
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import torch
from torch import nn

from fxviz.errors import ReplayError
from fxviz.fallback.values import RESERVED, decode
from fxviz.ir import Graph, Node, Ref
from fxviz.torchbridge.normalize import flatten_inputs


def replay(
    graph: Graph, model: nn.Module, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Run ``graph`` on ``model``'s state and these inputs; returns output path -> value
    (``{"logits": tensor, "loss": "None"}``; a non-tensor output gives its recorded ``repr``)."""
    verdict = graph.annotations.get("replay", {"ok": True})
    if not verdict.get("ok", False):
        raise ReplayError(f"graph {graph.name!r} cannot be replayed: {verdict.get('reason')}")
    flat = flatten_inputs(model, args, dict(kwargs or {}))
    inputs = dict(zip(flat.names, flat.tensors, strict=True))
    state: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    state.update((k, b.detach().clone()) for k, b in model.named_buffers(remove_duplicate=False))
    env: dict[Ref, Any] = {}
    results: dict[str, Any] = {}
    for node in graph.nodes:
        try:
            if node.kind == "input":
                env[Ref(node.name)] = inputs[node.target]
            elif node.kind in ("parameter", "buffer"):
                env[Ref(node.name)] = state[node.target]
            elif node.kind == "constant":
                env[Ref(node.name)] = _attribute(model, node.target)
            elif node.kind == "op":
                _run(node, env)
            elif node.kind == "output":
                results[node.target] = env[node.inputs[0]] if node.inputs else node.attrs.get("value")
        except ReplayError:
            raise
        except Exception as e:
            where = f" ({node.source.short()})" if node.source else ""
            raise ReplayError(f"replay failed at node {node.name!r} [{node.target}]{where}: {e}") from e
    return results


def _run(node: Node, env: dict[Ref, Any]) -> None:
    fn = resolve_target(node.target)
    args, kwargs = call_arguments(node, lambda r: env[r])
    out = fn(*args, **kwargs)
    if isinstance(out, (tuple, list)) and not node.attrs.get("data_dependent"):
        for i, o in enumerate(out):
            env[Ref(node.name, i)] = o
    elif out is not None:
        env[Ref(node.name, 0)] = out
    for k, ref in node.attrs.get("aliases", ()):
        env[Ref(node.name, k)] = env[Ref.from_json(ref)]  # written in place by this op


def call_arguments(node: Node, value_of: Callable[[Ref], Any]) -> tuple[list[Any], dict[str, Any]]:
    """Rebuild ``(args, kwargs)`` of a recorded call: tensors from the node's inputs, in argument
    order; everything else from its attrs."""
    attrs = node.attrs
    exact = attrs.get("py", {})
    refs = iter(node.inputs)
    taken = 0

    def take() -> Any:
        nonlocal taken
        taken += 1
        return value_of(next(refs))

    keywords = [k for k in attrs if k not in RESERVED and not _positional(k)]
    keyword_tensors = sum(_count_tensors(exact.get(k)) for k in keywords)
    positional_tensors = len(node.inputs) - keyword_tensors
    args: list[Any] = []
    i = 0
    while True:
        key = f"arg{i}"
        if key in attrs:
            args.append(decode(exact[key], take) if key in exact else attrs[key])
        elif taken < positional_tensors:
            args.append(take())
        else:
            break
        i += 1
    kwargs = {k: decode(exact[k], take) if k in exact else attrs[k] for k in keywords}
    return args, kwargs


def _positional(key: str) -> bool:
    return key.startswith("arg") and key[3:].isdigit()


def _count_tensors(exact: Any) -> int:
    if isinstance(exact, dict):
        return 1 if "tensor" in exact else sum(_count_tensors(v) for v in exact.values())
    if isinstance(exact, list):
        return sum(_count_tensors(v) for v in exact)
    return 0


@lru_cache(maxsize=1024)
def resolve_target(target: str) -> Callable[..., Any]:
    """The callable a recorded target names: ``Tensor.view`` -> ``torch.Tensor.view``,
    ``torch.nn.functional.linear``, ``Tensor.T.__get__`` (the property's getter)."""
    parts = target.split(".")
    if parts[0] == "Tensor":
        obj: Any = torch.Tensor
        parts = parts[1:]
    else:
        obj = importlib.import_module(parts[0])
        parts = parts[1:]
    path = [getattr(obj, "__name__", "")]
    for p in parts:
        path.append(p)
        try:
            obj = getattr(obj, p)
        except AttributeError:
            try:
                obj = importlib.import_module(".".join(path))
            except ImportError:
                raise ReplayError(f"cannot resolve op target {target!r}: no attribute {p!r}") from None
    if not callable(obj):
        raise ReplayError(f"op target {target!r} resolves to {type(obj).__name__}, not a callable")
    return obj  # type: ignore[no-any-return]


def _attribute(model: nn.Module, path: str) -> Any:
    if not path:
        raise ReplayError("the graph reads a tensor the model does not own; it cannot be rebuilt")
    obj: Any = model
    for p in path.split("."):
        obj = getattr(obj, p)
    return obj


__all__ = ["call_arguments", "replay", "resolve_target"]
