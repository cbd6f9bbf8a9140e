"""Whether the inputs ``--input-shape`` made fit the model: when the model raises on them, the
layer that takes them says what it expects (``Linear(in_features=10)`` expects ``(*, 10)``,
``Conv2d(3, ...)`` ``(N, 3, H, W)``), and the error says so in one line instead of the model's
``RuntimeError`` deep inside a kernel."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from fxviz.errors import ModelError, TargetError


def expects(layer: nn.Module) -> tuple[str, list[int | None]] | None:
    """What ``layer`` takes as its input: ``("(N, 3, H, W)", [None, 3, None, None])`` (a ``None``
    is any size; a leading ``"*"`` dimension is written as ``Ellipsis`` before the known ones), or
    ``None`` for a layer it does not know."""
    if isinstance(layer, nn.Linear):
        return f"(*, {layer.in_features})", [..., layer.in_features]  # type: ignore[list-item]
    if isinstance(layer, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        spatial = {nn.Conv1d: ["L"], nn.Conv2d: ["H", "W"], nn.Conv3d: ["D", "H", "W"]}[type(layer)]
        return f"(N, {layer.in_channels}, {', '.join(spatial)})", [None, layer.in_channels, *(None for _ in spatial)]
    if isinstance(layer, nn.LayerNorm):
        norm = list(layer.normalized_shape)
        return f"(*, {', '.join(map(str, norm))})", [..., *norm]  # type: ignore[list-item]
    if isinstance(layer, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)):
        rest = {nn.BatchNorm1d: ["L"], nn.BatchNorm2d: ["H", "W"], nn.BatchNorm3d: ["D", "H", "W"]}[type(layer)]
        return f"(N, {layer.num_features}, {', '.join(rest)})", [None, layer.num_features, *(None for _ in rest)]
    if isinstance(layer, nn.Embedding):
        return f"integer token ids below {layer.num_embeddings}", [...]  # type: ignore[list-item]
    if isinstance(layer, nn.RNNBase):
        return f"(*, {layer.input_size})", [..., layer.input_size]  # type: ignore[list-item]
    return None


def _fits(shape: Sequence[int], want: list[Any]) -> bool:
    if want and want[0] is Ellipsis:
        tail = want[1:]
        return len(shape) >= len(tail) and all(w is None or s == w for s, w in zip(shape[-len(tail):], tail, strict=True))
    return len(shape) == len(want) and all(w is None or s == w for s, w in zip(shape, want, strict=True))


def _example(shape: Sequence[int], want: list[Any]) -> list[int]:
    """``shape`` changed as little as possible to fit ``want``."""
    if want and want[0] is Ellipsis:
        tail = want[1:]
        head = list(shape[: max(len(shape) - len(tail), 0)]) or [1]
        return head + [w if w is not None else 8 for w in tail]
    given = list(shape) + [32] * (len(want) - len(shape))
    return [w if w is not None else (given[i] if i < len(given) else 32) for i, w in enumerate(want)]


def first_layer(model: nn.Module, failed: str | None = None) -> tuple[str, nn.Module] | None:
    """The layer the input meets, where :func:`expects` knows it: the model's first leaf module in
    registration order, when the model raised there (or where it raised is not known). ``None``
    otherwise: a layer further in (after a ``Flatten``, say) sees a shape the model made, and a
    wrong input shape is only a guess there."""
    leaf = next(((n, m) for n, m in model.named_modules() if next(iter(m.children()), None) is None), None)
    if leaf is None or expects(leaf[1]) is None or (failed is not None and failed != leaf[0]):
        return None
    return leaf


def misfit(model: nn.Module, shapes: Sequence[str], args: tuple[Any, ...], failed: str | None = None) -> str | None:
    """The line to show when the model raised on the ``--input-shape`` inputs ``args`` and the layer
    they meet expects another shape (``None`` where the shapes fit it: the model raised for another
    reason)."""
    found = first_layer(model, failed)
    if found is None or len(args) != 1 or not isinstance(args[0], torch.Tensor):
        return None
    name, layer = found
    text, want = expects(layer)  # type: ignore[misc]
    shape = tuple(args[0].shape)
    where = f"--input-shape {','.join(shapes)} does not fit {type(model).__name__}: its first layer " \
        f"{name or 'the model'} ({_describe(layer)})"
    if isinstance(layer, nn.Embedding):
        if args[0].is_floating_point():
            return f"{where} takes {text}, got {args[0].dtype} values; add --dtype int64"
        return None
    if not _fits(shape, want):
        example = ",".join(map(str, _example(shape, want)))
        return f"{where} expects {text}, got {shape}; pass e.g. --input-shape {example}"
    if not args[0].is_floating_point():
        return f"{where} takes floating-point values, got {args[0].dtype}; drop --dtype (float32 is the default)"
    return None


def suggest(model: nn.Module) -> str | None:
    """An ``--input-shape`` the model's first layer takes (``1,10`` for ``Linear(10, ...)``,
    ``1,3,32,32`` for ``Conv2d(3, ...)``), with why: for a factory that returns only a model."""
    found = first_layer(model)
    if found is None:
        return None
    name, layer = found
    text, want = expects(layer)  # type: ignore[misc]
    if isinstance(layer, nn.Embedding):
        return f"--input-shape 1,16 --dtype int64 (its first layer {name} ({_describe(layer)}) takes {text})"
    example = ",".join(map(str, _example((1,), want) if want[0] is Ellipsis else [1, *_example((), want)[1:]]))
    return f"--input-shape {example} (its first layer {name} ({_describe(layer)}) expects {text})"


def _describe(layer: nn.Module) -> str:
    return f"{type(layer).__name__}({layer.extra_repr()})"


def _failed_module(e: BaseException) -> str | None:
    """The module path a :class:`~fxviz.errors.ModelError`'s partial graph marks as where the model raised."""
    graph = getattr(e, "graph", None)
    if graph is None:
        return None
    for n in reversed(graph.nodes):
        if n.error is not None:
            return n.stack[-1][0] if n.stack else None
    return None


@contextlib.contextmanager
def shapes_fit(model: nn.Module, shapes: Sequence[str], args: tuple[Any, ...]) -> Iterator[None]:
    """Around a run of ``model`` on inputs made from ``--input-shape`` (``shapes``; nothing to do
    without them): where the model raises and its first layer expects another shape, a
    :class:`TargetError` saying so (the model's error is its cause, ``--verbose`` shows it); a
    :class:`ModelError` keeps its partial graph and says it first, its own message after."""
    try:
        yield
    except Exception as e:  # the model's own error, or what export or a pass made of it
        if isinstance(e, TargetError) and e.__cause__ is None:  # fxviz's own word on an argument
            raise  # (one with a cause is the model's error in other words: export refused it)
        line = misfit(model, shapes, args, _failed_module(e)) if shapes else None
        if line is None:
            raise
        if isinstance(e, ModelError):  # its partial graph is still shown (and written), exit 1
            raise ModelError(f"{line} ({e})", e.graph) from e
        raise TargetError(line) from e


__all__ = ["expects", "first_layer", "misfit", "shapes_fit", "suggest"]
