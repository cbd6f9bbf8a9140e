"""The view-model every renderer shares: one label, kind and colour per node, so that the tree,
the HTML report and the Graphviz image agree on what a node is called and how it looks.
"""

from __future__ import annotations

import hashlib
import re

from fxviz.ir import Graph, Node, Scope, module_class, short_target

# op kind -> colour (hex, readable on dark and light backgrounds)
KIND_COLORS: dict[str, str] = {
    "input": "#2e7d32",
    "output": "#c62828",
    "parameter": "#6d4c41",
    "buffer": "#8d6e63",
    "constant": "#757575",
    "conv": "#1565c0",
    "linear": "#283593",
    "matmul": "#4527a0",
    "attention": "#6a1b9a",
    "norm": "#00838f",
    "activation": "#ef6c00",
    "pool": "#0277bd",
    "elementwise": "#558b2f",
    "reduction": "#9e9d24",
    "shape": "#78909c",
    "indexing": "#8e24aa",
    "creation": "#546e7a",
    "embedding": "#ad1457",
    "data-dependent": "#d32f2f",
    "module": "#37474f",
    "other": "#607d8b",
}

_KIND_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("data-dependent", re.compile(r"^(item|_local_scalar_dense|tolist|__bool__|__int__|__float__|nonzero)$")),
    ("attention", re.compile(r"attention|sdpa|softmax")),
    ("conv", re.compile(r"conv")),
    ("linear", re.compile(r"^(linear|addmm|Linear|Conv1D)$")),
    ("matmul", re.compile(r"^(matmul|mm|bmm|baddbmm|einsum|__matmul__)$")),
    ("norm", re.compile(r"norm")),
    ("embedding", re.compile(r"embedding|Embedding")),
    ("pool", re.compile(r"pool")),
    ("activation", re.compile(r"^(relu|gelu|silu|sigmoid|tanh|elu|leaky_relu|hardtanh|mish|softplus"
                               r"|ReLU|GELU|SiLU|Sigmoid|Tanh|NewGELUActivation|dropout|Dropout)_?$")),
    ("reduction", re.compile(r"^(sum|mean|max|min|amax|amin|argmax|argmin|prod|var|std|any|all|cumsum)$")),
    ("shape", re.compile(r"^(view|reshape|permute|transpose|t|expand|contiguous|flatten|unsqueeze|squeeze"
                         r"|split|chunk|cat|stack|unbind|size|sym_size|_unsafe_view|clone|to|type_as"
                         r"|alias|detach|__getitem__|getitem|slice|select|narrow|unflatten|repeat)$")),
    ("indexing", re.compile(r"^(index|index_select|gather|scatter|masked_fill|where|index_put|__setitem__"
                            r"|copy_|masked_scatter)_?$")),
    ("creation", re.compile(r"^(arange|zeros|ones|full|empty|rand|randn|randint|tensor|zeros_like"
                            r"|ones_like|full_like|empty_like|scalar_tensor|triu|tril|lift_fresh_copy)$")),
    ("elementwise", re.compile(r"^(add|sub|mul|div|pow|neg|exp|log|sqrt|rsqrt|abs|__add__|__sub__|__mul__"
                               r"|__truediv__|__radd__|__rmul__|truediv|floordiv|eq|ne|lt|le|gt|ge|and_|or_"
                               r"|bitwise_and|bitwise_or|bitwise_not|logical_not|clamp|sin|cos|reciprocal"
                               r"|__and__|__or__|__invert__|maximum|minimum|erf|tanh)_?$")),
]


def op_kind(node: Node) -> str:
    """The op family a node belongs to (a key of :data:`KIND_COLORS`)."""
    if node.kind != "op":
        return node.kind
    name = short_target(node.target)
    for kind, pattern in _KIND_PATTERNS:
        if pattern.search(name) if kind in ("attention", "conv", "norm", "embedding", "pool") else pattern.match(name):
            return kind
    return "other"


def node_label(node: Node) -> str:
    """What a renderer prints for a node: the op's short name, a parameter's attribute name,
    an input's argument name."""
    if node.kind == "op":
        return short_target(node.target)
    if node.kind in ("parameter", "buffer", "constant"):
        return node.target.rsplit(".", 1)[-1] if node.target else node.name
    return node.target or node.name


def node_color(node: Node) -> str:
    return KIND_COLORS[op_kind(node)]


def stable_color(key: str) -> str:
    """A stable colour for any string (module classes): the same on every run, unlike ``hash()``."""
    h = int(hashlib.blake2s(key.encode(), digest_size=4).hexdigest(), 16)
    hue = h % 360
    return _hsl_to_hex(hue, 0.45, 0.42)


def _hsl_to_hex(h: float, s: float, lightness: float) -> str:
    c = (1 - abs(2 * lightness - 1)) * s
    x = c * (1 - abs((h / 60) % 2 - 1))
    m = lightness - c / 2
    r, g, b = [(c, x, 0), (x, c, 0), (0, c, x), (0, x, c), (x, 0, c), (c, 0, x)][int(h // 60) % 6]
    return "#" + "".join(f"{round((v + m) * 255):02x}" for v in (r, g, b))


def scope_label(graph: Graph, scope: Scope) -> str:
    """``initial_conv (Conv2d)``; the root is the model's class name."""
    if not scope.path:
        return graph.name or scope.cls
    cls = scope.cls or module_class(graph, scope.path)
    return f"{scope.name} ({cls})" if cls else scope.name


def format_count(n: int) -> str:
    """``124439808`` -> ``124.4M``."""
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)
