"""How a graph names an op that torch's dispatcher knows: the one spelling export, fx and the eager
tracer share, so that the same op meets itself in a diff.

``aten.linear.default`` and ``prims.add.default`` keep the dotted spelling torch prints; an op of
any other namespace (a ``torch.library.custom_op``, ``torchvision::nms``) is spelled with the
namespace torch declares it in, ``mylib::scaled_swish.default``, which :func:`fxviz.ops.short_name`
shows as ``mylib::scaled_swish`` (never just ``default``); a higher-order op is
``higher_order.cond``. A torch function (not a dispatcher op) is named as a user writes it,
``torch.nn.functional.linear``, ``Tensor.view`` (:func:`function_name`): the eager tracer's targets
and export's ``torch_fn`` calls share that spelling.

    >>> op_target(torch.ops.aten.add.Tensor), op_target(torch.ops.mylib.scaled_swish.default)
    ('aten.add.Tensor', 'mylib::scaled_swish.default')
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import resolve_name

#: Namespaces of torch's own operator library: their ops keep the dotted spelling torch prints.
TORCH_NAMESPACES = frozenset({"aten", "prims", "quantized"})


def op_target(func: Any) -> str | None:
    """The target a graph records for ``func`` when it is a dispatcher op (``OpOverload``,
    ``OpOverloadPacket``) or a higher-order op; ``None`` for anything else (a Python function, a
    method), which each capture names its own way."""
    if isinstance(func, torch._ops.HigherOrderOperator):
        return f"higher_order.{func.name()}"
    if isinstance(func, torch._ops.OpOverload):
        namespace = func.namespace
    elif isinstance(func, torch._ops.OpOverloadPacket):
        namespace = func._qualified_op_name.partition("::")[0]
    else:
        return None
    text = str(func)  # "mylib.scaled_swish.default"
    if namespace in TORCH_NAMESPACES or not text.startswith(namespace + "."):
        return text
    return f"{namespace}::{text[len(namespace) + 1 :]}"


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


__all__ = ["TORCH_NAMESPACES", "function_name", "op_target"]
