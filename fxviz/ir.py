"""The fxviz graph IR: plain, torch-free data that every pass and renderer reads.

Capture (``fxviz.capture``) turns a model's forward into a :class:`Graph`; passes annotate it;
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

SCHEMA_VERSION = 1

NodeKind = Literal["input", "parameter", "buffer", "constant", "op", "output"]
NODE_KINDS: tuple[str, ...] = ("input", "parameter", "buffer", "constant", "op", "output")
#: Kinds that hold state of the model rather than computing something.
STATE_KINDS = frozenset({"parameter", "buffer", "constant"})

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

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TensorMeta:
        return cls(tuple(d["shape"]), d["dtype"], d.get("device", ""), d.get("value"))


# Types of non-tensor values. "bool" is not here: it is also the dtype of bool tensors; a Python
# bool (or SymBool) is told apart by its ``value``.
SCALAR_DTYPES = frozenset({"int", "float", "complex", "str", "none", "object"})


@dataclass(frozen=True, slots=True)
class Ref:
    """A reference to output ``index`` of node ``node`` (most ops have one output, index 0)."""

    node: str
    index: int = 0

    def to_json(self) -> str | list[Any]:
        return self.node if self.index == 0 else [self.node, self.index]

    @classmethod
    def from_json(cls, v: str | list[Any]) -> Ref:
        return cls(v) if isinstance(v, str) else cls(str(v[0]), int(v[1]))


@dataclass(frozen=True, slots=True)
class SourceLoc:
    """Where in the user's code a node came from."""

    file: str
    line: int
    func: str = ""
    code: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    def short(self) -> str:
        """``model.py:12`` (file name without directories)."""
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "func": self.func, "code": self.code}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SourceLoc:
        return cls(d["file"], int(d["line"]), d.get("func", ""), d.get("code", ""))


ModuleCall = tuple[str, int]  # (module path, call index): ("h.0.attn", 0); the 2nd call has index 1


@dataclass(slots=True)
class Node:
    """One node of the graph.

    Attributes:
        name: unique within the graph.
        kind: ``input``, ``parameter``, ``buffer``, ``constant``, ``op`` or ``output``.
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

    @property
    def module(self) -> str:
        """Path of the innermost module this node belongs to (``""`` for the root model)."""
        return self.stack[-1][0] if self.stack else ""

    @property
    def meta(self) -> TensorMeta | None:
        """Metadata of the first output, if any."""
        return self.outputs[0] if self.outputs else None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.target:
            d["target"] = self.target
        if self.inputs:
            d["inputs"] = [r.to_json() for r in self.inputs]
        if self.stack:
            d["stack"] = [[p, c] for p, c in self.stack]
        if self.outputs:
            d["outputs"] = [m.to_dict() for m in self.outputs]
        if self.source is not None:
            d["source"] = self.source.to_dict()
        if self.attrs:
            d["attrs"] = self.attrs
        if self.error is not None:
            d["error"] = self.error
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Node:
        kind = d["kind"]
        if kind not in NODE_KINDS:
            raise ValueError(f"node {d.get('name')!r} has unknown kind {kind!r}")
        return cls(
            name=d["name"],
            kind=kind,
            target=d.get("target", ""),
            inputs=tuple(Ref.from_json(r) for r in d.get("inputs", ())),
            stack=tuple((str(p), int(c)) for p, c in d.get("stack", ())),
            outputs=tuple(TensorMeta.from_dict(m) for m in d.get("outputs", ())),
            source=SourceLoc.from_dict(d["source"]) if d.get("source") else None,
            attrs=dict(d.get("attrs", {})),
            error=d.get("error"),
        )


@dataclass(frozen=True, slots=True)
class Edge:
    """A value flowing from output ``src_index`` of ``src`` into ``dst`` (derived, never stored)."""

    src: str
    dst: str
    src_index: int
    meta: TensorMeta | None


@dataclass(frozen=True, slots=True)
class Attempt:
    """One capture attempt: which method, whether it worked, and why not."""

    method: str
    ok: bool
    seconds: float = 0.0
    error_type: str = ""
    message: str = ""
    source: SourceLoc | None = None

    def reason(self) -> str:
        """The failure in one line: ``GuardOnDataDependentSymNode: Could not guard on ... (m.py:12)``."""
        if self.ok:
            return "ok"
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        text = f"{self.error_type}: {first}" if first else self.error_type
        return f"{text} ({self.source.short()})" if self.source else text

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"method": self.method, "ok": self.ok, "seconds": round(self.seconds, 4)}
        if not self.ok:
            d.update(error_type=self.error_type, message=self.message)
        if self.source is not None:
            d["source"] = self.source.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Attempt:
        return cls(
            d["method"], bool(d["ok"]), float(d.get("seconds", 0.0)), d.get("error_type", ""),
            d.get("message", ""), SourceLoc.from_dict(d["source"]) if d.get("source") else None,
        )


@dataclass(frozen=True, slots=True)
class Assumption:
    """A condition on the inputs that symbolic capture took as given: a shape guard from user code
    (``x.shape[0] > 2`` where the forward branches on it). The captured graph holds only the path
    those inputs take; other inputs would take another path the graph does not have."""

    expr: str
    source: SourceLoc | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"expr": self.expr}
        if self.source is not None:
            d["source"] = self.source.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Assumption:
        return cls(d["expr"], SourceLoc.from_dict(d["source"]) if d.get("source") else None)


@dataclass(frozen=True, slots=True)
class ModuleInfo:
    """Facts about one submodule of the model, known at capture time."""

    cls: str  # class name, e.g. "GPT2Block"
    qualname: str = ""  # "transformers.models.gpt2.modeling_gpt2.GPT2Block"

    def to_dict(self) -> dict[str, Any]:
        return {"cls": self.cls, "qualname": self.qualname}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModuleInfo:
        return cls(d["cls"], d.get("qualname", ""))


@dataclass(slots=True)
class Scope:
    """One module in the derived scope tree, with the calls made to it.

    ``nodes`` are the nodes directly in this module (not in a child), in graph order. ``calls`` is
    how many times the module was called (0 for a container such as ``ModuleList`` that is never
    called itself).
    """

    path: str
    cls: str
    calls: int = 0
    children: dict[str, Scope] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1] if self.path else ""

    def walk(self) -> Iterator[Scope]:
        yield self
        for child in self.children.values():
            yield from child.walk()


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
        assumptions: conditions on the inputs the capture took as given (shape guards in user code;
            recorded when sizes are symbolic, see ``dynamic_shapes``).
    """

    name: str = ""
    nodes: list[Node] = field(default_factory=list)
    method: str = ""
    attempts: list[Attempt] = field(default_factory=list)
    modules: dict[str, ModuleInfo] = field(default_factory=dict)
    annotations: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    assumptions: list[Assumption] = field(default_factory=list)
    _index: dict[str, Node] | None = field(default=None, repr=False, compare=False)

    # ---- lookups (derived) -------------------------------------------------------------------

    def node(self, name: str) -> Node:
        """The node called ``name`` (``KeyError`` names it if there is none)."""
        if self._index is None or len(self._index) != len(self.nodes):
            self._index = {n.name: n for n in self.nodes}
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(f"graph {self.name!r} has no node {name!r}") from None

    def __contains__(self, name: object) -> bool:
        try:
            self.node(name)  # type: ignore[arg-type]
        except KeyError:
            return False
        return True

    def meta_of(self, ref: Ref) -> TensorMeta | None:
        """Metadata of the value ``ref`` points at."""
        outs = self.node(ref.node).outputs
        return outs[ref.index] if ref.index < len(outs) else None

    @property
    def edges(self) -> list[Edge]:
        """Every data edge, derived from node inputs."""
        return [
            Edge(r.node, n.name, r.index, self.meta_of(r)) for n in self.nodes for r in n.inputs
        ]

    def users(self) -> dict[str, list[str]]:
        """Node name -> names of the nodes that read it, in graph order."""
        out: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for r in n.inputs:
                if n.name not in out[r.node]:
                    out[r.node].append(n.name)
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
    def scopes(self) -> Scope:
        """The module scope tree derived from node stacks (the root is the model itself)."""
        return build_scopes(self)

    @property
    def partial(self) -> bool:
        return self.error is not None

    # ---- rendering (thin: the work is in fxviz.render) -----------------------------------------

    def tree(self, *, depth: int | None = None, unfold: bool = False) -> Any:
        """A rich renderable of the module tree (``rich.print(g.tree(depth=2))``)."""
        from fxviz.render.tree import TreeView

        return TreeView(self, depth=depth, unfold=unfold)

    def __rich__(self) -> Any:
        return self.tree()

    def to_html(self, path: str | None = None, **options: Any) -> str:
        """The interactive report as one self-contained HTML file (see ``fxviz.render.html``)."""
        from fxviz.render.html import to_html

        return to_html(self, path, **options)

    def _repr_html_(self) -> str:
        from fxviz.render.html import repr_html

        return repr_html(self)

    def to_dot(self, *, depth: int | None = None) -> str:
        """Graphviz DOT source: modules as clusters down to ``depth`` (needs pygraphviz)."""
        from fxviz.render.dot import to_dot

        return to_dot(self, depth=depth)

    def write_image(self, path: str, *, format: str | None = None, depth: int | None = None) -> None:
        """An SVG, PNG, PDF or DOT file through Graphviz; the format defaults to the suffix."""
        from fxviz.render.dot import write_image

        write_image(self, path, format=format, depth=depth)

    def to_svg(self, path: str, *, depth: int | None = None) -> None:
        self.write_image(path, format="svg", depth=depth)

    def to_png(self, path: str, *, depth: int | None = None) -> None:
        self.write_image(path, format="png", depth=depth)

    def to_pdf(self, path: str, *, depth: int | None = None) -> None:
        self.write_image(path, format="pdf", depth=depth)

    def __str__(self) -> str:
        import io

        from rich.console import Console

        console = Console(width=120, color_system=None, record=True, file=io.StringIO())
        console.print(self.tree())
        return console.export_text().rstrip("\n")

    # ---- serialisation -----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        d = {
            "schema": SCHEMA_VERSION,
            "name": self.name,
            "method": self.method,
            "attempts": [a.to_dict() for a in self.attempts],
            "modules": {p: m.to_dict() for p, m in self.modules.items()},
            "nodes": [n.to_dict() for n in self.nodes],
            "annotations": self.annotations,
            "error": self.error,
        }
        if self.assumptions:
            d["assumptions"] = [a.to_dict() for a in self.assumptions]
        return d

    def to_json(self, *, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Graph:
        schema = d.get("schema")
        if schema != SCHEMA_VERSION:
            raise ValueError(
                f"graph JSON has schema {schema!r}, this fxviz reads schema {SCHEMA_VERSION}: "
                "re-capture the model with this version"
            )
        return cls(
            name=d.get("name", ""),
            nodes=[Node.from_dict(n) for n in d.get("nodes", ())],
            method=d.get("method", ""),
            attempts=[Attempt.from_dict(a) for a in d.get("attempts", ())],
            modules={p: ModuleInfo.from_dict(m) for p, m in d.get("modules", {}).items()},
            annotations=dict(d.get("annotations", {})),
            error=d.get("error"),
            assumptions=[Assumption.from_dict(a) for a in d.get("assumptions", ())],
        )

    @classmethod
    def from_json(cls, text: str) -> Graph:
        return cls.from_dict(json.loads(text))

    # ---- checks ------------------------------------------------------------------------------

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first broken invariant (unique names, inputs defined
        before use, output indices in range)."""
        seen: dict[str, Node] = {}
        for n in self.nodes:
            if n.name in seen:
                raise ValueError(f"duplicate node name {n.name!r}")
            for r in n.inputs:
                src = seen.get(r.node)
                if src is None:
                    raise ValueError(f"node {n.name!r} reads {r.node!r} before it is defined")
                if src.outputs and r.index >= len(src.outputs):
                    raise ValueError(
                        f"node {n.name!r} reads output {r.index} of {r.node!r}, "
                        f"which has {len(src.outputs)}"
                    )
            seen[n.name] = n


def short_target(target: str) -> str:
    """The name a user recognises: ``aten.linear.default`` -> ``linear``, ``torch.nn.functional.relu``
    -> ``relu``, ``Tensor.view`` -> ``view``, ``aten.add.Tensor`` -> ``add``."""
    if target.startswith("aten.") or target.startswith("prims."):
        parts = target.split(".")
        return parts[1] if len(parts) > 1 else target
    return target.rsplit(".", 1)[-1]


def module_class(graph: Graph, path: str) -> str:
    """Class name of the module at ``path`` (``""`` when unknown)."""
    info = graph.modules.get(path)
    return info.cls if info else ""


def build_scopes(graph: Graph) -> Scope:
    """Derive the module scope tree from node stacks.

    Containers that are never called (``h`` holding ``h.0`` … ``h.11``) still appear, with
    ``calls == 0``, so the tree mirrors the model's attribute hierarchy. Children are in the order
    they first run; modules that only hold state (never called) come after. Export lists every
    parameter before the first op, so ordering by first appearance would follow the order of
    ``__init__`` instead of execution, and make unrelated siblings look consecutive.
    """
    root = Scope("", graph.name or module_class(graph, ""), calls=1)
    scopes: dict[str, Scope] = {"": root}
    seen_calls: dict[str, set[int]] = {}

    def get(path: str) -> Scope:
        s = scopes.get(path)
        if s is None:
            parent_path = path.rsplit(".", 1)[0] if "." in path else ""
            parent = get(parent_path)
            s = Scope(path, module_class(graph, path))
            parent.children[path] = s
            scopes[path] = s
        return s

    # first the modules that run, in execution order; nodes share a handful of stacks, so the
    # work is per distinct stack, not per node
    stacks: dict[tuple[ModuleCall, ...], None] = {}
    for n in graph.nodes:
        if n.kind not in STATE_KINDS and n.stack not in stacks:
            stacks[n.stack] = None
            for path, call in n.stack:
                get(path)
                seen_calls.setdefault(path, set()).add(call)
    for path, calls in seen_calls.items():
        scopes[path].calls = len(calls)
    for n in graph.nodes:
        get(n.module).nodes.append(n.name)
    return root
