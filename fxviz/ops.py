"""Op names and op families: the one home of what fxviz knows about op spellings. No torch.

A graph names an op by its target as the capture saw it: ``aten.linear.default`` (export),
``torch.nn.functional.linear`` or ``Tensor.view`` (the eager tracer), ``operator.add`` (fx),
``mylib::scaled_swish`` (a custom op). This module turns targets into the names a user reads
(:func:`short_name`), the name two spellings of one op share (:func:`op_name`), and the family an op
belongs to (:func:`op_family`), and holds the sets of names with a meaning of their own
(data-dependent exits, random ops, export's asserts).

    >>> short_name("aten.add.Tensor"), op_name("Tensor.__iadd__"), op_family("aten.conv2d.default")
    ('add', 'add', 'conv')
"""

from __future__ import annotations

import re
from functools import lru_cache

# ---- names ---------------------------------------------------------------------------------------

#: Target prefixes whose second part is the op (``aten.add.Tensor`` -> ``add``).
_NAMESPACED = frozenset({"aten", "prims", "quantized", "higher_order", "OpOverload", "OpOverloadPacket"})

# Python operators and their torch spellings -> one name, so ``x + y`` (``Tensor.__add__``) meets
# ``aten.add.Tensor``, ``torch.add`` and Dynamo's ``operator.add``; the operator module names each
# operator as its dunder does (``operator.invert`` is ``__invert__``; ``operator.inv`` too)
_DUNDER = {
    "add": "add", "radd": "add", "iadd": "add", "sub": "sub", "isub": "sub", "rsub": "rsub",
    "mul": "mul", "rmul": "mul", "imul": "mul", "truediv": "div", "rtruediv": "div",
    "itruediv": "div", "floordiv": "floor_divide", "rfloordiv": "floor_divide", "ifloordiv": "floor_divide",
    "mod": "remainder", "rmod": "remainder", "imod": "remainder",
    "pow": "pow", "rpow": "pow", "ipow": "pow", "matmul": "matmul", "rmatmul": "matmul", "imatmul": "matmul",
    "neg": "neg", "and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor", "iand": "bitwise_and",
    "ior": "bitwise_or", "ixor": "bitwise_xor", "invert": "bitwise_not", "inv": "bitwise_not",
    "lshift": "bitwise_left_shift", "ilshift": "bitwise_left_shift", "rshift": "bitwise_right_shift",
    "irshift": "bitwise_right_shift",
    "eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "getitem": "getitem",
    "setitem": "setitem", "abs": "abs",
}
_ALIASES = {
    "divide": "div", "true_divide": "div", "multiply": "mul", "subtract": "sub",
    "greater": "gt", "less": "lt", "not_equal": "ne", "absolute": "abs",
}


@lru_cache(maxsize=8192)
def short_name(target: str) -> str:
    """The name a user recognises: ``aten.linear.default`` -> ``linear``,
    ``torch.nn.functional.relu`` -> ``relu``, ``Tensor.view`` -> ``view``, ``aten.add.Tensor`` ->
    ``add``; a custom op keeps its namespace (``mylib::scaled_swish.default`` -> ``mylib::scaled_swish``:
    capture spells ops outside ``aten``/``prims`` that way), so it is never just ``default``."""
    if "::" in target:
        ns, _, rest = target.partition("::")
        return f"{ns}::{rest.split('.', 1)[0]}"
    parts = target.split(".")
    if parts[0] in _NAMESPACED and len(parts) > 1:
        return parts[1]
    return parts[-1]


def property_target(attr: str) -> str:
    """The target of a tensor property read (``w.T``) as the eager tracer records it (the property's
    getter, ``Tensor.T.__get__``), for a record that spells it as an attribute read (Dynamo's
    ``getattr(w, 'T')``, a trace's ``builtins.getattr``)."""
    return f"Tensor.{attr}.__get__"


@lru_cache(maxsize=8192)
def op_name(target: str) -> str:
    """The name two spellings of one op share: ``aten.add_.Tensor``, ``Tensor.__iadd__``,
    ``torch.add`` and ``operator.add`` all give ``add``; ``torch.nn.functional.linear`` and
    ``aten.linear.default`` give ``linear``."""
    parts = target.split(".")
    name = parts[-2] if parts[-1] == "__get__" and len(parts) > 1 else short_name(target)
    if "::" in name:
        return name
    if name.startswith("__") and name.endswith("__") and len(name) > 4:
        inner = name[2:-2]
        return _DUNDER.get(inner, inner)
    if name.endswith("_") and not name.endswith("__") and len(name) > 1:
        name = name[:-1]  # in-place spelling of the same op
    return _ALIASES.get(name) or _DUNDER.get(name, name)  # the operator module's spellings: the dunders'


# ---- names with a meaning of their own -------------------------------------------------------------

#: Where a forward leaves the graph: a Python value computed from tensor data.
DATA_DEPENDENT = frozenset({
    "item", "__bool__", "__int__", "__float__", "__index__", "__complex__", "tolist", "numpy",
    "__array__", "equal", "allclose", "is_nonzero", "_local_scalar_dense",
})
#: Ops whose result depends on the random number generator.
RANDOM = frozenset({
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm", "bernoulli",
    "bernoulli_", "multinomial", "normal", "normal_", "uniform_", "exponential_", "geometric_",
    "cauchy_", "log_normal_", "random_", "rrelu", "rrelu_", "native_dropout",
})
DROPOUTS = frozenset({"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"})
#: ATen ops export inserts to check what it assumed; eager never runs them.
ASSERTS = frozenset({
    "_assert_tensor_metadata", "_assert_scalar", "_assert_async", "sym_constrain_range",
    "sym_constrain_range_for_size", "_functional_assert_async", "_functional_sym_constrain_range",
    "_functional_sym_constrain_range_for_size", "_check_is_size", "_assert",
})
#: Tensor attributes that are facts about a tensor, not values computed from its data: not ops.
TENSOR_META_ATTRS = frozenset({
    "shape", "dtype", "device", "ndim", "layout", "requires_grad", "is_leaf", "grad_fn", "is_cuda",
    "is_cpu", "is_meta", "is_sparse", "is_quantized", "is_mkldnn", "is_nested", "names", "itemsize",
    "nbytes", "_version", "_base", "output_nr", "is_mps", "is_xpu", "is_ipu", "is_xla", "is_vulkan",
    "_cdata",
})
#: Tensor methods that are metadata queries: not ops.
TENSOR_META_METHODS = frozenset({
    "size", "dim", "stride", "numel", "nelement", "ndimension", "is_contiguous", "data_ptr",
    "element_size", "storage_offset", "is_floating_point", "is_complex", "is_signed", "get_device",
    "__len__", "__repr__", "__format__", "__hash__", "untyped_storage", "dim_order", "is_inference",
    "is_set_to", "__reduce_ex__", "__deepcopy__", "__dir__", "__array_priority__", "has_names",
    "is_pinned", "is_shared", "__contains__",
})


# ---- families --------------------------------------------------------------------------------------

#: Every op family, in the order a legend lists them. Node kinds that are not ops (``input``,
#: ``parameter``, ...) are families of their own.
FAMILIES: tuple[str, ...] = (
    "input", "output", "parameter", "buffer", "constant", "conv", "linear", "matmul", "attention",
    "norm", "activation", "pool", "elementwise", "reduction", "shape", "indexing", "creation",
    "embedding", "data-dependent", "custom", "other",
)

# patterns matched anywhere in the name (``search``) for the first group, from the start for the rest
_SEARCH = ("attention", "conv", "norm", "embedding", "pool")
_FAMILY_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
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


@lru_cache(maxsize=8192)
def op_family(target: str) -> str:
    """The family of the op ``target`` calls (one of :data:`FAMILIES`)."""
    name = short_name(target)
    if "::" in name:
        return "custom"
    for family, pattern in _FAMILY_PATTERNS:
        if pattern.search(name) if family in _SEARCH else pattern.match(name):
            return family
    return "other"


__all__ = [
    "ASSERTS", "DATA_DEPENDENT", "DROPOUTS", "FAMILIES", "RANDOM", "TENSOR_META_ATTRS",
    "TENSOR_META_METHODS", "op_family", "op_name", "property_target", "short_name",
]
