"""What a callable is to the tracer, decided once per callable: an op to record, a metadata query to
let through, or an exit from the graph (a Python value computed from tensor data); and, for an
ATen op, which arguments it writes.

    >>> classify(torch.nn.functional.linear, "function")
    Kind(action=<Action.OP: 'op'>, target='torch.nn.functional.linear', name='linear')
    >>> classify(torch.Tensor.size, "function").action, classify(torch.Tensor.item, "function").action
    (<Action.SKIP: 'skip'>, <Action.EXIT: 'exit'>)

The names and sets behind these decisions live in :mod:`fxviz.ops`; this module only applies them to
torch callables.
"""

from __future__ import annotations

import enum
import inspect
from typing import Any, Literal, NamedTuple

import torch
from torch.overrides import resolve_name

from fxviz.ops import DATA_DEPENDENT, TENSOR_META_ATTRS, TENSOR_META_METHODS, short_name
from fxviz.torchbridge.opnames import op_target

#: What a recording mode sees: torch-function calls (``F.linear``) or ATen ops (``aten.addmm``).
Level = Literal["function", "aten"]
LEVELS: tuple[Level, ...] = ("function", "aten")


class Action(enum.Enum):
    """What the tracer does with a call."""

    SKIP = "skip"  #: a metadata query (``x.shape``, ``x.size()``): run it, record nothing
    OP = "op"  #: an op: run it, record a node
    EXIT = "exit"  #: leaves the graph (``x.item()``, ``bool(x)``): a node marked data-dependent


class Kind(NamedTuple):
    """A callable as the tracer records it."""

    action: Action
    target: str  #: how the graph names it: ``torch.nn.functional.linear``, ``aten.addmm.default``
    name: str  #: the base of its node names: ``linear``, ``addmm``
    #: may write its tensor arguments (``add_``, ``x[i] = v``, ``F.relu(x, inplace=True)``,
    #: ``F.batch_norm``'s running statistics, ``p.data = t``) or the ``.grad`` of the model's
    #: parameters (``backward``): the tracer backs up a model tensor before such a call
    writes: bool = False


#: Function-level calls that write their tensor arguments although their names do not end in
#: ``_``: in-place operators, normalisations that update running statistics, ``embedding`` with
#: ``max_norm`` (renormalises rows of its weight), and ``backward`` (accumulates into ``.grad``).
WRITERS = frozenset({
    "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
    "__ipow__", "__imatmul__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__",
    "batch_norm", "instance_norm", "embedding", "embedding_bag", "native_batch_norm", "backward",
})


#: level -> callable -> its kind. Naming a callable (``resolve_name``) is slow and its answer never
#: changes, so one table serves every capture in the process.
_KINDS: dict[str, dict[Any, Kind]] = {level: {} for level in LEVELS}


def kinds(level: Level) -> dict[Any, Kind]:
    """The process-wide table of callables already classified at ``level``; fill it with
    :func:`classify` (the recorder looks callables up inline: it is on every op's path)."""
    return _KINDS[level]


def kind_of(func: Any, level: Level) -> Kind:
    """``func``'s kind at ``level``, classified once per process."""
    table = _KINDS[level]
    k = table.get(func)
    if k is None:
        k = table[func] = classify(func, level)
    return k


def classify(func: Any, level: Level) -> Kind:
    """The kind of a callable at ``level``. ATen ops are named by torch itself (``addmm``, also for
    a custom op's ``mylib::foo.default``: ``foo``); torch-function calls by how a user writes them."""
    if level == "aten":
        target = op_target(func) or str(func)
        name = func.overloadpacket.__name__ if hasattr(func, "overloadpacket") else target
        schema = getattr(func, "_schema", None)
        writes = schema is not None and any(
            a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        return Kind(Action.EXIT if name in DATA_DEPENDENT else Action.OP, target, name, writes)
    target = op_target(func) or function_name(func)
    parts = target.split(".")
    tensor = target.startswith("Tensor.")
    if parts[-1] == "__get__":  # a property: ``Tensor.T.__get__`` is ``T``
        name = parts[-2]
        if tensor and name in TENSOR_META_ATTRS:
            return Kind(Action.SKIP, target, name)
    else:
        name = short_name(target)
        if tensor and name in TENSOR_META_METHODS:
            return Kind(Action.SKIP, target, name)
    action = Action.EXIT if name in DATA_DEPENDENT else Action.OP
    writes = (parts[-1] == "__set__" or name in WRITERS or (name.endswith("_") and not name.startswith("__"))
              or _takes_inplace(func))
    return Kind(action, target, name.strip("_") or name, writes)  # ``__add__`` -> ``add``


def _takes_inplace(func: Any) -> bool:
    """A function with an ``inplace`` parameter (``F.relu``, ``F.dropout``): it may write its input."""
    try:
        return "inplace" in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


#: ATen op -> positions of the arguments its schema says it writes (``add_``'s ``self``)
_WRITES: dict[Any, tuple[int, ...]] = {}


def written_tensors(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], names: list[str]
) -> tuple[int, ...]:
    """ATen level: which tensor arguments of this call the op writes, as indices among its tensor
    arguments in order (how the recorder lists the tensors it read). ``names``: the schema's
    argument names."""
    writes = _WRITES.get(func)
    if writes is None:
        schema = getattr(func, "_schema", None)
        writes = _WRITES[func] = tuple(
            i for i, a in enumerate(schema.arguments if schema is not None else ())
            if a.alias_info is not None and a.alias_info.is_write
        )
    if not writes:
        return ()
    # the schema counts every argument; map its positions onto the tensors among them
    positions: dict[int, int] = {}
    n = 0
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            positions[i] = n
            n += 1
        elif isinstance(a, (list, tuple)):
            n += sum(isinstance(x, torch.Tensor) for x in a)
    index = {name: i for i, name in enumerate(names)}
    for k, a in kwargs.items():
        if isinstance(a, torch.Tensor):
            if k in index:
                positions[index[k]] = n
            n += 1
        elif isinstance(a, (list, tuple)):
            n += sum(isinstance(x, torch.Tensor) for x in a)
    return tuple(positions[i] for i in writes if i in positions)


def function_name(func: Any) -> str:
    """``torch.nn.functional.linear``, ``Tensor.view``, ``Tensor.T.__get__``: how a user writes it."""
    try:
        name = resolve_name(func)
    except Exception:  # resolve_name walks torch's namespaces; anything odd falls through
        name = None
    if not name:
        mod = getattr(func, "__module__", None) or ""
        qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
        name = f"{mod}.{qual}" if mod and mod != "builtins" else str(qual)
    if name.startswith("torch._VariableFunctionsClass."):  # how resolve_name spells some torch.* ops
        name = "torch." + name.removeprefix("torch._VariableFunctionsClass.")
    return name.removeprefix("torch.") if name.startswith("torch.Tensor.") else name


__all__ = [
    "LEVELS", "WRITERS", "Action", "Kind", "Level", "classify", "function_name", "kind_of", "kinds", "written_tensors",
]
