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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fxviz.callbounds import STATE_KINDS, Boundaries, RegionBoundaries
from fxviz.callnodes import NodesFill

if TYPE_CHECKING:
    from fxviz.ir import Node, Ref

ModuleCall = tuple[str, int]  # (module path, call index): ("h.0.attn", 0); the 2nd call has index 1
Stack = tuple[ModuleCall, ...]



def call_id(stack: Stack) -> str:
    """The whole call chain as text: ``h#0/h.0#0/h.0.attn#0`` (``""`` for the model itself). Its
    length grows with the square of the nesting when paths extend each other, so :attr:`Call.id`
    is not built from it."""
    return "/".join(f"{p}#{c}" for p, c in stack)


@dataclass(eq=False, slots=True, init=False)
class Call:
    """One call of a module; the root is the model's own forward.

    A module that ran but dispatched no op is a call too (from its ``call`` node), with no ``ops``,
    ``nodes`` or ``steps`` of its own.

    Attributes:
        stack: the call chain, outermost first (``()`` for the root).
        parent: the enclosing call (``None`` for the root).
        children: child calls, in the order of their first op.
        steps: own ops (node names), child calls and regions, interleaved in execution order; a
            child call stands where its first op ran. A region (:class:`Region`) holds the ops and
            child calls that ran inside a higher-order op, in its own ``steps``.
        ops: names of the ops directly in this call.
        nodes: names of every op inside, any depth, in execution order.
        state: parameters, buffers and constants owned by this module (listed at its first call).
        inputs: values the call reads from outside itself (state excluded), in order of first read.
        outputs: values made inside and read outside (or returned by the model), the last made
            first: a block's result leads, caches it hands back follow.
        id: unique in its graph and as short as the module path: ``h.0.attn#0`` (path and call
            index), with ``@2``, ``@3`` … added for a later call that ends the same way from another
            place (``""`` for the model itself).
        region: the region of the parent call this call stands in (``None``: directly in it).
        regions: every region inside this call (not inside its child calls), outer ones first.
    """

    stack: Stack
    parent: Call | None = None
    children: list[Call] = field(default_factory=list)
    steps: list[Call | Region | str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    # ``nodes``: filled for the whole tree on first read (:mod:`fxviz.callnodes`)
    _nodes: list[str] | None = field(default=None, repr=False)
    state: list[str] = field(default_factory=list)
    id: str = ""
    region: Region | None = None
    regions: list[Region] = field(default_factory=list)
    # the boundaries are worked out for the whole tree on first use: most readers never need them
    # (``None``: none, made a list when read; most calls of a capture are never asked)
    _inputs: list[Ref] | None = field(default=None, repr=False)
    _outputs: list[Ref] | None = field(default=None, repr=False)
    _pending: Boundaries | None = field(default=None, repr=False)
    _fill: NodesFill | None = field(default=None, repr=False)

    def __init__(
        self, stack: Stack, parent: Call | None = None, children: list[Call] | None = None,
        steps: list[Call | Region | str] | None = None, ops: list[str] | None = None,
        nodes: list[str] | None = None, state: list[str] | None = None, id: str = "",
        region: Region | None = None, regions: list[Region] | None = None, _inputs: list[Ref] | None = None,
        _outputs: list[Ref] | None = None, _pending: Boundaries | None = None, _fill: NodesFill | None = None,
    ) -> None:
        # the generated __init__, without a call per list: a capture makes a call object per
        # module call, and this was most of making one
        self.stack = stack
        self.parent = parent
        self.children = [] if children is None else children
        self.steps = [] if steps is None else steps
        self.ops = [] if ops is None else ops
        self._nodes = nodes
        self.state = [] if state is None else state
        self.id = id
        self.region = region
        self.regions = [] if regions is None else regions
        self._inputs = _inputs
        self._outputs = _outputs
        self._pending = _pending
        self._fill = _fill

    @property
    def nodes(self) -> list[str]:
        if self._nodes is None:
            if self._fill is not None:
                self._fill.fill()
            if self._nodes is None:
                self._nodes = []
        return self._nodes

    @nodes.setter
    def nodes(self, value: list[str]) -> None:
        self._nodes = value

    @property
    def inputs(self) -> list[Ref]:
        if self._pending is not None:
            self._pending.fill()
        if self._inputs is None:
            self._inputs = []
        return self._inputs

    @property
    def outputs(self) -> list[Ref]:
        if self._pending is not None:
            self._pending.fill()
        if self._outputs is None:
            self._outputs = []
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

    def listed(self) -> list[Call]:
        """:meth:`walk` as a list, built without a generator (a reader that lists every call: half
        the cost)."""
        out: list[Call] = []
        todo = [self]
        while todo:
            c = todo.pop()
            out.append(c)
            children = c.children
            if children:
                todo.extend(reversed(children))
        return out

    def __repr__(self) -> str:
        return f"Call({self.id or '<root>'}, {len(self.nodes)} ops)"


@dataclass(eq=False, slots=True)
class Region:
    """Part of a call that ran inside a higher-order op: ``no_grad``, ``autocast(bfloat16)``,
    ``checkpoint``, ``cond: true branch (taken)``. Capture writes it on each op inside as
    ``attrs["region"] = [[depth, region id, label], ...]`` (outermost first; ``depth`` is how many
    module calls of the op's stack lie outside the region); the IR's stacks stay module calls only.

    A region sits in one call, at the place of its first op, and holds steps like a call does: its
    own ops, the child calls that ran inside it and the regions inside it. Readers that walk
    ``Call.steps`` meet it there and read it as they read a call (``steps``, ``nodes``, ``inputs``,
    ``outputs``, ``depth``, ``path``), with a ``label`` in place of a module name.

    Attributes:
        id: the region id capture gave it (unique per higher-order op invocation and branch).
        label: what wrapped the ops, in words.
        call: the call it sits in.
        parent: the region around it in the same call (``None``: directly in ``call``).
        steps: ops, child calls and regions inside it, in execution order.
        nodes: every op inside, any depth, in execution order.
    """

    id: str
    label: str
    call: Call
    parent: Region | None = None
    steps: list[Call | Region | str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    _boundary: RegionBoundaries | None = field(default=None, repr=False)
    _inputs: list[Ref] | None = field(default=None, repr=False)
    _outputs: list[Ref] | None = field(default=None, repr=False)

    @property
    def path(self) -> str:
        return self.call.path

    @property
    def index(self) -> int:
        return self.call.index

    @property
    def stack(self) -> Stack:
        return self.call.stack

    @property
    def depth(self) -> int:
        """The nesting level of the call it sits in (its ops are that call's own)."""
        return self.call.depth

    @property
    def name(self) -> str:
        return self.label

    @property
    def inputs(self) -> list[Ref]:
        """Values the region reads from outside itself (state excluded), in order of first read."""
        if self._inputs is None and self._boundary is not None:
            self._inputs, self._outputs = self._boundary.of(self)
        return self._inputs or []

    @property
    def outputs(self) -> list[Ref]:
        """Values made inside and read outside, the last made first (as :attr:`Call.outputs`)."""
        if self._outputs is None and self._boundary is not None:
            self._inputs, self._outputs = self._boundary.of(self)
        return self._outputs or []

    def __repr__(self) -> str:
        return f"Region({self.label!r} in {self.call.id or '<root>'}, {len(self.nodes)} ops)"


#: What a step of a call (or a region) is: an op's name, a child call, or a region.
StepItem = Call | Region | str


def region_entries(node: Node) -> list[tuple[int, str, str]]:
    """The well-formed ``attrs["region"]`` entries of an op, outermost first: each ``(depth, id,
    label)`` with depths that never decrease and never exceed the op's stack. Reading stops at the
    first entry that breaks the rule (a hand-edited or hostile graph draws without it)."""
    raw = node.attrs.get("region") if node.attrs else None
    if not isinstance(raw, list):
        return []
    out: list[tuple[int, str, str]] = []
    last = 0
    for e in raw:
        if not (isinstance(e, list | tuple) and len(e) == 3 and type(e[0]) is int and isinstance(e[1], str)
                and isinstance(e[2], str) and last <= e[0] <= len(node.stack)):
            break
        out.append((e[0], e[1], e[2]))
        last = e[0]
    return out


@dataclass(slots=True)
class CallTree:
    """Every module call of a graph. ``root`` is the model's forward; ``by_stack`` finds a call by
    its stack; :meth:`of` gives the call a node belongs to."""

    root: Call
    by_stack: dict[Stack, Call]
    node_call: dict[str, Call]
    by_path: dict[str, list[Call]]
    regions: list[Region] = field(default_factory=list)
    node_region: dict[str, Region] = field(default_factory=dict)

    def release(self, calls: list[Call] | None = None) -> None:
        """Break the tree's reference cycles (each call's ``parent``, the boundaries every call
        points at, which point back at the calls; with regions, the steps and regions of calls and
        regions), so that reference counting frees the tree when its last reference goes, not the
        cyclic collector: ~1,100 objects for GPT-2 small, which the collector otherwise walks on its
        next young-generation pass. The tree is unusable afterwards: only for the owner of a tree
        no one else holds (:func:`fxviz.passes.tree.sharing`, when a run of passes ends).
        ``calls``: the tree's calls (``list(self.walk())``), when the owner has them."""
        if self.root._fill is not None:  # the calls' nodes are not filled after this
            self.root._fill.args = None
        for c in self.root.listed() if calls is None else calls:
            c.parent = None
            c._pending = None
            if self.regions:
                c.steps = []
                c.regions = []
        for r in self.regions:
            r.parent = None
            r.steps = []
            r._boundary = None

    def of(self, name: str) -> Call:
        """The innermost call node ``name`` belongs to: an op's own call; a parameter, buffer or
        constant's owner's first call (the nearest enclosing module that ran); the root for the
        model's inputs and outputs."""
        return self.node_call.get(name, self.root)

    def region_of(self, name: str) -> Region | None:
        """The innermost region op ``name`` is a step of (in its own call), if any."""
        return self.node_region.get(name)

    def calls(self, path: str) -> list[Call]:
        """The calls of the module at ``path``, in order (empty when it never ran)."""
        return self.by_path.get(path, [])

    def count(self, path: str) -> int:
        """How many times the module at ``path`` was called (distinct call indices)."""
        return len({c.index for c in self.by_path.get(path, ())})

    def walk(self) -> Iterator[Call]:
        return self.root.walk()


def call_tree(nodes: Sequence[Node]) -> CallTree:
    """Derive the call tree of ``nodes`` (a graph's nodes, in execution order), with the regions
    of higher-order ops inside calls. Linear in the number of nodes times the module nesting depth."""
    root = Call(())
    by_stack: dict[Stack, Call] = {(): root}
    by_path: dict[str, list[Call]] = {}
    node_call: dict[str, Call] = {}
    # the boundaries of every call, worked out on first use (from what the walk below fills in)
    pending = root._pending = Boundaries(nodes, node_call, root)
    fill = root._fill = NodesFill(root, list(nodes))  # as they are now (a copy of pointers, in C)
    ids: dict[str, int] = {}  # "path#index" -> how many calls end that way so far
    regions: list[Region] = []
    node_region: dict[str, Region] = {}
    by_region: dict[tuple[str, int], Region] = {}  # (region id, id of its call) -> the region

    def new_call(parent: Call, stack: Stack, d: int, place: Region | None) -> Call:
        """The call ``stack[:d]``, new, in ``parent`` at ``place`` (a region of it, or itself)."""
        path, index = stack[d - 1]  # c.path and c.index, without the property calls
        # an id ends in "#<index>" or in "#<index>@<n>": the two kinds cannot meet
        cid = f"{path}#{index}"
        n = ids[cid] = ids.get(cid, 0) + 1
        s = stack[:d]
        # positional: keywords into a Python __init__ of thirteen parameters cost a fifth more
        c = Call(s, parent, None, None, None, None, None, cid if n == 1 else f"{cid}@{n}", place, None, None, None,
                 pending, fill)
        by_stack[s] = c
        same = by_path.get(path)
        if same is None:
            by_path[path] = [c]
        else:
            same.append(c)
        parent.children.append(c)
        (place.steps if place is not None else parent.steps).append(c)
        return c

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
                return make_below(parent, stack, k)
            k -= 1
        return make_below(root, stack, 0)

    def make_below(parent: Call, stack: Stack, k: int) -> Call:
        """Create the calls of ``stack`` below level ``k`` (``parent`` is the call at level ``k``)."""
        for d in range(k + 1, len(stack) + 1):
            parent = new_call(parent, stack, d, None)
        return parent

    def get_in_regions(stack: Stack, entries: list[tuple[int, str, str]], name: str) -> tuple[Call, Region | None]:
        """The call of an op inside regions, creating calls and regions level by level: a region
        at depth ``d`` sits in the call ``stack[:d]``, and a call created there stands in the
        innermost region of that level. Returns the op's call and its innermost region there."""
        call, j = root, 0
        while True:
            level = call.depth
            inner: Region | None = None
            while j < len(entries) and entries[j][0] == level:
                _, rid, label = entries[j]
                r = by_region.get((rid, id(call)))
                if r is None:
                    r = by_region[(rid, id(call))] = Region(rid, label, call, inner)
                    (inner.steps if inner is not None else call.steps).append(r)
                    call.regions.append(r)
                    regions.append(r)
                r.nodes.append(name)
                inner, j = r, j + 1
            if level == len(stack):
                return call, inner
            child = by_stack.get(stack[:level + 1])  # a call is known by its whole stack
            call = child if child is not None else new_call(call, stack, level + 1, inner)

    state: list[Node] = []
    # the ops of one call share one stack tuple: found by its id, where a lookup in ``by_stack``
    # hashes every level of the stack again (the nodes keep each stack, so an id is never reused)
    of_stack: dict[int, Call] = {}
    last_stack: Stack | None = None  # the previous op's, and its call (most ops follow one of their call)
    c = root
    for n in nodes:
        kind, name = n.kind, n.name
        if kind == "op":
            attrs = n.attrs
            if attrs and attrs.get("region") is not None and (entries := region_entries(n)):
                c, inner = get_in_regions(n.stack, entries, name)
                last_stack = None  # ``c`` is this op's call, not the previous op's
                node_call[name] = c
                c.ops.append(name)
                if inner is not None:
                    node_region[name] = inner
                    inner.steps.append(name)
                else:
                    c.steps.append(name)
                continue
            stack = n.stack
            if stack is not last_stack:
                last_stack = stack
                hit = of_stack.get(id(stack))
                if hit is None:
                    hit = of_stack[id(stack)] = get(stack)
                c = hit
            node_call[name] = c
            c.ops.append(name)
            c.steps.append(name)
        elif kind in STATE_KINDS:
            state.append(n)
        elif kind == "call":  # a module call that ran no op: the call exists, nothing in it
            node_call[name] = get(n.stack)
    for n in state:
        # a constant placed with its first reader's whole stack belongs to that very call; a
        # parameter to its owner's first call (the nearest enclosing module that ran)
        owner = by_stack.get(n.stack) if n.stack else root
        if owner is None:
            path = n.stack[-1][0]
            while path and path not in by_path:
                path = path.rpartition(".")[0]
            owner = by_path[path][0] if path else root
        node_call[n.name] = owner
        owner.state.append(n.name)
    if regions:
        shared = RegionBoundaries(nodes)
        for r in regions:
            r._boundary = shared
    return CallTree(root, by_stack, node_call, by_path, regions, node_region)


__all__ = ["STATE_KINDS", "Call", "CallTree", "ModuleCall", "Region", "Stack", "StepItem", "call_id", "call_tree",
           "region_entries"]
