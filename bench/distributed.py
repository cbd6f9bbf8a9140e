"""Capturing tensor-parallel models under a fake process group (issue 22).

    PYTHONPATH=$PWD python bench/distributed.py [--reps 5] [--layers 80] [--hidden 256[,512,...]] [--instructions [PARTS]]

1. A TP-sharded LLaMA-shaped decoder (small: 4 layers, hidden 256, MLP 2x hidden; ``--hidden``
   scales both, several sizes comma-separated) at world size 8 against the same model unsharded:
   process CPU time, interleaved repetitions, medians, ratio (target <= 1.5x); beside it the same
   capture recording through ``CommDebugMode`` (the recorder fxviz used before its own light one).
   The ratio is taken apart: torch's own cost (each forward alone, under ``no_grad`` as a capture
   runs it) and fxviz's added cost on each (capture minus forward), per op recorded. At hidden 256
   DTensor's forward alone costs about as much as the whole unsharded capture (1.0-1.1x: its
   dispatch, sharding propagation and ``from_local``/``redistribute`` are Python), and the sharded
   model records 142 ops to the unsharded 98 (``view_as`` of each ``from_local``, the
   all-reduces); so <= 1.5x leaves fxviz 0.4-0.5x its per-op cost on the unsharded model (it
   takes about 1.4x): the target as written is not one fxviz can meet at that size, and the
   figure fxviz controls is the per-op ratio of the added costs. The fake group runs rank 0's
   shard only: each sharded linear computes an eighth of the unsharded one, so the capture ratio
   falls as the model grows (about 1.7x at hidden 512, 1.5x at 1024, 0.2x at 4096) and says
   little there; at 1024 and up the forwards' own noise is larger than fxviz's added cost. Beside
   them, DTensor's forward under a dispatch mode that does nothing (:class:`PassThrough`): what
   recording collectives at the dispatcher would cost if the mode stayed on for the whole forward
   (+9.7 ms on 23.9 at hidden 256, this stop); fxviz's is on only for calls that may issue one, and
   the capture's floor (no recorder at all) is within 2 ms of it.
2. The LLaMA-70B shape (hidden 8192, 80 layers, 64 heads, 8 KV heads, MLP 28672, vocab 128256) on
   meta, sharded 8 ways: time and peak memory (target < 30 s, < 2 GB).
3. CommDebugMode alone on the same sharded model, for comparison: its time and its counts.

``--instructions`` instead counts instructions (valgrind's callgrind, as ``bench/instructions.py``:
a figure a loaded machine does not move) per call of each part of part 1: the unsharded capture
and forward, the sharded capture, its floor (recording no collectives) and the sharded forward;
with the four of them, the same decomposition, and each part's process CPU run natively and its
instruction rate. Counted so, the sharded capture at hidden 256 is 1.36x the unsharded one (73.8 M
against 54.4 M), while process CPU time says 2.1-2.3x. The gap is torch's forward, not fxviz, and
nothing callgrind misses: the two forwards alone run the same instructions (29.7 M sharded, 29.4 M
unsharded) but the sharded one takes 2.8-3.1x the CPU. Where that CPU goes (printed by part 1,
issue 22's third round): all of it is user time of the one thread that runs the forward (system
time 0-0.1 ms, other threads 0.0 ms: the fake group starts none that works, and
``torch.set_num_threads(1)``), 1-13 minor page faults per call, no collection inside either
forward. What differs is what the instructions are. The unsharded forward's linears alone (part 1
prints them: ``F.linear`` on the same weights) take 6.1-6.4 of its 8.8-9.0 ms, and callgrind counts
24.4 M instructions for them (of the forward's 29.4 M): MKL's sgemm at 4-5.7 G instructions/s
(``perf record -e cpu-clock`` on the forward, its samples minus a run without the loop: 6.6 of
16.5 ms in ``mkl_blas_def_sgemm_kernel_0_zen`` and its packing). The sharded forward's linears are
an eighth of that (1.1 ms); the rest of its 19-20 ms is dispatch: ``libpython`` 12.7 of 24.4 ms
sampled, ``libtorch_python`` (pybind11, argument parsing) 3.5, malloc 1.2; 7,286 Python calls per
forward (2,804 in ``torch.distributed``) against the unsharded forward's 290, at 1.4-1.9 G
instructions/s, as the unsharded forward's own non-BLAS part (5 M instructions in 2.6-2.9 ms). Not
Python's rate as such: a tight loop of attribute reads and small objects runs 7.6-8 G
instructions/s here. Callgrind's cache and branch simulation (``--cache-sim=yes --branch-sim=yes``,
per forward; the machine exposes no hardware counters) says what the dispatch code pays: the two
forwards run 29.4 M and 29.7 M instructions with the same data-cache misses (0.76 M and 0.70 M L1),
but the sharded one executes 4.2 M branches against 0.92 M, mispredicts 0.80 M against 0.11 M
(0.36 M of them indirect: calls through the interpreter, pybind11 and the dispatcher, against 0.05
M) and misses the instruction cache 0.95 M times against 0.18 M. At some 15-20 cycles a
mispredict and 10-20 an L1i miss served from L2, that is 8-11 ms at 2.45 GHz: the sharded
forward's whole gap (19-20 ms against 8.8-9.0 for the same instructions). So instructions weigh a dispatcher's instruction as one of
sgemm's FMAs of eight floats, and understate torch's share of the CPU time the target is stated
in; fxviz's added work is dispatch-like Python on both models, at 1.5-2.7 G instructions/s.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils._python_dispatch import TorchDispatchMode

import fxviz
import fxviz.fallback.comms as comms
from fxviz.passes.comm import collectives
from fxviz.torchbridge.distributed import fake_world


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, kv: int) -> None:
        super().__init__()
        self.hd = d // heads
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, kv * self.hd, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.hd).transpose(1, 2)
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(a.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, d: int, ff: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, ff, bias=False)
        self.up_proj = nn.Linear(d, ff, bias=False)
        self.down_proj = nn.Linear(ff, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, d: int, heads: int, kv: int, ff: int) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(d)
        self.self_attn = Attention(d, heads, kv)
        self.post_attention_layernorm = nn.RMSNorm(d)
        self.mlp = MLP(d, ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int, kv: int, ff: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Layer(d, heads, kv, ff) for _ in range(layers))
        self.norm = nn.RMSNorm(d)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def shard(model: Decoder) -> Decoder:
    """Tensor parallel over every rank (Megatron style: colwise in, rowwise out)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.layers:
        parallelize_module(layer, mesh, {
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel(),
        })
    return model


SMALL = {"vocab": 1000, "d": 256, "layers": 4, "heads": 8, "kv": 8, "ff": 512}
L70B = {"vocab": 128256, "d": 8192, "layers": 80, "heads": 64, "kv": 8, "ff": 28672}


def small(hidden: int = SMALL["d"]) -> dict[str, int]:
    """The small decoder's shape at ``hidden`` (MLP twice as wide, as the default's 256 -> 512)."""
    return {**SMALL, "d": hidden, "ff": 2 * hidden}


def small_sharded(hidden: int = SMALL["d"]) -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return shard(Decoder(**small(hidden))), (torch.randint(0, 1000, (2, 16)),)


def llama70b(layers: int = 80) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The 70B shape on meta, sharded over every rank: no memory for weights is taken."""
    with torch.device("meta"):
        model = Decoder(**{**L70B, "layers": layers})
    return shard(model), (torch.zeros(1, 128, dtype=torch.long, device="meta"),)


class CommDebugRecorder(CommDebugMode):  # type: ignore[misc]
    """The previous recorder: ``CommDebugMode`` (module hooks, every op inspected) keeping records."""

    def __init__(self, params: object = None) -> None:  # the light recorder's signature
        super().__init__()
        self.records: list[dict[str, object]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        before = sum(self.comm_counts.values())
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is not NotImplemented and sum(self.comm_counts.values()) > before:
            op = str(func._overloadpacket)
            group, size = comms._group(tuple(args), dict(kwargs or {}))
            self.records.append({"op": op, "kind": comms._kind(op), "group": group, "group_size": size,
                                 "bytes": comms._bytes(args[0]) if args else 0, "phase": "forward",
                                 "module": self.advanced_module_tracker.name.partition(".")[2],
                                 "source": comms._user_line()})
        return out


class PassThrough(TorchDispatchMode):
    """A dispatch mode that does nothing (DTensor desugars, every op runs as it is): what being a
    dispatch mode at all costs DTensor's forward, which any recorder of its collectives at the
    dispatcher (fxviz's, CommDebugMode) pays before doing anything."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if DTensor in types:
            return NotImplemented
        return func(*args, **(kwargs or {}))


def _under_mode(model: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
    with torch.no_grad(), PassThrough():
        model(*args)


class NoRecorder(contextlib.nullcontext):  # type: ignore[type-arg]
    """Records nothing: the sharded capture's floor (the tracer on DTensor's dispatch)."""

    records: list[dict[str, object]] = []

    def __init__(self, params: object = None) -> None:
        super().__init__()


def old_capture(model: nn.Module, args: tuple[torch.Tensor], recorder: type = CommDebugRecorder) -> None:
    light, comms.CommRecorder = comms.CommRecorder, recorder  # type: ignore[misc]
    try:
        fxviz.capture(model, args, world_size=8)
    finally:
        comms.CommRecorder = light  # type: ignore[misc]


#: [process CPU, this thread's CPU] summed over every :func:`cpu` call: what other threads took
OTHER_THREADS = [0.0, 0.0]

#: part -> summed [process CPU, user, system, other threads, minor faults, gc time, calls] of its
#: :func:`cpu` calls: where process CPU time goes (what instructions do not show)
USAGE: dict[str, list[float]] = {}

#: [seconds in Python's garbage collector, collection start]
_GC = [0.0, 0.0]


def _gc_timer(phase: str, info: dict[str, object]) -> None:
    if phase == "start":
        _GC[1] = time.perf_counter()
    else:
        _GC[0] += time.perf_counter() - _GC[1]


def cpu(fn: object, part: str | None = None) -> float:
    """Process CPU time of ``fn()``; with ``part``, its user and system time, other threads' CPU,
    minor page faults and collections are added up under that name (:data:`USAGE`)."""
    r, g = resource.getrusage(resource.RUSAGE_SELF), _GC[0]
    t, th = time.process_time(), time.thread_time()
    fn()  # type: ignore[operator]
    dt = time.process_time() - t
    own = time.thread_time() - th
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    OTHER_THREADS[0] += dt
    OTHER_THREADS[1] += own
    if part is not None:
        acc = USAGE.setdefault(part, [0.0] * 7)
        for i, v in enumerate((dt, r1.ru_utime - r.ru_utime, r1.ru_stime - r.ru_stime, max(0.0, dt - own),
                               r1.ru_minflt - r.ru_minflt, _GC[0] - g, 1)):
            acc[i] += v
    return dt


def usage_lines() -> list[str]:
    """Per part, per call: user and system CPU, other threads, minor faults, gc (then cleared)."""
    lines = ["  where process CPU goes, per call (getrusage user/sys, other threads = process - this thread's "
             "CPU, minor page faults, time in gc.callbacks' collections):"]
    for part, (dt, user, system, others, faults, gcs, n) in USAGE.items():
        lines.append(f"    {part:24s} {dt / n * 1e3:6.1f} ms: user {user / n * 1e3:6.1f}, sys {system / n * 1e3:4.1f}, "
                     f"other threads {others / n * 1e3:4.1f}, faults {faults / n:5.1f}, gc {gcs / n * 1e3:4.2f} ms")
    USAGE.clear()
    return lines


def python_calls(fn: object) -> tuple[int, int, int, int]:
    """Python function calls of ``fn()`` (sys.setprofile): all, in ``torch.distributed``, in fxviz,
    and calls of C functions from Python: how much of a run is interpreted Python."""
    calls = [0, 0, 0, 0]

    def prof(frame: object, event: str, arg: object) -> None:
        if event == "call":
            name = frame.f_code.co_filename  # type: ignore[attr-defined]
            calls[0] += 1
            calls[1] += f"torch{os.sep}distributed{os.sep}" in name
            calls[2] += f"{os.sep}fxviz{os.sep}" in name
        elif event == "c_call":
            calls[3] += 1
    sys.setprofile(prof)
    try:
        fn()  # type: ignore[operator]
    finally:
        sys.setprofile(None)
    return calls[0], calls[1], calls[2], calls[3]


#: the parts ``--instructions`` counts, by name (each runs inside the fake group)
PARTS = ("unsharded", "unsharded_forward", "sharded", "floor", "sharded_forward")


@contextlib.contextmanager
def _parts(hidden: int) -> Iterator[dict[str, Callable[[], object]]]:
    """The parts ``--instructions`` counts, by name, ready to run inside the fake group."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    plain, plain_args = Decoder(**small(hidden)), (torch.randint(0, 1000, (2, 16)),)
    with fake_world(8):
        sharded, args = small_sharded(hidden)
        yield {"unsharded": lambda: fxviz.capture(plain, plain_args, method="eager"),
               "unsharded_forward": lambda: _no_grad(plain, plain_args),
               "sharded": lambda: fxviz.capture(sharded, args, world_size=8),
               "floor": lambda: old_capture(sharded, args, NoRecorder),
               "sharded_forward": lambda: _no_grad(sharded, args)}


def _part(name: str, hidden: int) -> None:
    """Run part ``name`` under callgrind's collection (this process is the one valgrind runs)."""
    with _parts(hidden) as fns:
        fn = fns[name]
        for _ in range(2):
            fn()
        functools.reduce(lambda acc, _: fn(), range(3), None)


def _rates(names: list[str], hidden: int, reps: int = 9) -> dict[str, float]:
    """Process CPU seconds per call of each part, natively (interleaved, median): what the counted
    instructions take on this machine."""
    with _parts(hidden) as fns:
        for name in names:
            fns[name]()
        times: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(reps):
            for name in names:
                times[name].append(cpu(fns[name]))
    return {name: statistics.median(t) for name, t in times.items()}


def _no_grad(model: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
    """The forward as a capture runs it: under ``no_grad`` (with autograd recording, DTensor's
    from_local/redistribute Functions cost about twice as much)."""
    with torch.no_grad():
        model(*args)


def _matmuls(model: nn.Module, tokens: int) -> Callable[[], None]:
    """The forward's linears alone, on this rank's weights (a DTensor's local shard) and inputs of
    their shapes: the part of torch's cost that is BLAS (MKL's sgemm), the rest being dispatch."""
    weights = []
    for m in model.modules():
        if isinstance(m, nn.Linear):
            w = m.weight.detach()
            w = w.to_local() if isinstance(w, DTensor) else w
            weights.append((torch.randn(tokens, w.shape[1]), w))

    def run() -> None:
        with torch.no_grad():
            for x, w in weights:
                F.linear(x, w)
    return run


def _ops(graph: fxviz.Graph) -> int:
    return sum(n.kind == "op" for n in graph.nodes)


def op_counts(hidden: int) -> tuple[int, int]:
    """The ops each capture records (unsharded, sharded): what the added cost is divided by."""
    torch.manual_seed(0)
    plain, plain_args = Decoder(**small(hidden)), (torch.randint(0, 1000, (2, 16)),)
    with fake_world(8):
        sharded, args = small_sharded(hidden)
        return (_ops(fxviz.capture(plain, plain_args, method="eager")),
                _ops(fxviz.capture(sharded, args, world_size=8)))


def decomposition(b: float, t: float, pf: float, f: float, ops: tuple[int, int], unit: str) -> list[str]:
    """The ratio taken apart: torch's own cost (the two forwards alone, no fxviz) and fxviz's added
    cost on each (its capture minus its forward), per op recorded; and what <= 1.5x leaves fxviz.
    The ``lower bound`` row: DTensor's sharded forward alone (no fxviz) plus fxviz's added cost on
    the unsharded model (its capture minus its forward), as a ratio to the unsharded capture: a
    tracer that adds to the sharded forward no less than it adds to the unsharded one (which records
    fewer ops) cannot go below it; the row says how far the TP x8 capture is from it.
    ``unit``: ``ms`` or ``M`` (instructions); per op in ``us`` or ``k``."""
    small_unit = {"ms": "us", "M": "k"}[unit]
    add_b, add_t = b - pf, t - f
    per_b, per_t = add_b / ops[0], add_t / ops[1]
    room = 1.5 * b - f  # what fxviz may add to the sharded forward within the target
    bound = f + add_b  # DTensor's forward plus the whole of what fxviz adds to the unsharded one
    lines = [
        f"  torch's own cost (the forwards under no_grad, as a capture runs them): unsharded {pf:.1f} {unit}, "
        f"sharded (DTensor) {f:.1f} {unit}: {f / b:.2f}x the unsharded capture, {f / pf:.2f}x its forward",
        f"  fxviz's added cost (capture minus forward): unsharded {add_b:.1f} {unit} over {ops[0]} ops "
        f"({per_b * 1e3:.0f} {small_unit} per op), sharded {add_t:.1f} {unit} over {ops[1]} ops "
        f"({per_t * 1e3:.0f} {small_unit} per op): per op sharded/unsharded {per_t / per_b:.2f}x (the figure fxviz controls)",
        f"  lower bound (DTensor's forward + the unsharded capture's added cost): {bound:.1f} {unit}, {bound / b:.2f}x "
        f"the unsharded capture; the TP x8 capture is {t / b:.2f}x, {t / bound:.2f}x the bound",
    ]
    if room <= 0:
        lines.append(f"  verdict: DTensor's forward alone is {f / b:.2f}x the unsharded capture: no capture of it "
                     "meets <= 1.5x at this size, whatever fxviz adds")
    else:
        lines.append(f"  verdict: <= 1.5x leaves fxviz {room:.1f} {unit} on the sharded model ({room / ops[1] * 1e3:.0f} "
                     f"{small_unit} per op, {room / ops[1] / per_b:.2f}x its per-op cost on the unsharded one): "
                     f"{'met' if t <= 1.5 * b else 'not met'}")
    return lines


def instructions(parts: list[str], hidden: int) -> None:
    got = {}
    for name in parts:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "callgrind.out")
            proc = subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--toggle-collect=functools_reduce",
                 sys.executable, __file__, "--part", name, "--hidden", str(hidden)], capture_output=True, text=True, check=False)
        m = re.search(r"Collected : (\d+)", proc.stderr)
        if proc.returncode != 0 or m is None:
            raise SystemExit(f"callgrind failed on {name}: {proc.stderr[-2000:]}")
        got[name] = int(m.group(1)) / 3
    base = got.get("unsharded")
    secs = _rates(list(got), hidden)
    print(f"instructions per call (callgrind, hidden {hidden})" + (", ratio to the unsharded capture" if base else "")
          + "; process CPU per call run natively, and the rate:")
    for name, n in got.items():
        print(f"  {name:18s} {n / 1e6:8.1f} M" + (f"  {n / base:.2f}x" if base else "")
              + f"  {secs[name] * 1e3:6.1f} ms CPU  {n / secs[name] / 1e9:4.2f} G instructions/s")
    if {"unsharded", "unsharded_forward", "sharded", "sharded_forward"} <= got.keys():
        m = {k: v / 1e6 for k, v in got.items()}
        for line in decomposition(m["unsharded"], m["sharded"], m["unsharded_forward"], m["sharded_forward"],
                                  op_counts(hidden), "M"):
            print(line)


def small_decoder(hidden: int, reps: int) -> None:
    """Part 1 at one hidden size: the two captures, the forwards alone, the old recorder, the floor."""
    torch.manual_seed(0)
    plain, plain_args = Decoder(**small(hidden)), (torch.randint(0, 1000, (2, 16)),)
    with fake_world(8):
        sharded, args = small_sharded(hidden)
        fxviz.capture(plain, plain_args, method="eager")  # warm both paths
        fxviz.capture(sharded, args, world_size=8)
        old_capture(sharded, args)
        plain_mm, sharded_mm = _matmuls(plain, plain_args[0].numel()), _matmuls(sharded, args[0].numel())
        base, tp, old, comm, walls, old_walls, fwd, floor, plain_fwd = [], [], [], [], [], [], [], [], []
        base_walls: list[float] = []
        moded: list[float] = []
        for _ in range(reps):  # interleaved
            w = time.perf_counter()
            base.append(cpu(lambda: fxviz.capture(plain, plain_args, method="eager"), "unsharded capture"))
            base_walls.append(time.perf_counter() - w)
            w = time.perf_counter()
            tp.append(cpu(lambda: fxviz.capture(sharded, args, world_size=8), "TP x8 capture"))
            walls.append(time.perf_counter() - w)
            w = time.perf_counter()
            old.append(cpu(lambda: old_capture(sharded, args)))
            old_walls.append(time.perf_counter() - w)
            floor.append(cpu(lambda: old_capture(sharded, args, NoRecorder)))
            mode = CommDebugMode()

            def run(mode: CommDebugMode = mode) -> None:
                with mode:
                    sharded(*args)
            comm.append(cpu(run))
            fwd.append(cpu(lambda: _no_grad(sharded, args), "TP x8 forward (DTensor)"))  # DTensor's own dispatch, nothing recorded
            plain_fwd.append(cpu(lambda: _no_grad(plain, plain_args), "unsharded forward"))
            moded.append(cpu(lambda: _under_mode(sharded, args)))
            cpu(plain_mm, "unsharded linears alone")
            cpu(sharded_mm, "TP x8 linears alone")
        g = fxviz.capture(sharded, args, world_size=8)
        ops = (_ops(fxviz.capture(plain, plain_args, method="eager")), _ops(g))
        calls = {"unsharded forward": python_calls(lambda: _no_grad(plain, plain_args)),
                 "TP x8 forward": python_calls(lambda: _no_grad(sharded, args)),
                 "unsharded capture": python_calls(lambda: fxviz.capture(plain, plain_args, method="eager")),
                 "TP x8 capture": python_calls(lambda: fxviz.capture(sharded, args, world_size=8))}
    b, t, c = statistics.median(base), statistics.median(tp), statistics.median(comm)
    bw, tw = statistics.median(base_walls), statistics.median(walls)
    print(f"small decoder ({SMALL['layers']} layers, hidden {hidden}) eager capture: unsharded {b * 1e3:.1f} ms CPU "
          f"({bw * 1e3:.1f} ms wall), TP x8 {t * 1e3:.1f} ms CPU ({tw * 1e3:.1f} ms wall), ratio {t / b:.2f}x CPU, "
          f"{tw / bw:.2f}x wall (target <= 1.5x)")
    f, pf = statistics.median(fwd), statistics.median(plain_fwd)
    for line in decomposition(b * 1e3, t * 1e3, pf * 1e3, f * 1e3, ops, "ms"):
        print(line)
    for line in usage_lines():
        print(line)
    print("  Python function calls per run (sys.setprofile; in torch.distributed, in fxviz; C functions called from Python):")
    for part, (py, td, fx, cc) in calls.items():
        print(f"    {part:24s} {py:6,d} (torch.distributed {td:5,d}, fxviz {fx:5,d}); C {cc:6,d}")
    o = statistics.median(old)
    print(f"  before (recording through CommDebugMode): TP x8 {o * 1e3:.0f} ms CPU "
          f"({statistics.median(old_walls) * 1e3:.0f} ms wall), ratio {o / b:.2f}x; light recorder {o / t:.1f}x faster")
    m = statistics.median(moded)
    print(f"  torch's price of a dispatch mode: the sharded forward under one that does nothing {m * 1e3:.1f} ms "
          f"CPU, +{(m - f) * 1e3:.1f} ms on its {f * 1e3:.1f} (DTensor desugars each op again through Python); fxviz "
          f"records collectives with such a mode (on only for calls that may issue one)")
    print(f"  floor (the same capture recording no collectives): {statistics.median(floor) * 1e3:.1f} ms CPU, "
          f"ratio {statistics.median(floor) / b:.2f}x")
    print(f"  CommDebugMode alone on the sharded forward: {c * 1e3:.0f} ms CPU; "
          f"counts {mode.get_total_counts()} collectives; fxviz: {len(collectives(g))} with bytes, module, node")
    total, own = OTHER_THREADS
    print(f"  process CPU {total * 1e3:.0f} ms over all runs, of which other threads {max(0.0, total - own) * 1e3:.1f} ms "
          "(process_time counts every thread: the fake group starts none that works)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=80, help="layers of the 70B shape (0: skip it)")
    ap.add_argument("--hidden", default=str(SMALL["d"]),
                    help="the small decoder's hidden size (MLP 2x); comma-separated for several (256,512,1024,4096)")
    ap.add_argument("--instructions", nargs="?", const=",".join(PARTS), metavar="PARTS",
                    help=f"count instructions of these parts instead (comma-separated; all: {','.join(PARTS)})")
    ap.add_argument("--part", choices=PARTS)
    a = ap.parse_args()
    sizes = [int(h) for h in a.hidden.split(",")]
    if a.part:
        return _part(a.part, sizes[0])
    if a.instructions:
        for h in sizes:
            instructions(a.instructions.split(","), h)
        return None
    torch.set_num_threads(1)
    gc.callbacks.append(_gc_timer)
    for h in sizes:
        small_decoder(h, a.reps)
    if a.layers <= 0:
        return None
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    w, t0 = time.perf_counter(), time.process_time()
    g = fxviz.capture(lambda: llama70b(a.layers), world_size=8)
    cpu70, wall70 = time.process_time() - t0, time.perf_counter() - w
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    total = sum(r["bytes"] for r in collectives(g))
    print(f"LLaMA-70B shape ({a.layers} layers) on meta, TP x8: {cpu70:.1f} s CPU, {wall70:.1f} s wall, "
          f"peak RSS {rss / 1024:.0f} MB (was {rss0 / 1024:.0f} MB before), {len(g.nodes)} nodes, "
          f"{len(collectives(g))} collectives, {total:,} bytes per rank (targets < 30 s, < 2 GB)")
    return None


if __name__ == "__main__":
    main()
