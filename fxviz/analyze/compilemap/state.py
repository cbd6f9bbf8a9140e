"""The model as the user's first call finds it: what :func:`~fxviz.analyze.compilemap.compile_map`
saves before its runs and puts back between them and after. Needs torch.

A forward may change its model: BatchNorm's statistics, a scale read from the first batch
(``if self.scale is None: self.scale = x.max().item()``), a cache filled on first use, a buffer
registered lazily. The compiled run and the eager trace must each see the model as the user's first
call would, and the user must get it back as it was: :class:`ModelSnapshot` keeps, for every
module,

* its Python attributes (``__dict__`` less the parameter, buffer and submodule tables), by
  reference, and the contents of those that are ``dict``, ``list`` or ``set`` one level deep (a
  cache filled in place is emptied again, and stays the same object);
* which parameters, buffers and submodules it has (a buffer registered or replaced by the forward
  is taken out or put back);
* the values of its buffers (copied; written back in place);
* FSDP2's own state (``fully_shard``: kept outside the modules, by
  :class:`~fxviz.torchbridge.fsdpstate.FsdpState`): a compiled forward leaves the root's
  parameters unsharded and FSDP2 initialised, which the eager trace must not find.

A parameter's values are not copied up front: :class:`~fxviz.torchbridge.guard.Backups` copies those a compiled graph writes
in place (a momentum update under ``no_grad``), just before the graph's first call, read from the
graph itself (:func:`written_inputs`). Not restored: a parameter written in code Dynamo ran eagerly,
and a plain tensor attribute (not a registered buffer) written in place (kept by reference).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fxviz.torchbridge.fsdpstate import FsdpState, fsdp_states

_TABLES = ("_parameters", "_buffers", "_modules")
_CONTAINERS = (dict, list, set)


class ModelSnapshot:
    """The state of ``model`` and its submodules now; :meth:`restore` puts it back (any number of
    times)."""

    def __init__(self, model: nn.Module) -> None:
        self._modules: list[tuple[dict[str, Any], dict[str, Any], list[tuple[Any, Any]]]] = []
        for m in model.modules():
            d = m.__dict__
            attrs = {k: v for k, v in d.items() if k not in _TABLES}
            contents = [(v, _copy(v)) for v in attrs.values() if isinstance(v, _CONTAINERS)]
            contents += [(d[t], dict(d[t])) for t in _TABLES if t in d]
            self._modules.append((d, attrs, contents))
        self._buffers = [(b, b.detach().clone()) for b in model.buffers() if not b.is_meta]
        states = fsdp_states(model.modules())
        self._fsdp = FsdpState(states) if states else None

    def restore(self) -> None:
        if self._fsdp is not None:
            self._fsdp.restore()
        for d, attrs, contents in self._modules:
            for k in [k for k in d if k not in attrs and k not in _TABLES]:
                del d[k]
            d.update(attrs)
            for obj, saved in contents:
                _put_back(obj, saved)
        with torch.no_grad():  # every time: kernels such as batch_norm's write its statistics without
            for b, saved in self._buffers:  # moving the tensor's version counter
                if b.shape == saved.shape and b.dtype == saved.dtype:
                    b.copy_(saved)


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


def _copy(v: Any) -> Any:
    if isinstance(v, dict):
        return dict(v)
    return list(v) if isinstance(v, list) else set(v)


def _put_back(obj: Any, saved: Any) -> None:
    if isinstance(obj, dict):
        if obj.keys() != saved.keys() or any(obj[k] is not v for k, v in saved.items()):
            obj.clear()
            obj.update(saved)
    elif isinstance(obj, list):
        if len(obj) != len(saved) or any(a is not b for a, b in zip(obj, saved, strict=True)):
            obj[:] = saved
    else:  # a set: its members compare by hash and ==, which a tensor answers with a tensor
        obj.clear()
        obj.update(saved)


__all__ = ["ModelSnapshot", "written_inputs"]
