"""Make ``comms.log``: a real ``TORCH_TRACE`` of Inductor's communication passes on the CPU.

``python tests/data/traces/gen_comms.py DIR`` compiles tests/test_inside_comms.py's model (local work,
then two all-gathers of DTensor parameters) with Inductor in torch's fake process group of 2 ranks,
with ``bucket_all_gathers_fx`` and ``reorder_for_compute_comm_overlap`` on, provenance tracking on
and the scheduler passes' summaries logged (``config_comms.reorder_sink_verbose_logging``), writing
torch's trace into DIR; then ``make_fixtures.py DIR/<file> comms.log`` trims it (torch 2.13).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    os.environ["TORCH_TRACE"] = sys.argv[1]
    import torch
    import torch._inductor.config as inductor_config
    import torch._inductor.config_comms as comms_config

    from fxviz.torchbridge.distributed import fake_world
    from tests.test_inside_comms import PASSES, _model

    with fake_world(2), inductor_config.patch({**PASSES, "trace.provenance_tracking_level": 1}), \
            comms_config.patch({"reorder_sink_verbose_logging": True}), torch.no_grad():
        model, args = _model()
        torch.compile(model, backend="inductor")(*args)
