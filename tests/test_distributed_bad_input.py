"""Bad input to a sharded capture (issue 22, must hold): one line that says what to do, the partial
graph kept, no process group left behind. Checked against torch's own run of the same factory."""

from __future__ import annotations

import pytest
import torch.distributed as dist

import fxviz
from fxviz.errors import ModelError
from fxviz.torchbridge.distributed import fake_world
from tests.test_distributed import block_factory


def test_an_uneven_shard_the_models_own_view_cannot_use_is_named() -> None:
    """At world size 3 the column-parallel ``q`` (32 output features) shards unevenly (11, 11, 10);
    the attention's own ``view(b, s, -1, 8)`` of its local output fails before any sharding
    propagation does, so the line said only torch's complaint about a shape. It names the
    parameter and dimension torch sharded unevenly, as for a failed propagation."""
    with fake_world(3):
        model, args = block_factory()
        with pytest.raises(RuntimeError, match="is invalid for input of size 110"):  # torch's own run
            model(*args)
        w = model.q.weight
        assert (w.placements[0].dim, w.shape[0], w.device_mesh.size(), w.to_local().shape[0]) == (0, 32, 3, 11)
    with pytest.raises(ModelError) as e:
        fxviz.capture(block_factory, world_size=3)
    msg = str(e.value)
    assert "\n" not in msg and "is invalid for input of size 110" in msg  # torch's words, then what to do
    assert msg.endswith("; q.weight's dimension 0 (32) does not split evenly over the 3 ranks of the mesh, and the "
                        "tensor-parallel styles take even shards: use a world size that divides it")
    assert e.value.graph is not None and any(n.module == "q" for n in e.value.graph.nodes)  # the partial graph
    assert not dist.is_initialized()
