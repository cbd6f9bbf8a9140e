"""Do a stage's numbers still match eager PyTorch, and where do they first part?

A stage's program runs on the example inputs (its graph module called with the parameters,
buffers and constants it lifted, then the user's tensors: one forward, no unlifting) and each user
output is compared with eager's: largest absolute and relative difference, and whether every
element is within ``atol + rtol * |expected|`` for its dtype (:data:`TOLERANCE`; integer and bool
outputs must be equal). Inputs or state on ``meta`` or fake tensors hold no numbers: the check is
skipped with a note.

Within the first stage out of tolerance, both that stage and the one before run once more under a
recording :class:`torch.fx.Interpreter` that keeps only the values it will compare: each node of
the earlier stage against the node of the later one that stands for it (itself when kept; else the
last node linked to it with the same shape: the result of its decomposition or fusion). The first
such node, in the later stage's order, whose value differs is where the numbers part.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from fxviz.analyze.pipeline.links import Links
from fxviz.analyze.pipeline.result import Numbers, OutputError

#: (atol, rtol) by dtype: loose enough for a decomposition's reordered float arithmetic, tight
#: enough that a changed op shows.
TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
}
_DEFAULT_TOLERANCE = (1e-4, 1e-4)


def no_numbers(tensors: Sequence[Any]) -> str:
    """Why these tensors hold no numbers to compare (``""`` when they do)."""
    for t in tensors:
        if isinstance(t, FakeTensor):
            return "inputs are fake tensors: no numbers to compare"
        if isinstance(t, torch.Tensor) and t.device.type == "meta":
            return "inputs or weights are on the meta device: no numbers to compare"
    return ""


def program_args(ep: ExportedProgram, user: Sequence[Any]) -> list[Any]:
    """The flat arguments of ``ep.graph_module``: lifted state in signature order, then the user's."""
    it = iter(user)
    out: list[Any] = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            out.append(next(it))
        elif spec.target in ep.state_dict:
            out.append(ep.state_dict[spec.target])
        else:
            out.append(ep.constants[spec.target])  # type: ignore[index]
    return out


def user_outputs(ep: ExportedProgram, out: Any) -> list[Any]:
    values = out if isinstance(out, (tuple, list)) else [out]
    return [v for v, s in zip(values, ep.graph_signature.output_specs, strict=False) if s.kind == OutputKind.USER_OUTPUT]


def run_program(ep: ExportedProgram, user: Sequence[Any]) -> list[Any]:
    """One forward of ``ep`` on the user's flat inputs; its user outputs."""
    with torch.no_grad():
        return user_outputs(ep, ep.graph_module(*program_args(ep, user)))


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return TOLERANCE.get(dtype, _DEFAULT_TOLERANCE)


def difference(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float, bool]:
    """(max abs, max rel, within tolerance) of ``got`` against ``want``."""
    if got.shape != want.shape:
        return float("inf"), float("inf"), False
    if not want.is_floating_point() and not want.is_complex():
        equal = bool(torch.equal(got, want))
        return (0.0, 0.0, True) if equal else (float("inf"), float("inf"), False)
    a, b = got.detach().double(), want.detach().double()
    both_nan = torch.isnan(a) & torch.isnan(b)
    diff = torch.where(both_nan, torch.zeros_like(a), (a - b).abs())
    diff = torch.nan_to_num(diff, nan=float("inf"))
    atol, rtol = tolerance(want.dtype)
    ok = bool((diff <= atol + rtol * b.abs()).all())
    max_abs = float(diff.max()) if diff.numel() else 0.0
    scale = b.abs()
    rel = torch.where(scale > 0, diff / scale.clamp_min(1e-300), torch.zeros_like(diff))
    return max_abs, float(rel.max()) if rel.numel() else 0.0, ok


def compare_outputs(got: Sequence[Any], want: Sequence[Any], names: Sequence[str], seconds: float) -> Numbers:
    outs: list[OutputError] = []
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        if not isinstance(g, torch.Tensor) or not isinstance(w, torch.Tensor):
            continue
        max_abs, max_rel, ok = difference(g, w)
        atol, rtol = tolerance(w.dtype) if w.is_floating_point() or w.is_complex() else (0.0, 0.0)
        outs.append(OutputError(names[i] if i < len(names) else f"output[{i}]", str(w.dtype).removeprefix("torch."),
                                max_abs, max_rel, ok, atol, rtol))
    return Numbers(outs, "" if outs else "no tensor outputs to compare", seconds)


def check(ep: ExportedProgram, user: Sequence[Any], want: Sequence[Any], names: Sequence[str]) -> Numbers:
    """Run ``ep`` and compare its outputs with ``want`` (eager's)."""
    t0 = time.perf_counter()
    got = run_program(ep, user)
    return compare_outputs(got, want, names, time.perf_counter() - t0)


class _Recorder(torch.fx.Interpreter):
    """Runs a graph module and keeps the values of the nodes in ``keep`` (detached)."""

    def __init__(self, gm: torch.fx.GraphModule, keep: set[str]) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.keep = keep
        self.values: dict[str, torch.Tensor] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        out = super().run_node(n)
        if n.name in self.keep:
            v = out[0] if isinstance(out, (tuple, list)) and out else out
            if isinstance(v, torch.Tensor):
                self.values[n.name] = v.detach()
        return out


def record(ep: ExportedProgram, user: Sequence[Any], keep: set[str]) -> dict[str, torch.Tensor]:
    rec = _Recorder(ep.graph_module, keep)
    with torch.no_grad():
        rec.run(*program_args(ep, user))
    return rec.values


def _shape(n: torch.fx.Node) -> Any:
    v = n.meta.get("val")
    v = v[0] if isinstance(v, (tuple, list)) and v else v
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def counterparts(before: ExportedProgram, after: ExportedProgram, links: Links) -> list[tuple[str, str]]:
    """(node of ``after``, node of ``before`` it stands for), in ``after``'s order."""
    old = {n.name: n for n in before.graph.nodes if n.op == "call_function"}
    rep: dict[str, str] = {}  # old node -> the last new node linked to it with its shape
    order: list[str] = []
    for n in after.graph.nodes:
        if n.op != "call_function":
            continue
        order.append(n.name)
        if n.name in links:
            for src, _ in links[n.name]:
                if src in old and _shape(old[src]) == _shape(n):
                    rep[src] = n.name
        elif n.name in old:
            rep[n.name] = n.name
    by_new: dict[str, str] = {}
    for src, new in rep.items():
        by_new.setdefault(new, src)
    return [(name, by_new[name]) for name in order if name in by_new]


def first_differing_node(before: ExportedProgram, after: ExportedProgram, links: Links,
                         user: Sequence[Any]) -> tuple[str, str, float] | None:
    """(node of ``after``, its counterpart in ``before``, max abs difference) for the first node
    whose value leaves tolerance; ``None`` when every compared node agrees."""
    pairs = counterparts(before, after, links)
    new_vals = record(after, user, {a for a, _ in pairs})
    old_vals = record(before, user, {b for _, b in pairs})
    for a, b in pairs:
        if a in new_vals and b in old_vals:
            max_abs, _, ok = difference(new_vals[a], old_vals[b])
            if not ok:
                return a, b, max_abs
    return None


__all__ = ["TOLERANCE", "check", "counterparts", "difference", "first_differing_node", "no_numbers", "program_args",
           "record", "run_program", "tolerance"]
