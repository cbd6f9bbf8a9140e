"""Inside torch.compile: Inductor's stages per compiled graph, every generated kernel and extern
call mapped to the eager ops and modules it runs, and what compiling cost, all from torch's own
structured trace.

``build`` (:mod:`.build`, no torch) reads a :class:`~fxviz.tracefile.records.Trace` (a live run's
or a saved ``TORCH_TRACE`` directory's); ``live`` (:mod:`.live`, torch) records a compiled run and
times its kernels with torch.profiler and collects Inductor's fusion decisions (:mod:`.fusion` puts
its refusals on the kernels); ``overlay`` writes the ``kernel`` and ``kernel time``
overlays and the ``kernels``, ``not fused``, ``stages`` and ``compile cost`` panels on the eager graph;
``partition`` (no torch) reads a training step's forward/backward partition (what the backward saves
and recomputes) and ``backward`` the modules of the backward's kernels. The
result (:class:`Inside`) is plain data riding on the compile map:

    >>> cm = fxviz.compile_map(model, (x,), backend="inductor", inside=True)
    >>> print(cm.inside.summary())
    1 compiled graph, 3 kernels and calls (2 extern), 100% of post-grad ops mapped to a kernel
"""

from __future__ import annotations

from fxviz.analyze.inside.result import Cost, Inside, InsideGraph, Kernel

__all__ = ["Cost", "Inside", "InsideGraph", "Kernel"]
