"""The fxviz graph IR: plain, torch-free data that every pass and renderer reads.

Capture (``fxviz.api.capture``) turns a model's forward into a :class:`Graph`; passes annotate it;
renderers only read it. Nothing here imports torch, so a graph saved as JSON renders anywhere.

One source of truth:

* a :class:`Node` stores its ``inputs`` (references to producer outputs); edges and users are derived;
* a node stores its module call ``stack`` (module path and call index per level); the module scope
  tree is derived from the stacks of all nodes;
* passes write their results under ``Graph.annotations[pass_name]`` and can be re-run at any time.

Example::

    >>> g = Graph(name="Tiny", nodes=[
    ...     Node("x", "input", outputs=(TensorMeta((2, 3), "float32"),)),
    ...     Node("relu", "op", target="aten.relu.default", inputs=(Ref("x"),),
    ...          stack=(("act", 0),), outputs=(TensorMeta((2, 3), "float32"),)),
    ...     Node("output", "output", inputs=(Ref("relu"),)),
    ... ])
    >>> [(e.src, e.dst, e.meta.shape) for e in g.edges]
    [('x', 'relu', (2, 3)), ('relu', 'output', (2, 3))]
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from fxviz.calls import CallTree, ModuleCall, call_tree
from fxviz.errors import GraphFormatError, RenderError
from fxviz.facts import Assumption as Assumption  # re-exported: the IR's plain facts live there
from fxviz.facts import Attempt as Attempt
from fxviz.facts import ModuleInfo as ModuleInfo
from fxviz.facts import SourceLoc as SourceLoc
from fxviz.nodelist import NodeList
from fxviz.saved import PHASES as PHASES  # re-exported: the values of Node.phase
from fxviz.saved import Saved
from fxviz.schema import NODE_KINDS as NODE_KINDS  # re-exported: the IR's node kinds
from fxviz.schema import SCHEMA_VERSION, check, parse, stack_indexer
from fxviz.schema.compact import pack
from fxviz.scopes import Scope, build_scopes

NodeKind = Literal["input", "parameter", "buffer", "constant", "op", "output", "call"]

Dim = int | str  # a concrete size, or a symbolic one such as "s0"


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """What flows along an edge: a tensor's shape and dtype, or a non-tensor value.

    ``shape`` holds ints, or strings for symbolic sizes (``"s0"``, ``"2*s0"``). Non-tensor values
    (a ``SymInt`` computed from a shape, a Python scalar) have ``shape == ()`` and a ``dtype``
    such as ``"int"``, and may carry their printed ``value``.
    """

    shape: tuple[Dim, ...] = ()
    dtype: str = "float32"
    device: str = ""
    value: str | None = None

    @property
    def is_tensor(self) -> bool:
        return self.value is None and self.dtype not in SCALAR_DTYPES

    @property
    def numel(self) -> int | None:
        """Number of elements, or None when a size is symbolic."""
        n = 1
        for d in self.shape:
            if not isinstance(d, int):
                return None
            n *= d
        return n

    def shape_str(self) -> str:
        """``[1, 3, 32, 32]``; a scalar shows its value (``s0``) or its type (``int``)."""
        if not self.is_tensor:
            return self.value if self.value is not None else self.dtype
        return "[" + ", ".join(str(d) for d in self.shape) + "]"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"shape": list(self.shape), "dtype": self.dtype}
        if self.device:
            d["device"] = self.device
        if self.value is not None:
            d["value"] = self.value
        return d


# Types of non-tensor values. "bool" is not here: it is also the dtype of bool tensors; a Python
# bool (or SymBool) is told apart by its ``value``.
SCALAR_DTYPES = frozenset({"int", "float", "complex", "str", "none", "object"})


@dataclass(slots=True, unsafe_hash=True)  # immutable by convention: a frozen __init__ costs 4x, one per value
class Ref:
    """A reference to output ``index`` of node ``node`` (most ops have one output, index 0)."""

    node: str
    index: int = 0

    def to_json(self) -> str | list[Any]:
        return self.node if self.index == 0 else [self.node, self.index]

    @classmethod
    def from_json(cls, v: str | list[Any]) -> Ref:
        return cls(v) if isinstance(v, str) else cls(str(v[0]), int(v[1]))


@dataclass(slots=True)
class Node:
    """One node of the graph.

    Attributes:
        name: unique within the graph.
        kind: ``input``, ``parameter``, ``buffer``, ``constant``, ``op``, ``output``, or ``call``: a
            module call that ran but dispatched no op (an eval-mode ``Dropout`` at ATen level, an
            ``Identity``), so that every module that ran is in the graph; it has no inputs or
            outputs, its ``stack`` is the call's and its ``target`` the module's class.
        target: what an op calls: ``aten.linear.default``, ``torch.relu``, ``Tensor.view``; for a
            parameter or buffer its state-dict name (``h.0.attn.c_attn.weight``); for an input the
            argument it came from (``input_ids``, ``args[1]['mask']``).
        inputs: the producers this node reads, in argument order.
        stack: module calls enclosing the node, outermost first; the root model is not included.
            A parameter's stack is its owning module (call index 0).
        outputs: metadata of each value the node produces.
        source: where in the user's code the node was created, if known.
        attrs: non-tensor arguments and other facts, JSON-safe (``{"stride": [1, 1]}``).
        error: set on the node that raised in a partial graph.
        phase: which pass of a training step the node belongs to: ``forward`` (every node of a
            forward-only capture), ``backward`` (``capture(backward=True)``: gradients, in the
            module whose forward op they differentiate), or ``recompute``. JSON leaves out
            ``forward``, so graphs saved before phases existed read as forward graphs.
    """

    name: str
    kind: NodeKind
    target: str = ""
    inputs: tuple[Ref, ...] = ()
    stack: tuple[ModuleCall, ...] = ()
    outputs: tuple[TensorMeta, ...] = ()
    source: SourceLoc | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    phase: str = "forward"

    @property
    def module(self) -> str:
        """Path of the innermost module this node belongs to (``""`` for the root model)."""
        return self.stack[-1][0] if self.stack else ""

    @property
    def meta(self) -> TensorMeta | None:
        """Metadata of the first output, if any."""
        return self.outputs[0] if self.outputs else None

    def to_dict(self, stack: int | None = None) -> dict[str, Any]:
        """Plain data for JSON; empty fields are left out (:mod:`fxviz.schema` fills them in).
        ``stack``: the index of this node's stack in the graph's table of stacks, written in place
        of the stack itself (see :meth:`Graph.to_dict`)."""
        d: dict[str, Any] = {"name": self.name, "kind": self.kind, "target": self.target,
                             "inputs": [r.to_json() for r in self.inputs],
                             "stack": [[p, c] for p, c in self.stack] if stack is None else stack + 1,
                             "outputs": [m.to_dict() for m in self.outputs],
                             "source": self.source.to_dict() if self.source is not None else None,
                             "attrs": self.attrs}
        d = {k: v for k, v in d.items() if v or k in ("name", "kind")}
        if self.error is not None:
            d["error"] = self.error
        if self.phase != "forward":
            d["phase"] = self.phase
        return d


@dataclass(slots=True, unsafe_hash=True)  # derived per edge: not frozen, as Ref
class Edge:
    """A value flowing from output ``src_index`` of ``src`` into ``dst`` (derived, never stored)."""

    src: str
    dst: str
    src_index: int
    meta: TensorMeta | None


#: Renderers register here (``fxviz.render`` does on import, and ``import fxviz`` imports it), so
#: the IR, at the bottom of the house, draws itself without importing what draws it.
VIEWS: dict[str, Callable[..., Any]] = {}


def view(name: str) -> Callable[..., Any]:
    """The renderer registered as ``name`` (``tree``, ``html``, ``repr_html``, ``text``, ...)."""
    fn = VIEWS.get(name)
    if fn is None:
        raise RenderError(f"no renderer is registered as {name!r}: import fxviz.render first")
    return fn


@dataclass(slots=True)
class Graph:
    """A captured forward graph.

    Attributes:
        name: the model's class name.
        nodes: in execution (topological) order.
        method: the capture method that produced the graph (``export``, ``export-strict``, ``fx``,
            ``eager``, ``eager (fake)``).
        attempts: every capture attempt, in order, including failed ones.
        modules: module path -> facts about that module (``""`` is the root model).
        annotations: results written by passes, keyed by pass name.
        error: when the model itself raised, the error (the graph is partial).
        assumptions: conditions on the inputs the capture took as given (shape guards in user code,
            recorded when sizes are symbolic, see ``dynamic_shapes``; runtime assertions of an
            exported graph).
        notes: facts about the capture a reader should know (``unwrapped OptimizedModule ...``).
        saved: the tensors autograd keeps for the backward (:class:`Saved`), in the order they were
            saved; empty for a forward-only capture.
    """

    name: str = ""
    nodes: list[Node] = field(default_factory=list)
    method: str = ""
    attempts: list[Attempt] = field(default_factory=list)
    modules: dict[str, ModuleInfo] = field(default_factory=dict)
    annotations: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    assumptions: list[Assumption] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    saved: list[Saved] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, NodeList):
            self.nodes = NodeList(self.nodes)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "nodes" and not isinstance(value, NodeList):
            value = NodeList(value)
        object.__setattr__(self, name, value)

    # ---- lookups (derived) -------------------------------------------------------------------

    def node(self, name: str) -> Node:
        """The node called ``name`` (``KeyError`` names it if there is none)."""
        n = cast(NodeList, self.nodes).find(name)
        if n is None:
            raise KeyError(f"graph {self.name!r} has no node {name!r}")
        return n

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and cast(NodeList, self.nodes).find(name) is not None

    def meta_of(self, ref: Ref) -> TensorMeta | None:
        """Metadata of the value ``ref`` points at."""
        outs = self.node(ref.node).outputs
        return outs[ref.index] if ref.index < len(outs) else None

    @property
    def edges(self) -> list[Edge]:
        """Every data edge, derived from node inputs."""
        return [Edge(r.node, n.name, r.index, self.meta_of(r)) for n in self.nodes for r in n.inputs]

    def users(self) -> dict[str, list[str]]:
        """Node name -> names of the nodes that read it, in graph order (each reader once)."""
        out: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            name = n.name
            for r in n.inputs:
                readers = out[r.node]
                # nodes are visited in order, so a reader that reads a value twice is the last one
                if not readers or readers[-1] != name:
                    readers.append(name)
        return out

    @property
    def ops(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "op"]

    @property
    def inputs(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "input"]

    @property
    def outputs(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "output"]

    @property
    def calls(self) -> CallTree:
        """The module call tree (:mod:`fxviz.calls`), derived from node stacks on each access:
        take it once per piece of work."""
        return call_tree(self.nodes)

    @property
    def scopes(self) -> Scope:
        """The module scope tree derived from node stacks (the root is the model itself)."""
        return build_scopes(self.nodes, self.modules, self.name or module_class(self, ""))

    @property
    def partial(self) -> bool:
        return self.error is not None

    # ---- rendering: the renderers in fxviz.render register themselves in VIEWS ----------------

    def tree(self, *, depth: int | None = None, unfold: bool = False, **options: Any) -> Any:
        """A rich renderable of the module tree (``rich.print(g.tree(depth=2))``)."""
        return view("tree")(self, depth=depth, unfold=unfold, **options)

    def __rich__(self) -> Any:
        return self.tree()

    def to_html(self, path: str | None = None, **options: Any) -> str:
        """The interactive report as one self-contained HTML file (see ``fxviz.render.html``)."""
        return view("html")(self, path, **options)  # type: ignore[no-any-return]

    def _repr_html_(self) -> str:
        return view("repr_html")(self)  # type: ignore[no-any-return]

    def to_dot(self, *, depth: int | None = None) -> str:
        """Graphviz DOT source: modules as clusters down to ``depth`` (needs pygraphviz)."""
        return view("dot")(self, depth=depth)  # type: ignore[no-any-return]

    def write_image(self, path: str, *, format: str | None = None, depth: int | None = None) -> None:
        """An SVG, PNG, PDF or DOT file through Graphviz; the format defaults to the suffix."""
        view("image")(self, path, format=format, depth=depth)

    def to_svg(self, path: str, *, depth: int | None = None) -> None:
        self.write_image(path, format="svg", depth=depth)

    def to_png(self, path: str, *, depth: int | None = None) -> None:
        self.write_image(path, format="png", depth=depth)

    def to_pdf(self, path: str, *, depth: int | None = None) -> None:
        self.write_image(path, format="pdf", depth=depth)

    def __str__(self) -> str:
        """The tree as plain text, 120 columns wide."""
        return view("text")(self)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        ops = sum(1 for n in self.nodes if n.kind == "op")
        params = sum((n.meta.numel or 0) for n in self.nodes if n.kind == "parameter" and n.meta is not None
                     and "tied_to" not in n.attrs and "shard_of" not in n.attrs)
        extra = ", partial" if self.partial else ""
        return f"<fxviz.Graph {self.name or 'model'!r} by {self.method or '?'}: {ops} ops, {params:,} params{extra}>"

    # ---- serialisation -----------------------------------------------------------------------

    def to_dict(self, *, stack_table: bool = True) -> dict[str, Any]:
        """Plain data for JSON, linear in nodes + depth: call stacks as one table ``stacks`` of
        ``[parent, path, call index]`` (each node's ``stack`` is 1 + its innermost level's index),
        long strings after earlier ones (:func:`fxviz.schema.compact.pack`). ``stack_table=False``
        writes it all in full."""
        table: list[list[Any]] = []
        stack_index = stack_indexer(table)
        d = {
            "schema": SCHEMA_VERSION,
            "name": self.name,
            "method": self.method,
            "attempts": [a.to_dict() for a in self.attempts],
            "modules": {p: m.to_dict() for p, m in self.modules.items()},
            "nodes": [n.to_dict(stack_index(n.stack) if n.stack and stack_table else None) for n in self.nodes],
            "annotations": self.annotations,
            "error": self.error,
        }
        if table:
            d["stacks"] = table
        if self.assumptions:
            d["assumptions"] = [a.to_dict() for a in self.assumptions]
        if self.notes:
            d["notes"] = list(self.notes)
        if self.saved:
            d["saved"] = [s.to_dict() for s in self.saved]
        return pack(d) if stack_table else d

    def to_json(self, *, indent: int | None = None) -> str:
        """JSON text :meth:`from_json` reads back; NaN or infinity raises :class:`GraphFormatError`."""
        try:
            return json.dumps(self.to_dict(), indent=indent, allow_nan=False)
        except ValueError as e:
            raise GraphFormatError(f"graph {self.name!r} cannot be written as JSON: {e}") from e

    @classmethod
    def from_dict(cls, d: Any) -> Graph:
        """The graph from plain data, checked by :func:`fxviz.schema.check` (see :meth:`from_json`)."""
        return _build(check(d))

    @classmethod
    def from_json(cls, text: str | bytes) -> Graph:
        """The graph from JSON text; anything malformed raises :class:`GraphFormatError`, naming the
        field or node and what was expected."""
        return _build(parse(text))

    def validate(self) -> None:
        """Raise :class:`GraphFormatError` (a ``ValueError``) naming the first broken rule of those a
        saved graph is read by (unique names, inputs defined before use, output indices, types)."""
        try:
            data = self.to_dict(stack_table=False)  # a broken stack is named by its node
        except (TypeError, ValueError, AttributeError) as e:
            raise GraphFormatError(f"graph {self.name!r} has a field of the wrong type: {e}") from e
        check(data)


def _build(d: dict[str, Any]) -> Graph:
    """Objects from data :func:`fxviz.schema.check` returned (already checked and normalised)."""
    source: Callable[[dict[str, Any] | None], SourceLoc | None] = lambda s: SourceLoc(**s) if s is not None else None  # noqa: E731
    nodes = [
        Node(n["name"], n["kind"], n["target"], tuple(Ref(src, i) for src, i in n["inputs"]), n["stack"],
             tuple(TensorMeta(**m) for m in n["outputs"]), source(n["source"]), n["attrs"], n["error"], n["phase"])
        for n in d["nodes"]
    ]
    return Graph(
        name=d["name"], nodes=nodes, method=d["method"],
        attempts=[Attempt(**{**a, "source": source(a["source"])}) for a in d["attempts"]],
        modules={p: ModuleInfo(**m) for p, m in d["modules"].items()},
        annotations=d["annotations"], error=d["error"],
        assumptions=[Assumption(a["expr"], source(a["source"]), a["holds"], a["kind"]) for a in d["assumptions"]],
        notes=d["notes"],
        saved=[Saved(s["node"], s["module"], s["shape"], s["dtype"], s["bytes"], s["value"], s["shares"],
                     s["inferred"], s["reason"]) for s in d["saved"]],
    )


def module_class(graph: Graph, path: str) -> str:
    """Class name of the module at ``path`` (``""`` when unknown)."""
    info = graph.modules.get(path)
    return info.cls if info else ""
