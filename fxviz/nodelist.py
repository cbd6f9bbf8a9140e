"""A graph's node list with an index by name that can never go stale. No torch."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fxviz.ir import Node


class NodeList(list["Node"]):
    """A graph's nodes: a list that keeps its own index by name and drops it on every change, so a
    lookup can never return a node that was removed or replaced. A node renamed in place is found
    under its new name too: a hit is checked against the node's current name, and a miss rebuilds
    the index once before it says no. Like a scan, a lookup gives the first node of a name."""

    __slots__ = ("_by_name",)

    def __init__(self, items: Iterable[Node] = ()) -> None:
        super().__init__(items)
        self._by_name: dict[str, Node] | None = None

    def find(self, name: str) -> Node | None:
        index = self._by_name
        if index is not None:
            n = index.get(name)
            if n is not None and n.name == name:
                return n
        index = self._by_name = {n.name: n for n in reversed(self)}
        return index.get(name)


def _drops_index(method: Callable[..., Any]) -> Callable[..., Any]:
    def changed(self: NodeList, *args: Any, **kwargs: Any) -> Any:
        self._by_name = None  # before and after: a key function or generator may look nodes up
        try:
            return method(self, *args, **kwargs)
        finally:
            self._by_name = None

    changed.__name__ = changed.__qualname__ = method.__name__
    return changed


# every way a list changes drops the index
for _name in ("append", "extend", "insert", "remove", "pop", "clear", "sort", "reverse", "__setitem__",
              "__delitem__", "__iadd__", "__imul__"):
    setattr(NodeList, _name, _drops_index(getattr(list, _name)))


__all__ = ["NodeList"]
