"""Where a joint graph's saved value is not what eager autograd keeps for the same step.

The joint graph's saved records (:func:`fxviz.symbolic.joint.inferred_saved`) are the forward values
its backward reads, which is what AOT Autograd's partition saves. Eager autograd, which
``saved_tensors_hooks`` sees, runs the model's own kernels, and two of them keep something else:

- **dropout**: the joint graph has ``native_dropout`` (torch's Python decomposition of
  ``aten.dropout``), which saves a ``bool`` mask; eager ``aten::dropout`` uses that fused kernel only
  on some devices (CUDA), and elsewhere multiplies by a noise tensor of the input's dtype, which its
  ``MulBackward0`` saves. What eager keeps is read by running ``F.dropout`` once on a 4-element
  tensor of that device and dtype and reading its autograd node's saved tensors
  (:func:`eager_dropout_saves`, RNG state kept), and the record takes its dtype and bytes (``reason`` says so; it is exact, not inferred).
- **the attention mask** of ``scaled_dot_product_attention``: the traced program passes a mask that
  the backward reads, but a model may build it only while traced (``transformers`` materialises
  its causal mask under tracing and calls sdpa with ``is_causal=True`` and no mask in eager), so
  eager may save nothing for it; with it, the key and value heads the traced program repeats for
  grouped-query attention (eager passes the unrepeated ones with ``enable_gqa=True``). Such records
  keep the joint graph's bytes, marked ``inferred`` with the reason: the residual the joint graph
  cannot settle, since eager takes a branch the traced program did not. So are the ``bool`` masks it
  builds from the shapes alone (T5's, read by ``where``): eager may build none, or one per layer
  where the traced program shares one (a record of 0 bytes, a view, is marked too).
"""

from __future__ import annotations

import functools
import operator

import torch
import torch.fx
from torch._dispatch.python import no_python_dispatcher
from torch.utils._python_dispatch import _disable_current_modes

from fxviz.passes.overlays import ITEMSIZE

_DROPOUT = torch.ops.aten.native_dropout.default


@functools.cache
def eager_dropout_saves(device: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype of what eager ``F.dropout(x, 0.5, training=True)`` saves for its backward, for ``x`` of
    ``dtype`` on ``device`` (``bool``: the fused kernel's mask; else the noise it multiplies by)."""
    dev = torch.device(device)
    devices = [dev.index or 0] if dev.type == "cuda" else []
    # the joint export's fake mode and Python dispatcher are still on (and saved-tensor hooks off): the
    # real kernel runs without them, and its autograd node says what it saved
    with _disable_current_modes(), no_python_dispatcher(), \
            torch.random.fork_rng(devices=devices, device_type=dev.type if dev.type == "cuda" else "cuda"), \
            torch.enable_grad():
        x = torch.ones(4, dtype=dtype, device=dev, requires_grad=True)
        fn = torch.nn.functional.dropout(x, 0.5, training=True).grad_fn
        saved = [getattr(fn, a) for a in dir(fn) if a.startswith("_saved_")]
    return next((t.dtype for t in saved if isinstance(t, torch.Tensor) and t is not x), torch.bool)


def _is_dropout_mask(n: torch.fx.Node) -> bool:
    return (n.op == "call_function" and n.target is operator.getitem and bool(n.args[1] == 1)
            and isinstance(n.args[0], torch.fx.Node) and n.args[0].target is _DROPOUT)


def _sdpa_args(n: torch.fx.Node) -> list[dict[str, object]]:
    """The arguments, by name, of each forward ``scaled_dot_product`` op that reads ``n``."""
    out = []
    for u in n.users:
        schema = getattr(u.target, "_schema", None)
        if schema is None or "scaled_dot_product" not in schema.name or u.meta.get("partitioner_tag") != "is_forward":
            continue
        names = [a.name for a in schema.arguments]
        out.append(dict(zip(names, u.args, strict=False)) | dict(u.kwargs))
    return out


def _is_sdpa_mask(n: torch.fx.Node) -> bool:
    return any(given.get("attn_mask") is n for given in _sdpa_args(n))


_REPEAT = frozenset(("aten::expand", "aten::clone", "aten::_unsafe_view", "aten::view", "aten::reshape",
                     "aten::unsqueeze", "aten::slice"))


def _is_repeated_kv(n: torch.fx.Node) -> bool:
    """``n`` is the key or value of a masked sdpa op, made by repeating heads (an ``expand`` copied): the
    traced program's grouped-query attention where eager may call sdpa with ``enable_gqa``."""
    if not any(isinstance(given.get("attn_mask"), torch.fx.Node) and n in (given.get("key"), given.get("value"))
               for given in _sdpa_args(n)):
        return False
    m = n
    for _ in range(6):
        name = getattr(getattr(m.target, "_schema", None), "name", "")
        if name not in _REPEAT or not m.args or not isinstance(m.args[0], torch.fx.Node):
            return False
        if name == "aten::expand":
            return True
        m = m.args[0]
    return False


_MASK = ("the attention mask the traced program passes to scaled_dot_product_attention: a model may build it only "
         "when traced (transformers does, and calls sdpa with is_causal=True and no mask in eager, which then saves "
         "nothing for it)")
_GQA = ("the key or value heads the traced program repeats for its masked scaled_dot_product_attention: eager "
        "transformers passes no mask and the unrepeated heads with enable_gqa=True, and saves those")


_SHAPES = ("a mask the traced program builds from the shapes alone: transformers builds its attention masks when "
           "traced, where eager may build none (no padding) or one per layer, and saves what it builds")


def _from_shapes(n: torch.fx.Node) -> bool:
    """``n`` is a ``bool`` value that reads no input, parameter or buffer: made from ``arange`` and the
    like, a mask the program builds from the shapes alone."""
    val = n.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype != torch.bool:
        return False
    todo, seen = [n], {n}
    while todo:
        m = todo.pop()
        if m.op == "placeholder":
            return False
        for a in m.all_input_nodes:
            if a not in seen:
                seen.add(a)
                todo.append(a)
    return True


def as_eager(n: torch.fx.Node, dtype: str, nbytes: int) -> tuple[str, int, bool, str]:
    """(dtype, bytes, inferred, reason) of the record of saved value ``n`` (its base's ``nbytes``, 0 for a
    view of a storage counted before), as eager autograd keeps it (see the module's docstring)."""
    val = n.meta.get("val")
    if _is_dropout_mask(n) and isinstance(val, torch.Tensor) and nbytes:
        src = n.args[0].args[0].meta.get("val")  # type: ignore[union-attr]
        kept = eager_dropout_saves(str(val.device), src.dtype if isinstance(src, torch.Tensor) else torch.float32)
        if kept != val.dtype:
            name = str(kept).removeprefix("torch.")
            return (name, nbytes // max(val.element_size(), 1) * ITEMSIZE.get(name, 1), False,
                    f"eager dropout on {val.device.type} saves its {name} noise, not the bool mask of the "
                    "joint graph's native_dropout")
    if nbytes and _is_sdpa_mask(n):
        return dtype, nbytes, True, _MASK
    if nbytes and _is_repeated_kv(n):
        return dtype, nbytes, True, _GQA
    if _from_shapes(n):  # a view too: eager may keep one such mask per layer where the traced program shares one
        return dtype, nbytes, True, _SHAPES
    return dtype, nbytes, False, ""


__all__ = ["as_eager", "eager_dropout_saves"]
