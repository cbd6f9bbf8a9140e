"""Bad input to a sharded capture (issue 22, must hold): one line that says what to do, the partial
graph kept, no process group left behind. Checked against torch's own run of the same factory."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

import fxviz
from fxviz.errors import ModelError
from fxviz.passes.overlays import overlays
from fxviz.torchbridge.distributed import end_world, fake_world
from tests.test_distributed import block_factory, sp_factory, waited


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
        # a view that fails on features no parameter's shard gives (a whole activation: 30 per
        # position) is the model's own error, no sharding's: nothing added
        from fxviz.fallback.commfail import uneven_shards

        other = RuntimeError("shape '[2, 5, -1, 8]' is invalid for input of size 300")
        assert uneven_shards(other, model.named_parameters()) == ""
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


GPU_FACTORIES = '''
import torch, torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(16, 64), nn.Linear(64, 16)

    def forward(self, x):
        return self.down(torch.relu(self.up(x.cuda())))  # the training code's own move to its GPU


def set_device():  # as training code starts: each rank picks its GPU
    torch.cuda.set_device(dist.get_rank())
    return nn.Linear(4, 4), (torch.randn(2, 4),)


def cuda_in_forward():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    return parallelize_module(MLP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()}), (torch.randn(4, 16),)
'''

GPU_HINT = ("; the fake process group runs in this process, on its CPU: build the mesh with init_device_mesh('cpu', "
            "...) and the model on the CPU (or under torch.device('meta') for one too big), or launch it with torchrun "
            "where the GPUs are")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without a GPU")
def test_a_factory_or_forward_that_needs_a_gpu_is_one_line_that_says_what_to_do(tmp_path) -> None:
    """``torch.cuda.set_device(rank)`` in the factory (torch: ``no attribute '_cuda_setDevice'``
    without CUDA) and ``x.cuda()`` in the forward (torch: ``not compiled with CUDA``) said torch's
    words alone; each now says that the fake group runs on the CPU and what to do, from the CLI in
    one line, the forward's with its partial graph (the recorded ops up to the move)."""
    import subprocess
    import sys

    import torch

    f = tmp_path / "gpu.py"
    f.write_text(GPU_FACTORIES)
    ns: dict[str, object] = {}
    exec(compile(GPU_FACTORIES, str(f), "exec"), ns)  # noqa: S102 - the factories, run by torch alone
    with fake_world(2):
        with pytest.raises(AttributeError, match="_cuda_setDevice"):
            ns["set_device"]()  # type: ignore[operator]
        model, args = ns["cuda_in_forward"]()  # type: ignore[operator]
        with pytest.raises(AssertionError, match="not compiled with CUDA"):
            model(*args)
    with pytest.raises(ModelError) as e:
        fxviz.capture(ns["cuda_in_forward"], world_size=2)
    assert "\n" not in str(e.value) and str(e.value).endswith(GPU_HINT) and "not compiled with CUDA" in str(e.value)
    assert e.value.graph is not None and [n.name for n in e.value.graph.inputs] == ["x"]  # the partial graph
    assert not dist.is_initialized() and not torch.distributed.is_initialized()
    for name, code, torchs in (("set_device", 2, "_cuda_setDevice"), ("cuda_in_forward", 1, "not compiled with CUDA")):
        out = subprocess.run([sys.executable, "-m", "fxviz", "tree", f"{f}:{name}", "--world-size", "2"],
                             capture_output=True, text=True, timeout=120)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == code and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
        assert lines[0].startswith("error: ") and torchs in lines[0] and lines[0].endswith(GPU_HINT)


def test_an_uneven_shard_names_the_sizes_that_even_every_sharded_dimension() -> None:
    """The TP+SP decoder (vocabulary 100, hidden 64) at world size 6 (dp 2 x tp 3): the line named
    the embedding's 100 rows and said to use a world size that divides it, but a tp of 5 (100 / 5)
    fails again on the 64 features. It names the tp sizes that divide every dimension sharded over
    tp, which torch's own placements give, and torch's own run works at each and fails at 3."""
    sizes = set()
    for ws in (6, 4, 8, 10):
        with fake_world(ws):
            model, args = sp_factory()
            if ws == 6:
                sizes = {int(p.shape[pl.dim]) for p in model.parameters() if isinstance(p, DTensor)
                         for pl in p.placements if pl.is_shard()}
            if ws in (6, 10):  # tp 3 and tp 5 (which divides the 100 rows the line named)
                with pytest.raises(RuntimeError):
                    model(*args)
            else:
                waited(model(*args))
    assert sizes == {128, 100, 64, 32}
    with pytest.raises(ModelError) as e:
        fxviz.capture(sp_factory, world_size=6)
    msg = str(e.value)
    assert "\n" not in msg and msg.endswith(
        "; embed_tokens.weight's dimension 0 (100) does not split evenly over the 3 ranks of mesh dimension tp, and the "
        "tensor-parallel styles take even shards: use a world size that gives mesh dimension tp a size dividing every "
        "dimension sharded over it (128, 100, 64, 32): 2 or 4")
    assert e.value.graph is not None and not dist.is_initialized()


class _VocabLM(nn.Module):
    """A vocabulary-parallel head whose loss is computed under torch's ``loss_parallel()``;
    ``step``: the forward differentiates it there itself, as torch's docs ask."""

    def __init__(self, step: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, 32)
        self.lm_head = nn.Linear(32, 64, bias=False)
        self.step = step

    def forward(self, idx: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor.parallel import loss_parallel

        with torch.enable_grad():
            logits = self.lm_head(self.emb(idx))
            with loss_parallel():
                loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
                if self.step:
                    loss.backward()
        return loss.detach() if self.step else loss


def vocab_lm_factory(step: bool = False) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    plan = {"emb": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    return parallelize_module(_VocabLM(step), mesh, plan), (torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8)))


def test_a_loss_parallel_loss_differentiated_by_the_step_says_to_differentiate_it_inside() -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from fxviz.fallback.comms import COLLECTIVES

    # torch's own failure, fxviz or not: the backward outside loss_parallel()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        model, args = vocab_lm_factory()
        with pytest.raises(RuntimeError, match="nll_loss_backward.* got mixed torch.Tensor and DTensor"):
            model(*args).backward()
    finally:
        end_world()
    with pytest.raises(ModelError) as e:
        fxviz.capture(vocab_lm_factory, world_size=4, backward=True)
    assert "\n" not in str(e.value) and "call loss.backward() inside `with loss_parallel():` in the forward" in str(e.value)
    assert e.value.graph is not None and any(n.module == "lm_head" for n in e.value.graph.nodes)  # the partial graph
    # the workaround it gives captures, with the collectives torch dispatches for that step
    g = fxviz.capture(lambda: vocab_lm_factory(step=True), world_size=4)

    class Seen(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[tuple[str, int]] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            from torch.distributed.tensor import DTensor

            if DTensor in types:
                return NotImplemented
            if func._overloadpacket in COLLECTIVES:
                self.ops.append((str(func._overloadpacket), args[0].numel() * args[0].element_size()))
            return func(*args, **(kwargs or {}))

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        model, args = vocab_lm_factory(step=True)
        with Seen() as seen:
            model(*args)
    finally:
        end_world()
    assert [(r["op"], r["bytes"]) for r in g.annotations["collectives"]] == seen.ops
    assert len(seen.ops) >= 3
