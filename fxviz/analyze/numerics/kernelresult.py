"""What ``--per-kernel`` found, as plain data (:mod:`~fxviz.analyze.numerics.kernels`): a
:class:`KernelCheck` per Inductor kernel call with a :class:`BufferCheck` per buffer it wrote, each
with two errors against eager: the compiled run's (what the user sees, with everything inherited from
the kernels before) and the kernel's own (the same kernel run on eager's values of what it reads,
:mod:`~fxviz.analyze.numerics.isolate`). The cause named is the first kernel whose own error is beyond
tolerance; the kernels after it that are beyond only by what they read are ``inherited``. No torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fxviz.analyze.numerics.error import Error, rel_text
from fxviz.ir import Graph
from fxviz.passes.panels import row, set_panel

#: What a kernel's errors say (:attr:`KernelCheck.origin`).
ORIGINS = {
    "own": "its own error is beyond tolerance",
    "inherited": "beyond tolerance only by what it reads: on eager's inputs it is within",
    "unmeasured": "beyond tolerance; its own error was not measured",
    "": "",
}


@dataclass(slots=True)
class BufferCheck:
    """One buffer a kernel wrote: its name in the output code (``buf5``), the post-grad node it holds
    (Inductor's ``origin_node``; ``""`` when it holds none exactly), the Dynamo node whose eager value
    it was compared with (``""``: none, ``error.note`` says why), the error of the compiled run's
    value and ``own``, the error of the value the kernel writes on eager's inputs (``None``: not measured)."""

    buffer: str
    node: str
    eager: str
    error: Error
    own: Error | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer, "node": self.node, "eager": self.eager, "error": self.error.to_dict()} | (
            {} if self.own is None else {"own": self.own.to_dict()})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BufferCheck:
        return cls(d["buffer"], d["node"], d["eager"], Error.from_dict(d["error"]),
                   None if d.get("own") is None else Error.from_dict(d["own"]))


@dataclass
class KernelCheck:
    """One kernel call of a compiled graph (``graph``: its index in compile order), by torch's
    provenance handle (``cpp_fused_gelu_0:2``, ``extern_kernels.addmm:1``, as in
    ``cppCodeToPost``): ``kind`` (``cpp``, ``triton``, ``extern``, ``other``), the Dynamo ops it
    covers (``ops``, graph order), the eager op it is reported at (``op``: the op of its worst
    compared buffer, else its last op), that op's module path and user line, the buffers it wrote,
    ``observed`` (False when the call did not run under the watch: then nothing was compared) and
    ``own_note``: why it was not run on eager's inputs, or, where it was, the buffers it read that
    eager has no value for (a partial result another kernel wrote) and that the value given was the
    one that kernel wrote on eager's inputs."""

    handle: str
    graph: int
    kind: str = "other"
    ops: list[str] = field(default_factory=list)
    op: str = ""
    module: str = ""
    source: str = ""
    buffers: list[BufferCheck] = field(default_factory=list)
    observed: bool = False
    own_note: str = ""

    @property
    def error(self) -> Error | None:
        """The worst compared buffer's error (``None`` when no buffer was comparable)."""
        compared = [b.error for b in self.buffers if b.error.comparable]
        return Error.worst(compared) if compared else None

    @property
    def own_error(self) -> Error | None:
        """The worst error of what it writes on eager's inputs (``None``: not measured)."""
        own = [b.own for b in self.buffers if b.own is not None and b.own.comparable]
        return Error.worst(own) if own else None

    @property
    def exceeds(self) -> bool:
        e = self.error
        return e is not None and e.exceeds

    @property
    def origin(self) -> str:
        """``own`` (its own error is beyond tolerance), ``inherited`` (beyond tolerance, but within on
        eager's inputs), ``unmeasured`` (beyond tolerance, own error not measured) or ``""`` (within)."""
        own = self.own_error
        if own is not None and own.exceeds:
            return "own"
        if not self.exceeds:
            return ""
        return "unmeasured" if own is None else "inherited"

    def where(self) -> str:
        """``handle (op) in module at file:line``."""
        op = f" ({self.op})" if self.op else ""
        at = f" at {self.source}" if self.source else ""
        return f"{self.handle}{op} in {self.module or 'the model itself'}{at}"

    def verdict(self) -> str:
        """What its errors say, in a few words."""
        e = self.error
        if not self.observed:
            return "not run while watched"
        if e is None:
            return "no buffer with an eager counterpart: not comparable"
        own = self.own_error
        mine = f"own max rel {rel_text(own.max_rel)}" + (f"; reads {self.own_note}" if self.own_note else "") \
            if own is not None else f"own error not measured: {self.own_note or 'no buffer of it compared'}"
        if self.origin == "own":
            return f"own error beyond tolerance ({mine})"
        if self.origin == "inherited":
            return f"beyond tolerance, inherited ({mine})"
        return ("beyond tolerance; " if e.exceeds else "within tolerance; ") + mine

    def text(self) -> str:
        """One line: where, the worst buffer's max abs / max rel, and the verdict."""
        e = self.error
        values = "" if e is None or not self.observed else f"max abs {e.max_abs:.3g} · max rel {rel_text(e.max_rel)} · "
        return f"{self.where()}: {values}{self.verdict()}"

    def to_dict(self) -> dict[str, Any]:
        e, own = self.error, self.own_error
        return {"handle": self.handle, "graph": self.graph, "kind": self.kind, "ops": self.ops, "op": self.op,
                "module": self.module, "source": self.source, "observed": self.observed,
                "within": None if e is None else not e.exceeds,
                "max_abs": None if e is None else _finite(e.max_abs),
                "max_rel": None if e is None else _finite(e.max_rel),
                "origin": self.origin,
                "own_within": None if own is None else not own.exceeds,
                "own_max_abs": None if own is None else _finite(own.max_abs),
                "own_max_rel": None if own is None else _finite(own.max_rel),
                "own_note": self.own_note,
                "buffers": [b.to_dict() for b in self.buffers]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KernelCheck:
        return cls(d["handle"], d["graph"], d.get("kind", "other"), list(d.get("ops", [])), d.get("op", ""),
                   d.get("module", ""), d.get("source", ""), [BufferCheck.from_dict(b) for b in d.get("buffers", [])],
                   bool(d.get("observed", False)), d.get("own_note", ""))


def first_beyond(kernels: list[KernelCheck]) -> KernelCheck | None:
    """The cause: the first kernel, in execution order, whose own error is beyond tolerance; where
    none is, the first beyond tolerance whose own error was not measured (``None``: neither; kernels
    beyond tolerance then only carry what accumulated over kernels each within)."""
    return next((k for k in kernels if k.origin == "own"), None) or \
        next((k for k in kernels if k.origin == "unmeasured"), None)


def kernel_note(kernels: list[KernelCheck]) -> str:
    """One line on what ``--per-kernel`` compared and what it found."""
    run = [k for k in kernels if k.observed]
    buffers = [b for k in run for b in k.buffers]
    compared = sum(1 for b in buffers if b.error.comparable)
    isolated = sum(1 for k in run if k.own_error is not None)
    by = {o: sum(1 for k in kernels if k.origin == o) for o in ORIGINS}
    first = first_beyond(kernels)
    beyond = sum(1 for k in kernels if k.exceeds)
    if first is None:
        verdict = "every compared buffer within tolerance" if not beyond else \
            f"{beyond} kernel(s) beyond tolerance, none by its own error: the error accumulates over kernels each within"
    else:
        what = "its own error beyond tolerance" if first.origin == "own" else "beyond tolerance, its own error not measured"
        verdict = f"the first kernel with {what} is {first.where()}"
        if by["own"] > 1:
            verdict += f"; {by['own']} kernel(s) in all with their own error beyond tolerance"
        if by["inherited"]:
            verdict += f"; {by['inherited']} kernel(s) beyond tolerance only by what they inherit"
    return (f"per kernel: {len(run)} of {len(kernels)} kernel calls watched, {compared} of {len(buffers)} "
            f"buffers they wrote compared with eager (the others hold no one eager op's value), "
            f"{isolated} kernel(s) also run on eager's inputs (own error); {verdict}")


#: How many kernels after the cause the ``kernels`` panel prints in the terminal (the report lists all).
AFTER = 5


def kernel_panel(g: Graph, kernels: list[KernelCheck]) -> None:
    """The ``kernels`` panel: every kernel call in execution order, the error of its output in the
    compiled run, its own error on eager's inputs and what they say (``own``, ``inherited``, ...)."""
    first = first_beyond(kernels)
    calls = {c.path: c.id for c in g.calls.walk() if c.stack}
    rows = []
    for k in kernels:
        e, own = k.error, k.own_error
        origin = k.origin or ("within" if e is not None else "not run" if not k.observed else "not compared")
        if origin == "unmeasured":
            origin = f"beyond tolerance, own error not measured: {k.own_note}"
        elif k.origin and k.own_note:  # own or inherited, measured on a partial result another kernel wrote
            origin = f"{origin} (reads {k.own_note})"
        rows.append(row(k.handle, k.module or "the model itself", None if e is None else rel_text(e.max_rel),
                        None if own is None else rel_text(own.max_rel), origin, k.source,
                        module=calls.get(k.module), sort=[None, None, _sortable(e), _sortable(own), None, None],
                        level={"own": "error", "inherited": "warn", "unmeasured": "warn"}.get(k.origin)))
    beyond = [k for k in kernels if k.exceeds]
    inherited = sum(1 for k in beyond if k.origin == "inherited")
    meaning = "own max rel: the kernel's error when run on eager's values of what it reads"
    note = f"every kernel within tolerance; {meaning}" if not beyond else (
        f"{len(beyond)} kernel(s) beyond tolerance in the compiled run, {inherited} of them only by what they "
        f"inherit (within on eager's inputs); {meaning}")
    spec = set_panel(g, "kernels", title="kernels (--per-kernel), in execution order",
                     columns=["kernel", "module", "max rel", "own max rel", "origin", "line"], rows=rows, note=note)
    spec["page"] = kernels.index(first) + 1 + AFTER if first is not None else 2 * AFTER


def _sortable(e: Error | None) -> float | None:
    return e.max_rel if e is not None and math.isfinite(e.max_rel) else None


def _finite(x: float) -> float | str | None:
    if x != x:
        return None
    return x if abs(x) != float("inf") else ("inf" if x > 0 else "-inf")


__all__ = ["AFTER", "ORIGINS", "BufferCheck", "KernelCheck", "first_beyond", "kernel_note", "kernel_panel"]
