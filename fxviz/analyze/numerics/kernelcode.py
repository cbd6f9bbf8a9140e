"""The output code of one compiled graph as the ``--per-kernel`` watch runs it
(:mod:`fxviz.analyze.numerics.kernels`): each kernel call's argument names, which arguments a kernel
writes, the loaded module, and the wrappers that see each call finish.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

#: Runs the watched kernel once more on other arguments: (positional args, keyword args) -> its result.
Rerun = Callable[[tuple[Any, ...], dict[str, Any]], Any]


class Hooks(Protocol):
    """What the wrappers tell the watch about each kernel call: ``before`` it runs (its arguments
    still hold what the kernel reads; what it returns is handed to ``after``), and ``after`` it
    finished, with a way to run the same kernel again (``rerun``) on other arguments."""

    def before(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], written: Written | None) -> Any: ...

    def after(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
              written: Written | None, token: Any, rerun: Rerun) -> None: ...


@dataclass(frozen=True)
class Written:
    """The positional arguments a generated kernel writes (``positions``) and, among them, those it
    also reads first (``inout``: ``in_out_ptr`` arguments; every written one where the names are unknown)."""

    positions: tuple[int, ...]
    inout: tuple[int, ...]


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


def wrap_kernel(name: str, kernel: Any, written: Written | None, hooks: Hooks) -> Any:
    """``kernel`` (a C++ kernel, or a Triton kernel object launched by ``.run``) telling ``hooks``
    of each call; ``written``: a C++ kernel's written arguments."""
    if hasattr(kernel, "run"):
        return Launcher(kernel, name, triton_written(kernel), hooks)

    def rerun(a: tuple[Any, ...], k: dict[str, Any]) -> Any:
        return kernel(*a, **k)

    def wrapped(*a: Any, **k: Any) -> Any:
        token = hooks.before(name, a, k, written)
        out = kernel(*a, **k)
        hooks.after(name, a, k, out, written, token, rerun)
        return out

    return wrapped


class Dotted:
    """A global of the output code (``extern_kernels``, ``torch``) through which some kernels are
    called by a dotted name (``extern_kernels.addmm``, ``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default``):
    those calls are watched, every other attribute is the real one."""

    def __init__(self, real: Any, path: str, names: set[str], hooks: Hooks) -> None:
        self._real, self._path, self._names, self._hooks = real, path, names, hooks

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._real, attr)
        full = f"{self._path}.{attr}"
        if full in self._names and callable(value):
            f, hooks = value, self._hooks

            def rerun(a: tuple[Any, ...], k: dict[str, Any]) -> Any:
                return f(*a, **k)

            def wrapped(*a: Any, **k: Any) -> Any:
                token = hooks.before(full, a, k, None)
                out = f(*a, **k)
                hooks.after(full, a, k, out, None, token, rerun)
                return out

            return wrapped
        if any(n.startswith(full + ".") for n in self._names):
            return Dotted(value, full, self._names, self._hooks)
        return value


class Launcher:
    """A Triton kernel object whose ``run`` is watched (the rest is the kernel's own)."""

    def __init__(self, kernel: Any, name: str, written: Written | None, hooks: Hooks) -> None:
        self._kernel, self._name, self._written, self._hooks = kernel, name, written, hooks

    def run(self, *a: Any, **k: Any) -> Any:
        token = self._hooks.before(self._name, a, k, self._written)
        out = self._kernel.run(*a, **k)
        self._hooks.after(self._name, a, k, None, self._written, token, self._rerun)
        return out

    def _rerun(self, a: tuple[Any, ...], k: dict[str, Any]) -> Any:
        return self._kernel.run(*a, **k)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._kernel, attr)


def triton_written(kernel: Any) -> Written | None:
    """The positions of a Triton kernel's ``out_ptr``/``in_out_ptr`` arguments, and of the latter
    (``None``: its argument names are not known)."""
    names = [str(n) for n in getattr(getattr(kernel, "fn", None), "arg_names", None) or
             list((getattr(kernel, "triton_meta", None) or {}).get("signature", {}))]
    if not names:
        return None
    return Written(tuple(i for i, n in enumerate(names) if n.startswith(("out_ptr", "in_out_ptr"))),
                   tuple(i for i, n in enumerate(names) if n.startswith("in_out_ptr")))


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


def cpp_written(line: str, source: str) -> Written | None:
    """The arguments a C++ kernel writes: its non-const pointers (the types of its definition's line
    ``cpp_fused_0 = async_compile.cpp_pybinding(['float*', 'const float*'], r\'\'\'``), and the
    ``in_out_ptr`` ones among them (the parameter names of ``kernel(...)`` in its ``source``)."""
    types = cpp_argtypes(line)
    if types is None:
        return None
    positions = tuple(i for i, t in enumerate(types) if t.endswith("*") and not t.startswith("const"))
    m = re.search(r"\bkernel\s*\(([^)]*)\)", source)
    names = [p.strip().split()[-1].lstrip("*") for p in m.group(1).split(",") if p.strip()] if m else []
    if len(names) != len(types):
        return Written(positions, positions)
    return Written(positions, tuple(i for i in positions if names[i].startswith("in_out_ptr")))


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


__all__ = ["CallSite", "Dotted", "Hooks", "Launcher", "Rerun", "Written", "call_site", "cpp_argtypes", "cpp_written", "kind_of",
           "loaded_module", "triton_written", "wrap_kernel"]
