"""Inside torch.compile on a live run: torch's structured trace of the compiled run, and each
kernel's time from torch.profiler over a few warm iterations. Needs torch.

:class:`LiveRun` is what ``compile_map(..., inside=True)`` hands its compiled run: the run goes on
inside :func:`fxviz.torchbridge.tracelog.structured_trace` (with C++ kernels named in the
profiler: ``torch._inductor.config.cpp.enable_kernel_profile``; AOT Autograd's cache off, so
every stage is recorded); with ``grad`` the first input
set's outputs are differentiated once (``torch.autograd.grad``: no ``.grad`` is written) so the
backward compiles too; then :data:`ITERATIONS` warm iterations run under the profiler. Inductor
names each compiled graph's call ``## Call CompiledFxGraph <FX graph cache key> ##``: its direct
children are the kernels (``graph_<n>_<kernel>``) and the extern calls (ATen ops, matched to the
output code's extern calls in call order).
"""

from __future__ import annotations

import contextlib
import re
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fxviz.analyze.inside.result import Inside, Kernel
from fxviz.tracefile.records import Trace

#: Warm iterations timed with torch.profiler (the issue allows at most 10).
ITERATIONS = 3
_CALL = re.compile(r"^## Call CompiledFxGraph (\S+) ##$")
_KERNEL = re.compile(r"^graph_\d+_(.+)$")
#: The name a C++ kernel records itself under in the profiler (``cpp.enable_kernel_profile``).
_PROFILED = re.compile(r'RAIIAtenRecordFunctionHandle\s+\w+\("([^"]+)"')


@dataclass
class LiveRun:
    """Collects a compiled run's structured trace and its kernels' profile."""

    grad: bool = False
    iterations: int = ITERATIONS
    events: list[Any] = field(default_factory=list)
    calls: list[tuple[str, list[tuple[str, float]]]] = field(default_factory=list)  # (key, children) per call
    device: dict[str, float] = field(default_factory=dict)  # device kernel name -> total us
    profiled: int = 0
    note: str = ""

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        from torch._functorch import config as functorch_config
        from torch._inductor import config as inductor_config

        from fxviz.torchbridge.tracelog import structured_trace

        # AOT Autograd's cache off: a hit skips the pre-grad, joint and partition stages (Inductor's
        # FX graph cache still serves the post-grad graph and the kernels)
        with structured_trace() as events, inductor_config.patch({"cpp.enable_kernel_profile": True}), \
                functorch_config.patch({"enable_autograd_cache": False}):
            self.events = events
            yield

    def backward(self, out: Any, leaves: Sequence[torch.Tensor]) -> None:
        """Differentiate the outputs once (without writing ``.grad``) so the backward compiles."""
        if not self.grad:
            return
        outs = [t for t in _tensors(out) if t.requires_grad and t.is_floating_point()]
        wrt = [t for t in leaves if t.requires_grad]
        if outs and wrt:
            torch.autograd.grad([t.sum() for t in outs], wrt, allow_unused=True)

    def profile(self, run: Callable[[], Any], leaves: Sequence[torch.Tensor]) -> None:
        """Run ``run`` (one forward, and a backward with ``grad``) warm under torch.profiler."""
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        try:
            self.backward(run(), leaves)  # one more warm-up: the backward's first run, lazy library set-up
            with profile(activities=acts) as prof:
                for _ in range(self.iterations):
                    self.backward(run(), leaves)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - the kernels are still mapped: say why they have no time
            self.note = f"kernel times not measured: torch.profiler failed: {type(e).__name__}: {e}"
            return
        self.profiled = self.iterations
        for ev in prof.events():
            m = _CALL.match(ev.name)
            if m:
                kids = sorted(ev.cpu_children, key=lambda k: k.time_range.start)
                self.calls.append((m.group(1), [(k.name, k.time_range.elapsed_us()) for k in kids]))
            elif getattr(ev, "device_type", None) is not None and "CUDA" in str(ev.device_type):
                self.device[ev.name] = self.device.get(ev.name, 0.0) + float(getattr(ev, "device_time", 0.0) or 0.0)

    def apply(self, trace: Trace, inside: Inside) -> None:
        """Write the measured times on ``inside``'s kernels (per forward, microseconds) and their
        share of their output code's time. A call belongs to the output code whose C++ kernels'
        profiler names (in their source: ``RAIIAtenRecordFunctionHandle``) it ran, else to the one
        whose FX graph cache key it carries."""
        if not self.profiled:
            if self.note:
                inside.notes.append(self.note)
            return
        inside.timed = True
        by_cid = {c.compile_id: c for c in trace.compiles if c.rank is None}  # a live run has no ranks
        parts: list[tuple[list[Kernel], set[str], str | None]] = []
        for g in inside.graphs:
            c = by_cid.get(g.compile_id)
            keys = [_key(a.payload) for a in c.artifacts if a.name.startswith("fx_graph_cache_")] if c else []
            for i, part in enumerate(dict.fromkeys(k.part for k in g.kernels)):
                rows = [k for k in g.kernels if k.part == part]
                names = {m for k in rows if k.kind != "extern" for m in _PROFILED.findall(k.source)}
                parts.append((rows, names, keys[i] if i < len(keys) else None))
        mine: list[list[list[tuple[str, float]]]] = [[] for _ in parts]
        for key, kids in self.calls:
            ran = {name for name, _ in kids}
            at = next((i for i, (_, names, _k) in enumerate(parts) if names & ran), None)
            if at is None:
                at = next((i for i, (_, names, k) in enumerate(parts) if k == key and key != "None"), None)
            if at is not None:
                mine[at].append(kids)
        for (rows, _, _), calls in zip(parts, mine, strict=True):
            _time(rows, calls, self.device, self.profiled)


def _key(payload: Any) -> str | None:
    import json

    if isinstance(payload, str):
        try:
            payload = json.loads(payload)
        except ValueError:
            return None
    return payload.get("key") if isinstance(payload, dict) else None


def _tail(name: str) -> str:
    parts = [p for p in name.split(".") if p not in ("default", "out", "Tensor")]
    return parts[-1] if parts else name


def _time(rows: list[Kernel], calls: list[list[tuple[str, float]]], device: dict[str, float], n: int) -> None:
    """Each row's time from the profiled calls of its output code (see the module's docstring)."""
    times: dict[str, list[float]] = {}
    for kids in calls:
        used: set[int] = set()
        for k in rows:
            if k.kind == "extern":
                want = _tail(k.name)
                i = next((i for i, (name, _) in enumerate(kids) if i not in used and not _KERNEL.match(name)
                          and name.split("::")[-1] == want), None)
            else:
                names = set(_PROFILED.findall(k.source)) or {k.name}
                i = next((i for i, (name, _) in enumerate(kids) if i not in used and name in names), None)
            if i is not None:
                used.add(i)
                times.setdefault(k.id, []).append(kids[i][1])
    # per forward: the median call (a machine shared with other work makes single calls slow) times
    # how often it ran per iteration
    per: dict[str, float] = {h: statistics.median(ts) * len(ts) / n for h, ts in times.items()}
    for k in rows:
        if k.kind == "triton" and k.name in device:
            per[k.id] = per.get(k.id, 0.0) + device[k.name] / n
    whole = sum(per.values())
    for k in rows:
        if k.id in per:
            k.time_us = per[k.id]
            k.share = per[k.id] / whole if whole else None


def _tensors(out: Any) -> list[torch.Tensor]:
    from torch.utils import _pytree as pytree

    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


__all__ = ["ITERATIONS", "LiveRun"]
