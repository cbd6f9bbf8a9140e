"""``fold``: find runs of identical consecutive sibling modules (``h.0`` … ``h.11``).

Two siblings are identical when they have the same class and the same structure: the same ops,
in the same order, in the same relative submodules, with the same output shapes and the same
parameter shapes. A run also has to be a chain: each block reads what the one before it produced
(directly, or through ops of the parent such as a residual add). Identical siblings that run side
by side (``q``, ``k``, ``v`` projections; two parallel conv paths) are parallel work, not a stack of
repeated blocks, and stay unfolded. Writes ``graph.annotations["fold"]``, a list of runs::

    [{"parent": "h", "paths": ["h.0", ..., "h.11"], "cls": "GPT2Block", "label": "h.0-11", "count": 12}]

Renderers show a run once, labelled ``h.0-11 ×12``, and can unfold it.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

from fxviz.calls import Call, CallTree
from fxviz.ir import Graph
from fxviz.passes.tree import calls_of, nodes_by_name, tree_of
from fxviz.scopes import call_count, hierarchy


def _relative(path: str, base: str) -> str:
    return path[len(base) + 1 :] if path != base else ""


#: A module as a run compares it: its path, class and how many times it was called (distinct call
#: indices; 0 for a container that is never called itself).
Module = tuple[str, str, int]


def _parents(graph: Graph, tree: CallTree, calls: list[Call]) -> list[tuple[str, list[Module]]]:
    """The modules with more than one child in the module hierarchy (:func:`fxviz.scopes.hierarchy`),
    parents first, each with its children in the order they first ran: where a run may be. Paths
    alone, without a scope object per module (most modules have one child or none)."""
    kids = hierarchy(calls)
    modules, by_path = graph.modules, tree.by_path
    out: list[tuple[str, list[Module]]] = []
    todo = [""]
    while todo:  # Scope.walk(): parents first, children in order
        path = todo.pop()
        children = kids[path]
        if len(children) > 1:
            listed: list[Module] = []
            for p in children:
                info = modules.get(p)
                of_path = by_path.get(p)
                listed.append((p, info.cls if info else "", 0 if of_path is None else call_count(of_path)))
            out.append((path, listed))
        if children:
            todo.extend(reversed(children))
    return out


def _candidates(parents: list[tuple[str, list[Module]]]) -> set[str]:
    """Modules that could start or continue a run: those next to a sibling of the same class and
    call count, in execution order (``parents``: the modules with more than one child). A run is
    made of neighbours only, so a module whose neighbours differ from it (GPT-2's ``ln_1`` and
    ``ln_2``, ``mlp.c_fc`` and ``mlp.c_proj``) is never compared: its structure is not read."""
    out: set[str] = set()
    for _, children in parents:
        prev: Module | None = None
        for c in children:
            if prev is not None and c[1] == prev[1] and c[2] == prev[2]:
                out.add(prev[0])
                out.add(c[0])
            prev = c
    return out


#: One node's part of a module's structure: its kind, target (a state node's name relative to the
#: module), path relative to the module, call indices below it and output shapes. A tuple, not
#: text: only compared, and joining five strings per node and level cost more than the comparing.
Token = tuple[str, str, str, tuple[int, ...], str]


def _signatures(graph: Graph, candidates: set[str]) -> dict[str, list[Token]]:
    """Module path -> the structure of everything inside it, for the ``candidates`` only (the
    rest can never fold, and hashing every level of every node is the pass's whole cost)."""
    tokens: dict[str, list[Token]] = {}
    if not candidates:  # no module has a sibling of its class: nothing to read
        return {}
    # per-object caches, keyed by id: the tracer shares one TensorMeta per shape and one stack
    # tuple per module call, and hashing those values on every node costs more than the work saved
    shape_text: dict[int, str] = {}
    # what depends only on a node's stack (or a state node's owner) is worked out once per stack:
    # per level, the token list of the candidate, the path relative to it, and the call indices
    # below it (an op) or the candidate's own path (state)
    op_levels: dict[int, list[tuple[list[Token], str, Any]]] = {}
    state_levels: dict[str, list[tuple[list[Token], str, Any]]] = {}
    around: dict[str, list[str]] = {"": []}  # module path -> the candidates it is in, outer first
    last_stack = None  # the previous op's stack, and its levels (most ops follow one of their call)
    op_at: list[tuple[list[Token], str, Any]] = []
    for n in graph.nodes:
        kind = n.kind
        if kind == "op":
            stack = n.stack
            if stack is not last_stack:
                known = op_levels.get(id(stack))
                if known is None:
                    # the call index is structure too: a block that calls a child twice differs from
                    # one that calls it once
                    known = op_levels[id(stack)] = _op_levels(stack, candidates, tokens)
                last_stack, op_at = stack, known
            levels = op_at
        elif kind == "input" or kind == "output":
            continue
        else:  # state belongs to its owner and to every module around it
            stack = n.stack
            module = stack[-1][0] if stack else ""
            at_module = state_levels.get(module)
            if at_module is None:
                # _relative(), inlined
                at_module = state_levels[module] = [
                    (tokens.setdefault(p, []), module[len(p) + 1:] if p != module else "", p)
                    for p in _candidate_prefixes(module, candidates, around)
                ]
            levels = at_module
        if not levels:
            continue
        outs = n.outputs
        if len(outs) == 1:
            m = outs[0]
            shapes = shape_text.get(id(m))
            if shapes is None:
                shapes = shape_text[id(m)] = m.shape_str() + m.dtype
        else:
            shapes = "|".join(
                shape_text.get(id(m)) or shape_text.setdefault(id(m), m.shape_str() + m.dtype) for m in outs
            )
        if kind == "op":
            target = n.target
            for into, rel, calls in levels:
                into.append(("op", target, rel, calls, shapes))
        else:
            # export numbers lifted constants graph-wide (``h.0.attn.lifted_tensor_0``, then ``_2``
            # in ``h.1``): their names are not structure, their owner and shape are
            target = n.target
            for into, rel, path in levels:
                # _relative(), inlined
                name = "" if kind == "constant" or target == path else target[len(path) + 1 :]
                into.append((kind, name, rel, (), shapes))
    return tokens  # lists: only compared


def _op_levels(
    stack: tuple[tuple[str, int], ...], candidates: set[str], tokens: dict[str, list[Token]]
) -> list[tuple[list[Token], str, Any]]:
    """For the ops of one stack: per candidate around them, outer first, the candidate's token
    list, the ops' module relative to it and the call indices below it."""
    levels: list[tuple[list[Token], str, Any]] = []
    last = len(stack) - 1
    module = stack[last][0] if stack else ""
    for d, (path, _) in enumerate(stack):
        if path in candidates:
            if d == last:  # the ops' own module: nothing below it
                levels.append((tokens.setdefault(path, []), "", ()))
            else:  # _relative(), inlined
                levels.append((tokens.setdefault(path, []), module[len(path) + 1 :] if path != module else "",
                               tuple(map(_call_index, stack[d + 1 :]))))
    return levels


_call_index = itemgetter(1)


def _candidate_prefixes(path: str, candidates: set[str], around: dict[str, list[str]]) -> list[str]:
    """The candidates among ``path`` and the modules around it, outer first; ``around`` remembers
    each module's answer, so every module is looked at once (joining every prefix of every path
    cost the cube of the nesting depth)."""
    todo = []
    p = path
    while p not in around:
        todo.append(p)
        p = p.rpartition(".")[0]
    for q in reversed(todo):
        outer = around[q.rpartition(".")[0]]
        around[q] = [*outer, q] if q in candidates else outer
    return around[path]


def _run_label(paths: list[str]) -> str:
    """``h.0-11`` for ``h.0`` … ``h.11``; ``a-c`` for differently named siblings."""
    first, last = paths[0], paths[-1]
    head, _, a = first.rpartition(".")
    head2, _, b = last.rpartition(".")
    if head == head2 and a.isdigit() and b.isdigit():
        return f"{first}-{b}"
    return f"{first}-{last.rpartition('.')[2]}"


class _Members:
    """Module path -> names of the ops inside it (any depth, every call), worked out for the modules
    a run compares only (most modules have no sibling of their class), and the graph's nodes by
    name (a dict lookup where :meth:`Graph.node` is two Python calls per edge)."""

    def __init__(self, graph: Graph, tree: CallTree) -> None:
        self.tree = tree
        self.by_path: dict[str, set[str]] = {}
        self.nodes = nodes_by_name(graph)  # the first node of a name, as Graph.node

    def of(self, path: str) -> set[str]:
        found = self.by_path.get(path)
        if found is None:
            # the ops of every call of it and of every call inside those: the names of their
            # ``nodes``, which the tree fills only when asked (for every call: more than a run reads)
            found = self.by_path[path] = set()
            for call in self.tree.by_path.get(path, ()):
                if not call.children:  # a leaf call (most compared): its own ops, in C
                    found.update(call.ops)
                    continue
                for c in call.listed():
                    found.update(c.ops)
        return found


def _chained(a: str, b: str, members: _Members) -> bool:
    """Does module ``b`` read what module ``a`` produced, directly or through one op outside both?"""
    in_a, in_b, nodes = members.of(a), members.of(b), members.nodes
    for name in in_b:
        for r in nodes[name].inputs:
            if r.node in in_a:
                return True
            if r.node not in in_b:
                p = nodes[r.node]
                if p.kind == "op" and any(i.node in in_a for i in p.inputs):
                    return True
    return False


def fold_repeats(graph: Graph) -> Graph:
    tree = tree_of(graph)
    parents = _parents(graph, tree, calls_of(graph))  # where a run may be
    candidates = _candidates(parents)
    if not candidates:  # every sibling of another class: no run (most small models)
        graph.annotations["fold"] = []
        return graph
    sigs = _signatures(graph, candidates)
    members = _Members(graph, tree)
    runs: list[dict[str, Any]] = []

    for parent, children in parents:
        # every child counts, in execution order: any other sibling in between ends a run
        # what two neighbours must share, worked out once per child (it is compared on both sides)
        keys = [(cls, sigs.get(path), calls) for path, cls, calls in children]
        i = 0
        while i < len(children):
            j = i + 1
            key = keys[i]
            while (
                key[1] is not None
                and j < len(children)
                and keys[j] == key
                and _chained(children[j - 1][0], children[j][0], members)
            ):
                j += 1
            if j - i >= 2:
                paths = [c[0] for c in children[i:j]]
                runs.append({
                    "parent": parent, "paths": paths, "cls": children[i][1],
                    "label": _run_label(paths), "count": len(paths),
                })
            i = j
    graph.annotations["fold"] = runs
    return graph
