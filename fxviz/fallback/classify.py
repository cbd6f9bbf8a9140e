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
import sys
from typing import Any, Literal, NamedTuple

import torch

from fxviz.ops import DATA_DEPENDENT, TENSOR_META_ATTRS, TENSOR_META_METHODS, short_name
from fxviz.torchbridge.opnames import function_name, op_target

#: What a recording mode sees: torch-function calls (``F.linear``) or ATen ops (``aten.addmm``).
Level = Literal["function", "aten"]
LEVELS: tuple[Level, ...] = ("function", "aten")


class Action(enum.Enum):
    """What the tracer does with a call."""

    SKIP = "skip"  #: a metadata query (``x.shape``, ``x.size()``): run it, record nothing
    OP = "op"  #: an op: run it, record a node
    EXIT = "exit"  #: leaves the graph (``x.item()``, ``bool(x)``): a node marked data-dependent


class WritesWhen:
    """When a call of a function that writes only for some argument values writes, decided per
    call from those arguments: ``F.relu``/``F.dropout`` with ``inplace`` on, ``F.embedding``/
    ``F.embedding_bag`` with a ``max_norm`` (renormalises rows of the weight), ``F.batch_norm`` in
    training with running statistics (``F.instance_norm`` with ``use_input_stats``). Anything but
    an off value (``None``; for a flag also ``False`` or ``0``) counts as on."""

    __slots__ = ("tests",)

    def __init__(self, tests: tuple[tuple[str, int, Any, bool], ...]) -> None:
        #: ``(parameter, position, default, flag)``: every one on for the call to write
        self.tests = tests

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        for name, pos, default, flag in self.tests:
            v = kwargs[name] if name in kwargs else args[pos] if pos < len(args) else default
            if v is None or (flag and (v is False or (type(v) is int and v == 0))):
                return False
        return True

    def __repr__(self) -> str:
        return f"WritesWhen({', '.join(name for name, *_ in self.tests)})"


class Kind(NamedTuple):
    """A callable as the tracer records it."""

    action: Action
    target: str  #: how the graph names it: ``torch.nn.functional.linear``, ``aten.addmm.default``
    name: str  #: the base of its node names: ``linear``, ``addmm``
    #: every call may write its tensor arguments (``add_``, ``x[i] = v``, ``p.data = t``, an ATen op
    #: whose schema says so) or the ``.grad`` of the model's parameters (``backward``): the tracer
    #: backs up a model tensor before such a call
    writes: bool = False
    #: a call writes for some argument values only (``F.relu(x, inplace=True)``): this says which
    writes_when: WritesWhen | None = None
    #: function level, a ``torch.ops`` op whose schema says it writes arguments: that overload,
    #: whose schema the tracer reads the written tensors from (a custom op's writes may move no
    #: version counter: FSDP2 copies its all-gathered parameters out with theirs kept)
    schema_op: Any = None


#: Function-level calls that always write their tensor arguments although their names do not end
#: in ``_``: in-place operators and ``backward`` (accumulates into ``.grad``); and the builtin
#: spellings of the normalisations (``torch.batch_norm``), whose arguments have no signature to read
#: a :class:`WritesWhen` from (the ``F.`` spellings users call have one).
WRITERS = frozenset({
    "__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__",
    "__ipow__", "__imatmul__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__",
    "batch_norm", "instance_norm", "native_batch_norm", "backward",
})
#: the calls that run a backward (``grad`` too: its hooks may write, and a backward the forward runs
#: is recorded node by node, :mod:`fxviz.fallback.ownbackward`)
BACKWARD_CALLS = frozenset({"torch.autograd.backward", "Tensor.backward", "torch.autograd.grad"})


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
    short = name.strip("_") or name  # ``__add__`` -> ``add``
    op = _writing_overload(func)
    if op is not None:
        return Kind(action, target, short, True, None, op)
    if parts[-1] == "__set__" or (name.endswith("_") and not name.startswith("__")):
        return Kind(action, target, short, True)
    when = writes_when(func)
    return Kind(action, target, short, when is None and (name in WRITERS or target in BACKWARD_CALLS), when)


def _writes(schema: Any) -> tuple[int, ...]:
    """The positions of the arguments ``schema`` marks as written (``Tensor(a!)``)."""
    return tuple(i for i, a in enumerate(schema.arguments if schema is not None else ())
                 if a.alias_info is not None and a.alias_info.is_write)


def _writing_overload(func: Any) -> Any:
    """A ``torch.ops`` op (an overload, or a packet of one overload) whose schema writes an
    argument; None for anything else."""
    if isinstance(func, torch._ops.OpOverloadPacket):
        names = func.overloads()
        func = getattr(func, names[0]) if len(names) == 1 else None
    if isinstance(func, torch._ops.OpOverload) and _writes(func._schema):
        return func
    return None


def writes_when(func: Any) -> WritesWhen | None:
    """The arguments that make a call of ``func`` write, read from its signature: ``inplace``,
    ``max_norm``, or running statistics with ``training`` / ``use_input_stats``; None for a function
    with none of them (or no signature: a builtin)."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return None
    positional = [n for n, p in params.items() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    def test(name: str, flag: bool) -> tuple[str, int, Any, bool]:
        default = params[name].default
        pos = positional.index(name) if name in positional else sys.maxsize
        return name, pos, None if default is inspect.Parameter.empty else default, flag

    if "inplace" in params:
        return WritesWhen((test("inplace", True),))
    if "max_norm" in params:
        return WritesWhen((test("max_norm", False),))
    if "running_mean" in params:
        flag = next((n for n in ("training", "use_input_stats") if n in params), None)
        stats = test("running_mean", False)
        return WritesWhen((test(flag, True), stats) if flag else (stats,))
    return None


#: ATen op -> positions of the arguments its schema says it writes (``add_``'s ``self``)
_WRITES: dict[Any, tuple[int, ...]] = {}


def written_tensors(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], names: list[str]
) -> tuple[int, ...]:
    """Which tensor arguments of this call of an op (an overload) its schema says it writes, as
    indices among its tensor arguments in order, those in lists each (how the recorder lists the
    tensors it read). ``names``: the schema's argument names."""
    writes = _WRITES.get(func)
    if writes is None:
        writes = _WRITES[func] = _writes(getattr(func, "_schema", None))
    if not writes:
        return ()
    # the schema counts every argument; map its positions onto the tensors among them (a list
    # argument, ``_foreach_mul_``'s or ``out=``'s, holds several)
    positions: dict[int, range] = {}
    n = 0
    index = {name: i for i, name in enumerate(names)}
    for i, a in (*enumerate(args), *((index.get(k, -1), a) for k, a in kwargs.items())):
        k = 1 if isinstance(a, torch.Tensor) else \
            sum(isinstance(x, torch.Tensor) for x in a) if isinstance(a, (list, tuple)) else 0
        if k:
            positions[i] = range(n, n + k)
            n += k
    return tuple(j for i in writes for j in positions.get(i, ()))


__all__ = [
    "BACKWARD_CALLS", "LEVELS", "WRITERS", "Action", "Kind", "Level", "WritesWhen", "classify", "function_name", "kind_of", "kinds",
    "writes_when", "written_tensors",
]
