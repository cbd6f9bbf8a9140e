"""Inside torch.compile on a live run: torch's structured trace of the compiled run, and each
kernel's time from torch.profiler over a few warm iterations. Needs torch.

:class:`LiveRun` is what ``compile_map(..., inside=True)`` hands its compiled run: the run goes on
inside :func:`fxviz.torchbridge.tracelog.structured_trace` (AOT Autograd's cache off, so every
stage is recorded; torch's module of each post-grad node written into it,
:func:`fxviz.torchbridge.modulerecord.recorded_modules`; ``budget``, when given, as
``torch._functorch.config.activation_memory_budget``; Inductor's fusion decisions collected
too); with ``grad`` the first input set's outputs are differentiated once
(``torch.autograd.grad``: no ``.grad`` is written) so the backward compiles too; then one more
warm-up and :data:`ITERATIONS` warm iterations under the profiler, each C++ kernel wrapped for
the while in a ``record_function`` named ``<output code file>:<kernel>``. Inductor names each
compiled graph's call ``## Call CompiledFxGraph <FX graph cache key> ##``: its direct children are
those kernels and the extern calls (ATen ops, matched to the output code's extern calls in call
order); each kernel's time is the median of its calls. On CUDA the time is the device's: a call's
kernels (the Triton launcher's own ``record_function``, named as the kernel) and extern ATen ops
count the GPU time of the device kernels they launched (``device_time_total``), not their launch.
A kernel whose calls' times spread more than :data:`SPREAD` times gets a note: its figure is
contention, not the kernel.
"""

from __future__ import annotations

import contextlib
import re
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fxviz.analyze.inside.result import Inside, Kernel
from fxviz.tracefile.code import ONE_OP
from fxviz.tracefile.records import Trace

#: Warm iterations timed with torch.profiler (the issue allows at most 10).
ITERATIONS = 3
_CALL = re.compile(r"^## Call CompiledFxGraph (\S+) ##$")
#: A kernel whose slowest call took this many times its fastest has a time that says little: on a
#: loaded machine (or with OpenMP threads contending on a few cores) a tiny kernel's calls swing 1000x.
SPREAD = 20.0
#: The profiler's resolution (us): a call measured at 0 counts as this for the spread.
_RESOLUTION_US = 0.001
#: Kernels whose slowest call is under this (us) are left out: there the profiler's own overhead is the spread.
_FLOOR_US = 1.0


@dataclass
class LiveRun:
    """Collects a compiled run's structured trace and its kernels' profile."""

    grad: bool = False
    budget: float | None = None  # torch._functorch.config.activation_memory_budget for the run
    iterations: int = ITERATIONS
    events: list[Any] = field(default_factory=list)
    # (FX graph cache key, children) per call; a child: (name, CPU us, device us)
    calls: list[tuple[str, list[tuple[str, float, float]]]] = field(default_factory=list)
    device: dict[str, float] = field(default_factory=dict)  # device kernel name -> total us
    profiled: int = 0
    note: str = ""

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        from torch._functorch import config as functorch_config

        from fxviz.torchbridge.modulerecord import recorded_modules
        from fxviz.torchbridge.tracelog import structured_trace

        # AOT Autograd's cache off: a hit skips the pre-grad, joint and partition stages (Inductor's
        # FX graph cache still serves the post-grad graph and the kernels)
        patch: dict[str, Any] = {"enable_autograd_cache": False}
        if self.budget is not None:
            patch["activation_memory_budget"] = self.budget
        with structured_trace(fusion=True) as events, functorch_config.patch(patch), recorded_modules():
            self.events = events
            yield

    def backward(self, out: Any, leaves: Sequence[torch.Tensor]) -> None:
        """Differentiate the outputs once (without writing ``.grad``) so the backward compiles."""
        if self.grad:
            differentiate(out, leaves)

    def profile(self, run: Callable[[], Any], leaves: Sequence[torch.Tensor]) -> None:
        """Run ``run`` (one forward, and a backward with ``grad``) warm under torch.profiler."""
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        restore = self._name_kernels()
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
        finally:
            restore()
        self.profiled = self.iterations
        for ev in prof.events():
            m = _CALL.match(ev.name)
            if m:
                kids = sorted(ev.cpu_children, key=lambda k: k.time_range.start)
                self.calls.append((m.group(1), [(k.name, k.time_range.elapsed_us(), _device_us(k)) for k in kids]))
            elif getattr(ev, "device_type", None) is not None and "CUDA" in str(ev.device_type):
                self.device[ev.name] = self.device.get(ev.name, 0.0) + float(getattr(ev, "device_time", 0.0) or 0.0)

    def _name_kernels(self) -> Callable[[], None]:
        """Make each C++ kernel of the run's output code show in the profiler under
        ``<output code file>:<kernel>`` (its module's global, wrapped in a ``record_function``; put
        back by the function returned). Not Inductor's ``cpp.enable_kernel_profile``: that
        compiles every kernel with one more header (+35% CPU on ResNet-18's compile)."""
        from torch._inductor.codecache import PyCodeCache

        from fxviz.tracefile.code import parse_output_code

        loaded = [*getattr(PyCodeCache, "modules", ()), *list(sys.modules.values())]  # caches off: sys.modules only
        by_file = {getattr(m, "__file__", None): m for m in loaded}
        undo: list[tuple[dict[str, Any], str, Any]] = []
        for meta, payload in self.events:
            head = meta.get("inductor_output_code")
            if not isinstance(head, dict) or not isinstance(payload, str):
                continue
            mod = by_file.get(head.get("filename")) or by_file.get(head.get("file_path"))
            if mod is None:
                continue
            stem = _stem(head.get("filename"))
            try:
                kernels = parse_output_code(payload).kernels
            except Exception:  # noqa: BLE001 - build() notes the code it cannot read; no times here
                continue
            for k in kernels:
                fn = mod.__dict__.get(k.name)
                if k.kind == "cpp" and callable(fn):
                    mod.__dict__[k.name] = _recorded(fn, f"{stem}:{k.name}")
                    undo.append((mod.__dict__, k.name, fn))

        def restore() -> None:
            for globs, name, fn in undo:
                globs[name] = fn

        return restore

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
        by_cid = {c.label: c for c in trace.compiles}  # a fake process group's run has rank 0
        parts: list[tuple[list[Kernel], set[str], str | None]] = []
        stems: list[str] = []
        for g in inside.graphs:
            c = by_cid.get(g.compile_id)
            keys = [_key(a.payload) for a in c.artifacts if a.name.startswith("fx_graph_cache_")] if c else []
            codes = c.all("inductor_output_code") if c else []
            for i, part in enumerate(dict.fromkeys(k.part for k in g.kernels)):
                rows = [k for k in g.kernels if k.part == part]
                stem = _stem(codes[i].meta.get("filename")) if i < len(codes) else ""
                names = {f"{stem}:{k.name}" if k.kind == "cpp" else k.name for k in rows if k.kind not in ONE_OP}
                parts.append((rows, names, keys[i] if i < len(keys) else None))
                stems.append(stem)
        mine: list[list[list[tuple[str, float, float]]]] = [[] for _ in parts]
        for key, kids in self.calls:
            ran = {name for name, *_ in kids}
            # the output code whose kernels ran (C++ ones as fxviz names them, Triton ones as their
            # launcher does: those names repeat between output codes, so the closest set wins)
            fits = [(len(names & ran) - len(names - ran), i) for i, (_, names, _k) in enumerate(parts) if names & ran]
            at = max(fits)[1] if fits else None
            if at is None:
                at = next((i for i, (_, names, k) in enumerate(parts) if k == key and key != "None"), None)
            if at is None:  # no C++ kernel and no cache key (caches off): the extern calls it made, in order
                ext = [name.split("::")[-1] for name, *_ in kids if "::" in name]
                at = next((i for i, (rows, _, _k) in enumerate(parts)
                           if [_tail(r.name) for r in rows if r.kind == "extern"] == ext and ext), None)
            if at is not None:
                mine[at].append(kids)
        spread: list[tuple[float, str, float, float]] = []
        for (rows, _, _), calls, stem in zip(parts, mine, stems, strict=True):
            spread.extend(_time(rows, calls, self.device, self.profiled, stem))
        if spread:
            inside.notes.append(spread_note(spread))
        if self.calls and not any(k.time_us is not None for g in inside.graphs for k in g.kernels):
            inside.notes.append(f"kernel times not measured: none of the {len(self.calls)} profiled calls of a "
                                "compiled graph could be told apart by its kernels or cache key")


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


def _stem(path: Any) -> str:
    """The output code's file name without its folder and suffix: what names its kernels."""
    return str(path or "").rsplit("/", 1)[-1].removesuffix(".py")


def _recorded(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.autograd.profiler.record_function(name):
            return fn(*args, **kwargs)

    return run


def _device_us(ev: Any) -> float:
    """GPU time of the device kernels an op launched (0 without a device in the profile)."""
    try:
        return float(ev.device_time_total or 0.0)
    except Exception:  # noqa: BLE001 - an event kind without device time
        return 0.0


def spread_note(spread: list[tuple[float, str, float, float]]) -> str:
    """One line on the kernels whose calls' times spread widely: (max/min, kernel id, min us, max us)."""
    spread = sorted(spread, reverse=True)
    ratio, worst, low, high = spread[0]
    more = f" and {len(spread) - 1} more kernel(s)" if len(spread) > 1 else ""
    return (f"kernel times unreliable: the calls of {worst}{more} took from {low:.3g} to {high:.3g} us ({ratio:.0f}x; "
            f"more than {SPREAD:.0f}x is contention, not the kernel: a busy machine, or OpenMP threads on few cores); "
            "time again with torch.set_num_threads(1) or on a quieter machine")


def _time(rows: list[Kernel], calls: list[list[tuple[str, float, float]]], device: dict[str, float], n: int,
          stem: str) -> list[tuple[float, str, float, float]]:
    """Each row's time from the profiled calls of its output code (see the module's docstring):
    the device time of what the call launched where there is one, else the CPU time. Returns the
    kernels whose calls spread more than :data:`SPREAD` times: (max/min, id, min us, max us)."""
    times: dict[str, list[float]] = {}
    for kids in calls:
        used: set[int] = set()
        for k in rows:
            if k.kind in ONE_OP:  # an ATen op or a collective, named as the profiler names it
                want = {_tail(k.name)}
                i = next((i for i, (name, *_) in enumerate(kids) if i not in used and name.split("::")[-1] in want),
                         None)
            else:  # a C++ kernel as fxviz names it, a Triton kernel as its launcher does
                want = {f"{stem}:{k.name}", k.name}
                i = next((i for i, (name, *_) in enumerate(kids) if i not in used and name in want), None)
            if i is not None:
                used.add(i)
                _, cpu, dev = kids[i]
                times.setdefault(k.id, []).append(dev if dev > 0 else cpu)
    # per forward: the median call (a machine shared with other work makes single calls slow) times
    # how often it ran per iteration
    per: dict[str, float] = {h: statistics.median(ts) * len(ts) / n for h, ts in times.items()}
    for k in rows:  # a Triton kernel launched without its own record (older torch): by name, all calls
        if k.kind == "triton" and k.id not in per and k.name in device:
            per[k.id] = device[k.name] / n
    whole = sum(per.values())
    for k in rows:
        if k.id in per:
            k.time_us = per[k.id]
            k.share = per[k.id] / whole if whole else None
    spread = [(max(ts) / max(min(ts), _RESOLUTION_US), h, min(ts), max(ts)) for h, ts in times.items()
              if len(ts) > 1 and max(ts) >= _FLOOR_US]
    return [x for x in spread if x[0] > SPREAD]


def _tensors(out: Any) -> list[torch.Tensor]:
    from torch.utils import _pytree as pytree

    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def differentiate(out: Any, leaves: Sequence[torch.Tensor]) -> None:
    """The sum of each floating output that requires grad, differentiated once with respect to
    ``leaves`` (``torch.autograd.grad``: no ``.grad`` is written)."""
    outs = [t for t in _tensors(out) if t.requires_grad and t.is_floating_point()]
    wrt = [t for t in leaves if t.requires_grad]
    if outs and wrt:
        torch.autograd.grad([t.sum() for t in outs], wrt, allow_unused=True)


__all__ = ["ITERATIONS", "SPREAD", "LiveRun", "differentiate", "spread_note"]
