"""What a numerics run found, as plain data: :class:`Error` per value compared, and the
:class:`Numerics` result with its JSON and its marks on the eager graph (the ``error`` overlay, the
``divergence`` panel, the metrics in each node's attrs), and with ``--per-kernel`` a
:class:`KernelCheck` per Inductor kernel call (:mod:`~fxviz.analyze.numerics.kernels`). No torch: a saved result renders anywhere.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from fxviz.ir import Graph
from fxviz.passes.overlays import set_overlay
from fxviz.passes.panels import row, set_headline, set_panel

_FLOATS = ("max_abs", "max_rel", "cosine", "snr_db", "rel_rms", "floor")
#: How many modules the ``divergence`` panel lists after the first divergence.
WORST = 10
#: How many unit roundoffs of a low-precision dtype a value may be off by (relative RMS) before it is
#: beyond what that dtype is expected to give (:func:`fxviz.analyze.numerics.metrics.tolerance`). An
#: op run in bfloat16 or float16 carries the rounding of each input and of its result (three
#: roundings of up to one unit roundoff ``u``, about ``u`` RMS together) plus what it was handed
#: from the ops before; ``4u`` leaves room for a few ops' worth of it and is torch.testing's own
#: bfloat16 rtol (1.6e-2 = 4.1u).
ROUNDINGS = 4


@dataclass(slots=True)
class Error:
    """How far one value of the other side is from eager float32.

    ``rel_rms`` is ``‖other − eager‖₂ / ‖eager‖₂`` (0 when equal; the overlay's value, bigger is
    worse), ``snr_db`` ``−20·log10(rel_rms)`` (``inf`` when equal), ``max_rel`` the largest
    ``|other − eager| / |eager|`` where eager is not near zero (NaN when every element is:
    :data:`~fxviz.analyze.numerics.metrics.NEAR_ZERO`). ``exceeds`` says the value is beyond tolerance:
    ``‖other − eager‖₂ > atol·√n + rtol·‖eager‖₂`` (the RMS form of ``allclose``, so one element
    that cancels to nearly zero does not count as a divergence), or NaN/inf where eager has none, or
    integers that differ. ``note`` says why a value was not compared (``comparable`` False).
    ``floor`` is eager's own noise, ``‖eager₂ − eager₁‖₂ / ‖eager₁‖₂`` between two identical eager
    runs (0: reproducible); a value with noise is beyond tolerance only past it
    (:mod:`fxviz.analyze.numerics.floor`).
    """

    max_abs: float = 0.0
    max_rel: float = 0.0
    cosine: float = 1.0
    snr_db: float = math.inf
    rel_rms: float = 0.0
    exceeds: bool = False
    comparable: bool = True
    note: str = ""
    floor: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in _FLOATS:
            if not math.isfinite(d[k]):
                d[k] = None if d[k] != d[k] else ("inf" if d[k] > 0 else "-inf")
        for k in ("note", "floor"):
            if not d[k]:
                del d[k]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Error:
        v = dict(d)
        for k in _FLOATS:
            if isinstance(v.get(k), str):
                v[k] = float(v[k])
            elif v.get(k) is None and k in v:
                v[k] = math.nan
        return cls(**v)

    def text(self) -> str:
        """One line for the details panel and the terminal."""
        if not self.comparable:
            return f"not comparable: {self.note}" if self.note else "not comparable"
        snr = "exact" if self.rel_rms == 0 else f"SNR {self.snr_db:.1f} dB"
        return (f"{snr} · max abs {self.max_abs:.3g} · max rel {rel_text(self.max_rel)} · cos {self.cosine:.6f}"
                + (f" · eager noise {self.floor:.3g} (not reproducible)" if self.floor else "")
                + (" · beyond tolerance" if self.exceeds else ""))

    @staticmethod
    def worst(errors: list[Error]) -> Error | None:
        compared = [e for e in errors if e.comparable]
        if not compared:
            return errors[0] if errors else None
        return max(compared, key=lambda e: (e.exceeds, e.rel_rms if e.rel_rms == e.rel_rms else math.inf))


@dataclass(slots=True)
class BufferCheck:
    """One buffer a kernel wrote: its name in the output code (``buf5``), the post-grad node it holds
    (Inductor's ``origin_node``; ``""`` when it holds none exactly), the Dynamo node whose eager value
    it was compared with (``""``: none, ``error.note`` says why) and the error."""

    buffer: str
    node: str
    eager: str
    error: Error

    def to_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer, "node": self.node, "eager": self.eager, "error": self.error.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BufferCheck:
        return cls(d["buffer"], d["node"], d["eager"], Error.from_dict(d["error"]))


@dataclass
class Grads:
    """``params``: parameter name -> the error of its gradient; ``order``: the parameter names in the
    order eager backward finished their gradients (torch's ``post_accumulate_grad`` hooks);
    ``modules``: module path -> the worst error of its own parameters' gradients; ``first``: the
    first module in backward order with a gradient beyond tolerance (``None``: none)."""

    params: dict[str, Error] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    modules: dict[str, Error] = field(default_factory=dict)
    first: str | None = None

    @staticmethod
    def owner(param: str) -> str:
        return param.rpartition(".")[0]

    def settle(self) -> None:
        """Fill ``modules`` and ``first`` from ``params`` and ``order``."""
        by: dict[str, list[Error]] = {}
        for name in self.order:
            by.setdefault(self.owner(name), []).append(self.params[name])
        self.modules = {m: w for m, errs in by.items() if (w := Error.worst(errs)) is not None}
        self.first = next((self.owner(n) for n in self.order
                           if self.params[n].comparable and self.params[n].exceeds), None)

    def beyond(self) -> list[str]:
        return [n for n in self.order if self.params[n].comparable and self.params[n].exceeds]

    def headline(self) -> str:
        where = "every gradient within tolerance" if self.first is None else \
            f"first module whose gradient diverges (backward order): {self.first or 'the model itself'} " \
            f"[{self.modules[self.first].text()}]"
        return f"gradients: {len(self.params)} parameters compared, {len(self.beyond())} beyond tolerance; {where}"

    def to_dict(self) -> dict[str, Any]:
        return {"first": self.first, "order": self.order,
                "params": {k: e.to_dict() for k, e in self.params.items()},
                "modules": {k: e.to_dict() for k, e in self.modules.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Grads:
        return cls(params={k: Error.from_dict(v) for k, v in d["params"].items()}, order=list(d["order"]),
                   modules={k: Error.from_dict(v) for k, v in d["modules"].items()}, first=d.get("first"))


@dataclass
class KernelCheck:
    """One kernel call of a compiled graph (``graph``: its index in compile order), by torch's
    provenance handle (``cpp_fused_gelu_0:2``, ``extern_kernels.addmm:1``, as in
    ``cppCodeToPost``): ``kind`` (``cpp``, ``triton``, ``extern``, ``other``), the Dynamo ops it
    covers (``ops``, graph order), the eager op it is reported at (``op``: the op of its worst
    compared buffer, else its last op), that op's module path and user line, the buffers it wrote,
    and ``observed`` (False when the call did not run under the watch: then nothing was compared)."""

    handle: str
    graph: int
    kind: str = "other"
    ops: list[str] = field(default_factory=list)
    op: str = ""
    module: str = ""
    source: str = ""
    buffers: list[BufferCheck] = field(default_factory=list)
    observed: bool = False

    @property
    def error(self) -> Error | None:
        """The worst compared buffer's error (``None`` when no buffer was comparable)."""
        compared = [b.error for b in self.buffers if b.error.comparable]
        return Error.worst(compared) if compared else None

    @property
    def exceeds(self) -> bool:
        e = self.error
        return e is not None and e.exceeds

    def where(self) -> str:
        """``handle (op) in module at file:line``."""
        op = f" ({self.op})" if self.op else ""
        at = f" at {self.source}" if self.source else ""
        return f"{self.handle}{op} in {self.module or 'the model itself'}{at}"

    def text(self) -> str:
        """One line: where, and the worst buffer's max abs / max rel and the verdict."""
        e = self.error
        if not self.observed:
            what = "not run while watched"
        elif e is None:
            what = "no buffer with an eager counterpart: not comparable"
        else:
            what = (f"max abs {e.max_abs:.3g} · max rel {rel_text(e.max_rel)} · "
                    + ("beyond tolerance" if e.exceeds else "within tolerance"))
        return f"{self.where()}: {what}"

    def to_dict(self) -> dict[str, Any]:
        e = self.error
        return {"handle": self.handle, "graph": self.graph, "kind": self.kind, "ops": self.ops, "op": self.op,
                "module": self.module, "source": self.source, "observed": self.observed,
                "within": None if e is None else not e.exceeds,
                "max_abs": None if e is None else _finite(e.max_abs),
                "max_rel": None if e is None else _finite(e.max_rel),
                "buffers": [b.to_dict() for b in self.buffers]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KernelCheck:
        return cls(d["handle"], d["graph"], d.get("kind", "other"), list(d.get("ops", [])), d.get("op", ""),
                   d.get("module", ""), d.get("source", ""), [BufferCheck.from_dict(b) for b in d.get("buffers", [])],
                   bool(d.get("observed", False)))


def first_beyond(kernels: list[KernelCheck]) -> KernelCheck | None:
    """The first kernel, in execution order, with a buffer beyond tolerance."""
    return next((k for k in kernels if k.exceeds), None)


def _finite(x: float) -> float | str | None:
    if x != x:
        return None
    return x if abs(x) != float("inf") else ("inf" if x > 0 else "-inf")



@dataclass
class Numerics:
    """The result of :func:`fxviz.numerics`: per node and per module call :class:`Error` s against
    eager float32, the first divergence, and the eager graph they are written on.

    ``first`` is the first node, in execution order, whose value is beyond tolerance while every
    value it reads is within: where the error is born (``None`` when none is). ``births`` lists
    every such node. ``not_comparable`` lists the random ops (the other side is given eager's value
    there, so what follows stays comparable). ``expected`` names the low-precision dtype
    (``"bfloat16"``) whose default tolerance was used: what that dtype is expected to give (``""``:
    a float32 side, or a tolerance given). ``graph`` is the eager graph with the ``error`` overlay,
    the ``divergence`` panel and each node's metrics in ``attrs["numerics"]``.
    """

    against: str
    rtol: float
    atol: float
    graph: Graph
    expected: str = ""
    nodes: dict[str, Error] = field(default_factory=dict)
    modules: dict[str, Error] = field(default_factory=dict)
    first: str | None = None
    births: list[str] = field(default_factory=list)
    not_comparable: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    kernels: list[KernelCheck] | None = None  # --per-kernel: each Inductor kernel call, in execution order
    grads: Grads | None = None  # backward=True: each parameter's gradient

    # ---- reading ---------------------------------------------------------------------------------

    def module_snr(self) -> dict[str, float]:
        """SNR in dB of each module call's output (call id -> dB), the model's own as ``""``."""
        return {k: e.snr_db for k, e in self.modules.items() if e.comparable}

    def worst_snr(self) -> float:
        """The lowest SNR of any module call (``inf`` when every one is exact)."""
        return min(self.module_snr().values(), default=math.inf)

    def where(self, name: str) -> str:
        """``node in module path at file:line`` for a node of the graph."""
        n = self.graph.node(name)
        path = n.stack[-1][0] if n.stack else ""
        src = f" at {n.source.short()}" if n.source is not None else ""
        return f"{n.name} ({n.target}) in {path or 'the model itself'}{src}"

    @property
    def first_kernel(self) -> KernelCheck | None:
        """With ``per_kernel``: the first kernel, in execution order, whose output is beyond tolerance."""
        return first_beyond(self.kernels or [])

    def headline(self) -> str:
        compared = sum(1 for e in self.nodes.values() if e.comparable)
        beyond = sum(1 for e in self.nodes.values() if e.comparable and e.exceeds)
        snr = self.worst_snr()
        worst = "every module exact" if snr == math.inf else f"worst module SNR {snr:.1f} dB"
        if self.expected:  # the default tolerance of a low-precision dtype: say what it stands for
            what = f"what {self.expected} is expected to give"
            verdict = f"{beyond} beyond {what}" if beyond else f"all within {what}"
            tol = f"rtol {self.rtol:.3g} = {ROUNDINGS} unit roundoffs of {self.expected}, atol {self.atol:g}"
        else:
            verdict, tol = f"{beyond} beyond tolerance", f"rtol {self.rtol:g}, atol {self.atol:g}"
        return f"{self.graph.name} against {self.against}: {compared} values compared, {verdict} ({tol}), {worst}"

    # ---- JSON ------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "headline": self.headline(), "against": self.against, "rtol": self.rtol, "atol": self.atol,
            "expected": self.expected,
            "first": self.first,
            "first_where": self.where(self.first) if self.first else None,
            "births": self.births, "not_comparable": self.not_comparable, "notes": self.notes,
            "seconds": self.seconds,
            "nodes": {k: e.to_dict() for k, e in self.nodes.items()},
            "modules": {k: e.to_dict() for k, e in self.modules.items()},
            "graph": json.loads(self.graph.to_json()),
        } | ({} if self.kernels is None else {
            "kernels": [k.to_dict() for k in self.kernels],
            "first_kernel": None if (k := self.first_kernel) is None else k.handle,
        }) | ({} if self.grads is None else {"grads": self.grads.to_dict()})

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> Numerics:
        d = json.loads(text)
        return cls(
            against=d["against"], rtol=d["rtol"], atol=d["atol"], graph=Graph.from_json(json.dumps(d["graph"])),
            expected=d.get("expected", ""),
            nodes={k: Error.from_dict(v) for k, v in d["nodes"].items()},
            modules={k: Error.from_dict(v) for k, v in d["modules"].items()},
            first=d.get("first"), births=list(d.get("births", [])),
            not_comparable=list(d.get("not_comparable", [])), notes=list(d.get("notes", [])),
            seconds=dict(d.get("seconds", {})),
            kernels=None if "kernels" not in d else [KernelCheck.from_dict(k) for k in d["kernels"]],
            grads=None if "grads" not in d else Grads.from_dict(d["grads"]),
        )

    # ---- rendering -------------------------------------------------------------------------------

    def tree(self, *, depth: int | None = None, unfold: bool = False) -> Any:
        """The eager graph's tree with the error column (``rel_rms`` per module call) and the
        ``divergence`` panel under it."""
        return self.graph.tree(depth=depth, unfold=unfold, overlay="error")

    def to_html(self, path: str) -> None:
        self.graph.to_html(path, overlay="error")

    def __rich__(self) -> Any:
        return self.tree()


# ---- writing the result on the graph ---------------------------------------------------------------


def annotate(result: Numerics) -> None:
    """Write ``result`` on its graph: the ``error`` overlay (relative RMS error, log scale, per node
    and module call), the ``divergence`` panel (the first divergence, then the modules with the
    lowest SNR) and each compared node's metrics as text in ``attrs["numerics"]``."""
    g = result.graph
    for name, e in result.nodes.items():
        g.node(name).attrs["numerics"] = e.text()
    set_overlay(
        g, "error", label=f"error vs {result.against}", kind="number", unit="rel RMS", scale="log", reduce="max",
        nodes={k: e.rel_rms for k, e in result.nodes.items() if e.comparable and math.isfinite(e.rel_rms)},
        modules={k: e.rel_rms for k, e in result.modules.items() if k and e.comparable and math.isfinite(e.rel_rms)},
        description=f"‖{result.against} − eager‖ / ‖eager‖ of each op's output and each module call's output "
                    "(eager float32 is the reference; 0: identical)",
    )
    rows = []
    tree = g.calls
    if result.first is not None:
        n = g.node(result.first)
        e = result.nodes[result.first]
        rows.append(row("first divergence", _module_of(g, result.first), _snr(e), rel_text(e.max_rel),
                        n.source.short() if n.source is not None else "", node=n.name,
                        module=tree.of(n.name).id or None, level="error"))
    kernel = result.first_kernel
    if kernel is not None and (ke := kernel.error) is not None:  # --per-kernel: where inside the graph
        call = next((c for c in tree.walk() if c.stack and c.path == kernel.module), None)
        rows.append(row("first kernel", f"{kernel.module or 'the model itself'} · {kernel.handle}", _snr(ke),
                        rel_text(ke.max_rel), kernel.source, module=call.id if call is not None else None,
                        level="error"))
    calls = [(cid, e) for cid, e in result.modules.items() if cid and e.comparable and e.rel_rms > 0]
    calls.sort(key=lambda x: -x[1].rel_rms)
    by_id = {c.id: c for c in tree.walk() if c.stack}
    for cid, e in calls[:WORST]:
        c = by_id.get(cid)
        label = f"{c.path} ({g.modules[c.path].cls})" if c is not None and c.path in g.modules else cid
        rows.append(row("module", label, _snr(e), rel_text(e.max_rel), "", module=cid,
                        level="error" if e.exceeds else "warn"))
    within = f"every value within what {result.expected} is expected to give" if result.expected \
        else "no value is beyond tolerance"
    note = (within if result.first is None else
            f"the error is born at {result.where(result.first)}")
    if kernel is not None:
        note += f"; the first kernel beyond tolerance is {kernel.where()}"
    if result.not_comparable:
        note += f"; {len(result.not_comparable)} random op(s) not comparable"
    set_panel(g, "divergence", title=f"numerics against {result.against}",
              columns=["what", "where", "SNR dB", "max rel", "line"], rows=rows, note=note)
    set_headline(g, result.headline(), panel="divergence", node=result.first,
                 level="ok" if result.first is None else "warn")


def rel_text(max_rel: float) -> str:
    """``max_rel`` as shown: ``-`` where every element of the reference is near zero (NaN)."""
    return "-" if max_rel != max_rel else f"{max_rel:.3g}"


def _snr(e: Error) -> str:
    return "exact" if e.rel_rms == 0 else f"{e.snr_db:.1f}"


def _module_of(g: Graph, name: str) -> str:
    n = g.node(name)
    return f"{n.stack[-1][0]} · {n.name}" if n.stack else n.name


__all__ = ["ROUNDINGS", "WORST", "BufferCheck", "Error", "Grads", "KernelCheck", "Numerics", "annotate", "first_beyond", "rel_text"]
