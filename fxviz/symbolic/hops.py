"""Higher-order ops -> IR: the ops inside their bodies, in regions that say what wrapped them.

Export turns a ``torch.no_grad()`` block into ``wrap_with_set_grad_enabled(False, submod_1, x)``, an
autocast block into ``wrap_with_autocast(...)``, ``torch.cond`` into ``cond(pred, true_graph_0,
false_graph_0, operands)``, and so on: a higher-order op whose GraphModule arguments hold the ops
that ran. They are handled generically, through those arguments, and recursively:

* each body is converted in place of the op: its placeholders read the op's operands (the last
  ones, one per placeholder: a ``cond``'s predicate, read by no body, comes first), and every op
  inside gets ``attrs["region"]``, ``[[depth, region id, label], ...]`` outermost first, where
  ``depth`` is how many module calls of its stack lie outside the region (``fxviz.calls`` reads it);
* a body whose outputs are the op's outputs (``no_grad``, ``autocast``, ``checkpoint``,
  ``invoke_subgraph``) is transparent: readers of the op read the body's outputs; otherwise (two
  branches of a ``cond``, a loop, a ``map``) one node named after the op reads every body's outputs
  and hands on the op's, so the data flow stays honest; a ``cond``'s records which branch the example
  inputs take (``attrs["taken"]``), and the branch regions say it;
* ops that export traced inside a body without module calls (non-strict ``cond``, ``while_loop``,
  ``map``) take the calls around the op, and the module that owns a parameter they read
  (``attrs["stack_inferred"]``).

Ops that ran inside ``torch.utils.checkpoint`` without a higher-order op of their own (export inlines
a non-reentrant checkpoint, keeping only the user's line that calls it) get a ``checkpoint`` region
per call, as the calls ran during export (``attrs["checkpoint"]``, :mod:`fxviz.torchbridge.checkpoint`),
or from their stack traces where none was seen.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch import nn

from fxviz.ir import ModuleCall, Node, Ref, TensorMeta
from fxviz.torchbridge.checkpoint import add_region, one_region_per_call
from fxviz.torchbridge.checkpoint import common_depth as _common
from fxviz.torchbridge.source import source_from_trace
from fxviz.torchbridge.values import metas_from_val

if TYPE_CHECKING:
    from fxviz.symbolic.convert import Converter

Stack = tuple[ModuleCall, ...]

#: Modules that hold other modules and never run themselves: not calls in an inferred stack.
_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)
_CHECKPOINT = "/torch/utils/checkpoint.py"


def body_of(owner: torch.fx.GraphModule | None, target: str) -> torch.fx.GraphModule | None:
    """The GraphModule a ``get_attr`` node names, if it names one."""
    obj: Any = owner
    for part in target.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if isinstance(obj, torch.fx.GraphModule) else None


def _leaves(value: Any) -> list[Any]:
    """Every leaf of nested tuples, lists and dicts, in order (no recursion)."""
    out: list[Any] = []
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, (tuple, list)):
            todo.extend(reversed(v))
        elif isinstance(v, dict):
            todo.extend(reversed(list(v.values())))
        else:
            out.append(v)
    return out


def is_hop(conv: Converter, n: torch.fx.Node) -> bool:
    """A higher-order op with at least one body: a GraphModule argument."""
    return isinstance(n.target, torch._ops.HigherOrderOperator) and any(
        isinstance(a, torch.fx.Node) and a in conv.bodies for a in _leaves((n.args, n.kwargs)))


def region_labels(name: str, n: torch.fx.Node, count: int, taken: bool | None) -> list[str]:
    """What each body of higher-order op ``name`` is, in words a user reads in a box's title."""
    args = n.args
    if name == "wrap_with_set_grad_enabled":
        labels = ["enable_grad" if args and args[0] is True else "no_grad"]
    elif name == "wrap_with_autocast":
        device, dtype, enabled = (list(args[:3]) + [None, None, None])[:3]
        if enabled is False:
            labels = ["autocast disabled"]
        else:
            what = str(dtype).removeprefix("torch.") if dtype is not None else str(device)
            labels = [f"autocast({what})"]
    elif name == "tag_activation_checkpoint":
        labels = ["checkpoint"]
    elif name == "cond":
        if taken is None:
            labels = ["cond: true branch (taken: unknown)", "cond: false branch (taken: unknown)"]
        else:
            labels = [f"cond: true branch{' (taken)' if taken else ''}",
                      f"cond: false branch{'' if taken else ' (taken)'}"]
    elif name == "while_loop":
        labels = ["while_loop: condition", "while_loop: body"]
    elif name in ("map", "map_impl"):
        labels = ["map: body"]
    elif name in ("scan", "associative_scan"):
        labels = [f"{name}: combine"]
    else:
        labels = [name] if count == 1 else []
    if len(labels) != count:
        labels = [name] if count == 1 else [f"{name}: body {k + 1}" for k in range(count)]
    return labels


def convert_hop(conv: Converter, n: torch.fx.Node) -> None:
    """Convert higher-order op ``n`` and its bodies (see the module docstring)."""
    name = n.target.name()  # type: ignore[union-attr]
    leaves = [a for a in _leaves((n.args, n.kwargs)) if isinstance(a, torch.fx.Node)]
    bodies = [a for a in leaves if a in conv.bodies]
    operands = [a for a in leaves if a not in conv.bodies]
    stack = conv.stack_of(n, ())
    taken = conv.taken.get(n)
    labels = region_labels(name, n, len(bodies), taken)
    bound: set[torch.fx.Node] = set()
    results: list[list[Ref | None]] = []
    for k, b in enumerate(bodies):
        gm = conv.bodies[b]
        placeholders = [p for p in gm.graph.nodes if p.op == "placeholder"]
        # the last operands feed the placeholders; a placeholder with none is made by the op
        # itself (a loop index, flex_attention's positions) and is read by nothing in the graph
        missing = max(0, len(placeholders) - len(operands))
        feeds: list[torch.fx.Node | None] = [None] * missing + operands[len(operands) - (len(placeholders) - missing):]
        bound.update(f for f in feeds if f is not None)
        start = len(conv.nodes)
        conv.inherit.append(stack)
        try:
            results.append(_convert_body(conv, gm, placeholders, feeds))
        finally:
            conv.inherit.pop()
        conv.regions += 1
        enter_region(conv.nodes[start:], stack, f"r{conv.regions}", labels[k])

    metas = metas_from_val(n.meta.get("val"))
    if len(results) == 1 and _transparent(conv, results[0], metas):
        conv.multi[n] = results[0]
        return
    inputs = [conv.refs[o] for o in operands if o not in bound and o in conv.refs]
    inputs += [r for outs in results for r in outs if r is not None]
    attrs: dict[str, Any] = {"bodies": labels}
    if name == "cond":
        attrs["taken"] = "unknown" if taken is None else "true" if taken else "false"
    node = conv.add(Node(
        conv.unique(n.name), "op", target=f"higher_order.{name}", inputs=tuple(inputs), stack=stack,
        outputs=metas, source=source_from_trace(n.meta.get("stack_trace")), attrs=attrs,
    ))
    if isinstance(n.meta.get("val"), (tuple, list)):
        conv.multi[n] = [Ref(node.name, i) for i in range(len(metas))]
    else:
        conv.refs[n] = Ref(node.name)


def _convert_body(
    conv: Converter, gm: torch.fx.GraphModule, placeholders: list[torch.fx.Node],
    feeds: Sequence[torch.fx.Node | None],
) -> list[Ref | None]:
    """Convert one body: its placeholders read ``feeds``; returns what its output reads."""
    for p, f in zip(placeholders, feeds, strict=True):
        ref = conv.refs.get(f) if f is not None else None
        if ref is not None:
            conv.refs[p] = ref
        else:
            conv.refs.pop(p, None)
    outs: list[Ref | None] = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            outs = [conv.refs.get(x) if isinstance(x, torch.fx.Node) else None for x in _leaves(node.args)]
        else:
            conv.convert_node(node, gm)
    return outs


def _transparent(conv: Converter, outs: list[Ref | None], metas: tuple[TensorMeta, ...]) -> bool:
    """Does the body hand back exactly what the op hands back (same count, shapes and dtypes)? A
    body that hands back nothing, of an op that hands back nothing (export leaves such a
    ``wrap_with_set_grad_enabled`` where a grad mode changed between two ops), is transparent too."""
    if len(outs) != len(metas):
        return False
    for r, m in zip(outs, metas, strict=True):
        if r is None:
            return False
        produced = conv.by_name[r.node].outputs
        if r.index >= len(produced):
            return False
        got = produced[r.index]
        if got.shape != m.shape or got.dtype != m.dtype:
            return False
    return True


def enter_region(nodes: Iterable[Node], stack: Stack, rid: str, label: str) -> None:
    """Put the ops among ``nodes`` in region ``rid``, around any region they are in already. The
    region sits in the call ``stack`` (the op's); its depth never exceeds an op's own stack or the
    depth of a region inside it, so every op of the region agrees on where it is."""
    ops = [n for n in nodes if n.kind == "op"]
    if not ops:
        return
    depth = len(stack)
    for n in ops:
        depth = min(depth, _common(stack, n.stack))
        inner = n.attrs.get("region")
        if inner:
            depth = min(depth, inner[0][0])
    for n in ops:
        n.attrs["region"] = [[depth, rid, label], *n.attrs.get("region", [])]


def inferred_stack(conv: Converter, inputs: Sequence[Ref]) -> Stack:
    """The module calls of an op traced without them inside a body: those around the op, and down
    to the module that owns a parameter or buffer the op reads (a ``Linear`` in a ``cond`` branch)."""
    base = conv.inherit[-1]
    base_path = base[-1][0] if base else ""
    for r in inputs:
        node = conv.by_name.get(r.node)
        if node is None or node.kind not in ("parameter", "buffer"):
            continue
        owner = node.target.rpartition(".")[0]
        if not owner or (base_path and not owner.startswith(base_path + ".")):
            continue
        chain: list[ModuleCall] = []
        prefix = base_path
        for part in (owner[len(base_path) + 1 :] if base_path else owner).split("."):
            prefix = f"{prefix}.{part}" if prefix else part
            if prefix == owner or not isinstance(conv.modules.get(prefix), _CONTAINERS):
                chain.append((prefix, 0))
        return base + tuple(chain)
    return base


def mark_checkpoints(conv: Converter) -> None:
    """Regions for ops that ran inside ``torch.utils.checkpoint``: one per call where non-strict export
    saw the calls (``attrs["checkpoint"]``, :class:`~fxviz.torchbridge.checkpoint.Checkpoints`); else consecutive ops whose stack
    traces enter it from the same line, inside the same regions (a loop that checkpoints each of
    its blocks from one line makes one region, unless a higher-order op already tells the calls apart). Where a region of a higher-order op holds exactly those
    ops (reentrant checkpoint runs its function under ``no_grad``, which export wraps), that region
    is relabelled ``checkpoint``; otherwise a region is added around them."""
    if any("checkpoint" in n.attrs for n in conv.nodes if n.kind == "op"):  # the calls, seen run
        one_region_per_call(conv.nodes)
        return
    if not conv.traces:
        return
    run: list[Node] = []
    key: str | None = None
    for n in conv.nodes:
        if n.kind != "op":
            continue
        trace = conv.traces.get(n.name)
        entered = _checkpoint_key(trace) if trace else None
        # a run never spans two regions of higher-order ops: each reentrant checkpoint is one
        k = None if entered is None else entered + "".join(f"\0{r[1]}" for r in n.attrs.get("region", []))
        if k != key:
            _checkpoint_region(conv, run)
            run, key = [], k
        if k is not None:
            run.append(n)
    _checkpoint_region(conv, run)


#: A line of user code that calls ``checkpoint(...)`` (``torch.utils.checkpoint.checkpoint``,
#: ``checkpoint_sequential``): export inlines a non-reentrant checkpoint without its frames.
_CHECKPOINT_CALL = re.compile(r"^\s+.*(?<![\w])checkpoint(?:_sequential)?\(", re.MULTILINE)


def _checkpoint_key(trace: str) -> str | None:
    """The stack trace up to where it enters a checkpoint (its frames, or the user's line that
    calls ``checkpoint(``); ``None`` when it does not."""
    at = trace.find(_CHECKPOINT)
    m = _CHECKPOINT_CALL.search(trace)
    if m is not None and (at < 0 or m.end() < at):
        return trace[: m.end()]
    return trace[:at] if at >= 0 else None


def _checkpoint_region(conv: Converter, run: list[Node]) -> None:
    if not run:
        return
    names = {n.name for n in run}
    shared = [r for r in run[0].attrs.get("region", []) if all(
        any(x[1] == r[1] for x in n.attrs.get("region", [])) for n in run)]
    for r in shared:
        members = [n for n in conv.nodes if any(x[1] == r[1] for x in n.attrs.get("region", []))]
        if all(m.name in names for m in members):
            for m in members:
                for x in m.attrs["region"]:
                    if x[1] == r[1]:
                        x[2] = "checkpoint"
            return
    conv.regions += 1
    add_region(conv.nodes, run, f"r{conv.regions}", "checkpoint")


__all__ = ["add_region", "body_of", "convert_hop", "enter_region", "inferred_stack", "is_hop", "mark_checkpoints",
           "region_labels"]
