"""Make ``comms.log``: a real ``TORCH_TRACE`` of Inductor's communication passes on the CPU.

``python tests/data/traces/gen_comms.py DIR`` compiles tests/test_inside_comms.py's model (local work,
then two all-gathers of DTensor parameters) with Inductor in torch's fake process group of 2 ranks,
with ``bucket_all_gathers_fx`` and ``reorder_for_compute_comm_overlap`` on, provenance tracking on
and the scheduler passes' summaries logged (``config_comms.reorder_sink_verbose_logging``), writing
torch's trace into DIR; then ``make_fixtures.py DIR/<file> comms.log`` trims it (torch 2.13), less
``scheduler_nodes_before_comm_overlap``, the joint graphs and the subclass metadata.

``python tests/data/traces/gen_comms.py DIR sp`` compiles a sequence-parallel MLP instead (its input
all-gathered, its output reduce-scattered) with no communication pass: ``comms_sp.log``.
"""

from __future__ import annotations

import os
import sys


def _sequence_parallel():  # type: ignore[no-untyped-def]
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = torch.nn.Linear(16, 32)
            self.down = torch.nn.Linear(32, 16)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.down(torch.relu(self.up(x)))

    torch.manual_seed(0)
    plan = {"up": ColwiseParallel(input_layouts=Shard(0)), "down": RowwiseParallel(output_layouts=Shard(0))}
    return parallelize_module(MLP(), init_device_mesh("cpu", (2,)), plan), (torch.randn(4, 16),)


if __name__ == "__main__":
    os.environ["TORCH_TRACE"] = sys.argv[1]
    import torch
    import torch._inductor.config as inductor_config
    import torch._inductor.config_comms as comms_config

    from fxviz.torchbridge.distributed import fake_world
    from tests.test_inside_comms import PASSES, _model

    sp = sys.argv[2:] == ["sp"]
    with fake_world(2), inductor_config.patch({**(PASSES if not sp else {"force_disable_caches": True}),
                                               "trace.provenance_tracking_level": 1}), \
            comms_config.patch({"reorder_sink_verbose_logging": True}), torch.no_grad():
        model, args = _model() if not sp else _sequence_parallel()
        torch.compile(model, backend="inductor")(*args)
