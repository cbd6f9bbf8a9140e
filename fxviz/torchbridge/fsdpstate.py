"""FSDP2's own state of a model, kept and put back (``fully_shard``): what a run changes outside
the modules' dicts.

FSDP2 keeps a module's state in torch's registry of composable states, not in the module: the
``FSDPState`` (``_is_root``, ``_training_state``), its shared contexts, its parameter groups and
their ``FSDPParam`` objects (``sharded_state``, the unsharded parameter, the dtypes its lazy init
sets), and the state-dict hooks its lazy init registers on the modules. A forward changes them all
(the root's lazy init, the root's parameters left unsharded after its forward) and an attempt that
fails half-way (export, fx) leaves them half-changed; the module's ``_parameters``, which
:class:`~fxviz.torchbridge.guard.ModelState` puts back, then disagree with them, and the model's
next forward runs on what FSDP2 thinks it holds (an extra all-gather in its backward, a
``DTensor`` mixed with plain tensors, a missing ``param_dtype``). :class:`FsdpState` keeps each
object's attributes (its lists, dicts and sets copied: FSDP2 appends to them) and puts them back
as they were, so the model is FSDP2's as the caller left it: not initialised if it was not.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from torch import nn

#: the tables of the state-dict hooks an FSDP2 parameter group's lazy init registers on modules
_HOOK_TABLES = ("_module_to_pre_save_state_dict_hook_handle", "_module_to_pre_load_state_dict_hook_handle")


def fsdp_states(modules: Iterable[nn.Module]) -> list[Any]:
    """The FSDP2 states of ``modules``, each once (none for a model without ``fully_shard``)."""
    registry = sys.modules.get("torch.distributed._composable_state")  # where fully_shard registers a module
    if registry is None or not len(registry._module_state_mapping):
        return []  # no composable state in the process: nothing to walk
    states: dict[int, Any] = {}
    for m in modules:
        get = getattr(type(m), "_get_fsdp_state", None)  # on the class fully_shard made: no __getattr__
        state = get(m) if callable(get) else None
        if state is not None:
            states.setdefault(id(state), state)
    return list(states.values())


def param_groups(state: Any) -> list[Any]:
    """An FSDP2 state's parameter groups: ``_fsdp_param_groups`` where torch keeps several (2.13),
    its one ``_fsdp_param_group`` before (2.11)."""
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = getattr(state, "_fsdp_param_group", None)
    return [] if group is None else [group]


def _copy_vars_of(d: dict[str, Any]) -> dict[str, Any]:
    """``d``, its lists, dicts and sets copied (FSDP2 appends to them in place)."""
    return {k: (type(v)(v) if type(v) in (list, dict, set) else v) for k, v in d.items()}


class FsdpState:
    """The FSDP2 states ``states`` as they are now; :meth:`restore` puts them back."""

    __slots__ = ("hooks", "saved")

    def __init__(self, states: list[Any]) -> None:
        groups = [g for s in states for g in param_groups(s)]
        owners = [*states, *{id(s._state_ctx): s._state_ctx for s in states}.values(),
                  *{id(s._comm_ctx): s._comm_ctx for s in states}.values(), *groups,
                  *(p for g in groups for p in g.fsdp_params)]
        self.saved = [(o, _copy_vars_of(vars(o))) for o in owners]
        self.hooks = [(g, {k: dict(getattr(g, k)) for k in _HOOK_TABLES if isinstance(getattr(g, k, None), dict)})
                      for g in groups]

    def restore(self) -> None:
        for g, tables in self.hooks:  # the state-dict hooks FSDP2's lazy init registered on the modules
            for k, before in tables.items():
                for module, handle in list(getattr(g, k).items()):
                    if module not in before:
                        handle.remove()
        for o, d in self.saved:  # copies again: a later attempt appends to what it is given
            o.__dict__.clear()
            o.__dict__.update(_copy_vars_of(d))


__all__ = ["FsdpState", "fsdp_states", "param_groups"]
