"""The eager side of ``compile[:backend]``: an eager run that keeps the values of the ops the
compiled side will report, and nothing else, up to a byte budget.

Compiled code cannot be stepped op by op alongside the eager run (Dynamo runs its graphs and the
eager code between them itself), so the eager values it is compared with are kept from an eager run
made just before. :class:`Keeper` keeps them in execution order and stops once ``budget`` bytes are
held; the values past that point are kept by a later pair of runs (a chunk). A kept value is safe
from later in-place writes: before a call that may write a tensor whose storage a kept value
shares, the kept value is copied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from torch.utils import _pytree as pytree

from fxviz.analyze.numerics.run import Watcher
from fxviz.analyze.numerics.shadow import may_write
from fxviz.ir import Node

#: What :class:`Keeper` does with an op's outputs: keep them as a new value, keep them whatever the
#: budget (a random op's draw the compiled side is given), or not keep them.
Want = Literal["new", "carry", None]


def outputs_of(out: Any) -> list[torch.Tensor | None]:
    """An op's outputs as the eager tracer numbers them (``Ref.index``): a tensor is output 0,
    a tuple or list gives one output per item; items that are not tensors are ``None``."""
    items = (out,) if isinstance(out, torch.Tensor) else tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return [o if isinstance(o, torch.Tensor) else None for o in items]


class Keeper(Watcher):
    """Keeps the outputs of the ops ``want`` names (node -> :data:`Want`) in ``values`` (node name ->
    outputs), in execution order, until keeping one more would pass ``budget`` bytes (storages
    counted once): then ``stopped`` is set and nothing more is kept. At least one new value is
    always kept, so a chunk makes progress however small the budget."""

    def __init__(self, want: Callable[[Node], Want], *, budget: int) -> None:
        self.want, self.budget = want, budget
        self.values: dict[str, list[torch.Tensor | None]] = {}
        self.stopped = False
        self.held = 0
        self.peak = 0
        self._new = 0
        self._storages: dict[int, set[str]] = {}  # storage address -> names of kept values in it

    def before(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._storages and may_write(func, kwargs):
            for t in pytree.tree_leaves((args, kwargs)):
                if isinstance(t, torch.Tensor):
                    self._protect(t)
        return None

    def after(self, node: Node | None, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              out: Any, state: Any) -> None:
        if node is None or self.stopped:
            return
        want = self.want(node)
        if want is None:
            return
        outs = outputs_of(out)
        fresh: dict[int, int] = {}
        for t in outs:
            if t is not None:
                address, nbytes = _storage(t)
                if address not in self._storages:
                    fresh[address] = nbytes
        size = sum(fresh.values())
        if want == "new" and self._new and self.held + size > self.budget:
            self.stopped = True
            return
        self._new += want == "new"
        self.values[node.name] = outs
        for t in outs:
            if t is not None:
                self._storages.setdefault(_storage(t)[0], set()).add(node.name)
        self.held += size
        self.peak = max(self.peak, self.held)

    def _protect(self, t: torch.Tensor) -> None:
        """``t`` is about to be written: copy every kept value that shares its storage."""
        address = _storage(t)[0]
        names = self._storages.pop(address, None)
        if not names:
            return
        self.held -= _storage(t)[1]  # every kept value in it moves to a copy
        for name in names:
            outs = self.values[name]
            for i, o in enumerate(outs):
                if o is not None and _storage(o)[0] == address:
                    outs[i] = c = o.clone()
                    self._storages.setdefault(_storage(c)[0], set()).add(name)
                    self.held += _storage(c)[1]
        self.peak = max(self.peak, self.held)

    def drop(self, name: str) -> None:
        """Forget a kept value (compared for the last time, or not wanted after all)."""
        outs = self.values.pop(name, None)
        for o in outs or ():
            if o is None:
                continue
            address, size = _storage(o)
            names = self._storages.get(address)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._storages[address]
                    self.held -= size


def _storage(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


__all__ = ["Keeper", "Want", "outputs_of"]
