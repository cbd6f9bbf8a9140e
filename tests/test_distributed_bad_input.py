"""Bad input to a sharded capture (issue 22, must hold): one line that says what to do, the partial
graph kept, no process group left behind. Checked against torch's own run of the same factory."""

from __future__ import annotations

import pytest
import torch.distributed as dist

import fxviz
from fxviz.errors import ModelError
from fxviz.passes.overlays import overlays
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


def test_more_ranks_than_heads_is_named_with_the_world_sizes_that_work(tmp_path) -> None:
    """At world size 8 the column-parallel ``q`` (32 output features: 4 heads of 8) shards evenly,
    4 features per rank, less than one head: the attention's own ``view(b, s, -1, 8)`` of its local
    output fails (torch's own run below), and the line said only torch's complaint about a shape
    (the classic mistake: fewer key/value heads than tensor-parallel ranks). It names the parameter,
    its shard per rank and the world sizes that give each rank whole heads, from the CLI too."""
    import subprocess
    import sys

    with fake_world(8):
        model, args = block_factory()
        with pytest.raises(RuntimeError, match=r"shape '\[2, 5, -1, 8\]' is invalid for input of size 40"):
            model(*args)  # torch's own run
        w = model.q.weight
        assert (w.placements[0].dim, w.shape[0], w.device_mesh.size(), w.to_local().shape[0]) == (0, 32, 8, 4)
    said = ("; q.weight's dimension 0 (32: 4 of 8) splits into 4 per rank over the 8 ranks of the mesh, not whole "
            "units of 8 (the view's last dimension): use a world size that divides 4 (with tensor parallel, each "
            "rank takes whole heads)")
    with pytest.raises(ModelError) as e:
        fxviz.capture(block_factory, world_size=8)
    msg = str(e.value)
    assert "\n" not in msg and "is invalid for input of size 40" in msg and msg.endswith(said)
    assert e.value.graph is not None and any(n.module == "q" for n in e.value.graph.nodes)  # the partial graph
    assert not dist.is_initialized()
    out = subprocess.run([sys.executable, "-m", "fxviz", "tree", "tests/test_distributed.py:block_factory",
                          "--world-size", "8"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].endswith(said) and len(out.stderr.strip().splitlines()) == 1
    assert "q (Linear)" in out.stdout  # the partial tree


@pytest.mark.parametrize(("world", "said"), [
    (3, "the device mesh (dp=2 x tp=1) covers 2 of the 3 ranks: rank 2 holds no shard; tp has one rank: what is "
        "sharded over it moves nothing"),
    (4, None),
])
def test_a_mesh_that_leaves_ranks_out_says_so(world: int, said: str | None) -> None:
    """The TP+SP decoder's factory builds a ``(2, world // 2)`` mesh: at world size 3 that is (2, 1),
    over which torch moves nothing (CommDebugMode counts no collective on its own run) and rank 2
    holds no shard. The capture's 0 collectives are true, but silent about why: a note says it,
    from torch's own mesh; at world size 4 there is none."""
    from torch.distributed.tensor.debug import CommDebugMode

    from tests.test_distributed import sp_factory

    with fake_world(world):
        model, args = sp_factory()
        mesh = model.layers[0].self_attn.q_proj.weight.device_mesh._get_root_mesh()
        with CommDebugMode() as mode:
            model(*args)
        expected_ranks = sorted(int(r) for r in mesh.mesh.flatten().tolist())
    assert (mode.get_total_counts() == 0) == (world == 3)
    assert expected_ranks == ([0, 1] if world == 3 else [0, 1, 2, 3])
    g = fxviz.capture(sp_factory, world_size=world)
    notes = [n for n in g.notes if n.startswith("the device mesh")]
    assert notes == ([said] if said else [])
    # the comm overlay is there whatever moved (`--overlay comm` said "neither a JSON file nor an
    # overlay" where nothing did): the model's total is torch's count of bytes, 0 at world size 3
    comm = overlays(g)["comm"]
    assert len(g.annotations["collectives"]) == mode.get_total_counts()
    assert comm["modules"][g.calls.root.id] == sum(r["bytes"] for r in g.annotations["collectives"])
    assert (comm["modules"][g.calls.root.id] == 0) == (world == 3)
    assert not dist.is_initialized()
