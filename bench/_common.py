"""Shared helpers for the bench scripts: thread pinning, timing, tables, model builders."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def pin_threads(n: int) -> None:
    """Pin torch (and the BLAS/OpenMP pools it starts) to ``n`` threads before any work."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, str(n))
    import torch

    torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # already set when torch did work before
        torch.set_num_interop_threads(n)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    return timed_cpu(fn)[::2]


def timed_cpu(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """Wall and process CPU seconds of ``fn()`` (after a gc.collect(), which is not timed), and its result."""
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    t1, c1 = time.perf_counter(), time.process_time()
    return t1 - t0, c1 - c0, out


def round_robin(
    fns: dict[str, Callable[[], Any]], reps: int, warmup: int = 1, cpu: dict[str, list[float]] | None = None
) -> dict[str, list[float]]:
    """Run every function ``warmup`` times, then ``reps`` rounds in which each runs once, in turn, so
    that the machine's drift hits all of them alike (the order alternates between rounds). Wall
    times are returned; the process's CPU times (``time.process_time``: blind to time spent waiting
    for a core on a shared machine) go to ``cpu`` when given. Returns the timings of the measured rounds."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    for i in range(reps):
        for k in order if i % 2 == 0 else reversed(order):  # alternate, so no one always goes first
            wall, cpu_s, _ = timed_cpu(fns[k])
            times[k].append(wall)
            if cpu is not None:
                cpu.setdefault(k, []).append(cpu_s)
    return times


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def fmt_s(x: float | None) -> str:
    if x is None:
        return "n/a"
    if x < 1:
        return f"{x * 1e3:.3g} ms"
    return f"{x:.3g} s"



def callgrind_count(script: str, model_name: str, part: str, reps: int, layers: int) -> int:
    """Instructions per call of ``part``: ``script --child MODEL PART REPS LAYERS`` under callgrind,
    collecting only inside ``functools.reduce`` (the child calls the part ``reps`` times through it)."""
    import re
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        proc = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--toggle-collect=functools_reduce",
             sys.executable, script, "--child", model_name, part, str(reps), str(layers)],
            capture_output=True, text=True, check=False,
        )
    m = re.search(r"Collected : (\d+)", proc.stderr)
    if proc.returncode != 0 or m is None:
        raise SystemExit(f"callgrind failed on {model_name} {part}: {proc.stderr[-2000:]}")
    return int(m.group(1)) // reps

def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


def environment() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def write_json(path: str | None, data: dict[str, Any]) -> None:
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=2, default=str)
    print(f"\nwrote {path}", file=sys.stderr)


def quiet_transformers() -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import warnings

    warnings.filterwarnings("ignore")
    try:
        from transformers.utils import logging

        logging.set_verbosity_error()
    except ImportError:
        pass


def build_cnn() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """The built-in CNN example as ``(model, args, kwargs)``."""
    import fxviz.examples

    model, args = fxviz.examples.cnn()
    return model, args, {}


def build_gpt2() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """GPT-2 small (:func:`gpt2`) as ``(model, args, kwargs)``."""
    model, args = gpt2()
    return model, args, {}


def gpt2(n_layer: int = 12, seq: int = 128, device: str = "cpu") -> tuple[Any, tuple[Any, ...]]:
    """GPT-2 small from its default config (random weights), ``input_ids`` of shape (1, seq)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=n_layer)
    with torch.device(device):
        model = GPT2LMHeadModel(cfg).eval()
        ids = torch.randint(0, cfg.vocab_size, (1, seq))
    return model, (ids,)


def build_gpt2_checked() -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """GPT-2 small behind a check on tensor data (``torch._check`` on a count of end-of-text tokens,
    as LLaVA checks its image tokens): export defers it to a runtime assertion, so fxviz's
    ``validate`` must run the program once on the inputs to confirm it."""
    import torch
    from torch import nn

    class Checked(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor) -> Any:
            n = (input_ids == 50256).sum().item()
            torch._check(n == 0, lambda: "no end-of-text token inside the prompt")
            return self.inner(input_ids)

    model, args = gpt2()
    return Checked(model).eval(), args, {}
