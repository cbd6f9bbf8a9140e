"""The module hierarchy: the model's attribute tree (``h`` holds ``h.0`` holds ``h.0.attn``), each
module with the calls made to it (:mod:`fxviz.calls`) and the nodes directly in it. No torch."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fxviz.calls import Call, CallTree, call_tree

if TYPE_CHECKING:
    from fxviz.ir import ModuleInfo, Node


@dataclass(slots=True, eq=False, init=False)
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

    def __init__(self, path: str, cls: str, calls: int = 0, children: dict[str, Scope] | None = None,
                 nodes: list[str] | None = None) -> None:
        # the generated __init__, without a call per container (a scope per module, per fold)
        self.path = path
        self.cls = cls
        self.calls = calls
        self.children = {} if children is None else children
        self.nodes = [] if nodes is None else nodes

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
    nodes: Sequence[Node], modules: Mapping[str, ModuleInfo], name: str, tree: CallTree | None = None,
    *, own_nodes: bool = True, calls: Iterable[Call] | None = None,
) -> Scope:
    """The module scope tree of ``nodes``, from their call tree.

    Containers that are never called (``h`` holding ``h.0`` … ``h.11``) still appear, with
    ``calls == 0``, so the tree mirrors the model's attribute hierarchy. Children are in the order
    they first run; modules that only hold state (never called) come after. Export lists every
    parameter before the first op, so ordering by first appearance would follow the order of
    ``__init__`` instead of execution, and make unrelated siblings look consecutive.

    ``own_nodes=False`` leaves every scope's ``nodes`` empty, for a reader of the hierarchy alone
    (``fold``): filling them is a scan over every node. ``calls`` are the tree's calls in walk
    order, where the caller has them listed already.
    """
    tree = tree if tree is not None else call_tree(nodes)

    def cls_of(path: str) -> str:
        info = modules.get(path)
        return info.cls if info else ""

    root = Scope("", name or cls_of(""), 1)
    scopes: dict[str, Scope] = {"": root}
    for path, children in hierarchy(tree.walk() if calls is None else calls).items():
        below = scopes[path].children  # a parent is listed before its children
        for p in children:
            info = modules.get(p)  # cls_of(), inlined
            below[p] = scopes[p] = Scope(p, info.cls if info else "")
    for path, of_path in tree.by_path.items():
        scopes[path].calls = call_count(of_path)

    def get(path: str) -> Scope:  # a node's module, added if no call of the tree is in it
        s = scopes.get(path)
        if s is not None:
            return s
        missing = [path]
        parent_path = path.rpartition(".")[0]
        while parent_path not in scopes:
            missing.append(parent_path)
            parent_path = parent_path.rpartition(".")[0]
        s = scopes[parent_path]
        for p in reversed(missing):
            child = s.children[p] = scopes[p] = Scope(p, cls_of(p))
            s = child
        return s

    if not own_nodes:
        return root
    # the nodes of one module call share one stack tuple (a capture and a graph read from JSON
    # share them): each stack's scope is looked up once, not once per node (keyed by id: the nodes
    # keep every stack alive)
    own: dict[int, list[str]] = {}
    for n in nodes:
        stack = n.stack
        into = own.get(id(stack))
        if into is None:
            into = own[id(stack)] = get(stack[-1][0] if stack else "").nodes
        into.append(n.name)
    return root


def hierarchy(calls: Iterable[Call]) -> dict[str, list[str]]:
    """Each module's children in the order they first run, keyed by path (``""``: the root), from
    ``calls`` in walk order (parents first), with the containers that are never called themselves
    (``h`` holding ``h.0``): the module hierarchy as paths alone. A parent is listed before its
    children. :func:`build_scopes` makes it the scope tree; ``fold`` reads it as it is."""
    kids: dict[str, list[str]] = {"": []}
    for c in calls:
        stack = c.stack
        if stack and (path := stack[-1][0]) not in kids:  # Call.path, without the property call
            missing = [path]
            parent = path.rpartition(".")[0]
            while parent and parent not in kids:
                missing.append(parent)
                parent = parent.rpartition(".")[0]
            into = kids[parent]
            for p in reversed(missing):
                into.append(p)
                into = kids[p] = []
    return kids


def call_count(of_path: Sequence[Call]) -> int:
    """How many times a module was called, from its calls (:attr:`CallTree.by_path`): distinct call
    indices (a call seen in pieces, around a break, is one); most modules have one call."""
    return 1 if len(of_path) == 1 else len({c.stack[-1][1] for c in of_path})


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


__all__ = ["Scope", "build_scopes", "call_count", "hierarchy", "prefixes"]
