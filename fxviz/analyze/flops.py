"""``flops``: the forward FLOPs of each op and module call, from torch's own formulas. Needs torch.

The formulas are those ``torch.utils.flop_counter.FlopCounterMode`` counts with
(``flop_registry``: ``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``convolution``, the attention
kernels), evaluated on the shapes the capture recorded, so nothing runs and it works on ``meta``
and fake tensors. An op torch counts through one of them after decomposing it is counted the same
way: ``linear`` as the ``mm`` of its flattened input, ``matmul`` as a ``bmm``, ``conv2d`` as a
``convolution``, ``scaled_dot_product_attention`` as its kernel. Everything else torch counts as 0
(elementwise ops, views) and has no value here; a size that is symbolic gives none either. Writes
the number overlay ``flops`` (unit ``FLOP``, log scale): per node, and per module call the sum of
the ops inside it.

Registered as the pass ``flops`` when imported; :data:`CAPTURE_PASSES` is what
:func:`fxviz.api.capture` runs by default.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils import flop_counter

from fxviz.calls import Call
from fxviz.ir import Graph, Node
from fxviz.ops import op_name
from fxviz.passes import DEFAULT, PASSES
from fxviz.passes.overlays import set_overlay
from fxviz.passes.tree import Shared, shared

aten = torch.ops.aten
Shape = tuple[int, ...]

#: The default passes of a capture, and ``flops``.
CAPTURE_PASSES: tuple[str, ...] = (*DEFAULT, "flops")


def _formula(packet: Any) -> Callable[..., int] | None:
    return flop_counter.flop_registry.get(packet)


@functools.lru_cache(maxsize=4096)
def _apply(packet: Any, shapes: tuple[Any, ...], out: Shape | None = None) -> int | None:
    """torch's formula for ``packet`` at ``shapes`` (its positional arguments; ``out`` its
    ``out_val``), remembered: the formulas are pure functions of the shapes, a model repeats a few
    shapes many times, and torch's wrapper around each formula walks its arguments with a
    ``tree_map`` on every call (most of this pass's cost before)."""
    f = _formula(packet)
    if f is None:
        return None
    return f(*shapes) if out is None else f(*shapes, out_val=out)


def _mm(a: Shape, b: Shape) -> int | None:
    return _apply(aten.mm, (a, b))


def _linear(shapes: Sequence[Shape], out: Shape | None, transposed: bool) -> int | None:
    x, w = shapes[0], shapes[1]
    if len(w) != 2 or not x:
        return None
    return _mm((math.prod(x[:-1]), x[-1]), (w[1], w[0]))


def _matmul(shapes: Sequence[Shape], out: Shape | None, transposed: bool) -> int | None:
    a, b = list(shapes[0]), list(shapes[1])
    if not a or not b:
        return None
    if len(a) == 1:
        a = [1, *a]
    if len(b) == 1:
        b = [*b, 1]
    batch = math.prod(torch.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))) if len(a) > 2 or len(b) > 2 else 1
    return _apply(aten.bmm, ((batch, a[-2], a[-1]), (batch, b[-2], b[-1])))


def _conv(shapes: Sequence[Shape], out: Shape | None, transposed: bool) -> int | None:
    if out is None or not all(isinstance(d, int) for d in out):
        return None
    return _apply(aten.convolution, (shapes[0], shapes[1], None, None, None, None, transposed), tuple(out))


def _sdpa(shapes: Sequence[Shape], out: Shape | None, transposed: bool) -> int | None:
    return _apply(aten._scaled_dot_product_flash_attention, (shapes[0], shapes[1], shapes[2]))


Counter = Callable[[Sequence[Shape], "Shape | None", bool], "int | None"]


def _registered(packet: Any) -> Counter:
    def count(shapes: Sequence[Shape], out: Shape | None, transposed: bool) -> int | None:
        return _apply(packet, tuple(shapes))

    return count


#: Op name (:func:`fxviz.ops.op_name`, the name every spelling of an op shares) -> its count from
#: the shapes of its tensor inputs, in argument order, its output's shape and whether it is a
#: transposed convolution.
COUNTERS: dict[str, Counter] = {
    "mm": _registered(aten.mm), "addmm": _registered(aten.addmm), "bmm": _registered(aten.bmm),
    "baddbmm": _registered(aten.baddbmm), "linear": _linear, "matmul": _matmul,
    "conv1d": _conv, "conv2d": _conv, "conv3d": _conv, "convolution": _conv, "_convolution": _conv,
    "conv_transpose1d": _conv, "conv_transpose2d": _conv, "conv_transpose3d": _conv,
    "scaled_dot_product_attention": _sdpa, "_scaled_dot_product_flash_attention": _sdpa,
    "_scaled_dot_product_flash_attention_for_cpu": _sdpa, "_scaled_dot_product_efficient_attention": _sdpa,
    "_scaled_dot_product_cudnn_attention": _sdpa,
}
#: The shape of a value with a symbolic size (no count), apart from a scalar's (``None``: skipped).
_SYMBOLIC: Shape = (-1,)
#: How many tensor inputs each kind of counter reads.
_ARITY = {"linear": 2, "matmul": 2, "mm": 2, "bmm": 2, "addmm": 3, "baddbmm": 3}


def node_flops(graph: Graph, node: Node, shape_of: dict[int, Shape | None] | None = None) -> int | None:
    """The FLOPs of ``node`` by torch's formulas at its captured shapes; ``None`` when torch
    counts none for it or a shape is unknown or symbolic. ``shape_of`` remembers each metadata
    object's shape across the nodes of one graph (a capture shares one per shape)."""
    name = op_name(node.target)
    if name not in COUNTERS:
        return None
    if shape_of is None:
        shape_of = {}
    shapes: list[Shape] = []
    for r in node.inputs:
        m = graph.meta_of(r)
        if m is None:
            continue
        shape = shape_of.get(id(m), ())
        if shape == ():
            if not m.is_tensor:
                shape = None
            elif not all(isinstance(d, int) for d in m.shape):
                shape = _SYMBOLIC
            else:
                shape = tuple(int(d) for d in m.shape)
            shape_of[id(m)] = shape
        if shape is None:
            continue
        if shape is _SYMBOLIC:
            return None
        shapes.append(shape)
    out = tuple(node.outputs[0].shape) if node.outputs else None
    return op_flops(name, shapes, out, transposed=bool(node.attrs.get("transposed")))


def op_flops(name: str, shapes: Sequence[Shape], out: Sequence[Any] | None = None, *, transposed: bool = False) -> int | None:
    """torch's FLOPs for op ``name`` (as :func:`fxviz.ops.op_name` spells it) at the shapes of its
    tensor inputs (argument order) and its output's (``out``, read by convolutions); ``None``
    when torch counts none for it or the shapes do not fit its formula. The one place a count is
    worked out: the ``flops`` pass on captured nodes and the compile map on Dynamo's graphs."""
    counter = COUNTERS.get(name)
    if counter is None or len(shapes) < _ARITY.get(name, 3 if "attention" in name else 2):
        return None
    try:
        flops = counter(shapes, None if out is None else tuple(out), transposed or "transpose" in name)
    except (AssertionError, ValueError, TypeError, RuntimeError, IndexError):
        return None  # shapes the formula does not take (a broadcast it does not model)
    return int(flops) if flops is not None else None


def count_flops(graph: Graph) -> Graph:
    """Write the overlay ``flops`` (see the module docstring)."""
    nodes = {}
    shape_of: dict[int, Shape | None] = {}  # by id: the graph keeps every metadata object alive
    # a model repeats a few targets and a few shapes: the counter is looked up once per target
    # (most targets have none: ``op_name`` was most of this pass), and a count is worked out once
    # per target and input/output metadata objects (a capture shares one per shape)
    counted: dict[str, bool] = {}
    memo: dict[tuple[Any, ...], int | None] = {}
    facts: Shared | None = None
    by_name: dict[str, Node] | None = None  # Graph.meta_of, without its two Python calls per input
    for n in graph.nodes:
        if n.kind != "op":
            continue
        target = n.target
        has = counted.get(target)
        if has is None:
            has = counted[target] = op_name(target) in COUNTERS
        if not has:
            continue
        if by_name is None:
            facts = shared(graph)
            by_name = facts.by_name
        # output ``index`` of each producer, or None (as Graph.meta_of)
        metas = [outs[i] if (i := r.index) < len(outs := by_name[r.node].outputs) else None for r in n.inputs]
        key = (target, *map(id, metas), *map(id, n.outputs), n.attrs.get("transposed"))
        if key in memo:
            f = memo[key]
        else:
            f = memo[key] = node_flops(graph, n, shape_of)
        if f:
            nodes[n.name] = f
    modules = {}
    if nodes and facts is not None:
        # each counted op is added to its call, then each call's total to its parent's, children
        # before parents: linear in the ops and calls (summing every call's ``nodes`` cost the nodes
        # times the nesting depth; summing every call's ``ops``, a lookup per op of every call).
        # The tree is the one that gave the nodes by name (outside a run of passes, each
        # shared() builds one)
        calls, node_call = facts.calls, facts.tree.node_call  # calls: parents first
        totals: dict[Call, int] = {}  # a call hashes by identity
        for name, f in nodes.items():
            c = node_call[name]
            totals[c] = totals.get(c, 0) + f
        for c in reversed(calls):
            total = totals.get(c)
            if total and c.parent is not None:
                totals[c.parent] = totals.get(c.parent, 0) + total
        modules = {c.id: total for c in calls if c.stack and (total := totals.get(c))}
    set_overlay(graph, "flops", label="FLOPs", kind="number", unit="FLOP", scale="log", reduce="sum",
                nodes=nodes, modules=modules,
                description="forward FLOPs from torch.utils.flop_counter's formulas at the captured shapes "
                            "(matmul, linear, convolution, attention; torch counts other ops as 0)")
    return graph


PASSES["flops"] = count_flops

__all__ = ["CAPTURE_PASSES", "COUNTERS", "count_flops", "node_flops", "op_flops"]
