"""The output code of one compiled graph as the ``--per-kernel`` watch runs it
(:mod:`fxviz.analyze.numerics.kernels`): each kernel call's argument names, which arguments a kernel
writes, the loaded module, and the wrappers that see each call finish.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: What a watched kernel call reports when it finishes: (kernel name, positional args, keyword
#: args, what it returned, the positions of the arguments it writes or ``None``).
After = Callable[[str, tuple[Any, ...], dict[str, Any], Any, "list[int] | None"], None]


@dataclass
class CallSite:
    """One kernel call of the output code: its handle, the names of its positional arguments and of
    its ``out=`` argument and of what it is assigned to (``""`` where not a plain name)."""

    handle: str
    name: str
    kind: str
    args: list[str]
    out: str = ""
    result: str = ""


def wrap_kernel(name: str, kernel: Any, outputs: list[int] | None, after: After) -> Any:
    """``kernel`` (a C++ kernel, or a Triton kernel object launched by ``.run``) calling ``after``
    when each call finishes; ``outputs``: a C++ kernel's written arguments."""
    if hasattr(kernel, "run"):
        positions = triton_outputs(kernel)
        return Launcher(kernel, lambda a, k: after(name, a, k, None, positions))

    def wrapped(*a: Any, **k: Any) -> Any:
        out = kernel(*a, **k)
        after(name, a, k, out, outputs)
        return out

    return wrapped


class Dotted:
    """A global of the output code (``extern_kernels``, ``torch``) through which some kernels are
    called by a dotted name (``extern_kernels.addmm``, ``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default``):
    those calls are watched, every other attribute is the real one."""

    def __init__(self, real: Any, path: str, names: set[str], after: After) -> None:
        self._real, self._path, self._names, self._after = real, path, names, after

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._real, attr)
        full = f"{self._path}.{attr}"
        if full in self._names and callable(value):
            f = value

            def wrapped(*a: Any, **k: Any) -> Any:
                out = f(*a, **k)
                self._after(full, a, k, out, None)
                return out

            return wrapped
        if any(n.startswith(full + ".") for n in self._names):
            return Dotted(value, full, self._names, self._after)
        return value


class Launcher:
    """A Triton kernel object whose ``run`` is watched (the rest is the kernel's own)."""

    def __init__(self, kernel: Any, after: Callable[[tuple[Any, ...], dict[str, Any]], None]) -> None:
        self._kernel, self._after = kernel, after

    def run(self, *a: Any, **k: Any) -> Any:
        out = self._kernel.run(*a, **k)
        self._after(a, k)
        return out

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._kernel, attr)


def triton_outputs(kernel: Any) -> list[int]:
    """The positions of a Triton kernel's ``out_ptr``/``in_out_ptr`` arguments."""
    names = getattr(getattr(kernel, "fn", None), "arg_names", None) or \
        list((getattr(kernel, "triton_meta", None) or {}).get("signature", {}))
    return [i for i, n in enumerate(names) if str(n).startswith(("out_ptr", "in_out_ptr"))]


def kind_of(name: str) -> str:
    if name.startswith("extern_kernels."):
        return "extern"
    if name.startswith("cpp_"):
        return "cpp"
    if name.startswith("triton_"):
        return "triton"
    return "other"


def cpp_argtypes(line: str) -> list[str] | None:
    """The argument types of a C++ kernel, from its definition's line
    (``cpp_fused_0 = async_compile.cpp_pybinding(['float*', 'const float*'], r'''``)."""
    m = re.search(r"cpp_pybinding\((\[[^\]]*\])", line)
    if m is None:
        return None
    try:
        types = ast.literal_eval(m.group(1))
    except (ValueError, SyntaxError):
        return None
    return [str(t) for t in types] if isinstance(types, list) else None


def call_site(handle: str, name: str, kind: str, line: str) -> CallSite:
    """The argument names of one kernel call line of the output code."""
    c = CallSite(handle, name, kind if kind in ("cpp", "triton", "extern") else kind_of(name), [])
    try:
        stmt = ast.parse(line.strip()).body[0]
    except (SyntaxError, IndexError):
        return c
    value = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
    if isinstance(stmt, ast.Assign) and stmt.targets and isinstance(stmt.targets[0], ast.Name):
        c.result = stmt.targets[0].id
    if isinstance(value, ast.Call):
        c.args = [_buffer(a) for a in value.args]
        c.out = next((_buffer(k.value) for k in value.keywords if k.arg == "out"), "")
    return c


def _buffer(e: ast.expr) -> str:
    """The buffer an argument names: ``buf2``, or the first one inside ``reinterpret_tensor(buf9, …)``."""
    if isinstance(e, ast.Name):
        return e.id
    if isinstance(e, ast.Call) and e.args:
        return _buffer(e.args[0])
    return ""


def loaded_module(path: str) -> Any:
    """The output-code module Inductor loaded from ``path`` (``PyCodeCache``)."""
    from torch._inductor.codecache import PyCodeCache

    if not path:
        return None
    loaded = [*PyCodeCache.modules, *PyCodeCache.modules_no_attr.values()]
    return next((m for m in loaded if str(getattr(m, "__file__", "")) == path), None)


__all__ = ["After", "CallSite", "Dotted", "Launcher", "call_site", "cpp_argtypes", "kind_of", "loaded_module", "triton_outputs", "wrap_kernel"]
