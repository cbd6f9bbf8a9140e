"""Every collective a forward runs is in the graph, on the edges of the values it moves (issue 22
point 2): the model's own ``dist.*`` calls, a process group's methods, the ones DTensor runs inside
an op, FSDP2's all-gathers; counted against ``CommDebugMode`` on the same model."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

import fxviz
from fxviz.passes.comm import collectives
from fxviz.passes.overlays import overlays
from tests.test_distributed import counts, fsdp_factory, oracle


def inputs(g: fxviz.Graph, name: str) -> list[str]:
    return [r.node for r in g.node(name).inputs]


class OwnCalls(nn.Module):
    """``torch.distributed``'s own functions, in place: c10d neither moves the tensors' version
    counters nor marks them written in its ops' schemas."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        dist.all_reduce(y)
        gathered = torch.empty(dist.get_world_size() * 2, 8)
        dist.all_gather_into_tensor(gathered, y)  # deprecated: torch wraps it in typing_extensions
        dist.broadcast(x, 0)
        return y.relu() + gathered.sum() + x


def own_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    return OwnCalls(), (torch.randn(2, 8),)


def test_the_models_own_collectives_are_nodes_that_later_ops_read() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        g = fxviz.capture(own_factory, world_size=4)
        want = oracle(own_factory, 4)
    assert want[""] == {"all_reduce": 1, "all_gather": 1, "broadcast": 1}  # torch's own count
    assert counts(g) == want
    recs = collectives(g)
    assert [r["kind"] for r in recs] == ["all_reduce", "all_gather", "broadcast"]
    reduce, gather, bcast = (g.node(r["node"]) for r in recs)
    assert inputs(g, reduce.name) == ["linear"]
    relu = next(n for n in g.nodes if n.target == "Tensor.relu")
    assert inputs(g, relu.name) == [reduce.name]  # the reduced value, not the linear's
    assert gather.name in inputs(g, next(n.name for n in g.nodes if n.target == "Tensor.sum"))
    assert bcast.name in inputs(g, g.nodes[-2].name)  # the last add reads the broadcast x
    first = OwnCalls.forward.__code__.co_firstlineno
    assert [r["source"] for r in recs] == [f"{__file__}:{first + k}" for k in (2, 4, 5)]
    assert [n.source.line for n in (reduce, gather, bcast)] == [first + 2, first + 4, first + 5]
    assert all(n.attrs["collectives"] == [r["kind"]] for n, r in zip((reduce, gather, bcast), recs, strict=True))
    assert overlays(g)["comm"]["nodes"] == {r["node"]: r["bytes"] for r in recs}


class GroupMethod(nn.Module):
    """A process group's own method: a ``c10d`` op that reaches no torch-function mode at all."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        dist.group.WORLD.allreduce([y])
        return y + 1


def test_a_collective_below_every_torch_function_gets_a_node_of_its_own() -> None:
    g = fxviz.capture(lambda: (GroupMethod(), (torch.randn(4),)), world_size=4)
    (r,) = collectives(g)
    node = g.node(r["node"])
    assert (node.target, node.module, node.attrs["collectives"]) == ("c10d.allreduce_", "", ["all_reduce"])
    assert inputs(g, node.name) == ["mul"]
    add = next(n for n in g.nodes if n.target == "Tensor.add")
    assert inputs(g, add.name) == [node.name]
    assert node.source is not None and node.source.line == GroupMethod.forward.__code__.co_firstlineno + 2
    assert g.annotations["replay"]["ok"] is False  # a replay outside the group cannot repeat it


class Gathers(nn.Module):
    """A column-parallel linear that keeps its DTensor output (Shard(1), which its output hook
    redistributes to Shard(-1): a new DTensor over the same shard), then a softmax over the sharded
    dimension: DTensor all-gathers inside the softmax's dispatch."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x).softmax(-1).full_tensor()


def gathers_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    return parallelize_module(Gathers(), mesh, {"a": ColwiseParallel(use_local_output=False)}), (torch.randn(2, 8),)


def test_a_redistributed_dtensor_reads_its_producer_and_its_op_holds_the_gather() -> None:
    g = fxviz.capture(gathers_factory, world_size=4)
    assert counts(g) == oracle(gathers_factory, 4)
    softmax = next(n for n in g.nodes if n.target == "Tensor.softmax")
    assert inputs(g, softmax.name) == ["linear"]  # not a constant cutting the graph after the hook
    assert not [n.name for n in g.nodes if n.kind == "constant"]
    (r,) = collectives(g)
    assert (r["kind"], r["mesh_dim"], r["node"]) == ("all_gather", "tp", softmax.name)
    assert softmax.attrs["collectives"] == ["all_gather"] and softmax.attrs["placements"] == "R"
    assert overlays(g)["comm"]["nodes"] == {softmax.name: r["bytes"]}


def test_fsdp2_parameters_and_copies_are_in_the_graph() -> None:
    """FSDP2 swaps each unit's unsharded parameters in before its forward and copies the
    all-gathered bytes into them with their version counters kept: the linears read parameters
    by name (unsharded shapes), and the copy-out is the all-gather's reader and the writer of the
    buffers the parameters are views of."""
    g = fxviz.capture(fsdp_factory, world_size=4)
    linears = [n for n in g.nodes if n.target == "torch.nn.functional.linear"]
    assert [inputs(g, n.name)[1:] for n in linears] == [
        [f"{u}.{m}.weight", f"{u}.{m}.bias"] for u in ("0", "1") for m in ("up", "down")]
    assert [g.node(f"0.{m}.weight").kind for m in ("up", "down")] == ["parameter"] * 2
    assert [tuple(g.node(f"0.{m}.weight").outputs[0].shape) for m in ("up", "down")] == [(64, 16), (16, 64)]
    copies = [n for n in g.nodes if n.target == "fsdp::split_with_sizes_copy"]
    gathers = [g.node(r["node"]) for r in collectives(g)]
    assert len(copies) == len(gathers) == 2
    for copy, gather in zip(copies, gathers, strict=True):
        assert g.node(copy.inputs[0].node).inputs[0].node == gather.name  # a view of the gathered bytes
        views = [n for n in g.nodes if n.target == "torch.as_strided" and n.module == copy.module]
        assert len(views) == 4 and all(inputs(g, v.name) == [copy.name] for v in views)


def test_placements_are_on_the_tree_and_the_reports_edges() -> None:
    """A DTensor's shape is its global one: beside it the tree and the report's edges say how it
    lies on the mesh (``S(1)``), and a partial's subclass (the vocabulary-parallel embedding's
    ``MaskPartial``) reads as the pending sum it is, not its mask's repr."""
    from fxviz.render.html import view_model
    from fxviz.render.tree import tree_text
    from tests.test_distributed import sp_factory

    g = fxviz.capture(sp_factory, world_size=8)
    norm = g.node(g.calls.calls("layers.0.input_layernorm")[0].ops[-1])
    assert norm.attrs["placements"] == "S(1)" and tuple(norm.outputs[0].shape) == (2, 16, 64)
    text = tree_text(g, width=200, unfold=True)
    assert f"{norm.name}  → [2, 16, 64] S(1)" in text
    assert "input_layernorm (RMSNorm)  [2, 4, 64] → [2, 16, 64] S(1)" in text  # the local shard in, DTensor out
    assert "embedding  → [2, 16, 64] P(sum)" in text and "MaskP" not in text
    data = view_model(g)
    row = data["nodes"]["n"].index(norm.name)
    first_out = sum(data["nodes"]["no"][:row])
    assert data["metas"][data["nodes"]["out"][first_out]] == ["[2, 16, 64] S(1)", "float32", "2×16×64 f32 S(1)"]


def test_each_sharded_parameter_carries_torchs_placement_and_fsdp_ones_stay_unsharded() -> None:
    """A tensor-parallel weight is a DTensor (a column-parallel ``S(0)``, a row-parallel ``S(1)``,
    its bias ``R``): its node had no placement, so the edge into the linear said nothing of how it
    lies on the mesh. Each parameter's node now has torch's own placement and mesh (the factory's
    model, built again in a fake group of the test's own), in the report's edges and the JSON; an
    FSDP2 parameter's node is the unsharded one its all-gather gives, and stays without one."""
    from fxviz.render.html import view_model
    from fxviz.torchbridge.distributed import fake_world
    from tests.test_distributed import block_factory, sp_factory

    for factory, world in ((block_factory, 4), (sp_factory, 8)):
        with fake_world(world):
            model, _ = factory()
            torchs = {n: (", ".join(str(p) for p in t.placements), "x".join(map(str, t.device_mesh.shape)))
                      for n, t in model.named_parameters()}
            names = {n: t.device_mesh.mesh_dim_names for n, t in model.named_parameters()}
        g = fxviz.capture(factory, world_size=world)
        read = {n.name for n in g.nodes if n.kind == "parameter"}
        assert read == set(torchs)
        for name, (place, shape) in torchs.items():
            mesh = f"{names[name][0]}={shape}" if names[name] else shape
            assert g.node(name).attrs == {"placements": place, "mesh": mesh}, name
        if factory is block_factory:
            assert [g.node(f"{m}.weight").attrs["placements"] for m in ("q", "o")] == ["S(0)", "S(1)"]
            assert g.node("o.bias").attrs["placements"] == "R"
        back = fxviz.Graph.from_json(g.to_json())
        assert {n: back.node(n).attrs for n in torchs} == {n: g.node(n).attrs for n in torchs}
        data = view_model(back)  # the report's edge out of the weight: its shape and placement
        row = data["nodes"]["n"].index("layers.0.self_attn.q_proj.weight" if factory is sp_factory else "q.weight")
        assert data["metas"][data["nodes"]["out"][sum(data["nodes"]["no"][:row])]][0].endswith(" S(0)")
    g = fxviz.capture(fsdp_factory, world_size=4)
    assert all("placements" not in n.attrs for n in g.nodes if n.kind == "parameter")


def test_in_a_callers_process_group_the_graphs_have_the_models_own_collectives() -> None:
    """A compile map, or a plain capture, in a process group the caller made (no ``world_size``):
    the tracer still learns from c10d's dispatch what ``dist.all_reduce`` wrote, so the eager graph
    the map assigns to Dynamo's graphs has the collective, and the relu reads its result."""
    from fxviz.analyze.compilemap.run import compile_map
    from fxviz.torchbridge.distributed import fake_world

    with warnings.catch_warnings(), fake_world(4):
        warnings.simplefilter("ignore", FutureWarning)
        model, args = own_factory()
        truth = torch._dynamo.explain(model)(*args)
        cmap = compile_map(model, args, backend="aot_eager")
        plain = fxviz.capture(model, args, method="eager")
    assert (truth.graph_count, truth.graph_break_count) == (2, 1)  # torch's own: dist.broadcast breaks
    for g in (cmap.graph, plain):
        reduce = next(n for n in g.ops if n.target.endswith("distributed_c10d.all_reduce"))
        relu = next(n for n in g.ops if n.target == "Tensor.relu")
        assert inputs(g, relu.name) == [reduce.name]
    reduce = next(n for n in cmap.graph.ops if n.target.endswith("distributed_c10d.all_reduce"))
    assert cmap.assigned[reduce.name] == "g0"


def test_a_training_step_records_each_forward_collective_once() -> None:
    """With ``backward=True`` the collectives' recorder is on for the whole step: no second one
    joins it for the forward (each would record, and one node per recorder)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        g = fxviz.capture(own_factory, world_size=4, backward=True)
    recs = collectives(g)
    assert [(r["kind"], r["phase"]) for r in recs] == [("all_reduce", "forward"), ("all_gather", "forward"),
                                                       ("broadcast", "forward")]
    nodes = [n.name for n in g.nodes if n.attrs.get("collectives")]
    assert nodes == [r["node"] for r in recs] == ["all_reduce", "all_gather_single", "broadcast"]
    g = fxviz.capture(lambda: (GroupMethod(), (torch.randn(4, requires_grad=True),)), world_size=4, backward=True)
    (r,) = collectives(g)
    assert [n.name for n in g.nodes if n.target == "c10d.allreduce_"] == [r["node"]]  # below every torch function


def test_sends_and_receives_are_nodes_on_the_values_they_move() -> None:
    """A send returns and writes nothing, yet is a node reading what it sends; a receive is the
    producer of the buffer it filled (``batch_isend_irecv``'s too), which the next op reads."""
    from tests.test_distributed_p2p import p2p_factory

    g = fxviz.capture(p2p_factory, world_size=4)
    recs = collectives(g)
    nodes = [g.node(r["node"]) for r in recs]
    assert [(r["kind"], n.target.rpartition(".")[2]) for r, n in zip(recs, nodes, strict=True)] == [
        ("send", "send"), ("recv", "recv"), ("send", "isend"), ("send", "isend"), ("recv", "irecv")]
    assert inputs(g, nodes[0].name) == ["linear"] and nodes[0].outputs == ()
    add = next(n for n in g.nodes if n.target == "Tensor.add")
    assert [r.node for r in add.inputs][1] == nodes[-1].name  # buf, as the last receive filled it


def test_a_model_sharded_in_the_callers_group_has_its_parameters_placements() -> None:
    """A tensor-parallel model the caller sharded in a group of its own, captured without
    ``world_size`` (and by a compile map's eager graph): each DTensor parameter's node has torch's
    placement, as with ``world_size`` (the recorder's state node takes it as inputs and outputs do;
    it was a pass run only on the ``world_size`` path)."""
    from fxviz.torchbridge.distributed import fake_world
    from tests.test_distributed import block_factory

    with fake_world(4):
        model, args = block_factory()
        torchs = {n: ", ".join(str(p) for p in t.placements) for n, t in model.named_parameters()}
        g = fxviz.capture(model, args, method="eager")
    assert {n.name: n.attrs.get("placements") for n in g.nodes if n.kind == "parameter"} == torchs
    assert torchs["q.weight"] == "S(0)" and torchs["o.weight"] == "S(1)" and torchs["o.bias"] == "R"
