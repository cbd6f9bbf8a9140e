"""Torch values -> IR values: tensor metadata, JSON-safe arguments, module facts, output nodes.

What every capture method shares when it turns torch objects into plain data; torch objects stop
at this package (``fxviz.torchbridge``), which ``capture`` and ``fallback`` both build on.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from itertools import compress
from typing import Any

import torch
from torch import nn

from fxviz.ir import Graph, ModuleInfo, Node, Ref, TensorMeta
from fxviz.text import without_address
from fxviz.torchbridge.guard import named_modules
from fxviz.torchbridge.walk import state_of


def module_infos(
    model: nn.Module, named: list[tuple[str, nn.Module]] | None = None
) -> dict[str, ModuleInfo]:
    """Module path -> class facts for every submodule (``""`` is the model itself); one
    ModuleInfo per class, shared (an 80-layer model repeats a handful of classes). ``named`` is
    ``model.named_modules(remove_duplicate=False)`` when the caller has walked it already."""
    infos: dict[type, ModuleInfo] = {}
    out: dict[str, ModuleInfo] = {}
    for path, m in named if named is not None else named_modules(model, remove_duplicate=False):
        cls = type(m)
        info = infos.get(cls)
        if info is None:
            info = infos[cls] = ModuleInfo(cls.__name__, f"{cls.__module__}.{cls.__qualname__}")
        out[path] = info
    return out


def meta_from_value(v: Any) -> TensorMeta | None:
    """TensorMeta of one (fake) tensor, SymInt or Python scalar; ``None`` for anything else."""
    if isinstance(v, torch.Tensor):
        return TensorMeta(
            tuple(d if isinstance(d, int) else str(d) for d in v.shape),
            str(v.dtype).removeprefix("torch."),
            v.device.type,
        )
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        kind = {torch.SymInt: "int", torch.SymFloat: "float", torch.SymBool: "bool"}[type(v)]
        return TensorMeta((), kind, value=str(v))
    if isinstance(v, bool):
        return TensorMeta((), "bool", value=str(v))
    if isinstance(v, int):
        return TensorMeta((), "int", value=str(v))
    if isinstance(v, float):
        return TensorMeta((), "float", value=repr(v))
    if isinstance(v, complex):
        return TensorMeta((), "complex", value=repr(v))
    return None


def metas_from_val(val: Any) -> tuple[TensorMeta, ...]:
    if isinstance(val, (tuple, list)):
        return tuple(meta_from_value(v) or TensorMeta((), "none") for v in val)
    m = meta_from_value(val)
    return (m,) if m is not None else ()


def json_safe(v: Any, depth: int = 0) -> Any:
    """A JSON-safe rendering of a non-tensor argument (``torch.float32`` -> ``"float32"``)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if v == v and v not in (float("inf"), float("-inf")) else str(v)
    if isinstance(v, (list, tuple)) and depth < 4:
        return [json_safe(x, depth + 1) for x in v]
    if isinstance(v, dict) and depth < 4:
        return {str(k): json_safe(x, depth + 1) for k, x in v.items()}
    if isinstance(v, torch.dtype):
        return str(v).removeprefix("torch.")
    if isinstance(v, slice):
        return f"{_s(v.start)}:{_s(v.stop)}" + (f":{v.step}" if v.step is not None else "")
    if v is Ellipsis:
        return "..."
    return without_address(str(v))


def _s(x: Any) -> str:
    return "" if x is None else str(x)


def mark_tied(nodes: list[Node], model: nn.Module, named: list[tuple[str, nn.Module]] | None = None) -> None:
    """One node per tied tensor (``lm_head.weight`` is ``transformer.wte.weight``), in place: the
    name torch lists first (``named_parameters()``) owns it, every reader reads the owner's node,
    and that node's ``attrs["shared_with"]`` lists the tensor's other names, from torch's own
    record (``named_parameters(remove_duplicate=False)``). A capture that read the tensor under a
    second name only (export names it by either) gets that node renamed to the owner, in the
    owner's module; one that made a node per name keeps the owner's. So every renderer draws the
    shared weight from its owner's node, and a module that holds it under another name says so."""
    names: dict[int, list[str]] = {}
    # ``named_parameters(remove_duplicate=False)`` then ``named_buffers(...)``, over one walk of the
    # modules (``named``: ``named_modules(remove_duplicate=False)`` when the caller has it): torch's
    # own walks are chains of nested generators, which cost more than a deep model's ops
    walk = named if named is not None else named_modules(model, remove_duplicate=False)
    for members in ("_parameters", "_buffers"):
        for path, m in walk:
            own = getattr(m, members)
            if own:
                prefix = f"{path}." if path else ""
                for k, t in own.items():
                    if t is not None:
                        names.setdefault(id(t), []).append(prefix + k)
    _one_node_per_tensor(nodes, [ns for ns in names.values() if len(ns) > 1])


def mark_tied_state(nodes: list[Node], state: Mapping[str, torch.Tensor]) -> None:
    """:func:`mark_tied` for a program without its model (a ``.pt2`` file): tensors of the
    program's ``state_dict`` that are one tensor (``torch.save`` keeps the sharing: the same
    storage, offset, shape and strides) are tied, owned by the name its graph lists first, as
    ``named_parameters()`` would. Tensors without storage (``meta``) cannot be told apart: none
    is taken as tied."""
    order = {n.target: i for i, n in enumerate(nodes) if n.kind in ("parameter", "buffer")}
    names: dict[tuple[Any, ...], list[str]] = {}
    for name, t in state.items():
        if name not in order or not isinstance(t, torch.Tensor) or t.device.type == "meta" or not t.data_ptr():
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        names.setdefault(key, []).append(name)
    _one_node_per_tensor(nodes, [sorted(ns, key=order.__getitem__) for ns in names.values() if len(ns) > 1])


def _one_node_per_tensor(nodes: list[Node], tied: list[list[str]]) -> None:
    """The work of :func:`mark_tied`: ``tied`` holds the names of each tied tensor, owner first.
    An FSDP2 parameter is two nodes of one name, its shard (``shard_of``, which the unit's
    all-gather reads) and the unsharded parameter (the all-gather's copy-out): a tied one keeps
    both, each standing for its own kind, the shard named ``<owner>.shard``."""
    owner_of = {a: ns[0] for ns in tied for a in ns}
    others = {ns[0]: ns[1:] for ns in tied}
    if not owner_of:
        return
    keep: dict[tuple[str, bool], Node] = {}  # (owner name, a shard) -> the node that stands for the tensor
    for n in nodes:
        owner = owner_of.get(n.target) if n.kind in ("parameter", "buffer") else None
        key = (owner, "shard_of" in n.attrs) if owner is not None else None
        if key is not None and (key not in keep or n.target == owner):
            keep[key] = n  # type: ignore[index]
    taken = {n.name for n in nodes}
    rename: dict[str, str] = {}  # node name -> the name of the node that stands for its tensor
    for (owner, shard), n in keep.items():
        n.attrs.pop("tied_to", None)
        n.attrs["shared_with"] = others[owner]
        if n.target != owner:  # the capture knew it by another name only: it becomes the owner's
            n.target = owner
            path = owner.rpartition(".")[0]
            n.stack = ((path, 0),) if path else ()
            name = f"{owner}.shard" if shard else owner
            if shard:
                n.attrs["shard_of"] = owner
            if name not in taken:
                rename[n.name] = name
                taken.add(name)
                n.name = name
    placed: set[tuple[str, bool]] = set()
    out: list[Node] = []
    for n in nodes:
        owner = owner_of.get(n.target) if n.kind in ("parameter", "buffer") else None
        if owner is not None:
            key = (owner, "shard_of" in n.attrs)
            stand = keep[key]
            if stand is not n:
                rename[n.name] = stand.name
            if key not in placed:  # where the tensor is first met, so it is made before it is read
                placed.add(key)
                out.append(stand)
            continue
        if rename and any(r.node in rename for r in n.inputs):  # none renamed: no input to scan
            n.inputs = tuple(Ref(rename.get(r.node, r.node), r.index) for r in n.inputs)
        out.append(n)
    nodes[:] = out


def output_node(name: str, path: str, ref: Ref | None, const: str | None) -> Node:
    """The output node for one leaf of the model's output, shared by every capture method: a tensor
    leaf reads ``ref``; any other leaf has no input and shows its ``repr`` as ``attrs["value"]``."""
    attrs: dict[str, Any] = {} if const is None else {"value": const}
    return Node(name, "output", target=path, inputs=(ref,) if ref is not None else (), attrs=attrs)


_name_of = operator.itemgetter(2)


def add_unread_state(graph: Graph, model: nn.Module) -> None:
    """Give every parameter and buffer of ``model`` that the captured run never read a node (kind
    ``parameter``/``buffer``, in its owning module, no users), as export's graph lists all of them:
    without them a model's parameter count depended on the method (fx, export-strict and the eager
    tracer list only what the run reads: Dinov2's ``mask_token``, read only with
    ``bool_masked_pos``, was missing from the header's and its module's count)."""
    have = {n.target for n in graph.nodes if n.kind in ("parameter", "buffer")}
    # each tensor named by its first owner, as named_parameters does (the walk the tracer shared)
    names, paths, _ = state_of(model)
    entries = list(names.values())
    missing = list(compress(zip(entries, paths, strict=True),
                            map(operator.not_, map(have.__contains__, map(_name_of, entries)))))
    if not missing:  # (most captures: in C)
        return
    taken = {n.name for n in graph.nodes}
    new: list[Node] = []
    for (t, kind, name), path in missing:
        if name in taken or not isinstance(t, torch.Tensor):
            continue
        meta = meta_from_value(t)
        new.append(Node(name, kind, name, stack=((path, 0),) if path else (),
                        outputs=(meta,) if meta is not None else ()))
    if new:
        graph.nodes[:0] = new
