"""Kernel times from a synthetic torch.profiler record (no real timing): each kernel's time is the
median of its calls, and a kernel whose calls spread more than SPREAD times (OpenMP threads
contending on a loaded machine swing a tiny kernel's calls 1000x) gets a note saying its figure is
unreliable and what to do."""

from __future__ import annotations

from fxviz.analyze.inside.live import SPREAD, LiveRun
from fxviz.analyze.inside.result import Inside, InsideGraph, Kernel
from fxviz.analyze.pipeline.result import Pipeline
from fxviz.tracefile.records import Trace


def _timed(add_us: list[float], mm_us: list[float]) -> Inside:
    """One compiled graph with a C++ kernel and an extern mm, profiled over three iterations whose
    calls took ``add_us`` and ``mm_us`` (CPU time; no device)."""
    kernels = [Kernel("cpp_fused_add_0:1", "cpp_fused_add_0", "cpp", "graph 0", "0/0", "inference"),
               Kernel("extern_kernels.mm:2", "extern_kernels.mm", "extern", "graph 0", "0/0", "inference")]
    inside = Inside([InsideGraph("graph 0", "0/0", Pipeline("graph 0"), kernels=kernels)])
    live = LiveRun(profiled=3)
    # the output code has no file name here: fxviz names its C++ kernel ":cpp_fused_add_0"
    live.calls = [("None", [(":cpp_fused_add_0", a, 0.0), ("aten::mm", m, 0.0)]) for a, m in zip(add_us, mm_us, strict=True)]
    live.apply(Trace(), inside)
    return inside


def test_steady_kernel_times_give_no_note() -> None:
    inside = _timed([10.0, 12.0, 11.0], [40.0, 41.0, 60.0])
    assert [k.time_us for k in inside.kernels] == [11.0, 41.0]
    assert inside.timed and not any("unreliable" in n for n in inside.notes)


def test_calls_that_spread_widely_say_the_time_is_unreliable() -> None:
    inside = _timed([0.5, 600.0, 1.0], [40.0, 41.0, 60.0])
    assert inside.kernels[0].time_us == 1.0  # still the median call
    notes = [n for n in inside.notes if "unreliable" in n]
    assert len(notes) == 1
    assert "cpp_fused_add_0:1" in notes[0] and "extern_kernels.mm" not in notes[0]
    assert "1200x" in notes[0] and "torch.set_num_threads(1)" in notes[0] and "more kernel" not in notes[0]
    # just past the threshold for both: the worst is named, the other counted
    inside = _timed([1.0, 1.0, 1.0 * SPREAD * 1.5], [1.0, 1.0 * SPREAD * 1.1, 1.0])
    (note,) = [n for n in inside.notes if "unreliable" in n]
    assert "cpp_fused_add_0:1 and 1 more kernel(s)" in note and "30x" in note
    # a call measured at 0 us (below the profiler's resolution) does not divide by zero
    inside = _timed([0.0, 0.0, 0.0], [40.0, 40.0, 40.0])
    assert not any("unreliable" in n for n in inside.notes)
