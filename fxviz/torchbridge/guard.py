"""What a capture attempt may disturb, taken once before the first attempt and put back after every
one: the model, the user's inputs and the process.

A forward may write anything it can reach, and so may a capture method on the way: fx runs a
buffer's ``add_`` for real while it traces, stows constants on the model (``_tensor_constant0``)
and leaves Proxies in a Python cache; non-strict export rebinds a dict the forward fills; the eager
tracer runs the forward for real. Restoring after each attempt from one snapshot taken before the
first also keeps a later attempt from starting from what an earlier one changed (an fx attempt
that bumped a step counter must not become the eager attempt's "original").

What :class:`Snapshot` keeps, and what it costs:

* every module's ``__dict__`` (a shallow copy) and every ``dict``/``list``/``set`` reachable from it
  through containers (contents by identity): attributes the forward assigns or adds, parameters,
  buffers and submodules rebound, hooks, the training flag, a Python cache filled in place;
* every parameter, buffer and plain tensor attribute by identity, with its ``requires_grad``, its
  ``.grad`` object and its storage (a ``.data = ...`` rebinding is undone); buffers and tensor
  attributes also by value (a copy: they are small next to the parameters, and fx and BatchNorm
  write them without bumping a version counter). Parameters are not copied: fx backs up any its
  trace writes for real (``symbolic/fx.py``), and the eager tracer each one just before an op writes it;
* the inputs' containers and tensors, by identity and value;
* the process (:class:`ProcessState`): ``sys.stdout``/``sys.stderr``, warning hooks and filters,
  torch's logger levels, torch's function and dispatch mode stacks, the methods fx patches on
  ``nn.Module``, fx's tracing flag, grad and autocast modes, the default dtype, the recursion
  limit, global module hooks, the random number generators, and the code Dynamo compiled or marked
  during the attempt (``torch.cond``'s eager path compiles through Dynamo; a code object an attempt
  marked as "skip" made a later export of a ``cond`` model fail).

Writes are put back through ``.data`` (no version bump: a user's autograd graph that saved a buffer
stays valid), and only where a value differs.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from functools import partial
from itertools import chain, compress, filterfalse, repeat
from typing import Any

import torch
from torch import nn

from fxviz.torchbridge.distributed import data_alias
from fxviz.torchbridge.fsdpstate import FsdpState, fsdp_states
from fxviz.torchbridge.process import DynamoCodes, ProcessState
from fxviz.torchbridge.walk import modules_of, named_modules, walks_shared

_first, _second = operator.itemgetter(0), operator.itemgetter(1)
_PLAIN_TENSORS, _PARAMETER = frozenset((torch.Tensor, nn.Parameter, nn.Buffer)), frozenset((nn.Parameter,))
_is_meta = operator.attrgetter("is_meta")
_dict_of = operator.attrgetter("__dict__")
_not_none = partial(operator.is_not, None)
_NOT_CONTAINERS = (torch.Tensor, nn.Module)
_SCALARS = frozenset({int, float, bool, str, bytes, type(None), complex})
#: Containers walked into at most (a forward's Python caches; a guard against pathological models).
_MAX_CONTAINERS = 200_000


def _real(t: torch.Tensor) -> bool:
    """A tensor with values to copy: not on ``meta``, not a fake or functional wrapper."""
    return type(t) in _PLAIN_TENSORS and not t.is_meta


class _Containers:
    """``dict``/``list``/``set`` objects by identity with a copy of their contents; put back in
    place (the object the model holds stays the same object)."""

    __slots__ = ("saved",)

    def __init__(self, roots: Iterable[Any]) -> None:
        self.saved: list[tuple[Any, Any]] = []
        seen: set[int] = set()
        todo = list(roots)
        while todo and len(self.saved) < _MAX_CONTAINERS:
            v = todo.pop()
            t = type(v)  # not isinstance: a failed one calls __getattribute__ (transformers' configs: Python)
            if t in _SCALARS or issubclass(t, _NOT_CONTAINERS) or id(v) in seen:
                continue
            if issubclass(t, dict):
                seen.add(id(v))
                self.saved.append((v, v.copy()))
                todo.extend(v.values())
            elif issubclass(t, list):
                seen.add(id(v))
                self.saved.append((v, v.copy()))
                todo.extend(v)
            elif issubclass(t, set):
                seen.add(id(v))
                self.saved.append((v, v.copy()))
            elif t is tuple:
                seen.add(id(v))
                todo.extend(v)

    def restore(self) -> None:
        for obj, saved in self.saved:
            if isinstance(obj, dict):
                if _dict_changed(obj, saved):
                    obj.clear()
                    obj.update(saved)
            elif isinstance(obj, list):
                if len(obj) != len(saved) or not all(map(operator.is_, obj, saved)):
                    obj[:] = saved
            elif len(obj) != len(saved) or any(x not in saved for x in obj):
                obj.clear()
                obj.update(saved)


def _dict_changed(d: dict[Any, Any], saved: dict[Any, Any]) -> bool:
    """Whether ``d`` holds other keys or other objects (by identity) than ``saved``; in C."""
    return len(d) != len(saved) or d.keys() != saved.keys() or not all(
        map(operator.is_, d.values(), saved.values()))


_grad_of = operator.attrgetter("grad")
_data_of = operator.attrgetter("data")
_requires_grad_of = operator.attrgetter("requires_grad")
_shape_of = operator.attrgetter("shape")
_dtype_of = operator.attrgetter("dtype")


class _Tensors:
    """Tensors by identity: ``requires_grad``, the ``.grad`` object (leaves), the storage (through
    an alias, so a ``.data = ...`` rebinding can be undone), and for some a copy of the values.

    :meth:`restore` first compares all of it at once, in C (``map`` over the tensors): an
    attempt almost never changes any, and a Python loop over every parameter of a large model
    after every attempt cost more than the tracer's own work on a small one."""

    __slots__ = ("aliases", "grads", "leaves", "other", "real", "real_aliases", "signature", "tensors", "values")

    def __init__(self, tensors: Iterable[tuple[torch.Tensor, bool]]) -> None:
        tensors = list(tensors)  # (tensor, copy) pairs; a tensor listed twice: the later entry, in C
        unique = dict(zip(map(id, map(_first, tensors)), tensors, strict=True))
        self.tensors = ts = list(map(_first, unique.values()))
        # parameters are leaves with storage; tensor attributes and inputs may be neither
        kinds = set(map(type, ts))  # what follows in C where every tensor is plain (most models)
        self.leaves = list(ts) if kinds <= _PARAMETER else [t for t in ts if type(t) is nn.Parameter or t.is_leaf]
        real: list[bool] = []
        if kinds <= _PLAIN_TENSORS and not any(map(_is_meta, ts)):  # _real() of each, in C
            self.real, self.other = list(ts), []
        else:
            real = list(map(_real, ts))
            self.real = list(compress(ts, real))
            self.other = list(compress(ts, map(operator.not_, real)))  # meta, fake: no storage to compare
        with torch.no_grad():
            self.aliases = list(map(data_alias if self.other else _data_of, ts))
            self.values = [(t, t.detach().clone()) for t, _ in filter(_second, unique.values()) if _real(t)]
        self.real_aliases = list(compress(self.aliases, real)) if self.other else self.aliases
        self.signature = self._signature()
        self.grads = self.signature[0]  # neither is ever changed

    def _signature(self) -> tuple[list[Any], ...]:
        """What a capture could change, in C: ``.grad`` objects, ``requires_grad``, the dtype, the
        shapes of tensors without storage. (Where the elements are, :meth:`_moved`.)"""
        return (list(map(_grad_of, self.leaves)), list(map(_requires_grad_of, self.tensors)),
                list(map(_dtype_of, self.tensors)), list(map(_shape_of, self.other)))

    def _moved(self) -> bool:
        """Whether a tensor with storage no longer has its storage, offset, sizes and strides (a
        ``.data = ...`` rebinding, to other memory or to a view of its own: ``w.data = w.data.t()``
        keeps the data pointer), each compared with its alias in C (``is_set_to``)."""
        return not all(map(torch.Tensor.is_set_to, self.real, self.real_aliases))

    def restore(self) -> None:
        now = self._signature()
        with torch.no_grad():
            if self._moved() or not all(
                    len(a) == len(b) and all(map(operator.is_ if k == 0 else operator.eq, a, b))
                    for k, (a, b) in enumerate(zip(now, self.signature, strict=True))):
                self._restore_each()
            for t, value in self.values:
                if not _equal(t, value):
                    t.data.copy_(value)

    def _restore_each(self) -> None:
        for t, data in zip(self.tensors, self.aliases, strict=True):
            if not _same_storage(t, data):
                t.data = data
        for t, grad in zip(self.leaves, self.grads, strict=True):
            if t.grad is not grad:
                t.grad = grad
        for t, requires_grad in zip(self.tensors, self.signature[1], strict=True):
            if t.requires_grad != requires_grad and t.is_leaf:
                t.requires_grad_(requires_grad)


def _same_storage(t: torch.Tensor, data: torch.Tensor) -> bool:
    if not _real(t):
        return t.shape == data.shape and t.dtype == data.dtype
    return (t.data_ptr() == data.data_ptr() and t.shape == data.shape and t.dtype == data.dtype
            and t.stride() == data.stride())


def _equal(t: torch.Tensor, value: torch.Tensor) -> bool:
    try:
        return t.shape == value.shape and t.dtype == value.dtype and bool(torch.equal(t.detach(), value))
    except RuntimeError:  # an exotic layout or dtype: write it back rather than guess
        return False


#: What ``nn.Module.__init__`` puts in every module's ``__dict__``: the parameter, buffer and
#: submodule dicts, and hook dicts (almost always empty). Handled without a Python-level walk: a
#: 1,200-layer decoder has 15,600 modules, 220,000 such dicts.
_STATE_DICTS = ("_parameters", "_buffers", "_modules")
_HOOK_DICTS = (
    "_non_persistent_buffers_set", "_backward_pre_hooks", "_backward_hooks", "_forward_hooks",
    "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs", "_state_dict_hooks", "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
)
_STANDARD = frozenset(("training", "_is_full_backward_hook", *_STATE_DICTS, *_HOOK_DICTS))
_N_STANDARD = len(_STANDARD)
_hooks_of = operator.itemgetter(*_HOOK_DICTS)
_state_of = operator.itemgetter(*_STATE_DICTS)


class ModelState:
    """The model and its inputs as they were; :meth:`restore` puts them back.

    Every module's ``__dict__``, its non-empty parameter, buffer, submodule and hook dicts are
    kept as one list of all their keys and one of all their values, with each dict's length (built
    in C: this runs before every capture, and a Python loop over a large model's modules costs
    more than the tracer's work on a small one); :meth:`restore` compares lengths and values at
    once and puts a dict back from its slice of the lists only where something differs. Dicts that were empty are only checked to
    be empty still."""

    def __init__(self, model: nn.Module, inputs: Iterable[Any]) -> None:
        inputs = list(inputs)
        user: list[Any] = list(inputs)  # roots of the containers walked into
        tensors: list[tuple[torch.Tensor, bool]] = []
        mods = modules_of(model)
        dicts = list(map(_dict_of, mods))
        states = fsdp_states(mods)  # FSDP2's, outside the modules' dicts
        self._fsdp = FsdpState(states) if states else None
        try:
            state = list(map(_state_of, dicts))
            hooks = list(chain.from_iterable(map(_hooks_of, dicts)))
            standard = dicts
        except KeyError:  # a module whose __init__ did not run as nn.Module's does
            standard = [d for d in dicts if d.keys() >= _STANDARD]
            user += [v for d in dicts if not d.keys() >= _STANDARD for v in d.values()]
            state = list(map(_state_of, standard))
            hooks = list(chain.from_iterable(map(_hooks_of, standard)))
        _own_attributes(standard, tensors, user)
        state_dicts = list(chain.from_iterable(state))
        params = chain.from_iterable(map(dict.values, map(_first, state)))
        buffers = chain.from_iterable(map(dict.values, map(_second, state)))
        tensors += zip(filter(_not_none, params), repeat(False))
        tensors += zip(filter(_not_none, buffers), repeat(True))
        # dicts that were empty only need to stay empty (:meth:`restore` checks them in C, by their
        # truth, as they were sorted here); most models hold no hook at all: one scan tells
        kept = list(filter(None, hooks)) if any(hooks) else []
        self._empty = (list(filterfalse(None, hooks)) if kept else hooks) + list(filterfalse(None, state_dicts))
        self._dicts = dicts + list(filter(None, state_dicts)) + [c for c in kept if isinstance(c, dict)]
        self._signature = _dicts_signature(self._dicts)
        # every dict's keys as they were, all in one list made in C (their values are the
        # signature's): a copy of each dict, for the few a capture changes, was 1,200 dicts made,
        # walked by the collector and freed per capture of a 300-layer stack
        self._keys = list(chain.from_iterable(self._dicts))
        self._sets = [(c, c.copy()) for c in kept if not isinstance(c, dict)]
        self._containers = _Containers(user)
        self._tensors = _Tensors(tensors)
        self._inputs = _Tensors((t, True) for t in _tensors_in(inputs))

    def restore(self) -> None:
        if self._fsdp is not None:
            self._fsdp.restore()
        lengths, values = _dicts_signature(self._dicts)
        if lengths != self._signature[0] or not all(map(operator.is_, values, self._signature[1])):
            self._restore_dicts()
        for c, saved in self._sets:
            if c != saved:
                c.clear()
                c.update(saved)
        if any(self._empty):  # a hook, parameter or buffer registered during the attempt
            for h in self._empty:
                h.clear()
        self._containers.restore()
        self._tensors.restore()
        self._inputs.restore()

    def _restore_dicts(self) -> None:
        (lengths, values), keys, at = self._signature, self._keys, 0
        for d, n in zip(self._dicts, lengths, strict=True):
            start, at = at, at + n
            if len(d) != n or list(d) != keys[start:at] or not all(map(operator.is_, d.values(), values[start:at])):
                d.clear()
                d.update(zip(keys[start:at], values[start:at], strict=True))


def _own_attributes(dicts: list[dict[str, Any]], tensors: list[tuple[torch.Tensor, bool]], user: list[Any]) -> None:
    """A module's own attributes (``Linear``'s ``in_features``): tensors onto ``tensors`` (copied),
    other objects than scalars onto ``user`` (containers walked into), in module order. Read per
    layout of keys (one per class, mostly) in C first: a layout whose attributes are all scalars
    in every module (most) adds nothing, and only modules of the other layouts are looped over."""
    own = list(compress(dicts, map(_N_STANDARD.__lt__, map(len, dicts))))
    if not own:
        return
    layouts = list(map(tuple, own))
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for d, keys in zip(own, layouts, strict=True):
        group = groups.get(keys)
        if group is None:
            groups[keys] = [d]
        else:
            group.append(d)
    extras: dict[tuple[str, ...], list[str]] = {}  # the layouts with other values than scalars -> own keys
    for keys, group in groups.items():
        ks = [k for k in keys if k not in _STANDARD]
        values = map(operator.itemgetter(*ks), group)
        if not set(map(type, values if len(ks) == 1 else chain.from_iterable(values))) <= _SCALARS:
            extras[keys] = ks
    if not extras:
        return
    for d, keys in zip(own, layouts, strict=True):
        mixed = extras.get(keys)
        if mixed is None:
            continue
        for v in map(d.__getitem__, mixed):
            t = type(v)
            if issubclass(t, torch.Tensor):  # by type: see _Containers
                tensors.append((v, True))
            elif t not in _SCALARS:
                user.append(v)


def _dicts_signature(dicts: list[dict[str, Any]]) -> tuple[list[int], list[Any]]:
    """The length of each of ``dicts`` and all their values in order, gathered in C. (A key renamed
    while the dict keeps its length and its values is not seen; nothing a forward does by
    assigning attributes.)"""
    return list(map(len, dicts)), list(chain.from_iterable(map(dict.values, dicts)))


def _tensors_in(roots: list[Any]) -> Iterable[torch.Tensor]:
    todo, seen = list(roots), set()
    while todo:
        v = todo.pop()
        if isinstance(v, torch.Tensor):
            yield v
        elif id(v) not in seen and isinstance(v, (dict, list, tuple)):
            seen.add(id(v))
            todo.extend(v.values() if isinstance(v, dict) else v)


class Snapshot:
    """The model, the inputs and the process before a capture; :meth:`restore` after each attempt."""

    def __init__(self, model: nn.Module, inputs: Iterable[Any]) -> None:
        self.model = ModelState(model, inputs)
        self.process = ProcessState()

    def restore(self) -> None:
        self.process.restore()
        self.model.restore()


class Backups:
    """Copies of the parameters and buffers a run writes for real where nothing else keeps them
    (compiled graphs writing in place, fx tracing a loop over ``self.parameters()``), each taken
    before its first write; :meth:`restore` puts their values back (through ``.data``: no
    version bump)."""

    def __init__(self) -> None:
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def keep(self, tensors: Any) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor) and id(t) not in self.saved and not t.is_meta:
                self.saved[id(t)] = (t, t.detach().clone())

    def restore(self) -> None:
        with torch.no_grad():
            for t, value in self.saved.values():
                if t.shape == value.shape and t.dtype == value.dtype and t.data_ptr() != value.data_ptr():
                    t.data.copy_(value)
                else:  # set_ rebound it to another size
                    t.data = value


__all__ = ["Backups", "DynamoCodes", "ModelState", "ProcessState", "Snapshot", "modules_of", "named_modules", "walks_shared"]
