"""The values an op or module call of the compile map takes besides a graph's id (``g0``): one
definition each, which the map (:mod:`.result`), its overlay and the matching use; and the break
categories with their remedies. No torch."""

from __future__ import annotations

#: An op that ran outside every compiled graph (Dynamo ran it as Python: a graph break, a skipped frame).
EAGER = "eager"
#: A module call several graphs, or graphs and eager ops, ran.
MIXED = "mixed"
#: The op where a graph broke (``.item()``, ``bool(tensor)``).
BREAK = "break"
#: An op of the eager trace that did not run under torch.compile at all: the forward took another path
#: when compiling (``torch.compiler.is_compiling()``, transformers' ``is_tracing``). Neither compiled nor eager.
UNRUN = "unrun"

#: Break categories, in the order the break list shows them, with a label.
CATEGORIES: dict[str, str] = {
    "item": "data-dependent .item()",
    "value": "data-dependent Python value",
    "branch": "data-dependent branch",
    "shape": "data-dependent output shape",
    "print": "print / logging",
    "unsupported": "unsupported call",
    "subclass": "tensor subclass",
    "skip": "function skipped",
    "other": "other",
}

_DOCS = "https://docs.pytorch.org/docs/stable"
_TROUBLE = f"{_DOCS}/torch.compiler_troubleshooting.html"
#: One-line remedies by category, with the PyTorch page that explains them; none where none is known.
HINTS: dict[str, tuple[str, str]] = {
    "item": ("set torch._dynamo.config.capture_scalar_outputs = True, or keep the value a tensor "
             "(torch._check to state its range)",
             _TROUBLE),
    "value": ("keep the value a tensor (torch.equal(a, b) -> (a == b).all(), and torch.where or torch.cond for a "
              "branch on it), or wrap the op in a custom op (torch.library.custom_op)",
              f"{_DOCS}/library.html#torch.library.custom_op"),
    "shape": ("set torch._dynamo.config.capture_dynamic_output_shape_ops = True (nonzero, unique, boolean "
              "masks), or keep the op out of the compiled code",
              _TROUBLE),
    "branch": ("express the branch with torch.cond, or make it branchless (torch.where)",
               f"{_DOCS}/cond.html"),
    "print": ("move the call out of the compiled code (the forward, a backward hook), or list the function in torch._dynamo.config."
              "reorderable_logging_functions (print) or ignore_logging_functions (logging)",
              _TROUBLE),
    "unsupported": ("wrap the call in a custom op (torch.library.custom_op) or move it out of the compiled code",
                    f"{_DOCS}/library.html#torch.library.custom_op"),
    "skip": ("Dynamo ran this whole function eagerly (a break inside a loop or a resume it could not "
             "build): fix the break inside it",
             _TROUBLE),
}


__all__ = ["BREAK", "CATEGORIES", "EAGER", "HINTS", "MIXED", "UNRUN"]
