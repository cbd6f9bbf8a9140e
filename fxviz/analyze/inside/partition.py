"""AOT Autograd's forward/backward partition of one compiled graph, read from torch's own graphs.
No torch.

The partitioner (``min_cut_rematerialization_partition`` under Inductor, ``default_partition``
under ``aot_eager``) splits the joint graph into the forward and backward graphs torch prints into
its structured trace (``aot_forward_graph``, ``aot_backward_graph``). What it chose is in them, so
fxviz reads it there and does not imitate the partitioner:

* **saved**: the backward graph's inputs that are not tangents (``tangents_*``), which are the forward
  graph's outputs beyond the user's. Each is the forward node of that name; its ``bytes`` is the
  extra memory it costs, as in :class:`fxviz.saved.Saved`: the size of its storage the first time that
  storage is saved, 0 for a forward input (a parameter, a buffer, a user input) or for a view
  of one (``shares`` says which), or for a view of a storage already counted (``view``);
  the sizes come from the printed shapes and dtypes (``f32[4, 32]``); symbolic sizes give
  ``bytes = None``.
* **recomputed**: the backward's ops that are ops of the forward graph too (same node name), torch's
  own definition (``remat_nodes`` in ``torch/_functorch/partitioners.py``), getitems left out; when
  the joint graph was printed too, only those that are ops of it.

Each node's module comes from the stages' provenance: the post-grad graph's node of that name
(Inductor's ``postToPre``: exact), else a Dynamo node of the same user source line (:func:`_align`:
inferred); a forward input's from the Dynamo placeholder it is (``PlainAOTInput(idx=N)``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from fxviz.analyze.inside.stages import primal_index
from fxviz.analyze.pipeline.result import Pipeline
from fxviz.ir import Graph, Node, TensorMeta
from fxviz.passes.overlays import ITEMSIZE, set_overlay
from fxviz.passes.panels import row, set_panel

#: The overlay of the saved bytes on the eager graph.
SAVES = "backward saves"

_INPUT_KINDS = ("input", "parameter", "buffer")
#: ATen ops whose output is a view of their first input (the storage is their input's).
_VIEWS = frozenset({
    "view", "reshape", "permute", "t", "transpose", "expand", "unsqueeze", "squeeze", "slice", "select", "as_strided",
    "alias", "_unsafe_view", "view_as", "unflatten", "flatten", "detach", "_reshape_alias", "narrow", "diagonal",
    "split", "split_with_sizes", "unbind", "chunk",
})


@dataclass
class SavedValue:
    """A forward value the compiled backward reads (see the module's docstring)."""

    node: str
    module: str | None
    bytes: int | None
    shape: list[Any]
    dtype: str
    shares: str = ""  # why bytes is 0: "parameter", "buffer", "input" or "view"
    eager: str = ""  # the eager op it comes from, when known
    inferred: bool = False  # the module was matched by source line, not recorded by torch


@dataclass
class Recomputed:
    """A forward op the compiled backward runs again."""

    node: str
    module: str | None
    op: str
    eager: str = ""
    inferred: bool = False


@dataclass
class Partition:
    """What the partitioner chose for one compiled graph."""

    saved: list[SavedValue] = field(default_factory=list)
    recomputed: list[Recomputed] = field(default_factory=list)
    partitioner: str = ""  # "min-cut" when torch's events show min_cut_rematerialization_partition ran

    @property
    def saved_bytes(self) -> int:
        """The extra memory of the saved values (symbolic sizes left out)."""
        return sum(s.bytes or 0 for s in self.saved)

    def per_module(self) -> list[tuple[str, int, int, int]]:
        """(module, saved bytes, saved values, recomputed ops) per module, most bytes first;
        ``"?"`` for the nodes no record placed."""
        rows: dict[str, list[int]] = {}
        for s in self.saved:
            r = rows.setdefault("?" if s.module is None else s.module, [0, 0, 0])
            r[0] += s.bytes or 0
            r[1] += 1
        for c in self.recomputed:
            rows.setdefault("?" if c.module is None else c.module, [0, 0, 0])[2] += 1
        return sorted(((m, *v) for m, v in rows.items()), key=lambda r: (-r[1], -r[3], r[0]))  # type: ignore[misc]

    def to_dict(self) -> dict[str, Any]:
        return {"partitioner": self.partitioner, "saved_bytes": self.saved_bytes,
                "saved": [asdict(s) for s in self.saved], "recomputed": [asdict(r) for r in self.recomputed]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Partition:
        return cls([SavedValue(**s) for s in d.get("saved", [])], [Recomputed(**r) for r in d.get("recomputed", [])],
                   d.get("partitioner", ""))


def read(pipeline: Pipeline, *, partitioner: str = "", record: Mapping[str, str] | None = None) -> Partition | None:
    """The partition the stages of one compiled graph record (``None`` without a backward graph);
    ``record``: AOT forward node -> the module torch's own ``nn_module_stack`` gives it, where a live
    ``aot_eager`` run recorded it (:func:`fxviz.torchbridge.modulerecord.aot_eager_recorded`)."""
    graphs = {s.name: s.graph for s in pipeline.stages}
    fw, bw = graphs.get("AOT forward"), graphs.get("AOT backward")
    if fw is None or bw is None:
        return None
    origin = _Origin(graphs, fw, record or {})
    fw_nodes = {n.name: n for n in fw.nodes}
    out = Partition(partitioner=partitioner)
    counted: set[str] = set()
    for p in bw.nodes:
        if p.kind not in _INPUT_KINDS or p.name.startswith("tangents"):
            continue
        n = fw_nodes.get(p.name, p)
        meta = n.meta or p.meta
        base = _base(n, fw_nodes)
        module, eager, inferred = origin.of(_aliased(n, fw_nodes) if n.kind == "op" else base)
        shares = ""
        size: int | None = 0
        if meta is None or not meta.is_tensor:
            size = 0
        elif base.kind in _INPUT_KINDS:
            shares = origin.input_kind(base)
            if shares in ("parameter", "buffer") and base is not n:  # a view of it: its module's, exactly
                module, eager, inferred = origin.of(base)
        elif base.name in counted:
            shares = "view"
        else:
            counted.add(base.name)
            size = _bytes(base.meta if base.meta is not None and base.meta.is_tensor else meta)
        out.saved.append(SavedValue(p.name, module, size, list(meta.shape) if meta else [],
                                    meta.dtype if meta else "", shares, eager, inferred))
    joint = graphs.get("AOT joint graph")
    joint_ops = {n.name for n in joint.nodes if n.kind == "op"} if joint is not None else None
    for n in bw.nodes:
        f = fw_nodes.get(n.name)
        if n.kind != "op" or f is None or f.kind != "op" or _short(n.target) == "getitem":
            continue
        if joint_ops is not None and n.name not in joint_ops:
            continue
        module, eager, inferred = origin.of(f)
        out.recomputed.append(Recomputed(n.name, module, _short(n.target), eager, inferred))
    return out


def size(n: int | None) -> str:
    """``3.0 KB``; ``?`` for a symbolic size."""
    if n is None:
        return "?"
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def summary(parts: list[Partition]) -> str:
    """``the compiled backward saves 3.0 KB (5 values) and recomputes 2 ops``."""
    saved = sum(p.saved_bytes for p in parts)
    n = sum(len(p.saved) for p in parts)
    r = sum(len(p.recomputed) for p in parts)
    out = (f"the compiled backward saves {size(saved)} ({n} value{'s' if n != 1 else ''}) and recomputes "
           f"{r} op{'s' if r != 1 else ''}")
    lost = [s for p in parts for s in p.saved if s.module is None]
    lost_ops = sum(1 for p in parts for c in p.recomputed if c.module is None)
    if lost or lost_ops:  # '?' in the tables: say why rather than leave it unexplained
        out += (f"; {len(lost)} saved value(s) ({size(sum(s.bytes or 0 for s in lost))}) and {lost_ops} recomputed "
                "op(s) on no module ('?'): no record names one, and the source line AOT Autograd gives them "
                "(inside a torch function or a higher-order op's body) is on no op of the Dynamo graph")
    return out


def write(graph: Graph, parts: list[Partition], ids: Sequence[str] = ()) -> None:
    """The overlay ``backward saves`` (bytes per eager op that made a saved value, per module call
    with its submodules) and the panel ``partition`` (one row per saved value and recomputed op,
    with the compiled graph of ``ids`` it belongs to; the note names each graph's partitioner, as
    the terminal's tables do) on the eager ``graph``."""
    if not parts:
        return
    ops = {n.name for n in graph.nodes if n.kind == "op"}
    nodes: dict[str, int] = {}
    for p in parts:
        for s in p.saved:
            if s.eager in ops:
                nodes[s.eager] = nodes.get(s.eager, 0) + (s.bytes or 0)
    if nodes:
        modules = {c.id: sum(nodes.get(x, 0) for x in c.nodes) for c in graph.calls.walk() if c.id}
        set_overlay(graph, SAVES, label="backward saves", kind="number", unit="B", scale="log", reduce="sum",
                    nodes=nodes, modules={k: v for k, v in modules.items() if v},
                    description="bytes the compiled backward keeps from the forward (AOT Autograd's partition: "
                                "each storage once, inputs and parameters 0), per op that made them")
    rows = []
    gids = list(ids) if len(ids) == len(parts) else [""] * len(parts)
    for gid, p in zip(gids, parts, strict=True):
        for s in p.saved:
            rows.append(row(gid or None, "saved", s.node, _where(s.module), s.eager or None, f"{s.dtype}{s.shape}",
                            size(s.bytes) + (f" ({s.shares})" if s.shares else ""),
                            node=s.eager if s.eager in ops else None, level="info" if s.shares else "ok",
                            sort=[None, None, None, None, None, None, s.bytes]))
        for c in p.recomputed:
            rows.append(row(gid or None, "recomputed", c.node, _where(c.module), c.eager or None, c.op, None,
                            node=c.eager if c.eager in ops else None, level="warn"))
    how = [f"{gid or 'graph'}: {p.partitioner} partitioner" for gid, p in zip(gids, parts, strict=True) if p.partitioner]
    set_panel(graph, "partition", title="forward/backward partition",
              columns=["graph", "what", "node", "module", "eager op", "tensor / op", "bytes"], rows=rows,
              note=summary(parts) + " (AOT Autograd's forward and backward graphs)" + "".join(f"; {h}" for h in how))


def _where(module: str | None) -> str:
    return "?" if module is None else module or "(model)"


def _short(target: str) -> str:
    """``aten.addmm.default`` -> ``addmm``; ``operator.getitem`` -> ``getitem``."""
    parts = [p for p in target.split(".") if p not in ("torch", "ops", "aten", "prims", "operator", "default",
                                                         "Tensor", "Scalar", "int", "dim", "using_ints")]
    return parts[0] if parts else target


def _base(n: Node, nodes: dict[str, Node]) -> Node:
    """The node whose storage ``n``'s output is (through view ops' first input)."""
    for _ in range(1000):
        if n.kind != "op" or not n.inputs or n.inputs[0].node not in nodes:
            break
        src = nodes[n.inputs[0].node]
        if _short(n.target) in _VIEWS:
            n = src
        elif _short(n.target) == "getitem" and src.kind == "op" and _short(src.target) in _VIEWS:
            n = src  # an output of split / unbind / chunk: a view of their input
        else:
            break
    return n


def _aliased(n: Node, nodes: dict[str, Node]) -> Node:
    """The op whose output ``n`` is, through ``detach``/``alias`` (AOT Autograd saves
    ``detach(detach(tanh))``: the value is tanh's, and it sits on tanh's line, not the line AOT
    printed the detach under)."""
    while n.kind == "op" and _short(n.target) in ("detach", "alias") and n.inputs and n.inputs[0].node in nodes:
        n = nodes[n.inputs[0].node]
    return n


def _bytes(meta: TensorMeta) -> int | None:
    numel = meta.numel
    size = ITEMSIZE.get(meta.dtype)
    return None if numel is None or size is None else numel * size


class _Origin:
    """Module paths and eager ops of the forward graph's nodes (see the module's docstring)."""

    def __init__(self, graphs: dict[str, Graph], fw: Graph, record: Mapping[str, str]) -> None:
        self.record = record
        self.posts = [g for name, g in graphs.items() if name.startswith("post-grad passes")]
        dyn = graphs.get("Dynamo graph")
        self.dyn_inputs = [n for n in dyn.nodes if n.kind in _INPUT_KINDS] if dyn is not None else []
        self.by_line: dict[str, Node] = {}  # AOT forward node -> the Dynamo node of its line
        if dyn is None:
            return
        lines: dict[tuple[str, int], list[Node]] = {}
        for n in dyn.nodes:
            if n.kind == "op" and n.source is not None and n.source.line:
                lines.setdefault((n.source.file, n.source.line), []).append(n)
        mine: dict[tuple[str, int], list[Node]] = {}
        for n in fw.nodes:
            if n.kind == "op" and n.source is not None and n.source.line:
                mine.setdefault((n.source.file, n.source.line), []).append(n)
        for key, aot in mine.items():
            self.by_line.update(_align(aot, lines.get(key, [])))

    def of(self, n: Node) -> tuple[str | None, str, bool]:
        """(module, eager op, inferred) of forward node ``n``."""
        if n.kind in _INPUT_KINDS:
            d = self._dyn_input(n)
            return (_module(d) if d is not None else None), "", False
        for post in self.posts:
            if n.name in post:
                p = post.node(n.name)
                eager = str(p.attrs.get("eager", ""))
                m = _module(p)
                if m is not None:
                    return m, _first(eager), "(inferred)" in eager
        d = self.by_line.get(n.name)
        if n.name in self.record:  # torch's own: a node inside a torch function has no Dynamo op of its line
            return self.record[n.name], _first(str(d.attrs.get("eager", ""))) if d is not None else "", False
        if d is not None:
            return _module(d), _first(str(d.attrs.get("eager", ""))), True
        return None, "", False

    def _dyn_input(self, n: Node) -> Node | None:
        idx = primal_index(n.attrs.get("aot"))
        return self.dyn_inputs[idx] if idx is not None and idx < len(self.dyn_inputs) else None

    def input_kind(self, n: Node) -> str:
        d = self._dyn_input(n)
        return d.kind if d is not None and d.kind in ("parameter", "buffer") else "input"


def _align(aot: list[Node], dyn: list[Node]) -> dict[str, Node]:
    """The AOT ops of one source line -> the Dynamo ops of that line (a line runs once per call:
    GPT-2's blocks run the same lines), in order. An AOT op of a Dynamo op's own name is the first
    such Dynamo op not taken yet, at or after the last one matched (:func:`_op_name`: ``native_layer_norm``
    is ``layer_norm``'s); an output of a multi-output op (``getitem``) is that op's; any other comes from decomposing
    a Dynamo op that no AOT op is named after (``linear`` -> ``t``, ``addmm``): the one at or after
    the last matched, the next one when the op that opened its group comes again."""
    if not dyn:
        return {}
    names = {_op_name(_short(a.target)) for a in aot}
    dnames = [_op_name(d.target.rsplit(".", 1)[-1]) for d in dyn]
    split = [k for k, name in enumerate(dnames) if name not in names]
    taken: set[int] = set()
    opened: dict[int, str] = {}  # a decomposed Dynamo op -> the name of its first AOT op
    out: dict[str, Node] = {}
    p = 0
    for a in aot:
        name = _op_name(_short(a.target))
        src = a.inputs[0].node if a.inputs else ""
        if name == "getitem" and src in out:  # an output of a multi-output op (native_layer_norm's mean): that op's
            out[a.name] = out[src]
            continue
        k = next((k for k in range(p, len(dyn)) if dnames[k] == name and k not in taken), None)
        if k is not None:
            taken.add(k)
        else:
            ahead = [k for k in split if k >= p] or split[-1:] or [p]
            k = ahead[1] if opened.get(ahead[0]) == name and len(ahead) > 1 else ahead[0]
            opened.setdefault(k, name)
        out[a.name] = dyn[k]
        p = k
    return out


def _op_name(name: str) -> str:
    """An op's name as Dynamo's graph and AOT's graph both spell it: aten's ``native_layer_norm``
    and ``_softmax`` are Dynamo's ``layer_norm`` and ``softmax``."""
    name = name.strip("_")
    return name.removeprefix("native_")


def _module(n: Node) -> str | None:
    if n.stack:
        return n.module
    if "module" in n.attrs:
        return str(n.attrs["module"])
    if n.kind == "input":
        return ""
    return "" if n.attrs.get("eager") else None


def _first(eager: str) -> str:
    return eager.replace(" (inferred)", "").split(", ")[0]


__all__ = ["SAVES", "Partition", "Recomputed", "SavedValue", "read", "size", "summary", "write"]
