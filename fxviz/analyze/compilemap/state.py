"""Which of a compiled graph's inputs are the model's parameters or buffers written in place: what
:class:`~fxviz.torchbridge.guard.Backups` copies just before the graph's first call, so that
:func:`~fxviz.analyze.compilemap.compile_map` can put them back (everything else of the model is put
back by :class:`~fxviz.torchbridge.guard.ModelState`, as after every capture attempt: parameters
are not copied up front, most forwards never write one). Needs torch.

Not restored: a parameter written in code Dynamo ran eagerly.
"""

from __future__ import annotations

import torch

_STATE = ("._parameters[", "._buffers[")


def written_inputs(gm: torch.fx.GraphModule) -> list[int]:
    """Positions of the graph's inputs that are a module's parameters or buffers written in place
    by an op of the graph: directly, through ``.data``, a view or another in-place op's result
    (``k.weight.mul_(0.9).add_(q.weight)``), or rebound by ``set_``. Anything computed from such an
    input counts as an alias of it: at worst one parameter too many is copied."""
    root: dict[torch.fx.Node, int] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, n in enumerate(placeholders):
        source = getattr(getattr(n.meta.get("grapharg"), "source", None), "name", "")
        if any(k in str(source() if callable(source) else source) for k in _STATE):
            root[n] = i
    written: set[int] = set()
    for n in gm.graph.nodes:
        first = n.args[0] if n.op in ("call_method", "call_function") and n.args else None
        if not isinstance(first, torch.fx.Node) or first not in root:
            continue
        root[n] = root[first]
        name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
        if name.endswith("_") and not name.endswith("__"):  # mul_, lerp_, copy_, set_
            written.add(root[first])
    return sorted(written)


__all__ = ["written_inputs"]
