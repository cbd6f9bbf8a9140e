"""Overlays: named analysis results that colour the graph. No torch.

An overlay is plain JSON under ``graph.annotations["overlays"][name]``: a ``number`` (with a
``unit`` and a ``scale``, ``linear`` or ``log``) or a ``category`` (with ``categories``, key ->
label and colour), given per node (``nodes``: node name -> value) and per module call
(``modules``: :attr:`fxviz.calls.Call.id` -> value); any value may be missing. ``reduce`` says
how a box without a value of its own gets one from the nodes inside it (``sum`` for FLOPs,
``max`` for an error). Every renderer reads overlays through :func:`overlays`, so an analysis
that writes one needs no renderer change::

    >>> set_overlay(g, "latency", label="latency", kind="number", unit="ms", nodes={"linear": 0.3})
    >>> overlays(g)["latency"]["nodes"]
    {'linear': 0.3}

Built in, derived from the IR on every read (never stored, so never stale): ``params`` (the
parameters each op reads and each module holds), ``bytes`` (what each op's outputs take: the
activation memory), ``family`` (the op family, a category), and for a training step ``phase``,
``saved`` and ``saved_own`` (:mod:`fxviz.passes.training`). The ``plumbing`` pass
(:mod:`fxviz.passes.plumbing`) and the ``flops`` analyzer (:mod:`fxviz.analyze.flops`, which needs
torch and runs at capture time) store theirs. Users bring their own with :func:`read_overlay`: a
JSON object mapping node names or module paths to values, an overlay in the format above, or
Model Explorer's per-node data JSON, as it is.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from itertools import repeat
from typing import Any

from fxviz.calls import CallTree
from fxviz.errors import GraphFormatError, TargetError
from fxviz.ir import Graph, Node, TensorMeta
from fxviz.ops import op_family
from fxviz.passes.training import checkpoint_saved_overlay, phase_overlay, saved_overlay, saved_own_overlay
from fxviz.schema import check_overlay, show

#: Bytes per element of each dtype a capture writes (``bytes`` leaves out tensors of other dtypes).
ITEMSIZE: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2, "int8": 1,
    "uint8": 1, "bool": 1, "complex128": 16, "complex64": 8, "complex32": 4, "uint16": 2, "uint32": 4,
    "uint64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}


def set_overlay(
    graph: Graph,
    name: str,
    *,
    label: str,
    kind: str,
    nodes: Mapping[str, Any] | None = None,
    modules: Mapping[str, Any] | None = None,
    unit: str = "",
    scale: str = "linear",
    categories: Mapping[str, Mapping[str, Any]] | None = None,
    description: str = "",
    reduce: str | None = None,
) -> dict[str, Any]:
    """Write overlay ``name`` on ``graph`` (replacing one of that name) and return it. Values are
    checked as a saved graph's are (:func:`fxviz.schema.check_overlay`): a bad value is a
    :class:`~fxviz.errors.GraphFormatError` naming it, here rather than when the graph is read."""
    spec: dict[str, Any] = {"label": label, "kind": kind}
    if unit:
        spec["unit"] = unit
    if kind == "number":
        spec["scale"] = scale
    if categories:
        spec["categories"] = {k: dict(v) for k, v in categories.items()}
    if description:
        spec["description"] = description
    if reduce is not None:
        spec["reduce"] = reduce
    # a copy without the missing values (in C when there are none: a capture's overlays hold a
    # value per op and per call)
    spec["nodes"] = _present(nodes)
    spec["modules"] = _present(modules)
    check_overlay(name, spec, "overlay")
    graph.annotations.setdefault("overlays", {})[name] = spec
    return spec


def _present(values: Mapping[str, Any] | None) -> dict[str, Any]:
    """``values`` without its ``None`` entries, as a new dict."""
    if not values:
        return {}
    if not any(map(operator.is_, values.values(), repeat(None))):
        return dict(values)
    return {k: v for k, v in values.items() if v is not None}


def stored(graph: Graph) -> dict[str, dict[str, Any]]:
    """The overlays written on ``graph`` (by passes, analyzers, users), by name."""
    found = graph.annotations.get("overlays")
    return found if isinstance(found, dict) else {}


def overlays(graph: Graph, tree: CallTree | None = None) -> dict[str, dict[str, Any]]:
    """Every overlay of ``graph``, by name: the built-in ones (:data:`BUILTIN`), then those written
    on it (which win over a built-in of the same name). Overlays with no value at all are left out."""
    tree = tree if tree is not None else graph.calls
    saved = stored(graph)
    out: dict[str, dict[str, Any]] = {}
    for name, make in BUILTIN.items():
        if name not in saved:
            spec = make(graph, tree)
            if spec["nodes"] or spec["modules"]:
                out[name] = spec
    for name, spec in saved.items():
        if spec.get("nodes") or spec.get("modules"):
            out[name] = spec
    return out


# ---- built-in overlays -----------------------------------------------------------------------------


def _numel(meta: TensorMeta | None) -> int:
    return (meta.numel or 0) if meta is not None else 0


def params_overlay(graph: Graph, tree: CallTree) -> dict[str, Any]:
    """Parameters each op reads (each parameter once per op), each parameter holds, and each module
    holds with its submodules (the ``stats`` pass's count)."""
    sizes = {n.name: _numel(n.meta) for n in graph.nodes if n.kind == "parameter"}
    nodes: dict[str, int] = {name: size for name, size in sizes.items() if size}
    for n in graph.nodes:
        if n.kind == "op":
            read = sum(sizes[r] for r in {r.node for r in n.inputs} if r in sizes)
            if read:
                nodes[n.name] = read
    mods = graph.annotations.get("stats", {}).get("modules", {})
    # every call, a module without parameters too: its box must not sum its nodes instead
    modules = {c.id: mods.get(c.path, {}).get("params", 0) for c in tree.walk() if c.stack} if nodes else {}
    return {"label": "parameters", "kind": "number", "unit": "params", "scale": "log", "reduce": "sum",
            "description": "parameters an op reads, a parameter holds, a module holds (with its submodules)",
            "nodes": nodes, "modules": modules}


def node_bytes(n: Node) -> int | None:
    """Bytes of the tensors ``n`` produces; ``None`` when a size is symbolic or a dtype unknown."""
    total = 0
    for m in n.outputs:
        if not m.is_tensor:
            continue
        size, numel = ITEMSIZE.get(m.dtype), m.numel
        if size is None or numel is None:
            return None
        total += size * numel
    return total


def bytes_overlay(graph: Graph, tree: CallTree) -> dict[str, Any]:
    """Bytes of what each op produces (activation memory at the captured shapes); a module call's
    value is the sum over the ops inside it."""
    nodes: dict[str, int] = {}
    for n in graph.nodes:
        if n.kind == "op" or n.kind == "input":
            b = node_bytes(n)
            if b:
                nodes[n.name] = b
    modules = {c.id: total for c in tree.walk() if c.stack
               for total in [sum(nodes.get(x, 0) for x in c.nodes)] if total}
    return {"label": "output bytes", "kind": "number", "unit": "B", "scale": "log", "reduce": "sum",
            "description": "bytes of the tensors each op produces (activation memory at the captured shapes); "
                           "a module's value sums the ops inside it",
            "nodes": nodes, "modules": modules}


def family_overlay(graph: Graph, tree: CallTree) -> dict[str, Any]:
    """The family of each op (``conv``, ``linear``, ``shape``, ...), or the kind of a node that is
    not an op (``input``, ``parameter``)."""
    nodes = {n.name: op_family(n.target) if n.kind == "op" else n.kind for n in graph.nodes}
    return {"label": "op family", "kind": "category", "description": "the family of each op (fxviz.ops)",
            "categories": {k: {"label": k} for k in dict.fromkeys(nodes.values())}, "nodes": nodes, "modules": {}}


#: Overlays derived from the IR on every read, by name, in the order a menu lists them.
BUILTIN: dict[str, Callable[[Graph, CallTree], dict[str, Any]]] = {
    "params": params_overlay,
    "bytes": bytes_overlay,
    "family": family_overlay,
    "phase": phase_overlay,
    "saved": saved_overlay,
    "saved_own": saved_own_overlay,
    "checkpoint_saved": checkpoint_saved_overlay,
}


# ---- values of boxes -------------------------------------------------------------------------------


def reduce_values(spec: Mapping[str, Any], values: Iterable[Any]) -> Any:
    """What a box holding nodes with ``values`` shows: the overlay's ``reduce`` of the numbers
    (``None`` without one), or for a category the one value all of them share, else its
    ``mixed`` category if it names one (the diff page's ``differs``: a box where anything
    differs), else ``None``."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    if spec.get("kind") == "category":
        return present[0] if all(v == present[0] for v in present) else spec.get("mixed")
    how = spec.get("reduce")
    if how == "sum":
        return sum(present)
    if how == "max":
        return max(present)
    if how == "min":
        return min(present)
    if how == "mean":
        return sum(present) / len(present)
    return None


# ---- overlays users bring ---------------------------------------------------------------------------


def _name_of(path: str) -> str:
    return re.sub(r"\.json$", "", path.replace("\\", "/").rsplit("/", 1)[-1]) or "overlay"


def _model_explorer_results(data: dict[str, Any], graph: Graph, where: str) -> dict[str, Any] | None:
    """The ``results`` of Model Explorer node data (``GraphNodeData``, or ``ModelNodeData``: graph
    id -> ``GraphNodeData``, where the graph whose id is the model's name, or the only one, is
    taken), or ``None`` when ``data`` is not Model Explorer's."""
    if isinstance(data.get("results"), dict):
        return data["results"]
    graphs = {k: v for k, v in data.items() if isinstance(v, dict) and isinstance(v.get("results"), dict)}
    if not graphs or len(graphs) != len(data):
        return None
    if len(graphs) == 1:
        return next(iter(graphs.values()))["results"]
    if graph.name in graphs:
        return graphs[graph.name]["results"]
    raise TargetError(f"{where} holds node data for {len(graphs)} graphs ({', '.join(map(show, graphs))}) and "
                      f"none is called {graph.name!r}: keep the one for this model")


def read_overlay(text: str | bytes, graph: Graph, *, where: str = "overlay file",
                 name: str | None = None) -> tuple[str, dict[str, Any], list[str]]:
    """An overlay for ``graph`` from a user's JSON file: ``(name, overlay, keys that match nothing)``.

    The file holds one of: an object mapping node names, module paths (``h.0.attn``: every call of
    it) or module call ids (``h.0.attn#1``) to values, all numbers or all strings (categories);
    an overlay as :func:`set_overlay` writes it (``{"kind", "label", "nodes", "modules", ...}``);
    or Model Explorer's per-node data JSON (``{"results": {node id: {"value": v, "bgColor": c}},
    ...}``, or that per graph id), whose node ids are node names in what ``fxviz json --format
    model-explorer`` writes. The name is ``name`` or the file's stem. Raises
    :class:`~fxviz.errors.TargetError` naming ``where`` when the file is not one of these or
    no key names a node or module of ``graph``.
    """
    try:
        data = json.loads(text)
    except ValueError as e:
        raise TargetError(f"{where} is not JSON ({e}): give a JSON object of node names to values") from e
    if not isinstance(data, dict):
        raise TargetError(f"{where} holds {show(data)}: give a JSON object of node names or module paths to values")
    name = name or _name_of(where)
    spec: dict[str, Any] = {"label": name}
    colors: dict[str, str] = {}
    results = _model_explorer_results(data, graph, where)
    if results is not None:
        spec["description"] = f"Model Explorer node data from {where}"
        values: dict[str, Any] = {}
        for key, r in results.items():
            v = r.get("value") if isinstance(r, dict) else r
            values[key] = v
            color = r.get("bgColor") if isinstance(r, dict) else None
            if isinstance(v, str) and isinstance(color, str) and re.fullmatch(r"#[0-9a-fA-F]{6}", color):
                colors.setdefault(v, color.lower())
        given_modules: dict[str, Any] = {}
    elif data.get("kind") in ("number", "category") and ("nodes" in data or "modules" in data):
        spec.update({k: v for k, v in data.items() if k not in ("nodes", "modules")})
        values = dict(data.get("nodes") or {})
        given_modules = dict(data.get("modules") or {})
    else:
        values, given_modules = dict(data), {}
    nodes, modules, unmatched = _match(graph, {**values, **given_modules})
    if not nodes and not modules:
        first = ", ".join(show(k) for k in list(values)[:3])
        raise TargetError(f"none of the {len(values) + len(given_modules)} keys in {where} names a node or a "
                          f"module of {graph.name or 'the graph'!r} (first: {first}): keys are node names "
                          "(as `fxviz json` writes them) or module paths")
    present = [v for v in [*nodes.values(), *modules.values()] if v is not None]
    if "kind" not in spec:
        if all(isinstance(v, str) for v in present):
            spec["kind"] = "category"
        elif all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
            spec["kind"] = "number"
        else:
            raise TargetError(f"{where} mixes numbers and other values: give all numbers or all strings")
    if spec["kind"] == "number":
        spec.setdefault("scale", "linear")
    else:
        cats = spec.setdefault("categories", {})
        for v in dict.fromkeys(present):
            cats.setdefault(v, {"label": v, **({"color": colors[v]} if v in colors else {})})
    spec["nodes"], spec["modules"] = nodes, modules
    try:
        check_overlay(name, spec, where)
    except GraphFormatError as e:
        raise TargetError(str(e).replace("graph JSON: ", "", 1)) from e
    return name, spec, unmatched


def _match(graph: Graph, values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Split ``values`` by what its keys name: nodes, module calls (by id, or every call of a module
    path), or nothing."""
    tree = graph.calls
    ids = {c.id for c in tree.walk() if c.stack}
    nodes: dict[str, Any] = {}
    modules: dict[str, Any] = {}
    unmatched: list[str] = []
    for key, v in values.items():
        if key in graph:
            nodes[key] = v
        elif key in ids:
            modules[key] = v
        elif tree.calls(key):
            for c in tree.calls(key):
                modules[c.id] = v
        else:
            unmatched.append(key)
    return nodes, modules, unmatched


__all__ = [
    "BUILTIN", "ITEMSIZE", "bytes_overlay", "family_overlay", "node_bytes", "overlays", "params_overlay",
    "read_overlay", "reduce_values", "set_overlay", "stored",
]
