"""Normalise a model's inputs and outputs so symbolic capture accepts any real model.

torch.export wants tensors (or pytrees of tensors) in and out. Real models take keyword arguments
and return ``ModelOutput``, dataclasses, ``DynamicCache`` and plain Python values. We flatten the
inputs to a list of tensors (non-tensor leaves become constants baked into the call), and the
outputs to a tuple of tensors, each with the path a user would write to reach it
(``logits``, ``cache.layers[0].keys``). The user never edits the model.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from fxviz.text import without_address


def bind_names(model: nn.Module, args: tuple[Any, ...]) -> list[str]:
    """Names of the positional ``args`` as ``model.forward`` declares them (``x``, ``input_ids``);
    ``args[i]`` where the signature does not say."""
    names: list[str] = []
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    for i in range(len(args)):
        p = params[i] if i < len(params) else None
        if p is None or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            names.append(f"args[{i}]")
        else:
            names.append(p.name)
    return names


def key_str(key: Any) -> str:
    """One pytree key as it reads in a path: ``[0]``, ``['logits']``, ``.keys``."""
    if isinstance(key, pytree.SequenceKey):
        return f"[{key.idx}]"
    if isinstance(key, pytree.MappingKey):
        return f"[{key.key!r}]"
    if isinstance(key, pytree.GetAttrKey):
        return f".{key.name}"
    return str(key)


@dataclasses.dataclass
class FlatInputs:
    """``args``/``kwargs`` split into tensor leaves (graph inputs) and everything else."""

    spec: pytree.TreeSpec
    leaves: list[Any]
    tensor_positions: list[int]
    names: list[str]  # one per tensor leaf
    # every other leaf (a flag, a number, ``None``) by its path, as ``names`` names the tensors
    constants: list[tuple[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(self.leaves[i] for i in self.tensor_positions)

    def rebuild(self, tensors: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        leaves = list(self.leaves)
        for pos, t in zip(self.tensor_positions, tensors, strict=True):
            leaves[pos] = t
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return tuple(args), dict(kwargs)


def flatten_inputs(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> FlatInputs:
    arg_names = bind_names(model, args)
    with_path, spec = pytree.tree_flatten_with_path((tuple(args), dict(kwargs)))
    leaves, positions, names = [], [], []
    constants: list[tuple[str, Any]] = []
    for i, (path, leaf) in enumerate(with_path):
        leaves.append(leaf)
        top, first, *rest = path
        assert isinstance(top, pytree.SequenceKey)
        if top.idx == 0:  # positional
            assert isinstance(first, pytree.SequenceKey)
            base = arg_names[first.idx]
        else:  # keyword
            base = str(getattr(first, "key", first))
        name = base + "".join(key_str(k) for k in rest)
        if isinstance(leaf, torch.Tensor):
            positions.append(i)
            names.append(name)
        else:
            constants.append((name, leaf))
    return FlatInputs(spec, leaves, positions, names, constants)


def flatten_outputs(
    obj: Any, path: str = "output", *, leaf_types: tuple[type, ...] = (torch.Tensor,)
) -> list[tuple[str, Any]]:
    """Every leaf of a model's output with its path, tensors and plain values alike, at any depth.

    Walks tuples, lists, mappings (``ModelOutput`` included), dataclasses and plain objects that
    hold tensors (``DynamicCache``). ``path`` names the root; a single tensor output is ``output``.
    No recursion (an output may nest deeper than Python's stack); a container met twice is walked
    once.
    """
    out: list[tuple[str, Any]] = []
    seen: set[int] = set()
    todo: list[tuple[Any, str]] = [(obj, path)]
    while todo:
        o, p = todo.pop()
        if isinstance(o, leaf_types) or o is None or isinstance(o, (int, float, str, bool)):
            out.append((p, o))
            continue
        if id(o) in seen:
            continue
        seen.add(id(o))
        sep = "" if p == "output" else "."
        root = "" if p == "output" else p
        children: list[tuple[Any, str]] = []
        if isinstance(o, Mapping):
            children = [(v, f"{root}{sep}{k}" if isinstance(k, str) else f"{p}[{k!r}]") for k, v in o.items()]
        elif isinstance(o, (list, tuple)):
            children = [(v, f"{p}[{i}]") for i, v in enumerate(o)]
        elif dataclasses.is_dataclass(o) and not isinstance(o, type):
            children = [(getattr(o, f.name), f"{root}{sep}{f.name}") for f in dataclasses.fields(o)]
        elif isinstance(o, nn.Module) or callable(o):
            out.append((p, o))
        elif hasattr(o, "__dict__"):
            children = [(v, f"{root}{sep}{k}") for k, v in vars(o).items()
                        if not k.startswith("_") and holds_tensors(v)]
        else:
            out.append((p, o))
        todo.extend(reversed(children))
    return out


def holds_tensors(o: Any) -> bool:
    """Whether a tensor is reachable from ``o`` through containers and plain objects."""
    seen: set[int] = set()
    todo = [o]
    while todo:
        o = todo.pop()
        if isinstance(o, torch.Tensor):
            return True
        if id(o) in seen or isinstance(o, (str, bytes, nn.Module)):
            continue
        seen.add(id(o))
        if isinstance(o, Mapping):
            todo.extend(o.values())
        elif isinstance(o, (list, tuple)):
            todo.extend(o)
        elif hasattr(o, "__dict__") and not callable(o):
            todo.extend(vars(o).values())
    return False


class NormalizedModel(nn.Module):
    """Wraps a model so its forward takes a flat tuple of tensors and returns a flat dict of them,
    keyed by their paths.

    The wrapped model is the submodule ``model``; capture strips that prefix from module paths and
    state-dict names. Output paths, constant outputs included, land in ``box["outputs"]`` when the
    forward runs in Python (non-strict export, fx); a Dynamo-traced forward (strict export) does not
    run it, and its tensor outputs are named by the returned dict's keys.
    """

    PREFIX = "model"

    def __init__(self, model: nn.Module, inputs: FlatInputs, box: dict[str, Any]) -> None:
        super().__init__()
        self.model = model
        self._inputs = inputs
        self._box = box

    def forward(self, *tensors: torch.Tensor) -> dict[str, torch.Tensor]:
        args, kwargs = self._inputs.rebuild(tensors)
        leaves = flatten_outputs(self.model(*args, **kwargs))
        self._box["outputs"] = [(p, _describe(v)) for p, v in leaves]
        # keyed by path: a program's output spec keeps the names where the box stays empty
        return {p: v for p, v in leaves if isinstance(v, torch.Tensor)}


def _describe(v: Any) -> str | None:
    """``None`` for a tensor leaf, else the ``repr`` a renderer shows for a constant output."""
    if isinstance(v, torch.Tensor):
        return None
    text = without_address(repr(v))
    return text if len(text) <= 80 else text[:77] + "..."
