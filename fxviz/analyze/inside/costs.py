"""What compiling each graph cost, from torch's own records. No torch.

The numbers are torch's: ``compilation_metrics`` (the frame: Dynamo plus the backend, forward) and
``bwd_compilation_metrics`` (the backward's Inductor compile) as torch wrote them, the phases'
seconds from torch's chromium events (a phase that ran twice, forward and backward, is summed) and
each cache lookup's outcome from the ``fx_graph_cache_*`` and ``aotautograd_cache_*`` artifacts.
"""

from __future__ import annotations

from typing import Any

from fxviz.analyze.inside.result import Cost
from fxviz.tracefile.records import Compile

#: The phases of a compile, in order: label -> the chromium events whose seconds it sums.
PHASES: dict[str, tuple[str, ...]] = {
    "Dynamo trace": ("bytecode_tracing",),
    "pre-grad passes": ("_recursive_pre_grad_passes",),
    "AOT trace": ("aot_collect_metadata", "aot_trace_joint_graph"),
    "joint passes + partition": ("_recursive_joint_graph_passes", "min_cut_rematerialization_partition"),
    "post-grad passes": ("_recursive_post_grad_passes",),
    "lowering": ("GraphLowering.run",),
    "scheduling": ("Scheduler.__init__",),
    "codegen": ("Scheduler.codegen", "PythonWrapperCodegen.generate"),
    "C++/Triton compile": ("PyCodeCache.load_by_key_path",),
    "guards": ("build_guards",),
}
#: The metrics a cost keeps (numbers torch writes in ``compilation_metrics``).
METRICS = ("entire_frame_compile_time_s", "backend_compile_time_s", "inductor_compile_time_s", "code_gen_time_s",
           "dynamo_time_before_restart_s", "structured_logging_overhead_s", "remote_cache_time_saved_s",
           "guard_count", "graph_op_count", "graph_node_count", "graph_input_count", "cache_size", "co_name",
           "co_filename", "co_firstlineno", "fail_type", "fail_reason")
_CACHES = ("fx_graph_cache", "aotautograd_cache")


def cost(c: Compile, graph: str) -> Cost:
    """The cost of compile ``c`` (whose graph is ``graph``)."""
    phases: dict[str, float] = {}
    for label, names in PHASES.items():
        s = sum(p.seconds for p in c.phases if p.name in names)
        if s:
            phases[label] = s
    cache: dict[str, list[str]] = {}
    for a in c.artifacts:
        for key in _CACHES:
            if a.name.startswith(key + "_"):
                cache.setdefault(key, []).append(a.name[len(key) + 1:])
    return Cost(c.compile_id, graph, _metrics(c.event("compilation_metrics")), _metrics(c.event("bwd_compilation_metrics")),
                phases, cache)


def _metrics(m: Any) -> dict[str, Any]:
    if not isinstance(m, dict):
        return {}
    return {k: m[k] for k in METRICS if m.get(k) is not None}


def cost_rows(c: Cost) -> list[tuple[str, str]]:
    """(what, value) rows of the cost table: torch's totals, then each phase, then the caches."""
    rows = []
    for key, label in (("entire_frame_compile_time_s", "frame compile (Dynamo + backend)"),
                       ("backend_compile_time_s", "backend compile"),
                       ("inductor_compile_time_s", "Inductor compile (forward)"),
                       ("code_gen_time_s", "code generation (forward)")):
        if key in c.metrics:
            rows.append((label, f"{c.metrics[key]:.3f} s"))
    for key, label in (("inductor_compile_time_s", "Inductor compile (backward)"),
                       ("code_gen_time_s", "code generation (backward)")):
        if key in c.bwd_metrics:
            rows.append((label, f"{c.bwd_metrics[key]:.3f} s"))
    rows += [(f"  {label}", f"{s:.3f} s") for label, s in c.phases.items()]
    rows += [(key.replace("_", " "), ", ".join(v)) for key, v in c.cache.items()]
    return rows


__all__ = ["METRICS", "PHASES", "cost", "cost_rows"]
