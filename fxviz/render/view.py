"""The view-model every renderer shares: one label, kind and colour per node, so that the tree,
the HTML report and the Graphviz image agree on what a node is called and how it looks.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, cast

from fxviz.calls import Call, CallTree, Region
from fxviz.ir import Graph, Node, Ref, TensorMeta, module_class
from fxviz.nodelist import NodeList
from fxviz.ops import op_family, short_name
from fxviz.passes.plumbing import plumbing_of, plumbing_summary
from fxviz.scopes import Scope

# op family (fxviz.ops.FAMILIES) -> colour. Red is kept for errors alone (ERROR_COLOR): an output
# is purple, a data-dependent exit amber; conv (blue) and pool (cyan), and the greys of shape,
# constant and other ops, differ in lightness as well as hue, so they stay apart for colour-blind
# readers too (tests/test_view.py checks the distances).
KIND_COLORS: dict[str, str] = {
    "input": "#2e7d32",
    "output": "#5e35b1",
    "parameter": "#6d4c41",
    "buffer": "#a1887f",
    "constant": "#bdbdbd",
    "conv": "#1565c0",
    "linear": "#283593",
    "matmul": "#8e24aa",
    "attention": "#ad1457",
    "norm": "#00796b",
    "activation": "#ef6c00",
    "pool": "#00acc1",
    "elementwise": "#7cb342",
    "reduction": "#827717",
    "shape": "#78909c",
    "indexing": "#f06292",
    "creation": "#8d6e63",
    "embedding": "#d81b60",
    "data-dependent": "#ffb300",
    "custom": "#afb42b",
    "module": "#37474f",
    "other": "#424242",
    "call": "#e0e0e0",  # a module call that ran no op: light, it computed nothing
}
#: The colour of the op that raised and of the boxes around it: nothing else is red.
ERROR_COLOR = "#c62828"
#: Colours for categories an overlay gives none for (plumbing's, a user's), in order.
CATEGORY_COLORS: tuple[str, ...] = (
    "#1565c0", "#ef6c00", "#2e7d32", "#8e24aa", "#00acc1", "#827717", "#d81b60", "#6d4c41", "#78909c",
    "#5e35b1", "#7cb342", "#ffb300",
)
#: How long a label or an id may be in any drawing (the details panel and the JSON keep all of it).
MAX_LABEL = 200


def bounded(text: str, limit: int = MAX_LABEL) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis: a 100,000-character class name
    must not become a 100,000-character box."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def text_color(background: str) -> str:
    """Black or white, whichever reads better on ``background`` (``#rrggbb``, WCAG contrast)."""
    def channel(i: int) -> float:
        c = int(background[i : i + 2], 16) / 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    lum = 0.2126 * channel(1) + 0.7152 * channel(3) + 0.0722 * channel(5)
    return "#000000" if (lum + 0.05) / 0.05 > 1.05 / (lum + 0.05) else "#ffffff"


def op_kind(node: Node) -> str:
    """The family a node belongs to (a key of :data:`KIND_COLORS`): its op's family, or its kind
    for a node that is not an op."""
    return op_family(node.target) if node.kind == "op" else node.kind


def node_label(node: Node) -> str:
    """What a renderer prints for a node: the op's short name, a parameter's attribute name,
    an input's argument name."""
    if node.kind == "op":
        return bounded(short_name(node.target))
    if node.kind in ("parameter", "buffer", "constant"):
        return bounded(node.target.rsplit(".", 1)[-1] if node.target else node.name)
    if node.kind == "call":  # the module ran and computed nothing, or ran where no op was seen
        return "ops not recorded" if node.attrs.get("unseen") else "no op"
    return bounded(node.target or node.name)


def node_color(node: Node) -> str:
    return KIND_COLORS[op_kind(node)]


def stable_color(key: str) -> str:
    """A stable colour for any string (module classes): the same on every run, unlike ``hash()``."""
    h = int(hashlib.blake2s(key.encode(), digest_size=4).hexdigest(), 16)
    hue = h % 360
    return _hsl_to_hex(hue, 0.45, 0.42)


def _hsl_to_hex(h: float, s: float, lightness: float) -> str:
    c = (1 - abs(2 * lightness - 1)) * s
    x = c * (1 - abs((h / 60) % 2 - 1))
    m = lightness - c / 2
    r, g, b = [(c, x, 0), (x, c, 0), (0, c, x), (0, x, c), (x, 0, c), (c, 0, x)][int(h // 60) % 6]
    return "#" + "".join(f"{round((v + m) * 255):02x}" for v in (r, g, b))


def scope_label(graph: Graph, scope: Scope) -> str:
    """``initial_conv (Conv2d)``; the root is the model's class name."""
    if not scope.path:
        return bounded(graph.name or scope.cls)
    cls = scope.cls or module_class(graph, scope.path)
    return bounded(f"{scope.name} ({cls})" if cls else scope.name)


def counted(n: int, noun: str, plural: str = "") -> str:
    """``1 op``, ``1,234 ops``: a count and its noun, singular for one (as the report's
    ``counted`` in web/src/text.js)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def format_count(n: int) -> str:
    """``124439808`` -> ``124.4M``."""
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def shared_state(graph: Graph) -> dict[str, list[tuple[str, str]]]:
    """Module path -> ``(attribute, owner node)`` for each parameter or buffer the module holds
    under a name that is not its owner's (tied weights: ``lm_head`` -> ``[("weight",
    "transformer.wte.weight")]``), from the owner nodes' ``attrs["shared_with"]``
    (:func:`fxviz.torchbridge.values.mark_tied`)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for n in graph.nodes:
        if n.kind in ("parameter", "buffer") and n.attrs.get("shared_with"):
            for alias in n.attrs["shared_with"]:
                path, _, attr = str(alias).rpartition(".")
                out.setdefault(path, []).append((attr, n.name))
    return out


#: Capture methods (``Graph.method``) in words: what captured the graph, never what ran it.
CAPTURED_BY: dict[str, str] = {
    "export": "torch.export", "export-strict": "torch.export (strict)",
    "export-decomposed": "torch.export, decomposed to core ATen", "fx": "torch.fx symbolic tracing",
    "eager": "the eager tracer", "eager-aten": "the eager tracer at ATen level",
    "eager (fake)": "the eager tracer on fake tensors", "eager-aten (fake)": "the eager tracer at ATen level on fake tensors",
}


def captured_by(method: str | None) -> str:
    """``captured by the eager tracer``: how a graph was captured, apart from what any analysis of
    it found (a compile page's graph "eager" read as "ran eagerly"); the words of the terminal
    tree's header and the report's. A method with a note after it keeps the note
    (``export (.pt2)``: ``captured by torch.export (.pt2)``); one not known is named as it is."""
    if not method:
        return "captured by an unknown method"
    if method in CAPTURED_BY:
        return f"captured by {CAPTURED_BY[method]}"
    base, paren, note = method.partition(" (")
    if paren and base in CAPTURED_BY:
        return f"captured by {CAPTURED_BY[base]} ({note}"
    return f"captured by {method}"


def node_origin(graph: Graph, name: str) -> str:
    """A node as drawn and where it comes from: ``sub (node add) in mlp.fc at model.py:12``; the
    name only where the label is not it."""
    n = graph.node(name)
    label = node_label(n)
    path = n.module
    text = label if label == n.name else f"{label} (node {n.name})"
    text += f" in {path}" if path else " in the model itself"
    return text + (f" at {n.source.short()}" if n.source is not None else "")


# ---- edges -------------------------------------------------------------------------------------

_SHORT_DTYPES: dict[str, str] = {
    "float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
    "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8",
    "complex64": "c64", "complex128": "c128", "float8_e4m3fn": "f8e4m3", "float8_e5m2": "f8e5m2",
}


def short_dtype(dtype: str) -> str:
    """``float32`` -> ``f32``: edge labels are read a hundred at a time, so they stay short."""
    return _SHORT_DTYPES.get(dtype, dtype)


def edge_label(meta: TensorMeta | None, place: str = "") -> str:
    """What an edge says about the value it carries: ``1×16×768 f32``, a DTensor's placement after
    it (``1×16×768 f32 S(1)``: the shape is the global one); a scalar shows its value or type
    (``s0``, ``int``); unknown metadata gives ``""``."""
    if meta is None:
        return ""
    if not meta.is_tensor:
        return meta.shape_str()
    dims = "×".join(str(d) for d in meta.shape) if meta.shape else "scalar"
    return f"{dims} {short_dtype(meta.dtype)}" + (f" {place}" if place else "")


def node_placement(node: Node) -> str:
    """The placement on its device mesh of ``node``'s (first) output, where it is a DTensor
    (``S(1)``, ``R``, ``P(sum)``, one per mesh dimension: ``attrs["placements"]``), else ``""``."""
    return str(node.attrs.get("placements", ""))


def placement(graph: Graph, ref: Ref) -> str:
    """:func:`node_placement` of the value ``ref`` names."""
    node = cast(NodeList, graph.nodes).find(ref.node) if not ref.index else None
    return node_placement(node) if node is not None else ""


# ---- module calls as boxes -----------------------------------------------------------------------


#: Kinds of box: a module call, a run of folded repeats, a box of the model's inputs or outputs,
#: a region a higher-order op wraps (issue 9), the plumbing of one box.
GROUP_KINDS = ("module", "run", "values", "region", "plumbing")


@dataclass(slots=True)
class Group:
    """One box of a drawn graph; ``kind`` (one of :data:`GROUP_KINDS`) says which: a call of a
    module (``module``), a run of folded identical siblings (``run``), a box of the model's inputs
    or outputs (``values``), a region of a call that ran inside a higher-order op (``region``:
    ``no_grad``, a ``cond`` branch; its ``label`` says which, its ``path`` and ``call`` are those of
    the call it sits in), or the plumbing ops of one box (``plumbing``).

    A module called twice (a shared ``max_pool``) is two boxes, one per call, because a data-flow
    drawing with one box per module would draw edges from the box's second call back into its
    first. ``parent`` is ``None`` for a box directly under the model itself.
    """

    id: str
    path: str
    call: int
    label: str
    cls: str
    parent: str | None
    depth: int  # module nesting level: top-level modules are 1; a run has its members' level
    run: dict[str, Any] | None = None  # the fold annotation entry, for a run box
    children: list[str] = field(default_factory=list)  # child group ids, in first-use order
    values: str = ""  # "input" or "output" for a box of the model's inputs or outputs
    size: int = 0  # how many inputs or outputs a values box holds, how many ops a plumbing box
    kind: str = "module"


@dataclass(slots=True)
class ModuleBoxes:
    """The boxes of a graph and the innermost box of each node (``None``: directly in the model)."""

    groups: dict[str, Group]
    node_group: dict[str, str | None]
    members: dict[str, list[str]]  # run id -> its member group ids, in order
    regions: dict[str, Region] = field(default_factory=dict)  # region box id -> its region

    def ancestors(self, gid: str | None) -> list[str]:
        """``gid`` and the boxes around it, innermost first."""
        out: list[str] = []
        while gid is not None:
            out.append(gid)
            gid = self.groups[gid].parent
        return out


def _box_name(path: str) -> str:
    """``h.0.attn`` -> ``attn``; a list item keeps its container, ``h.0`` -> ``h.0``, since ``0``
    alone says nothing inside a box."""
    head, _, name = path.rpartition(".")
    if name.isdigit() and head:
        return f"{head.rpartition('.')[2]}.{name}"
    return name


#: The container an input or output belongs to: ``cache.layers[3].keys`` ->
#: ``cache``; a plain name (``logits``) has none.
_CONTAINER = re.compile(r"^([^.\[]+)[.\[]")


def value_boxes(graph: Graph, *, min_size: int = 3) -> dict[tuple[str, str], list[str]]:
    """The model's inputs and outputs that come out of one container (a cache, a dict, a tuple),
    ``(kind, container) -> node names``, for containers with at least ``min_size`` of them.

    A 48-layer GPT-2 returns 96 ``cache`` tensors: drawn one by one at the top level,
    they make the first view 96 nodes wide; in one box they read as what they are.
    """
    found: dict[tuple[str, str], list[str]] = {}
    for n in graph.nodes:
        if n.kind in ("input", "output"):
            m = _CONTAINER.match(n.target or n.name)
            if m:
                found.setdefault((n.kind, m.group(1)), []).append(n.name)
    return {k: names for k, names in found.items() if len(names) >= min_size}


def module_boxes(graph: Graph, *, group_values: bool = False, tree: CallTree | None = None,
                 plumbing: bool = True) -> ModuleBoxes:
    """Group the nodes of ``graph`` into boxes: one per module call (:mod:`fxviz.calls`), nested as
    the calls were, one per region of a call that ran inside a higher-order op (kind ``region``,
    labelled ``no_grad``, ``cond: true branch (taken)``, ...), around the ops and calls inside it,
    and one per run of folded repeats (``graph.annotations["fold"]``) around its members. With
    ``group_values``, also one box per container of inputs or outputs (:func:`value_boxes`). With
    ``plumbing`` (and the ``plumbing`` pass run), the plumbing ops of each box, two or more, go
    into one box of kind ``plumbing`` inside it (:func:`plumbing_boxes`).

    Parameters, buffers and constants sit in the box of their owner's first call, so that a
    collapsed ``Linear`` hides its weight and bias with it.
    """
    tree = tree if tree is not None else graph.calls
    groups: dict[str, Group] = {}
    node_group: dict[str, str | None] = {}
    region_gid = {id(r): f"region:{r.id}@{r.call.id}" for r in tree.regions}

    def place(call: Call | None, region: Region | None) -> str | None:
        """The box a step of ``call`` (standing in ``region`` of it) is drawn in."""
        if region is not None:
            return region_gid[id(region)]
        return call.id if call is not None and call.stack else None

    for call in tree.walk():  # parents first
        gid: str | None = None
        if call.stack:
            gid = call.id
            path, index = call.path, call.index
            cls = module_class(graph, path)
            name = _box_name(path)
            label = f"{name} ({cls})" if cls else name
            if index > 0:
                label += f" #{index + 1}"
            groups[gid] = Group(gid, path, index, bounded(label), cls, place(call.parent, call.region),
                                depth=path.count(".") + 1)
        for r in call.regions:  # outer regions first
            rid = region_gid[id(r)]
            groups[rid] = Group(rid, call.path, call.index, bounded(r.label), "", place(call, r.parent),
                                depth=call.path.count(".") + 1 if call.stack else 1, kind="region")
        for name in call.ops:
            node_group[name] = place(call, tree.region_of(name))
        for name in call.state:
            node_group[name] = gid
    # children in the order of their first op (a region is made with its call, before the calls
    # that run before it)
    position = {n.name: i for i, n in enumerate(graph.nodes)}
    first = {c.id: position.get(c.nodes[0], 0) for c in tree.walk() if c.stack and c.nodes}
    first.update({region_gid[id(r)]: position.get(r.nodes[0], 0) for r in tree.regions if r.nodes})
    for g in sorted(groups.values(), key=lambda g: first.get(g.id, 0)):
        if g.parent is not None:
            groups[g.parent].children.append(g.id)
    for n in graph.nodes:
        if n.kind in ("input", "output"):
            node_group[n.name] = None
        elif n.kind == "call":  # drawn inside the box of the module call that ran no op
            node_group[n.name] = tree.of(n.name).id

    members: dict[str, list[str]] = {}
    for run in graph.annotations.get("fold", ()):
        paths = set(run["paths"])
        inside = [g for g in groups.values() if g.path in paths and g.kind == "module"]
        parents = {g.parent for g in inside}
        if len(inside) < 2 or len(parents) != 1:
            continue  # members under different boxes: no single place to fold them into
        parent = parents.pop()
        rid = f"run:{run['label']}#{inside[0].id}"
        groups[rid] = Group(rid, run["label"], 0, bounded(f"{run['label']} ×{run['count']}"), run.get("cls", ""),
                            parent, depth=inside[0].depth, run=run,
                            children=[g.id for g in inside], kind="run")
        siblings = groups[parent].children if parent is not None else None
        for g in inside:
            g.parent = rid
            if siblings is not None and g.id in siblings:
                siblings.remove(g.id)
        if siblings is not None:
            siblings.append(rid)
        members[rid] = [g.id for g in inside]
    if group_values:
        for (kind, container), names in value_boxes(graph).items():
            vid = f"{kind}s:{container}"
            groups[vid] = Group(vid, container, 0, bounded(container), "", None, depth=1,
                                values=kind, size=len(names), kind="values")
            for name in names:
                node_group[name] = vid
    if plumbing:
        plumbing_boxes(graph, groups, node_group)
    # parents first, so a consumer can create boxes in one pass (a run box is made after its
    # members, so order them again; no recursion, nesting can be deep)
    ordered: dict[str, Group] = {}
    for gid in groups:
        chain = []
        at: str | None = gid
        while at is not None and at not in ordered:
            chain.append(at)
            at = groups[at].parent
        for x in reversed(chain):
            ordered[x] = groups[x]
    return ModuleBoxes(ordered, node_group, members, {gid: r for r in tree.regions
                                                      if (gid := region_gid[id(r)]) in groups})


def plumbing_boxes(graph: Graph, groups: dict[str, Group], node_group: dict[str, str | None],
                   *, min_size: int = 2) -> None:
    """Move the plumbing ops (:mod:`fxviz.passes.plumbing`) of every box, ``min_size`` or more,
    into one box of kind ``plumbing`` inside it, labelled ``12 plumbing ops (mask, shape)``. Works
    on whatever boxes exist (module calls, regions), so it composes with every other grouping.
    One op alone stays as it is: its box would be no smaller."""
    found = plumbing_of(graph)
    if not found:
        return
    by_box: dict[str | None, list[str]] = {}
    for n in graph.nodes:
        if n.name in found and n.kind == "op":
            by_box.setdefault(node_group.get(n.name), []).append(n.name)
    for box, names in by_box.items():
        if len(names) < min_size:
            continue
        around = groups[box] if box is not None else None
        pid = f"plumbing:{box if box is not None else ''}"
        groups[pid] = Group(
            pid, around.path if around else "", around.call if around else 0,
            bounded(plumbing_summary(names, found)), "", box, depth=(around.depth + 1) if around else 1,
            size=len(names), kind="plumbing")
        if around is not None:
            around.children.append(pid)
        for name in names:
            node_group[name] = pid

