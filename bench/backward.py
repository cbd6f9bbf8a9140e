"""``fxviz.capture(backward=True)`` on GPT-2 (small: 12 layers, seq 128) against its baselines (issue 21).

    .venv/bin/python bench/backward.py [--layers 12] [--seq 128] [--reps 3] [--out bench/results/backward.json]

Rows, process CPU time (wall in brackets), medians of interleaved rounds after a warm-up, torch on
one thread:

* ``step``: one plain training step: forward, the default loss (sum of the floating outputs), and
  ``torch.autograd.grad`` of it for every parameter (what the eager path runs, ``.grad`` untouched);
* ``fxviz eager``: ``capture(backward=True, method="eager")`` (tracer, grad_fn walk, saved
  activations, the real backward, passes). Target ≤ 1.5x ``step``;
* ``joint (bare)``: ``torch.export`` of the model with its loss then ``aot_export_joint_with_descriptors``,
  the exact calls fxviz makes (:func:`fxviz.symbolic.joint.export_joint`);
* ``fxviz export``: ``capture(backward=True, method="export")``. Target ≤ 1.2x ``joint (bare)``;
* ``--checkpoint``: the same rows on GPT-2 in train mode (dropout 0) with Hugging Face's gradient
  checkpointing (``use_reentrant=False``, one region per block); ``joint (bare)`` is then what torch
  needs to see the regions, strict export and the joint export, and ``fxviz export`` adds the
  non-strict export that finds the checkpoint calls. Beside the times: recompute nodes, and the saved
  bytes of both paths against ``saved_tensors_hooks``;
* ``torchlens`` (when run from ``bench/.venv``, ``bash bench/setup.sh``): ``torchlens.trace`` with
  every activation and gradient saved, then ``Trace.log_backward`` of the same loss (its
  first-class backward capture, torchlens ≥ 2.7), timed last (it keeps torch wrapped until
  ``unwrap_torch()``), against ``step``. Beside the times, what each shows of the backward:
  torch's autograd nodes of the step (the oracle), fxviz's backward ops, torchlens' grad_fns.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import (
    environment,
    fmt_s,
    med,
    pin_threads,
    quiet_transformers,
    round_robin,
    table,
    write_json,
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--checkpoint", action="store_true", help="GPT-2 with gradient checkpointing, in train mode")
    opts = ap.parse_args()
    pin_threads(1)
    quiet_transformers()
    import torch

    import fxviz
    from bench._common import gpt2
    from fxviz.symbolic.joint import export_joint
    from fxviz.torchbridge.normalize import flatten_inputs
    from fxviz.torchbridge.training import step_loss

    model, args = gpt2(n_layer=opts.layers, seq=opts.seq)
    if opts.checkpoint:
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
        model.train().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        torch.autograd.grad(step_loss(model(*args), None), params)

    def bare_joint() -> None:
        with contextlib.ExitStack() as stack:
            if opts.checkpoint:
                _strict_joint(model, args, stack)
            else:
                export_joint(model, flatten_inputs(model, args, {}), None, stack)

    fns = {
        "step": step,
        "fxviz eager": lambda: fxviz.capture(model, args, backward=True, method="eager"),
        "joint (bare)": bare_joint,
        "fxviz export": lambda: fxviz.capture(model, args, backward=True, method="export"),
    }
    cpu: dict[str, list[float]] = {}
    wall = round_robin(fns, opts.reps, warmup=1, cpu=cpu)
    base = {"fxviz eager": "step", "fxviz export": "joint (bare)", "torchlens": "step"}
    shows = {"torch autograd nodes": _autograd_nodes(step_loss(model(*args), None)),
             "fxviz backward ops": sum(1 for n in fxviz.capture(model, args, backward=True, method="eager").ops
                                       if n.phase == "backward")}
    if opts.checkpoint:
        from tests.backward_models import torch_step

        gx, ge = (fxviz.capture(model, args, backward=True, method=m) for m in ("export", "eager"))
        shows.update({"export recompute nodes": sum(1 for n in gx.nodes if n.phase == "recompute"),
                      "eager recompute nodes": sum(1 for n in ge.nodes if n.phase == "recompute"),
                      "saved bytes export": sum(s.bytes for s in gx.saved),
                      "eager": sum(s.bytes for s in ge.saved), "saved_tensors_hooks": torch_step(model, args)[0]})
    lens = _torchlens(model, args, step_loss)
    if lens is not None:  # last: torchlens keeps torch's functions wrapped until unwrap_torch()
        from torchlens.backends.torch.wrappers import unwrap_torch

        try:
            shows["torchlens grad_fns"] = len(list(lens().grad_fns))
            wall.update(round_robin({"torchlens": lens}, min(opts.reps, 3), warmup=0, cpu=cpu))
        finally:
            unwrap_torch()
        fns["torchlens"] = lens
    rows = []
    for k in fns:
        ratio = ""
        if k in base:
            b = base[k]
            ratio = f"{med(cpu[k]) / med(cpu[b]):.2f}x ({med(wall[k]) / med(wall[b]):.2f}x)"
        rows.append([k, f"{fmt_s(med(cpu[k]))} ({fmt_s(med(wall[k]))})", ratio])
    what = ", gradient checkpointing" if opts.checkpoint else ""
    print(f"GPT-2{what}, {opts.layers} layers, seq {opts.seq}, {opts.reps} rounds, CPU time (wall)\n")
    print(table(["what", "time", "ratio to baseline"], rows))
    print("\nwhat each shows of the backward: " + ", ".join(f"{k} {v}" for k, v in shows.items()))
    write_json(opts.out, {"env": environment(), "layers": opts.layers, "seq": opts.seq, "cpu": cpu, "wall": wall,
                          "shows": shows, "checkpoint": opts.checkpoint})


def _strict_joint(model: Any, args: tuple[Any, ...], stack: contextlib.ExitStack) -> Any:
    """The joint graph of a checkpointed model as torch alone makes it: strict export (with the
    context torch 2.13 needs for a plain checkpoint, :mod:`fxviz.symbolic.checkpoint`), then AOT
    Autograd's joint export."""
    import torch
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    from fxviz.symbolic.checkpoint import plain_checkpoints_as_selective
    from fxviz.symbolic.joint import LossModel
    from fxviz.torchbridge.normalize import flatten_inputs

    flat = flatten_inputs(model, args, {})
    wrapper = LossModel(model, flat, None)
    with plain_checkpoints_as_selective():
        ep = torch.export.export(wrapper, flat.tensors, strict=True)
    return aot_export_joint_with_descriptors(stack, ep.module(), flat.tensors, _record_nn_module_stack=True)


def _autograd_nodes(loss: Any) -> int:
    """torch's own count: the autograd nodes of the step other than AccumulateGrad."""
    seen, todo = set(), [loss.grad_fn]
    while todo:
        f = todo.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        todo += [g for g, _ in f.next_functions]
    return sum(1 for f in seen if type(f).__name__ != "AccumulateGrad")


def _torchlens(model: Any, args: tuple[Any, ...], step_loss: Any) -> Callable[[], Any] | None:
    """torchlens' forward trace (activations and gradients saved) and its backward capture."""
    try:
        import torchlens as tl
        from torchlens.options import CaptureOptions
    except ImportError:
        return None

    def run() -> Any:
        t = tl.trace(model, list(args), capture=CaptureOptions(layers_to_save="all", save_grads="all"))
        outs = [t[name].out for name in t.output_layers]
        t.log_backward(step_loss(outs, None))
        return t

    return run


if __name__ == "__main__":
    main()
