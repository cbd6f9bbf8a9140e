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
``# Topologically Sorted Source Nodes: [...], Original ATen: [...]`` comment. Nothing is executed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

KernelKind = Literal["cpp", "triton", "template", "other"]
CallKind = Literal["cpp", "triton", "extern", "other"]


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
    else of the kernel's definition)."""

    handle: str
    name: str
    kind: CallKind
    line: int
    source_nodes: list[str] = field(default_factory=list)
    aten: list[str] = field(default_factory=list)


@dataclass
class OutputCode:
    """``part``: ``"forward"``, ``"backward"``, ``"inference"`` from ``# AOT ID: ['0_forward']``
    (``""`` when absent); the kernels defined and the calls made, in order."""

    part: str = ""
    kernels: list[KernelDef] = field(default_factory=list)
    calls: list[KernelCall] = field(default_factory=list)

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
    out.calls = _calls(text, spans, {k.name: k for k in out.kernels})
    return out


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


def _calls(text: str, spans: list[tuple[int, int]], kernels: dict[str, KernelDef]) -> list[KernelCall]:
    calls: list[KernelCall] = []
    pending: list[tuple[str, int]] = []  # a handle comment waiting for its call: (handle, line)
    nodes: list[str] = []
    aten: list[str] = []

    def emit(name: str, line: int) -> None:
        nonlocal nodes, aten
        handle = pending.pop()[0] if pending else ""
        kernel = kernels.get(name)
        kind: CallKind = "other"
        if kernel is not None:
            if kernel.kind in ("cpp", "triton", "template"):
                kind = "cpp" if kernel.kind == "cpp" else "triton"
            if not nodes:
                nodes, aten = list(kernel.source_nodes), list(kernel.aten)
        elif name.startswith("extern_kernels."):
            kind = "extern"
        calls.append(KernelCall(handle, name, kind, line, nodes, aten))
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
        if not raw.startswith((" ", "\t")):
            flush()  # a module-level statement: not inside call()
            nodes, aten = [], []
            continue
        m = _CALL.match(s)
        called = m.group(1) if m else ""
        base = called[:-4] if called.endswith(".run") else called
        if pending:
            if base == pending[-1][0].rpartition(":")[0]:
                emit(base, here)
        elif base in kernels or base.startswith("extern_kernels."):
            emit(base, here)
    flush()
    return calls
