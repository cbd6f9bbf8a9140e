"""What happens inside torch.compile, as plain data: Inductor's stages per compiled graph, every
kernel and extern call with the eager ops and modules it runs, and the compile cost. No torch: a
saved map reads back and renders on a machine without torch.

Each compiled graph (a compile id) is a :class:`~fxviz.analyze.pipeline.result.Pipeline` whose
stages are torch's own graphs (Dynamo's, after the pre-grad passes, AOT Autograd's joint graph, its
forward and backward, the post-grad graphs and the kernels), so ``fxviz passes``' stage table,
``--stage N`` tree and report draw them unchanged. Stages branch (AOT's forward and backward both
come from the joint graph): :attr:`Stage.base` says which stage each is compared with.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fxviz.analyze.inside.partition import Partition
from fxviz.analyze.pipeline.result import Pipeline


@dataclass
class Kernel:
    """One generated kernel or extern call of one output code, as a row of the kernel map.

    ``id`` is torch's provenance handle (``cpp_fused_gelu_0:2``, ``extern_kernels.addmm:1``);
    ``name`` the kernel (``cpp_fused_gelu_0``) or the extern function (``extern_kernels.addmm``);
    ``kind`` ``cpp``, ``triton``, ``template``, ``extern``, ``collective`` or ``other``; ``graph``/``compile_id``/
    ``part`` the compiled graph and which of its output codes (``forward``, ``backward``,
    ``inference``). ``ops``: the post-grad nodes it runs; ``eager``: the eager graph's ops they
    come from and ``modules`` their module paths; ``lines``: the user lines torch's kernel stack
    traces name. ``inferred``: torch recorded no node mapping (the backward in torch 2.13), fxviz
    matched them. ``time_us``: measured time per forward (torch.profiler), ``share`` of its output
    code's time. ``group``: for a collective or its wait, the process group torch's post-grad graph
    runs it on (its name: ``0``, as the eager graph's collectives name it)."""

    id: str
    name: str
    kind: str
    graph: str
    compile_id: str
    part: str
    ops: list[str] = field(default_factory=list)
    eager: list[str] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    source: str = ""
    inferred: bool = False
    time_us: float | None = None
    share: float | None = None
    calls: int = 1
    group: str = ""

    @property
    def kind_where(self) -> str:
        """The kind, and for a collective the group it runs on: ``collective on group 0``."""
        return f"{self.kind} on group {self.group}" if self.group else self.kind

    @property
    def crosses_modules(self) -> bool:
        """A fusion whose ops come from more than one module."""
        return len(set(self.modules)) > 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"crosses_modules": self.crosses_modules}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Kernel:
        return cls(**{k: v for k, v in d.items() if k != "crosses_modules"})


@dataclass
class NotFused:
    """A fusion Inductor's scheduler refused, with the reason torch logged (its ``fusion`` logger:
    ``cannot fuse op0 with op1: exceeds max fusion``), read in a live run only (torch's structured
    trace does not record fusion decisions).

    ``first``/``second``: torch's scheduler nodes (``op3``; ``op3_op4`` for nodes fused before);
    ``first_ops``/``second_ops``: the post-grad nodes they compute (torch's origin nodes; of those,
    the ones their own kernels run, where the output code says which kernels those are);
    ``first_kernels``/``second_kernels``: the kernels (ids, as :attr:`Kernel.id`) that write their
    buffers in the output code (else that run those nodes) (on CPU both sides can name one kernel: a C++ kernel function may run several
    unfused loop nests); ``eager``/``modules``: the eager ops and module paths of those nodes,
    first's then second's. A refusal whose two sides torch fused in a later round is not kept."""

    graph: str
    compile_id: str
    part: str
    first: str
    second: str
    reason: str
    first_ops: list[str] = field(default_factory=list)
    second_ops: list[str] = field(default_factory=list)
    first_kernels: list[str] = field(default_factory=list)
    second_kernels: list[str] = field(default_factory=list)
    eager: list[str] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NotFused:
        return cls(**d)


@dataclass
class Cost:
    """What compiling one graph cost: torch's ``compilation_metrics`` (and
    ``bwd_compilation_metrics``) numbers as torch wrote them (``metrics``, ``bwd_metrics``:
    ``entire_frame_compile_time_s``, ``backend_compile_time_s``, ``inductor_compile_time_s``,
    ``code_gen_time_s``, ...), the seconds of each phase from torch's chromium events (``phases``:
    label -> seconds, see :data:`fxviz.analyze.inside.costs.PHASES`) and the cache outcomes
    (``cache``: ``fx_graph_cache`` / ``aotautograd_cache`` -> ``hit``, ``miss``, ``bypass``, one
    entry per lookup, forward first)."""

    compile_id: str
    graph: str
    metrics: dict[str, Any] = field(default_factory=dict)
    bwd_metrics: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    cache: dict[str, list[str]] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        """The frame's whole compile time (forward) plus the backward's Inductor compile."""
        fwd = self.metrics.get("entire_frame_compile_time_s") or 0.0
        bwd = self.bwd_metrics.get("inductor_compile_time_s") or 0.0
        return float(fwd) + float(bwd)


@dataclass
class InsideGraph:
    """One compiled graph: its stages (``pipeline``), kernels, what compiling it cost, the
    post-grad ops no kernel runs with the reason (``unmapped``: ``part:node`` -> why), the fusions
    Inductor refused (``not_fused``) and, with a backward graph, the partition
    (:mod:`fxviz.analyze.inside.partition`)."""

    id: str
    compile_id: str
    pipeline: Pipeline
    kernels: list[Kernel] = field(default_factory=list)
    cost: Cost | None = None
    unmapped: dict[str, str] = field(default_factory=dict)
    ops: int = 0  # post-grad ops that compute (views and getitems left out)
    mapped: int = 0  # of those, run by a kernel or extern call
    partition: Partition | None = None  # a training step's: what the backward saves and recomputes
    not_fused: list[NotFused] = field(default_factory=list)  # the fusions Inductor refused, in torch's order

    @property
    def share_mapped(self) -> float:
        return self.mapped / self.ops if self.ops else 1.0


@dataclass
class Inside:
    """Everything fxviz read from inside torch.compile: one :class:`InsideGraph` per compiled
    graph, in compile order; ``notes``: what torch did not record or fxviz could not read (a
    truncated trace's lines among them), each one line."""

    graphs: list[InsideGraph] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    timed: bool = False  # kernel times measured (live runs only)

    @property
    def kernels(self) -> list[Kernel]:
        return [k for g in self.graphs for k in g.kernels]

    @property
    def not_fused(self) -> list[NotFused]:
        return [n for g in self.graphs for n in g.not_fused]

    @property
    def costs(self) -> list[Cost]:
        return [g.cost for g in self.graphs if g.cost is not None]

    @property
    def share_mapped(self) -> float:
        ops = sum(g.ops for g in self.graphs)
        return sum(g.mapped for g in self.graphs) / ops if ops else 1.0

    def graph(self, key: str) -> InsideGraph:
        """A compiled graph by id (``g0``) or compile id (``0/0``)."""
        for g in self.graphs:
            if key in (g.id, g.compile_id):
                return g
        raise KeyError(f"no compiled graph {key!r}: there are {', '.join(g.id for g in self.graphs) or 'none'}")

    def summary(self) -> str:
        """``2 compiled graphs, 9 kernels and calls (5 extern, 1 collective, 1 wait), 100% of post-grad ops
        mapped to a kernel``: a collective's wait is counted as a wait, not as a collective."""
        ks = self.kernels
        if not ks and not any(g.ops for g in self.graphs):  # aot_eager: AOT Autograd's stages, no Inductor
            return f"{len(self.graphs)} compiled graph{'s' if len(self.graphs) != 1 else ''}, no Inductor kernels"
        ext = sum(1 for k in ks if k.kind == "extern")
        # a collective's wait is a row of kind collective too, but no collective: counted apart, so
        # the count is the collectives torch ran (CommDebugMode's), not twice it
        waits = sum(1 for k in ks if k.kind == "collective" and "wait_tensor" in k.name)
        comm = sum(1 for k in ks if k.kind == "collective") - waits
        p = self.share_mapped * 100
        pct = f"{p:.1f}%" if 99 < p < 100 else f"{p:.0f}%"
        parts = [f"{ext} extern"] + [f"{n} {w}" for n, w in ((comm, "collective"), (waits, "wait")) if n]
        return (f"{len(self.graphs)} compiled graph{'s' if len(self.graphs) != 1 else ''}, {len(ks)} kernels and "
                f"calls ({', '.join(parts)}), {pct} of post-grad ops mapped to a kernel")

    def to_dict(self) -> dict[str, Any]:
        """The JSON keys: ``stages`` (per compiled graph its pipeline), ``kernels``, ``fusion`` (the
        fusions Inductor refused, each a :class:`NotFused` naming its graph and the kernels on both
        sides), ``costs`` and ``inside`` (notes, unmapped ops, shares)."""
        return {
            "stages": [{"id": g.id, "compile_id": g.compile_id, **g.pipeline.to_dict()} for g in self.graphs],
            "kernels": [k.to_dict() for k in self.kernels],
            "fusion": [n.to_dict() for n in self.not_fused],
            "costs": [asdict(c) | {"total_s": c.total_s} for c in self.costs],
            "inside": {"notes": list(self.notes), "timed": self.timed, "summary": self.summary(),
                       "graphs": [{"id": g.id, "compile_id": g.compile_id, "ops": g.ops, "mapped": g.mapped,
                                   "unmapped": g.unmapped} | ({"partition": g.partition.to_dict()} if g.partition
                                                              is not None else {}) for g in self.graphs]},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Inside:
        import json

        meta = {g["id"]: g for g in d.get("inside", {}).get("graphs", [])}
        costs = {c["graph"]: Cost(**{k: v for k, v in c.items() if k != "total_s"}) for c in d.get("costs", [])}
        kernels: dict[str, list[Kernel]] = {}
        for k in d.get("kernels", []):
            kernels.setdefault(k["graph"], []).append(Kernel.from_dict(k))
        refused: dict[str, list[NotFused]] = {}
        for n in d.get("fusion", []):
            refused.setdefault(n["graph"], []).append(NotFused.from_dict(n))
        graphs = []
        for s in d.get("stages", []):
            p = {k: v for k, v in s.items() if k not in ("id", "compile_id")}
            m = meta.get(s["id"], {})
            graphs.append(InsideGraph(s["id"], s["compile_id"], Pipeline.from_json(json.dumps(p)),
                                      kernels.get(s["id"], []), costs.get(s["id"]), dict(m.get("unmapped", {})),
                                      m.get("ops", 0), m.get("mapped", 0),
                                      Partition.from_dict(m["partition"]) if "partition" in m else None,
                                      refused.get(s["id"], [])))
        return cls(graphs, list(d.get("inside", {}).get("notes", [])), bool(d.get("inside", {}).get("timed", False)))


__all__ = ["Cost", "Inside", "InsideGraph", "Kernel", "NotFused"]
