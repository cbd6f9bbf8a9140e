"""Plain torch, no fxviz: a pipeline stage given its shapes (``input_args``/``output_args``) with a
loss_fn, run by ``torchrun --nproc-per-node 2 tests/torch_pipeline_static.py OUT``, once with the
example tensors as ``torch.empty`` (rank 0's backward fails: "Output gradient: ('None',)") and once
made with ``requires_grad=True`` where a gradient flows (it runs). Each rank writes ``OUT.<rank>``:
``{"without": ..., "with": ...}``, ``"ok"`` or torch's error. The oracle of
``test_torchrun_a_stage_given_its_shapes_with_a_loss_is_torchs_failure_said_with_its_workaround``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe


def step(rank: int, grad: bool) -> str:
    group = dist.new_group([0, 1])  # a group of its own: a failed step leaves rank 1's gradient sends unreceived
    torch.manual_seed(0)
    part = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    stage = PipelineStage(part, rank, 2, torch.device("cpu"), input_args=torch.empty(2, 8, requires_grad=grad and rank > 0),
                          output_args=torch.empty(2, 8, requires_grad=grad), group=group)
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda o, t: (o - t).pow(2).mean())
    try:
        if rank == 0:
            schedule.step(torch.randn(4, 8))
        else:
            schedule.step(target=torch.zeros(4, 8))
    except RuntimeError as e:
        return f"{type(e).__name__}: {e}"
    return "ok"


if __name__ == "__main__":
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result = {"without": step(rank, False)}
    dist.barrier()
    result["with"] = step(rank, True)
    Path(f"{sys.argv[1]}.{rank}").write_text(json.dumps(result))
    dist.destroy_process_group()
