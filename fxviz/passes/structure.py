"""The structure of a forward pass: module calls nested in execution order, and inside each call
the series of steps, with parallel branches found from the data-flow edges.

Forward hooks alone give only the call order, a topological sort, from which the branches cannot
be recovered; the IR's edges can. Like :attr:`Graph.scopes`, this is derived on demand from the
nodes and never stored, so it cannot go stale. A region of a call that ran inside a higher-order op
(``no_grad``, a ``cond`` branch) is a step like a child call: a :class:`Block` with its own steps.

Each call's steps (its own ops and the calls of its children) are split into a series at *cut
points*: steps no data edge jumps over. Between two cut points the steps fall into connected
components; two or more are parallel branches (the two conv paths of a CNN, q/k/v projections),
one that shares its input with the cut point closing it is a residual branch. A value from outside
the call counts as appearing just before its first use, so a mask read only at the end does not
hide the structure before it.

A child call's place in the data flow is given by what its first reading op reads (the hidden
state a block starts from), not by every value read somewhere inside it: a causal mask that each
of 48 blocks reads deep in its attention would otherwise tie all blocks to the mask and hide the
chain of blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fxviz.calls import STATE_KINDS, Call, CallTree, Region
from fxviz.ir import Graph, Node, Ref


@dataclass(eq=False)
class Block:
    """One module call (the root is the model's forward), or one region of a call that ran inside
    a higher-order op (:class:`~fxviz.calls.Region`: ``no_grad``, a ``cond`` branch), with its steps
    in execution order, split into series and parallel parts."""

    call: Call | Region
    steps: list[Step] = field(default_factory=list)

    @property
    def region(self) -> Region | None:
        """The region this block is, ``None`` for a module call."""
        return self.call if isinstance(self.call, Region) else None

    @property
    def path(self) -> str:
        return self.call.path

    @property
    def index(self) -> int:
        return self.call.index

    @property
    def depth(self) -> int:
        return self.call.depth

    @property
    def nodes(self) -> list[str]:
        """Every op inside, any depth, in order."""
        return self.call.nodes

    @property
    def name(self) -> str:
        return self.call.name


@dataclass(eq=False)
class Op:
    node: str


@dataclass(eq=False)
class Parallel:
    """Branches that run side by side and join at the next step; ``residual`` marks a single
    branch whose input also skips around it."""

    branches: list[list[Step]]
    residual: bool = False


Step = Op | Block | Parallel


#: Parallel groups nest at most this deep; below, steps stay a plain series. Real models nest a few
#: levels; a crafted graph could nest one per op, and each level costs a pass over its steps.
MAX_NESTING = 64


def _step_nodes(step: Step) -> list[str]:
    if isinstance(step, Op):
        return [step.node]
    if isinstance(step, Block):
        return step.nodes
    out: list[str] = []
    todo: list[Step] = [step]
    while todo:  # no recursion: parallel groups nest
        s = todo.pop()
        if isinstance(s, Op):
            out.append(s.node)
        elif isinstance(s, Block):
            out.extend(s.nodes)
        else:
            todo.extend(reversed([x for b in s.branches for x in b]))
    return out


def structure(graph: Graph, tree: CallTree | None = None) -> Block:
    """The call tree of ``graph`` with each call's steps decomposed into series and parallel
    parts. Calls are visited without recursion: module nesting can be thousands of levels deep."""
    tree = tree if tree is not None else graph.calls
    state = {n.name for n in graph.nodes if n.kind in STATE_KINDS}
    blocks: dict[int, Block] = {}
    order: list[Call | Region] = [*tree.walk(), *tree.regions]
    for call in order:
        blocks[id(call)] = Block(call)
    for call in order:  # a step's own decomposition is not read here: any order will do
        raw: list[Step] = [Op(s) if isinstance(s, str) else blocks[id(s)] for s in call.steps]
        blocks[id(call)].steps = decompose(graph, raw, state)
    return blocks[id(tree.root)]


def decompose(graph: Graph, steps: list[Step], state: set[str]) -> list[Step]:
    """Split a sequence of steps into series items and :class:`Parallel` groups. In a training
    step the call's own backward ops are a series of their own after its forward steps: the
    gradients they read from child calls and the forward values they read would otherwise tie
    every step of the call together."""
    if len(steps) <= 1:
        return steps
    backward: list[Step] = [s for s in steps if isinstance(s, Op) and graph.node(s.node).phase != "forward"]
    if backward and len(backward) < len(steps):
        forward = [s for s in steps if not (isinstance(s, Op) and graph.node(s.node).phase != "forward")]
        return _decompose(graph, forward, state) + _decompose(graph, backward, state)
    return _decompose(graph, steps, state)


def _decompose(graph: Graph, steps: list[Step], state: set[str]) -> list[Step]:
    if len(steps) <= 1:
        return steps
    owner: dict[str, int] = {}
    for i, s in enumerate(steps):
        for name in _step_nodes(s):
            owner[name] = i
    # reads[i]: values step i reads from outside itself (state excluded); for a call, those its
    # first reading op reads
    reads: list[set[Ref]] = []
    for i, s in enumerate(steps):
        rs: set[Ref] = set()
        for name in _step_nodes(s):
            for r in graph.node(name).inputs:
                if r.node not in state and owner.get(r.node) != i:
                    rs.add(r)
            if rs and isinstance(s, Block):
                break
        reads.append(rs)
    return _split(steps, list(range(len(steps))), owner, reads)


def _split(
    steps: list[Step], seq: list[int], owner: dict[str, int], reads: list[set[Ref]], nesting: int = 0
) -> list[Step]:
    """Decompose the steps at positions ``seq`` (a subsequence in execution order); ``nesting``
    counts the decompositions around this one (past :data:`MAX_NESTING` the steps stay a series)."""
    if len(seq) <= 1 or nesting >= MAX_NESTING:
        return [steps[i] for i in seq]
    pos = {s: k for k, s in enumerate(seq)}
    n = len(seq)
    crossed = [0] * (n + 1)  # difference array over positions
    edges: list[tuple[int, int]] = []
    external: dict[Ref, list[int]] = {}
    for k, i in enumerate(seq):
        for r in reads[i]:
            src = owner.get(r.node)
            if src is not None and src in pos:
                a = pos[src]
                edges.append((a, k))
                if k - a > 1:
                    crossed[a + 1] += 1
                    crossed[k] -= 1
            else:
                external.setdefault(r, []).append(k)
    for users in external.values():
        first, last = users[0], users[-1]
        if last > first:
            crossed[first] += 1
            crossed[last] -= 1
    cuts, running = [], 0
    for k in range(n):
        running += crossed[k]
        if running == 0:
            cuts.append(k)
    out: list[Step] = []
    prev = -1
    for c in [*cuts, n]:
        region = list(range(prev + 1, c))
        if region:
            if len(region) == n:  # no cut point at all: one region, the whole sequence
                comps = _components(region, edges)
                if len(comps) == 1:
                    return [steps[i] for i in seq]
                out.append(Parallel([_split(steps, [seq[k] for k in comp], owner, reads, nesting + 1)
                                     for comp in comps]))
            else:
                out.extend(_region(steps, seq, region, edges, owner, reads, c if c < n else None, nesting))
        if c < n:
            out.append(steps[seq[c]])
        prev = c
    return out


def _region(
    steps: list[Step],
    seq: list[int],
    region: list[int],
    edges: list[tuple[int, int]],
    owner: dict[str, int],
    reads: list[set[Ref]],
    join: int | None,
    nesting: int,
) -> list[Step]:
    comps = _components(region, edges)
    if len(comps) >= 2:
        return [Parallel([_split(steps, [seq[k] for k in comp], owner, reads, nesting + 1) for comp in comps])]
    inner = _split(steps, [seq[k] for k in region], owner, reads, nesting + 1)
    if join is not None:
        # a residual: the step closing the region reads both what the region made and what the
        # region started from
        in_region = {seq[k] for k in region}
        join_reads = reads[seq[join]]
        made_here = any(owner.get(r.node) in in_region for r in join_reads)
        skip = {r for r in join_reads if owner.get(r.node) not in in_region}
        region_reads = set().union(*(reads[i] for i in in_region))
        if made_here and skip & region_reads:
            return [Parallel([inner], residual=True)]
    return inner


def _components(region: list[int], edges: list[tuple[int, int]]) -> list[list[int]]:
    """Weakly connected components of ``region`` under ``edges``, each in execution order,
    ordered by their first step."""
    parent = {k: k for k in region}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in edges:
        if a in parent and b in parent:
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, list[int]] = {}
    for k in region:
        groups.setdefault(find(k), []).append(k)
    return sorted(groups.values(), key=lambda g: g[0])


def first_node(graph: Graph, step: Step) -> Node:
    return graph.node(_step_nodes(step)[0])


def step_nodes(step: Step) -> list[str]:
    """Names of every op inside ``step``, in execution order."""
    return _step_nodes(step)
