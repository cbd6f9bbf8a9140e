"""FSDP2's parameters in the graph of a ``fully_shard`` model (issue 22): each parameter's shard,
which the unit's all-gather reads, is a parameter node by name, and the unsharded parameter the
unit's forward reads is produced by the copy-out of the gathered bytes, so the graph runs shard ->
all-gather -> copy-out -> unsharded parameter -> the op that reads it. Checked against the model's
own ``FSDPParam`` objects and ``CommDebugMode`` on the same model."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

import fxviz
from fxviz.ir import Graph, Node
from fxviz.passes.comm import collectives
from tests.test_distributed import counts, oracle, waited


class Block(nn.Module):
    """A GPT-2-shaped block, small: a parameter read long after its unit's all-gather (``fc``)."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.attn(self.ln_1(x)).chunk(3, -1)
        x = x + self.proj(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(40, 16)
        self.h = nn.ModuleList([Block(), Block()])
        self.ln_f = nn.LayerNorm(16)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()


def gpt_factory(cls: type[nn.Module] | None = None) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """FSDP2 as GPT-2 training code shards it: each block a unit, the root the rest (wte, ln_f)."""
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    m = (cls or GPT)()
    for block in m.h:
        fully_shard(block, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m, (torch.randint(0, 40, (2, 8)),)


def captured(factory: Any = None, world_size: int = 8, **options: Any) -> tuple[Graph, nn.Module]:
    """The capture of ``factory``'s model in a fake group of the test's own, and the model after
    torch's own forward of it there: the capture leaves FSDP2's state as it found it (not
    initialised), torch's run initialises it (each ``FSDPParam``'s name, its all-gather outputs)."""
    from fxviz.torchbridge.distributed import fake_world

    with fake_world(world_size):
        model, args = (factory or gpt_factory)()
        g = fxviz.capture(model, args, world_size=world_size, **options)
        waited(model(*args))
    return g, model


def units(model: nn.Module) -> list[tuple[str, list[Any]]]:
    """Each FSDP2 unit's path and its ``FSDPParam`` objects, as FSDP2 keeps them."""
    out = []
    for path, m in model.named_modules():
        group = m._get_fsdp_state()._fsdp_param_group if hasattr(m, "_get_fsdp_state") else None
        if group is not None:
            out.append((path, list(group.fsdp_params)))
    return out


def inputs(g: Graph, name: str) -> list[str]:
    return [r.node for r in g.node(name).inputs]


def producer(g: Graph, node: Node, k: int = 0) -> Node:
    return g.node(node.inputs[k].node)


def test_each_all_gather_reads_its_units_parameter_shards_by_name() -> None:
    g, model = captured()
    gathers = {r["module"]: g.node(r["node"]) for r in collectives(g)}
    assert list(gathers) == [path for path, _ in units(model)] == ["", "h.0", "h.1"]
    for path, params in units(model):
        copy_in = producer(g, gathers[path], 0)  # all_gather_single(output, input): the copy-in's output 1
        assert copy_in.target == "fsdp::all_gather_copy_in"
        shards = [producer(g, copy_in, k) for k in range(len(params))]
        assert [n.name for n in shards] == [f"{p._param_fqn}.shard" for p in params]
        for n, p in zip(shards, params, strict=True):
            local = p.sharded_param._local_tensor
            assert (n.kind, n.target, n.module) == ("parameter", p._param_fqn, p._param_fqn.rpartition(".")[0])
            assert tuple(n.outputs[0].shape) == tuple(p._sharded_param_data.shape)  # padded, flat
            assert n.attrs["shard_of"] == p._param_fqn
            assert n.attrs["shard_placements"] == "S(0)" == str(p.sharded_param.placements[0])
            assert n.attrs["shard_shape"] == list(local.shape) and n.attrs["mesh"] == "dp=8"
            assert "placements" not in n.attrs  # a DTensor's global shape goes with those; this is one rank's
        # what each rank sends is its shards, padded: the record's bytes are the nodes' sizes
        record = next(r for r in collectives(g) if r["module"] == path)
        assert record["bytes"] == sum(p._sharded_param_data.numel() * 4 for p in params)
    assert counts(g) == oracle(gpt_factory, 8)  # CommDebugMode: one all-gather per unit


@pytest.mark.parametrize("method", ["eager", "eager-aten"])
def test_unsharded_parameters_come_from_the_copy_out_of_their_all_gather(method: str) -> None:
    g, model = captured(method=method)
    gathers = {r["module"]: r["node"] for r in collectives(g)}
    for path, params in units(model):
        copy = next(n for n in g.nodes if n.target.startswith("fsdp::split_with_sizes_copy") and n.module == path)
        assert producer(g, producer(g, copy)).name == gathers[path]  # a view of the gathered bytes
        for p in params:
            param = g.node(p._param_fqn)
            assert (param.kind, param.target) == ("parameter", p._param_fqn)
            assert tuple(param.outputs[0].shape) == tuple(p._orig_size) == tuple(p.unsharded_param.shape)
            view = producer(g, param)  # FSDP2's as_strided of its all-gather output, made on the first forward
            assert view.target in ("torch.as_strided", "aten.as_strided.default")
            assert tuple(view.outputs[0].shape) == tuple(p._orig_size)
            assert view.inputs[0].node == copy.name  # the copy-out wrote it (its version counter kept)
            assert tuple(copy.outputs[view.inputs[0].index].shape) == tuple(p.all_gather_outputs[0].shape)
            readers = [n for n in g.nodes if any(r.node == param.name for r in n.inputs)]
            assert readers and all(n.kind == "op" for n in readers)
    # every op reads the unsharded parameters (nothing reads a shard but the copy-ins)
    shard_readers = {n.target for n in g.nodes if n.kind == "op" for r in n.inputs
                     if "shard_of" in g.node(r.node).attrs and not n.target.startswith("fsdp::all_gather_copy_in")}
    assert not shard_readers
    assert not [n.name for n in g.nodes if n.kind == "constant"]
    # the tied head reads the root unit's gathered wte, the same node the embedding reads
    (emb,) = [n for n in g.nodes if n.kind == "op" and "embedding" in n.target]
    (head,) = [n for n in g.nodes if n.target in ("Tensor.t", "aten.t.default") and n.module == ""]
    assert "wte.weight" in inputs(g, emb.name) and inputs(g, head.name) == ["wte.weight"]
    # the model's parameters are counted once, unsharded (the shards are the same parameters)
    total = sum(p._orig_size.numel() for _, params in units(model) for p in params)
    assert total == sum(p.numel() for p in GPT().parameters())
    assert g.annotations["stats"]["modules"][""]["params"] == total
    assert f"{total:,} params" in repr(g)


def test_the_tree_names_the_parameter_each_copy_out_view_becomes() -> None:
    """Each as_strided after a unit's copy-out says which parameter it is (relative to its unit),
    in FSDP2's own order of the unit's parameters."""
    from fxviz.render.tree import tree_text

    g, model = captured()
    text = tree_text(g, width=160, unfold=True)
    named = [line.rpartition("  = ")[2].strip() for line in text.splitlines() if "as_strided" in line]
    want = [p._param_fqn.removeprefix(f"{path}.") if path else p._param_fqn
            for path, params in units(model) for p in params]
    assert named == want and "= attn.weight" in text
    assert "as_strided  → [48, 16]  = attn.weight" in text


def test_a_training_step_names_each_gradient_by_its_fsdp_parameter() -> None:
    """The backward accumulates into FSDP2's unsharded parameters, which ``named_parameters`` no
    longer lists after the forward (the shards are swapped back in): each gradient still says
    whose it is, with the unsharded shape FSDP2 reduce-scatters."""
    g, model = captured(backward=True)
    grads = {n.attrs["grad_of"]: n for n in g.nodes if n.kind == "output" and "grad_of" in n.attrs}
    params = [p for _, ps in units(model) for p in ps]
    assert sorted(grads) == sorted(p._param_fqn for p in params)
    for p in params:
        made = [g.meta_of(r) for r in grads[p._param_fqn].inputs]
        assert all(m is not None and tuple(m.shape) == tuple(p._orig_size) for m in made)


def test_each_gradient_reduce_scatter_reads_its_units_gradients_in_its_unit() -> None:
    """FSDP2 reduce-scatters each unit's unsharded gradients once per step: the node reads them
    (the values the step's gradient outputs read) and sits in the unit, after they are made.
    ``CommDebugMode`` on the same step: one reduce-scatter per unit, every unit's count and the
    model's totals equal (it names the unit's last leaf to begin its backward, not the unit)."""
    from tests.test_distributed_backward import counts as step_counts
    from tests.test_distributed_backward import oracle as step_oracle

    g, model = captured(backward=True)
    want = step_oracle(gpt_factory, 8)
    grads = {n.attrs["grad_of"]: n for n in g.nodes if n.kind == "output" and "grad_of" in n.attrs}
    scatters = [r for r in collectives(g) if r["kind"] == "reduce_scatter"]
    assert want[""]["backward"]["reduce_scatter"] == len(scatters) == len(units(model)) == 3
    order = {n.name: i for i, n in enumerate(g.nodes)}
    for path, params in units(model):
        assert want[path]["backward"]["reduce_scatter"] == (1 if path else 3)  # the model: all three
        (r,) = [r for r in scatters if r["grads_of"] == [p._param_fqn for p in params]]
        node = g.node(r["node"])
        assert (node.phase, node.module, r["module"]) == ("backward", path, path)
        made = [ref for p in params for ref in grads[p._param_fqn].inputs]
        assert list(node.inputs) == made and all(order[ref.node] < order[node.name] for ref in made)
        padded = sum(p._sharded_param_data.numel() for p in params) * 8  # the unit's gradients, padded, in
        assert r["bytes"] == padded * 4
    paths = [path for path, _ in units(model)]  # the model and the units: both tools' counts, equal
    assert {p: step_counts(g)[p] for p in paths} == {p: want[p] for p in paths}


def fsdp_tp_factory(meta: bool = False) -> tuple[nn.Module, tuple[torch.Tensor]]:
    """FSDP2 over tensor parallel on a 2-D mesh (dp x tp): the unsharded parameters are DTensors;
    ``meta``: the model built on ``meta`` and sharded there."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from tests.test_distributed import MLP

    mesh = init_device_mesh("cpu", (2, dist.get_world_size() // 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    with torch.device("meta") if meta else contextlib.nullcontext():
        m = nn.Sequential(MLP(), MLP())
    for block in m:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(m, mesh=mesh["dp"])
    return m, (torch.randn(4, 16),)


def test_fsdp_over_tensor_parallel_linears_read_the_unsharded_dtensor_parameters_by_name() -> None:
    g, model = captured(fsdp_tp_factory)
    assert counts(g) == oracle(fsdp_tp_factory, 8)  # CommDebugMode: each unit's gather, each block's all-reduce
    linears = [n for n in g.nodes if n.target == "torch.nn.functional.linear"]
    assert [inputs(g, n.name)[1:] for n in linears] == [
        [f"{u}.{m}.weight", f"{u}.{m}.bias"] for u in ("0", "1") for m in ("up", "down")]
    for _, params in units(model):
        for p in params:
            node = g.node(p._param_fqn)
            unsharded = p.unsharded_param
            assert node.kind == "parameter" and tuple(node.outputs[0].shape) == tuple(unsharded.shape)
            assert node.attrs["placements"] == ", ".join(str(q) for q in unsharded.placements)
            # made from the copy-out of its unit's all-gather: as_strided, then DTensor's detach
            chain = [node]
            while chain[-1].inputs and not chain[-1].target.startswith("fsdp::split_with_sizes_copy"):
                chain.append(producer(g, chain[-1]))
            assert chain[-1].target == "fsdp::split_with_sizes_copy" and chain[-1].module == node.module.split(".")[0]


def _stepped(factory: Any) -> Any:
    def made() -> tuple[nn.Module, tuple[torch.Tensor]]:
        m, args = factory()
        m(*args).sum().backward()  # a training step before the capture: FSDP2's buffers exist
        stepped.append(m)
        return m, args

    stepped: list[nn.Module] = []
    made.models = stepped  # type: ignore[attr-defined]
    return made


@pytest.mark.parametrize("factory", [gpt_factory, fsdp_tp_factory], ids=["fsdp", "fsdp+tp"])
def test_after_a_step_the_parameters_read_the_copy_out_into_fsdps_own_buffers(factory: Any) -> None:
    """A model that already ran a step: FSDP2 copies the gathered bytes into the buffers it made
    then (``all_gather_outputs``), constants by name here, and swaps in the same unsharded
    parameters, views of them: each parameter reads the copy-out's write of its buffer."""
    made = _stepped(factory)
    g = fxviz.capture(made, world_size=8)
    assert not [n.name for n in g.nodes if n.kind == "constant" and "all_gather_output_of" not in n.attrs]
    for path, params in units(made.models[0]):
        copy = next(n for n in g.nodes if n.target == "fsdp::split_with_sizes_copy" and n.module == path)
        for p in params:
            buffer = g.node(f"{p._param_fqn}.all_gather_output")
            assert buffer.kind == "constant" and buffer.attrs["all_gather_output_of"] == p._param_fqn
            assert tuple(buffer.outputs[0].shape) == tuple(p.all_gather_outputs[0].shape)
            (src,) = g.node(p._param_fqn).inputs  # the parameter: its value is the copy-out's write
            assert src.node == copy.name and tuple(copy.outputs[src.index].shape) == tuple(p.all_gather_outputs[0].shape)


def meta_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """The GPT of :func:`gpt_factory` built on ``meta`` and sharded there: a model too big to load."""
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
    with torch.device("meta"):
        m = GPT()
    for block in m.h:
        fully_shard(block, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m, (torch.randint(0, 40, (2, 8)),)


class TiedGPT(GPT):
    """GPT with its head's weight tied to the embedding as Hugging Face ties it: one parameter
    registered under two names (``lm_head.weight`` is ``wte.weight``)."""

    def __init__(self) -> None:
        super().__init__()
        self.lm_head = nn.Linear(16, 40, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def tied_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    return gpt_factory(TiedGPT)


@pytest.mark.parametrize("backward", [False, True])
def test_a_tied_parameter_keeps_its_shard_and_its_unsharded_node(backward: bool) -> None:
    # the tied weight's shard and unsharded parameter were merged into one node, placed where the
    # shard was met and reading the copy-out made after it: the all-gather read the unsharded
    # parameter, and the graph's JSON did not load (which torchrun's ranks hand rank 0)
    g, model = captured(tied_factory, world_size=2, backward=backward)
    assert model.lm_head.weight is model.wte.weight
    Graph.from_json(g.to_json())
    for path, params in units(model):  # FSDP2's own record: one FSDPParam for the tied weight
        gather = next(g.node(r["node"]) for r in collectives(g) if r["module"] == path and r["phase"] == "forward")
        copy_in = producer(g, gather, 0)
        assert [producer(g, copy_in, k).name for k in range(len(params))] == [f"{p._param_fqn}.shard" for p in params]
        for p in params:
            assert producer(g, g.node(p._param_fqn)).target == "torch.as_strided"  # the unsharded one: its copy-out view
    shard, param = g.node("wte.weight.shard"), g.node("wte.weight")
    assert shard.attrs["shard_of"] == "wte.weight" and shard.attrs["shared_with"] == param.attrs["shared_with"] == ["lm_head.weight"]
    (head,) = [n for n in g.nodes if n.kind == "op" and n.phase == "forward" and n.module == "lm_head" and "linear" in n.target]
    assert "wte.weight" in inputs(g, head.name)
    total = sum(p._orig_size.numel() for _, params in units(model) for p in params)
    assert g.annotations["stats"]["modules"][""]["params"] == total == sum(p.numel() for p in TiedGPT().parameters())
