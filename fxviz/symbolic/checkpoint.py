"""Recomputation on the export path: what ``torch.utils.checkpoint`` leaves in the joint graph.

Non-strict ``torch.export`` runs the model's Python and traces straight through a checkpoint: the
exported program, and the joint graph made from it, keep nothing of it. So :func:`checkpoint_calls`
notes the checkpoint calls while non-strict export runs, and a model that made one is exported
again strictly (:func:`strict_program`): Dynamo turns each call into the higher-order op
``tag_activation_checkpoint``, and AOT Autograd, tracing it into the joint graph, tags every forward
op of the region with ``node.meta["recompute"]`` (a ``CheckpointPolicy``: ``PREFER_RECOMPUTE`` for a
plain checkpoint, a selective policy's answer otherwise) and ``node.meta["ac_graph_id"]`` (the
region). Those tags are what this module reads (:func:`recompute_tags`); it does not run or imitate
the partitioner. A region is shown recomputed whole, as torch tagged it (the eager path runs the
user's step and shows what its backward really runs again, early stop included:
:mod:`fxviz.fallback.recompute`): every op tagged ``*_RECOMPUTE`` is a node of phase ``recompute`` in
its op's module, each forward op of a region says in ``attrs["would_save"]`` what it would keep
without checkpoint, the backward ops read its recomputation (where the backward op's forward op is in the same region: an op outside it, or a
later region, keeps the value as it is), and the values ops tagged ``*_SAVE`` produce are kept by
the policy (:func:`add_recompute`; the saved records themselves are
:func:`fxviz.symbolic.joint.inferred_saved`'s). If strict export cannot trace the model, or a call is
``use_reentrant=True`` (Dynamo traces it as ``False``), capture says so in one line: the eager path
(``method="eager"``) shows the recomputation by running it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx

from fxviz.errors import CaptureError
from fxviz.ir import Node, Ref
from fxviz.torchbridge.checkpoint import Checkpoints, one_region_per_call

RECOMPUTE = frozenset({"PREFER_RECOMPUTE", "MUST_RECOMPUTE"})
SAVE = frozenset({"PREFER_SAVE", "MUST_SAVE"})


@contextlib.contextmanager
def checkpoint_calls(model: torch.nn.Module | None = None) -> Iterator[Checkpoints]:
    """The ``torch.utils.checkpoint`` calls made while it is open (``kinds``: ``"non-reentrant"`` /
    ``"reentrant"``; ``callers``: the path of the module of ``model`` that made each), as
    :class:`~fxviz.torchbridge.checkpoint.Checkpoints` sees them."""
    seen = Checkpoints()
    with seen.attach(model=model):
        yield seen


def _prefer_recompute(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.PREFER_RECOMPUTE


@contextlib.contextmanager
def plain_checkpoints_as_selective() -> Iterator[None]:
    """torch 2.13's strict export traces ``tag_activation_checkpoint`` (pre-dispatch) by reading its
    body's ``_checkpoint_context_fn``, which Dynamo sets only for a call given a ``context_fn``: a plain
    checkpoint fails with ``KeyError``. Give such a body the context torch itself runs a plain
    checkpoint with (``tag_activation_checkpoint_impl``: a selective policy that always recomputes)."""
    from torch._higher_order_ops.wrap import tag_activation_checkpoint
    from torch.fx.experimental.proxy_tensor import ProxyTorchDispatchMode
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    try:
        from torch._higher_order_ops.wrap import _always_prefer_recompute
    except ImportError:  # torch 2.11 runs a plain checkpoint outside this path and has no name for it
        _always_prefer_recompute = _prefer_recompute

    table = tag_activation_checkpoint.python_key_table
    traced = table[ProxyTorchDispatchMode]
    plain = functools.partial(create_selective_checkpoint_contexts, _always_prefer_recompute)

    def proxy(mode: Any, gmod: Any, *args: Any, **kwargs: Any) -> Any:
        gmod.meta.setdefault("_checkpoint_context_fn", plain)
        return traced(mode, gmod, *args, **kwargs)

    table[ProxyTorchDispatchMode] = proxy
    tag_activation_checkpoint._dispatch_cache.clear()
    try:
        yield
    finally:
        table[ProxyTorchDispatchMode] = traced
        tag_activation_checkpoint._dispatch_cache.clear()


def strict_program(module: torch.nn.Module, tensors: tuple[Any, ...], calls: list[str]) -> Any:
    """The strictly exported program of ``module`` (whose forward made the checkpoint ``calls``), or
    one line saying why there is none."""
    import logging

    if "reentrant" in calls:
        raise CaptureError(
            "a torch.utils.checkpoint call with use_reentrant=True: strict export traces it as use_reentrant=False, "
            "whose gradients differ where no input of the region requires grad; method='eager' runs it as it is")
    quiet = logging.getLogger("torch._higher_order_ops.wrap")  # warns that a context_fn "is passed"
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with plain_checkpoints_as_selective():
            return torch.export.export(module, tensors, strict=True)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CaptureError(
            f"the model calls torch.utils.checkpoint ({len(calls)} call(s)): non-strict export traces through it and "
            f"records no recomputation, and strict export failed ({type(e).__name__}: {first[:200]}); "
            "method='eager' shows the recomputation") from e
    finally:
        quiet.setLevel(level)


def recompute_tags(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, tuple[int, str]]:
    """The forward ops of the joint graph that a checkpoint region holds: (region, policy name), in
    graph order; regions are numbered from 0 in the order their first op runs."""
    regions: dict[Any, int] = {}
    out: dict[torch.fx.Node, tuple[int, str]] = {}
    for n in gm.graph.nodes:
        policy = n.meta.get("recompute")
        if policy is None or n.op != "call_function" or n.meta.get("partitioner_tag") != "is_forward":
            continue
        region = regions.setdefault(n.meta.get("ac_graph_id"), len(regions))
        out[n] = (region, getattr(policy, "name", str(policy)))
    return out


def add_recompute(nodes: list[Node], tags: dict[str, tuple[int, str]], would_save: dict[str, int],
                  rewire: set[tuple[str, str]]) -> list[Node]:
    """``nodes`` (the joint graph's IR) with the checkpoint regions of ``tags`` (IR op name ->
    (region, policy)): the forward ops marked ``attrs["checkpoint"]`` (region), ``policy`` and ``would_save``
    (from ``would_save``: what it would keep without checkpoint); one node of phase ``recompute`` per op
    tagged ``*_RECOMPUTE`` (``attrs["recomputes"]``, ``aten``), reading the recomputation of inputs recomputed too; a backward
    op reads the recomputation instead of the forward value where ``rewire`` holds (backward op, forward
    op): what an op of the region saved. Each region's recompute nodes come right before the first
    backward node that reads one of them."""
    by_name = {n.name: n for n in nodes}
    again: dict[str, Node] = {}
    region_of: dict[str, int] = {}
    for name, (region, policy) in tags.items():
        fwd = by_name[name]
        fwd.attrs["checkpoint"], fwd.attrs["policy"] = region, policy.lower()
        fwd.attrs["would_save"] = would_save.get(name, 0)  # the forward op's, as on the eager path
        if policy not in RECOMPUTE:
            continue
        inputs = tuple(Ref(again[r.node].name, r.index) if r.node in again and again[r.node].attrs["checkpoint"] == region
                       else r for r in fwd.inputs)  # another region's output: saved by this one's checkpoint
        again[name] = Node(f"{name} (recompute)", "op", target=fwd.target, inputs=inputs, stack=fwd.stack,
                           outputs=fwd.outputs, source=fwd.source, phase="recompute",
                           attrs={"recomputes": name, "checkpoint": region, "aten": [_packet(fwd.target)],
                                  **({"region": fwd.attrs["region"]} if "region" in fwd.attrs else {})})
        region_of[again[name].name] = region
    if not again:
        return nodes
    first_reader: dict[int, str] = {}
    for n in nodes:
        if n.phase != "backward":
            continue
        n.inputs = tuple(Ref(again[r.node].name, r.index) if (n.name, r.node) in rewire else r for r in n.inputs)
        for r in n.inputs:
            if r.node in region_of:
                first_reader.setdefault(region_of[r.node], n.name)
    first_backward = next((n.name for n in nodes if n.phase == "backward"), "")
    before: dict[str, list[Node]] = {}
    for node in again.values():
        before.setdefault(first_reader.get(node.attrs["checkpoint"], first_backward), []).append(node)
    out: list[Node] = []
    for n in nodes:
        out += before.pop(n.name, [])
        out.append(n)
    for rest in before.values():
        out += rest
    if not _ordered(out):  # a region reading another's recomputation (nested checkpoints): all up front
        out = [n for n in nodes if n.phase != "backward"] + list(again.values()) + [n for n in nodes if n.phase == "backward"]
    return out


def _packet(target: str) -> str:
    """``aten.addmm.default`` -> ``aten.addmm`` (the eager path's ``attrs["aten"]`` names)."""
    parts = target.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else target


def _ordered(nodes: list[Node]) -> bool:
    seen: set[str] = set()
    for n in nodes:
        if any(r.node not in seen for r in n.inputs):
            return False
        seen.add(n.name)
    return True


__all__ = ["RECOMPUTE", "SAVE", "add_recompute", "checkpoint_calls", "one_region_per_call", "plain_checkpoints_as_selective", "recompute_tags",
           "strict_program"]
