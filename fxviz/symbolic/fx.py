"""Capture through ``torch.fx.symbolic_trace`` -> IR; shapes from fake-tensor propagation."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx
from torch import nn

from fxviz.ir import Graph
from fxviz.symbolic.convert import Converter, Placeholder
from fxviz.torchbridge.checks import confirm_forward, real_inputs
from fxviz.torchbridge.normalize import flatten_inputs, flatten_outputs
from fxviz.torchbridge.values import mark_tied, module_infos


class _Tracer(torch.fx.Tracer):
    record_stack_traces = True


def capture_fx(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, validate: bool = True) -> Graph:
    """Capture with ``torch.fx.symbolic_trace``; shapes come from fake-tensor propagation. On real
    inputs (and ``validate``) the model runs once on them, and what it raises is a
    :class:`~fxviz.torchbridge.checks.RejectedInputs`: fake tensors check less than real kernels."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    flat = flatten_inputs(model, args, kwargs)
    if kwargs:
        raise TypeError("fx capture takes positional tensor inputs only; use method='export' for kwargs")
    tracer = _Tracer()
    graph = tracer.trace(model)
    gm = torch.fx.GraphModule(tracer.root, graph)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) < len(args):
        raise TypeError(f"forward takes {len(placeholders)} inputs, {len(args)} were given")
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
    FakeTensorProp(gm, mode).propagate(*fake_args)

    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    returned = _unpack_dataclasses(out_node.args[0])
    out_node.args = (returned,)
    for n in reversed(list(gm.graph.nodes)):
        if not n.users and _is_dataclass_call(n):
            gm.graph.erase_node(n)

    # the tensors given name the first placeholders; a keyword input left at its default keeps its own
    names = dict(zip([p.name for p in placeholders],
                     flat.names + [p.name for p in placeholders[len(flat.names):]], strict=False))
    conv = Converter(
        {p.name: Placeholder("input", names[p.name], names[p.name]) for p in placeholders},
        modules=dict(model.named_modules()),
    )
    conv.convert(gm.graph)
    items: list[tuple[str, torch.fx.Node | None, str | None]] = []
    for path, value in flatten_outputs(returned, leaf_types=(torch.fx.Node,)):
        if isinstance(value, torch.fx.Node):
            items.append((path, value, None))
        else:
            items.append((path, None, repr(value)))
    conv.add_outputs(items)
    mark_tied(conv.nodes, model)
    g = Graph(name=type(model).__name__, nodes=conv.nodes, method="fx", modules=module_infos(model))
    if validate and real_inputs(flat.tensors):
        confirm_forward(model, flat, g)
    return g


def _unpack_dataclasses(v: Any) -> Any:
    """fx records a returned dataclass as a call of its class with the fields as kwargs; turn it back
    into a mapping of fields so outputs get their paths (``logits``, ``hidden``) and shapes."""
    if isinstance(v, (tuple, list)):
        return type(v)(_unpack_dataclasses(x) for x in v)
    if isinstance(v, dict):
        return {k: _unpack_dataclasses(x) for k, x in v.items()}
    if isinstance(v, torch.fx.Node) and _is_dataclass_call(v):
        return {k: _unpack_dataclasses(x) for k, x in v.kwargs.items()}
    return v


def _is_dataclass_call(n: torch.fx.Node) -> bool:
    return (
        n.op == "call_function" and isinstance(n.target, type) and dataclasses.is_dataclass(n.target)
        and not n.args
    )


__all__ = ["capture_fx"]
