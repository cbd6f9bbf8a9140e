"""The module call tree: every module call of a forward, nested as the calls were, with its own ops,
the state it owns and the values at its boundary. Derived once from the node stacks; everything that
needs module calls reads it (scopes, structure, stats, fold, module boxes, graphdiff, the report).

A node stores its module call ``stack``, ``(("h.0", 0), ("h.0.attn", 0))``: the path and call index
of every enclosing module call, outermost first. A call is identified by its whole stack, so a
module called from two places is two calls, and a call whose ops are interrupted by ops of its
parent is still one call. No torch, no import of the IR at run time (nodes are read by their
fields), so the IR itself can build on this module.

    >>> tree = call_tree(graph.nodes)
    >>> [c.path for c in tree.root.children]
    ['conv1', 'relu', 'fc']
    >>> tree.of("relu_1").path, tree.root.outputs
    ('relu', [Ref(node='fc', index=0)])
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fxviz.ir import ModuleInfo, Node, Ref

ModuleCall = tuple[str, int]  # (module path, call index): ("h.0.attn", 0); the 2nd call has index 1
Stack = tuple[ModuleCall, ...]

#: Node kinds that hold state of the model rather than computing something.
STATE_KINDS = frozenset({"parameter", "buffer", "constant"})


def call_id(stack: Stack) -> str:
    """The whole call chain as text: ``h#0/h.0#0/h.0.attn#0`` (``""`` for the model itself). Its
    length grows with the square of the nesting when paths extend each other, so :attr:`Call.id`
    is not built from it."""
    return "/".join(f"{p}#{c}" for p, c in stack)


@dataclass(eq=False, slots=True)
class Call:
    """One call of a module; the root is the model's own forward.

    A module that ran but dispatched no op is a call too (from its ``call`` node), with no ``ops``,
    ``nodes`` or ``steps`` of its own.

    Attributes:
        stack: the call chain, outermost first (``()`` for the root).
        parent: the enclosing call (``None`` for the root).
        children: child calls, in the order of their first op.
        steps: own ops (node names) and child calls, interleaved in execution order; a child call
            stands where its first op ran.
        ops: names of the ops directly in this call.
        nodes: names of every op inside, any depth, in execution order.
        state: parameters, buffers and constants owned by this module (listed at its first call).
        inputs: values the call reads from outside itself (state excluded), in order of first read.
        outputs: values made inside and read outside (or returned by the model), the last made
            first: a block's result leads, caches it hands back follow.
        id: unique in its graph and as short as the module path: ``h.0.attn#0`` (path and call
            index), with ``@2``, ``@3`` … added for a later call that ends the same way from another
            place (``""`` for the model itself).
    """

    stack: Stack
    parent: Call | None = None
    children: list[Call] = field(default_factory=list)
    steps: list[Call | str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    state: list[str] = field(default_factory=list)
    id: str = ""
    # the boundaries are worked out for the whole tree on first use: most readers never need them
    _inputs: list[Ref] = field(default_factory=list, repr=False)
    _outputs: list[Ref] = field(default_factory=list, repr=False)
    _pending: _Boundaries | None = field(default=None, repr=False)

    @property
    def inputs(self) -> list[Ref]:
        if self._pending is not None:
            self._pending.fill()
        return self._inputs

    @property
    def outputs(self) -> list[Ref]:
        if self._pending is not None:
            self._pending.fill()
        return self._outputs

    @property
    def path(self) -> str:
        return self.stack[-1][0] if self.stack else ""

    @property
    def index(self) -> int:
        """Which call of its module this is (0 for the first)."""
        return self.stack[-1][1] if self.stack else 0

    @property
    def depth(self) -> int:
        return len(self.stack)

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1] if self.path else ""

    def walk(self) -> Iterator[Call]:
        """This call and every call inside it, parents first, in execution order (no recursion:
        module nesting can be thousands of levels deep)."""
        todo = [self]
        while todo:
            c = todo.pop()
            yield c
            todo.extend(reversed(c.children))

    def __repr__(self) -> str:
        return f"Call({self.id or '<root>'}, {len(self.nodes)} ops)"


@dataclass(slots=True)
class CallTree:
    """Every module call of a graph. ``root`` is the model's forward; ``by_stack`` finds a call by
    its stack; :meth:`of` gives the call a node belongs to."""

    root: Call
    by_stack: dict[Stack, Call]
    node_call: dict[str, Call]
    by_path: dict[str, list[Call]]

    def of(self, name: str) -> Call:
        """The innermost call node ``name`` belongs to: an op's own call; a parameter, buffer or
        constant's owner's first call (the nearest enclosing module that ran); the root for the
        model's inputs and outputs."""
        return self.node_call.get(name, self.root)

    def calls(self, path: str) -> list[Call]:
        """The calls of the module at ``path``, in order (empty when it never ran)."""
        return self.by_path.get(path, [])

    def count(self, path: str) -> int:
        """How many times the module at ``path`` was called (distinct call indices)."""
        return len({c.index for c in self.by_path.get(path, ())})

    def walk(self) -> Iterator[Call]:
        return self.root.walk()


def call_tree(nodes: Sequence[Node]) -> CallTree:
    """Derive the call tree of ``nodes`` (a graph's nodes, in execution order). Linear in the
    number of nodes times the module nesting depth."""
    root = Call(())
    by_stack: dict[Stack, Call] = {(): root}
    by_path: dict[str, list[Call]] = {}
    node_call: dict[str, Call] = {}
    ids: dict[str, int] = {}  # "path#index" -> how many calls end that way so far

    def get(stack: Stack) -> Call:
        c = by_stack.get(stack)
        if c is not None:
            return c
        # walk up to the deepest enclosing call that exists: usually one or two levels up (the
        # enclosing call made an op, or a sibling did), where walking down from the root would
        # cost a lookup per level for every new call
        k = len(stack) - 1
        while k > 0:
            parent = by_stack.get(stack[:k])
            if parent is not None:
                return make(parent, stack, k)
            k -= 1
        return make(root, stack, 0)

    def make(parent: Call, stack: Stack, k: int) -> Call:
        """Create the calls of ``stack`` below level ``k`` (``parent`` is the call at level ``k``)."""
        for d in range(k + 1, len(stack) + 1):
            c = Call(stack[:d], parent)
            # an id ends in "#<index>" or in "#<index>@<n>": the two kinds cannot meet
            cid = f"{c.path}#{c.index}"
            n = ids[cid] = ids.get(cid, 0) + 1
            c.id = cid if n == 1 else f"{cid}@{n}"
            by_stack[c.stack] = c
            by_path.setdefault(c.path, []).append(c)
            parent.children.append(c)
            parent.steps.append(c)
            parent = c
        return parent

    state: list[Node] = []
    position: dict[str, int] = {}
    for i, n in enumerate(nodes):
        position[n.name] = i
        if n.kind == "op":
            c = get(n.stack)
            node_call[n.name] = c
            c.ops.append(n.name)
            c.steps.append(n.name)
            a: Call | None = c
            while a is not None:
                a.nodes.append(n.name)
                a = a.parent
        elif n.kind in STATE_KINDS:
            state.append(n)
        elif n.kind == "call":  # a module call that ran no op: the call exists, nothing in it
            node_call[n.name] = get(n.stack)
    for n in state:
        path = n.stack[-1][0] if n.stack else ""
        while path and path not in by_path:
            path = path.rpartition(".")[0]
        owner = by_path[path][0] if path else root
        node_call[n.name] = owner
        owner.state.append(n.name)
    pending = _Boundaries(nodes, node_call, root, position)
    for c in by_stack.values():
        c._pending = pending
    return CallTree(root, by_stack, node_call, by_path)


class _Boundaries:
    """The inputs and outputs of every call, filled in on first use."""

    __slots__ = ("args",)

    def __init__(self, nodes: Sequence[Node], node_call: dict[str, Call], root: Call,
                 position: dict[str, int]) -> None:
        self.args: tuple[Sequence[Node], dict[str, Call], Call, dict[str, int]] | None = (
            nodes, node_call, root, position)

    def fill(self) -> None:
        if self.args is None:
            return
        nodes, node_call, root, position = self.args
        self.args = None
        for c in root.walk():
            c._pending = None
        _boundaries(nodes, node_call, root, position)


def _boundaries(nodes: Sequence[Node], node_call: dict[str, Call], root: Call, position: dict[str, int]) -> None:
    """Fill each call's inputs and outputs from the data edges: an edge from a value made in call
    P to a node in call C crosses every call below their common ancestor, out of P's side and into
    C's side. Cost per edge: the nesting levels it crosses."""
    kinds = {n.name: n.kind for n in nodes}
    ins: dict[int, dict[Ref, None]] = {}
    outs: dict[int, dict[Ref, None]] = {}
    calls: dict[int, Call] = {}
    for n in nodes:
        if n.kind in STATE_KINDS or not n.inputs:
            continue
        dst = node_call.get(n.name, root)
        for r in n.inputs:
            if kinds.get(r.node) in STATE_KINDS:
                continue
            src = node_call.get(r.node, root)
            a, b = src, dst
            while a is not b:
                if a.depth >= b.depth and a.parent is not None:
                    outs.setdefault(id(a), {})[r] = None
                    calls[id(a)] = a
                    a = a.parent
                elif b.parent is not None:
                    ins.setdefault(id(b), {})[r] = None
                    calls[id(b)] = b
                    b = b.parent
                else:  # pragma: no cover - both at the root
                    break
    for key, refs in ins.items():
        calls[key]._inputs = list(refs)
    for key, refs in outs.items():
        calls[key]._outputs = sorted(refs, key=lambda r: (-position.get(r.node, 0), r.index))


# ---- the module hierarchy --------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class Scope:
    """One module in the scope tree (the model's attribute hierarchy), with the calls made to it.

    ``nodes`` are the nodes directly in this module (not in a child), in graph order. ``calls`` is
    how many times the module was called (0 for a container such as ``ModuleList`` that is never
    called itself). Compared by identity and shown without its children: a generated ``==`` or
    ``repr`` would recurse through a tree that can be thousands of levels deep.
    """

    path: str
    cls: str
    calls: int = 0
    children: dict[str, Scope] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1] if self.path else ""

    def __repr__(self) -> str:
        return f"Scope({self.path or '<root>'!r}, {self.cls!r}, {len(self.children)} children, {len(self.nodes)} nodes)"

    def walk(self) -> Iterator[Scope]:
        """This scope and every scope below it, parents first (no recursion)."""
        todo = [self]
        while todo:
            s = todo.pop()
            yield s
            todo.extend(reversed(s.children.values()))


def build_scopes(
    nodes: Sequence[Node], modules: Mapping[str, ModuleInfo], name: str, tree: CallTree | None = None
) -> Scope:
    """The module scope tree of ``nodes``, from their call tree.

    Containers that are never called (``h`` holding ``h.0`` … ``h.11``) still appear, with
    ``calls == 0``, so the tree mirrors the model's attribute hierarchy. Children are in the order
    they first run; modules that only hold state (never called) come after. Export lists every
    parameter before the first op, so ordering by first appearance would follow the order of
    ``__init__`` instead of execution, and make unrelated siblings look consecutive.
    """
    tree = tree if tree is not None else call_tree(nodes)

    def cls_of(path: str) -> str:
        info = modules.get(path)
        return info.cls if info else ""

    root = Scope("", name or cls_of(""), calls=1)
    scopes: dict[str, Scope] = {"": root}

    def get(path: str) -> Scope:
        s = scopes.get(path)
        if s is not None:
            return s
        missing = [path]
        parent_path = path.rpartition(".")[0]
        while parent_path and parent_path not in scopes:
            missing.append(parent_path)
            parent_path = parent_path.rpartition(".")[0]
        parent = scopes[parent_path]
        for p in reversed(missing):
            s = Scope(p, cls_of(p))
            parent.children[p] = s
            scopes[p] = s
            parent = s
        return parent

    for c in tree.walk():
        if c.stack:
            get(c.path)
    for path, calls in tree.by_path.items():
        scopes[path].calls = len({c.index for c in calls})
    for n in nodes:
        get(n.stack[-1][0] if n.stack else "").nodes.append(n.name)
    return root


def prefixes(path: str) -> list[str]:
    """``"a.b.c"`` -> ``["", "a", "a.b", "a.b.c"]``: the module and every module around it."""
    out = [""]
    start = 0
    while path:
        i = path.find(".", start)
        if i < 0:
            out.append(path)
            break
        out.append(path[:i])
        start = i + 1
    return out


__all__ = ["STATE_KINDS", "Call", "CallTree", "ModuleCall", "Scope", "Stack", "build_scopes", "call_id",
           "call_tree", "prefixes"]
