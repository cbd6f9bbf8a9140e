"""Training facts of the IR that a forward-only graph leaves empty: the phase of a node and the
tensors autograd saves for the backward. Plain data, no torch (:mod:`fxviz.ir` re-exports them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fxviz.schema.saved import PHASES

Dim = int | str


@dataclass(frozen=True, slots=True)
class Saved:
    """A tensor autograd keeps from the forward for the backward (a saved activation).

    ``node`` is the forward op that saved it (the op autograd was recording when it was packed),
    ``module`` that op's module path; what ``torch.utils.checkpoint`` keeps to run a region again (its
    inputs) is saved by the region's first op, in the module that called checkpoint, which runs when
    torch packs it. ``bytes`` is the extra memory the record costs: its storage's
    size the first time that storage is saved, 0 for a parameter, a buffer, an input, a view of a
    storage already counted, or a tensor autograd no longer holds when the backward starts (``freed``:
    saved in a branch whose result was dropped; ``shares`` says which), so that the records' bytes add up to the
    step's saved-activation memory. ``value`` is the node whose output was saved, when known;
    ``inferred`` marks a record fxviz worked out rather than saw, and ``reason`` says why the record
    may differ from what eager autograd saves, or why it differs from the joint graph's value (see
    :mod:`fxviz.symbolic.joint`)."""

    node: str
    module: str
    shape: tuple[Dim, ...]
    dtype: str
    bytes: int
    value: str = ""
    shares: str = ""  # why bytes is 0: "parameter", "buffer", "input", "view" (of a counted storage) or "freed"
    inferred: bool = False
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"node": self.node, "module": self.module, "shape": list(self.shape),
                             "dtype": self.dtype, "bytes": self.bytes}
        if self.value:
            d["value"] = self.value
        if self.shares:
            d["shares"] = self.shares
        if self.inferred:
            d["inferred"] = True
        if self.reason:
            d["reason"] = self.reason
        return d


__all__ = ["PHASES", "Saved"]
