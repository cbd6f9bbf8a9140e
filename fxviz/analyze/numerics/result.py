"""What a numerics run found, as plain data: :class:`Error` per value compared
(:mod:`~fxviz.analyze.numerics.error`), and the :class:`Numerics` result with its JSON and its marks
on the eager graph (the ``error`` overlay, the ``divergence`` panel, the metrics in each node's
attrs), and with ``--per-kernel`` a :class:`KernelCheck` per Inductor kernel call and the ``kernels``
panel (:mod:`~fxviz.analyze.numerics.kernelresult`). No torch: a saved result renders anywhere.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from fxviz.analyze.numerics.error import Error, rel_text
from fxviz.analyze.numerics.kernelresult import BufferCheck, KernelCheck, first_beyond, kernel_panel
from fxviz.ir import Graph
from fxviz.passes.overlays import set_overlay
from fxviz.passes.panels import row, set_headline, set_panel

#: How many modules the ``divergence`` panel lists after the first divergence.
WORST = 10
#: How many unit roundoffs of a low-precision dtype a value may be off by (relative RMS) before it is
#: beyond what that dtype is expected to give (:func:`fxviz.analyze.numerics.metrics.tolerance`). An
#: op run in bfloat16 or float16 carries the rounding of each input and of its result (three
#: roundings of up to one unit roundoff ``u``, about ``u`` RMS together) plus what it was handed
#: from the ops before; ``4u`` leaves room for a few ops' worth of it and is torch.testing's own
#: bfloat16 rtol (1.6e-2 = 4.1u).
ROUNDINGS = 4


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
        """With ``per_kernel``: the cause, the first kernel in execution order whose own error is beyond
        tolerance (:func:`~fxviz.analyze.numerics.kernelresult.first_beyond`)."""
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
    ke = kernel.own_error if kernel is not None and kernel.origin == "own" else kernel.error if kernel else None
    if kernel is not None and ke is not None:  # --per-kernel: where inside the graph, by its own error
        call = next((c for c in tree.walk() if c.stack and c.path == kernel.module), None)
        rows.append(row("first kernel" + (" (own error)" if kernel.origin == "own" else " (own not measured)"),
                        f"{kernel.module or 'the model itself'} · {kernel.handle}", _snr(ke),
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
        note += f"; the first kernel {'with its own error ' if kernel.origin == 'own' else ''}beyond tolerance " \
                f"is {kernel.where()}"
    if result.not_comparable:
        note += f"; {len(result.not_comparable)} random op(s) not comparable"
    set_panel(g, "divergence", title=f"numerics against {result.against}",
              columns=["what", "where", "SNR dB", "max rel", "line"], rows=rows, note=note)
    if result.kernels is not None:
        kernel_panel(g, result.kernels)
    # under the answer, what the terminal prints under it: the gradients' answer and the notes
    said = [result.grads.headline()] if result.grads is not None else []
    set_headline(g, result.headline(), panel="divergence", node=result.first,
                 level="warn" if result.first is not None or (result.grads is not None and result.grads.first)
                 else "ok", notes=[*said, *result.notes], overlay="error")


def _snr(e: Error) -> str:
    return "exact" if e.rel_rms == 0 else f"{e.snr_db:.1f}"


def _module_of(g: Graph, name: str) -> str:
    n = g.node(name)
    return f"{n.stack[-1][0]} · {n.name}" if n.stack else n.name


__all__ = ["ROUNDINGS", "WORST", "BufferCheck", "Error", "Grads", "KernelCheck", "Numerics", "annotate", "first_beyond", "rel_text"]
