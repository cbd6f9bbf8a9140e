"""Read Inductor's generated wrapper code (``inductor_output_code``) into kernels and calls (no torch).

The output code of one compiled graph defines its kernels at module level::

    cpp_fused_gelu_0 = async_compile.cpp_pybinding(['float*', ...], r'''
    ...C++...
    ''')
    # kernel path: /tmp/torchinductor_.../xy.py
    # Topologically Sorted Source Nodes: [add, relu], Original ATen: [aten.add, aten.relu]
    triton_poi_fused_add_relu_0 = async_compile.triton('triton_poi_fused_add_relu_0', '''
    ...Triton...
    ''', device_str='cuda')

and ``call()`` runs them in order, each call preceded (with provenance tracking on) by
``# [Provenance debug handles] NAME:N`` (the key of ``cppCodeToPost`` in torch's
``inductor_provenance_tracking_node_mappings``) and, for most, by the
``# Topologically Sorted Source Nodes: [...], Original ATen: [...]`` comment; it ends with
``return (buf7, primals_3, reinterpret_tensor(buf2, ...), )``, the graph's outputs in order. Each
call line is read once, here: its name and the tensors it passes (:attr:`KernelCall.args`), and
the returned names (:attr:`OutputCode.returns`). Nothing is executed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

KernelKind = Literal["cpp", "triton", "template", "other"]
CallKind = Literal["cpp", "triton", "extern", "collective", "other"]
#: Calls that run one op each (an ATen kernel; a collective of ``_c10d_functional``), not a fused kernel.
ONE_OP = frozenset({"extern", "collective"})


@dataclass
class KernelDef:
    """A kernel the output code defines: its name, kind, source text (the C++ or Triton between the
    triple quotes) and the 1-based line of its ``name = async_compile...`` statement.
    ``source_nodes``/``aten`` come from the comment above the definition (Triton has one)."""

    name: str
    kind: KernelKind
    source: str
    line: int
    source_nodes: list[str] = field(default_factory=list)
    aten: list[str] = field(default_factory=list)


@dataclass
class KernelCall:
    """One kernel or extern call ``call()`` makes, in the order it runs: the provenance handle
    (``cpp_fused_gelu_0:2``, as in ``cppCodeToPost``; ``""`` without provenance tracking), the
    called name (``cpp_fused_gelu_0``, ``extern_kernels.addmm``), its kind, its 1-based line, and the
    post-grad nodes and ATen ops of the "Topologically Sorted Source Nodes" comment (of the call, or
    else of the kernel's definition).

    ``args``: the tensors the call line passes, in order (see :func:`call_args`: ``buf0``,
    ``arg0_1``, ``primals_3``; a ``reinterpret_tensor(buf2, ...)`` view as ``buf2``; ``out=buf0``
    included; numbers, sizes, ``stream=stream0`` and other keywords left out); ``results``: the
    names the line assigns (``buf3 = extern_kernels.convolution(...)`` -> ``["buf3"]``). The same
    parse, by place (what a kernel's signature is matched by): ``positional``, one entry per
    positional argument, its tensor (:func:`tensor_name`) or ``""``; ``out``, the ``out=`` tensor or
    ``""``. All empty for a call whose line was not found."""

    handle: str
    name: str
    kind: CallKind
    line: int
    source_nodes: list[str] = field(default_factory=list)
    aten: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    results: list[str] = field(default_factory=list)
    positional: list[str] = field(default_factory=list)
    out: str = ""


@dataclass
class OutputCode:
    """``part``: ``"forward"``, ``"backward"``, ``"inference"`` from ``# AOT ID: ['0_forward']``
    (``""`` when absent); the kernels defined and the calls made, in order. ``returns``: what
    ``call()`` returns, one name per returned item in order (the graph's outputs): the item itself
    (``buf7``, ``primals_3``), the buffer a ``reinterpret_tensor(buf2, ...)`` views (``buf2``), ``""``
    for anything else (``None``, a number); empty when ``call()`` has no ``return (...)``."""

    part: str = ""
    kernels: list[KernelDef] = field(default_factory=list)
    calls: list[KernelCall] = field(default_factory=list)
    returns: list[str] = field(default_factory=list)

    def kernel(self, name: str) -> KernelDef | None:
        return next((k for k in self.kernels if k.name == name), None)


_AOT_ID = re.compile(r"#\s*AOT ID:\s*\[\s*'\d+_(\w+)'")
_DEF = re.compile(r"^(\w+) = async_compile\.(\w+)\(", re.MULTILINE)
_ORIGINS = re.compile(r"#\s*(?:Topologically Sorted|Unsorted) Source Nodes:\s*\[(.*?)\],\s*"
                      r"Original ATen:\s*\[(.*?)\]\s*$")
_HANDLE = re.compile(r"#\s*\[Provenance debug handles\]\s*(\S+)\s*$")
_CALL = re.compile(r"^\s*(?:[\w, ]+=\s*)?([A-Za-z_][\w.]*)\s*\(")
_KINDS: dict[str, KernelKind] = {"cpp_pybinding": "cpp", "cpp": "cpp", "triton": "triton",
                                 "cuda": "template", "rocm": "template"}


def parse_output_code(text: str) -> OutputCode:
    """The kernels an ``inductor_output_code`` payload defines and the calls its ``call()`` makes."""
    out = OutputCode()
    m = _AOT_ID.search(text, 0, 4096)
    if m:
        out.part = m.group(1)
    spans: list[tuple[int, int]] = []  # character spans of the kernel definitions
    for d in _DEF.finditer(text):
        name, method = d.group(1), d.group(2)
        if any(a <= d.start() < b for a, b in spans[-1:]):
            continue  # inside the previous kernel's source
        eol = text.find("\n", d.end())
        eol = len(text) if eol < 0 else eol
        open_ = text.find("'''", d.end(), eol)  # the source starts on the definition's line
        close = text.find("'''", open_ + 3) if open_ >= 0 else -1
        if close < 0:  # no source (async_compile.multi_kernel picks among other kernels)
            source, end = "", eol
        else:
            source = text[open_ + 3:close].strip("\n")
            end = text.find("\n", close)
        spans.append((d.start(), len(text) if end < 0 else end))
        kind = _KINDS.get(method, "other")
        if kind == "triton" and name.startswith("triton_tem_"):
            kind = "template"
        line = text.count("\n", 0, d.start()) + 1
        nodes, aten = _origins_above(text, d.start())
        out.kernels.append(KernelDef(name, kind, source, line, nodes, aten))
    out.calls, out.returns = _calls(text, spans, {k.name: k for k in out.kernels})
    return out


#: Names Inductor gives the non-tensors a call passes: sizes and symbols (``s0``, ``ks0``, ``ps0``,
#: unbacked ``u0``), and CUDA streams (``stream0``).
_NOT_TENSOR = re.compile(r"^(?:s|ks|ps|u|zf|zuf|stream)\d+$")
_NAME = re.compile(r"^[A-Za-z_]\w*$")
#: Wrappers whose first argument is the tensor they view.
_VIEWS = ("reinterpret_tensor(", "as_strided(", "torch.as_strided(")
_CONSTANTS = frozenset({"None", "True", "False", "inf", "nan"})


def split_args(args: str) -> list[str]:
    """A call's argument text split at its top-level commas (brackets and quotes respected)."""
    out: list[str] = []
    depth, start, quote = 0, 0, ""
    for i, ch in enumerate(args):
        if quote:
            if ch == quote and args[i - 1] != "\\":
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(args[start:i].strip())
            start = i + 1
    out.append(args[start:].strip())
    return [x for x in out if x]


def tensor_name(item: str) -> str:
    """The tensor one argument or returned item names: ``buf0``; ``reinterpret_tensor(buf2, ...)``
    -> ``buf2``; ``""`` for a constant, a size, a stream or an expression."""
    item = item.strip()
    for view in _VIEWS:
        if item.startswith(view) and item.endswith(")"):
            inner = split_args(item[len(view):-1])
            return tensor_name(inner[0]) if inner else ""
    if _NAME.match(item) and item not in _CONSTANTS and not _NOT_TENSOR.match(item):
        return item
    return ""


def call_args(line: str) -> tuple[list[str], list[str], list[str], str]:
    """What a call line passes and assigns: ``(args, results, positional, out)`` (see
    :class:`KernelCall`)."""
    s = line.strip()
    open_ = s.find("(")
    close = s.rfind(")")
    if open_ < 0 or close < open_:
        return [], [], [], ""
    head = s[:open_]
    results: list[str] = []
    eq = head.find("=")
    if eq >= 0:
        results = [r for r in (x.strip() for x in head[:eq].split(",")) if _NAME.match(r)]
    args: list[str] = []
    positional: list[str] = []
    out = ""
    for a in split_args(s[open_ + 1:close]):
        key, sep, value = a.partition("=")
        if sep and _NAME.match(key.strip()) and not value.startswith("="):
            if key.strip() == "out":  # alpha=1, stream=stream0, ...: not tensors passed
                out = tensor_name(value)
                args += _tensors(value)
            continue
        positional.append(tensor_name(a))
        args += _tensors(a)
    return args, results, positional, out


def _tensors(item: str) -> list[str]:
    """The tensors one argument names: itself or its view (:func:`tensor_name`), or each of a
    ``[buf0, buf1]`` / ``(buf0, buf1)`` list's items."""
    item = item.strip()
    if item[:1] in "([" and item[-1:] in ")]":
        return [n for x in split_args(item[1:-1]) for n in _tensors(x)]
    name = tensor_name(item)
    return [name] if name else []


def returned(line: str) -> list[str]:
    """``return (buf7, reinterpret_tensor(buf2, ...), None, )`` -> ``["buf7", "buf2", ""]``."""
    s = line.strip()
    body = s[len("return"):].strip()
    if body.startswith("(") and body.endswith(")"):
        body = body[1:-1]
    return [tensor_name(x) for x in split_args(body)]


def _origins_above(text: str, pos: int) -> tuple[list[str], list[str]]:
    """The Source Nodes comment among the comment lines right above ``pos``."""
    end = pos
    while end > 0:
        start = text.rfind("\n", 0, end - 1) + 1
        line = text[start:end].strip()
        if not line.startswith("#"):
            break
        m = _ORIGINS.match(line)
        if m:
            return _names(m.group(1)), _names(m.group(2))
        end = start
    return [], []


def _names(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def _calls(text: str, spans: list[tuple[int, int]],
           kernels: dict[str, KernelDef]) -> tuple[list[KernelCall], list[str]]:
    """The calls ``call()`` makes and what it returns (see :class:`OutputCode`)."""
    calls: list[KernelCall] = []
    returns: list[str] = []
    call_indent = -1  # the indentation of ``def call(`` while inside it, else -1
    pending: list[tuple[str, int]] = []  # a handle comment waiting for its call: (handle, line)
    nodes: list[str] = []
    aten: list[str] = []

    def emit(name: str, line: int, src: str = "") -> None:
        nonlocal nodes, aten
        handle = pending.pop()[0] if pending else ""
        kernel = kernels.get(name)
        kind: CallKind = "other"
        if kernel is not None:
            if kernel.kind in ("cpp", "triton", "template"):
                kind = "cpp" if kernel.kind == "cpp" else "triton"
            if not nodes:
                nodes, aten = list(kernel.source_nodes), list(kernel.aten)
        elif "c10d_functional." in name:  # torch.ops._c10d_functional.all_reduce_.default
            kind = "collective"
        elif name.startswith(("extern_kernels.", "torch.ops.")):  # an ATen fallback is an extern call too
            kind = "extern"
        args, results, positional, out = call_args(src) if src else ([], [], [], "")
        calls.append(KernelCall(handle, name, kind, line, nodes, aten, args, results, positional, out))
        nodes, aten = [], []

    def flush() -> None:
        """A handle whose call was not found below it still names one call (at the next line)."""
        if pending:
            emit(pending[-1][0].rpartition(":")[0], pending[-1][1] + 1)

    pos, line, span_i = 0, 1, 0
    while pos < len(text):
        if span_i < len(spans) and pos >= spans[span_i][0]:
            end = spans[span_i][1]
            line += text.count("\n", pos, end)
            pos = end
            span_i += 1
            flush()
            nodes, aten = [], []
            continue
        eol = text.find("\n", pos)
        if eol < 0:
            eol = len(text)
        raw = text[pos:eol]
        s = raw.strip()
        here = line
        line += 1
        pos = eol + 1
        if not s:
            continue
        if s.startswith("#"):
            m = _HANDLE.match(s)
            if m:
                flush()
                pending.append((m.group(1), here))
                continue
            m = _ORIGINS.match(s)
            if m:
                nodes, aten = _names(m.group(1)), _names(m.group(2))
            continue
        indent = len(raw) - len(raw.lstrip())
        if call_indent >= 0 and indent <= call_indent:
            call_indent = -1  # past the end of call()
        if s.startswith("def call("):  # a method of Runner, or a module-level function
            flush()
            call_indent = indent
            continue
        if not indent:
            flush()  # a module-level statement: not inside call()
            nodes, aten = [], []
            continue
        if call_indent >= 0 and (s == "return" or s.startswith(("return (", "return("))):
            returns = returned(s)
            continue
        m = _CALL.match(s)
        called = m.group(1) if m else ""
        base = called[:-4] if called.endswith(".run") else called
        if pending:
            if base == pending[-1][0].rpartition(":")[0]:
                emit(base, here, s)
        elif base in kernels or base.startswith("extern_kernels.") or (
                call_indent >= 0 and base.startswith("torch.ops.")):  # an ATen fallback or a collective
            emit(base, here, s)
    flush()
    return calls, returns
