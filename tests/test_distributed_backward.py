"""A training step of a sharded model: ``capture(backward=True, world_size=N)`` (issue 22 point 5).

The backward's collectives (tensor parallel's all-reduce of the input gradient, sequence parallel's
gathers and scatters, FSDP2's gradient reduce-scatters and backward all-gathers) are nodes of the
backward phase, in the module call of the backward op that ran them, and agree with torch's
``CommDebugMode`` over the same forward and backward.

``CommDebugMode`` names, for a backward collective, the last module whose backward began (a
module backward pre-hook, never popped), fxviz the module of the backward op (autograd node) that
ran it, which is where the op's forward ran. Both agree on every module that holds others (a
layer, an FSDP unit, the model); the leaf they name differs where a collective runs between leaf
modules: FSDP2's reduce-scatter after a block's first layer (fxviz: in the block, the FSDP unit
whose gradients it reduces), sequence parallel's redistribution of
an input that two projections read. The tests compare the whole table where both agree (tensor
parallel) and every module with submodules elsewhere, with the totals per kind always exact.
"""

from __future__ import annotations

import re
import warnings
from collections import Counter
from typing import Any

import pytest
import torch
import torch.distributed as dist
from click.testing import CliRunner
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils._python_dispatch import TorchDispatchMode

import fxviz
from fxviz.fallback.comms import COLLECTIVES, _kind
from fxviz.ir import Graph
from fxviz.passes.comm import collectives
from fxviz.passes.overlays import overlays
from fxviz.torchbridge.distributed import end_world
from fxviz.torchbridge.source import is_user_file
from tests.test_distributed import FACTORY, MLP, _bench, fsdp_factory, sp_factory
from tests.test_distributed_fsdp import gpt_factory, meta_factory, units

Counts = dict[str, dict[str, dict[str, int]]]  # module -> phase -> kind -> count


class Pre(nn.Module):
    """A plain layer before a tensor-parallel MLP: the MLP's input needs a gradient, whose
    partial sums the colwise layer's input redistribution all-reduces in the backward."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 16)
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.inp(x))


def tp_factory():
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    m = Pre()
    parallelize_module(m.mlp, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return m, (torch.randn(4, 16),)


def oracle(factory, world_size: int) -> Counts:
    """``CommDebugMode``'s per-module counts over one forward and backward (the loss fxviz takes
    by default: the output's sum), each module's own and its submodules', as it keeps them."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        model, args = factory()
        with CommDebugMode() as mode:
            model(*args).sum().backward()
        return {("" if k == "Global" else k.partition(".")[2]): {
                    phase: {_kind(str(op)): n for op, n in v[phase].items() if n} for phase in ("forward", "backward")}
                for k, v in mode.comm_module_counts.items()}
    finally:
        end_world()


def counts(graph: Graph) -> Counts:
    """The graph's records counted as ``CommDebugMode`` counts: per module, own and inherited by
    every ancestor that ran, forward and backward apart."""
    tree = graph.calls
    out: Counts = {}
    for r in collectives(graph):
        parts = r["module"].split(".") if r["module"] else []
        for k in range(len(parts), -1, -1):
            prefix = ".".join(parts[:k])
            if k and not tree.calls(prefix):  # a container never called (ModuleList): no module of its own
                continue
            d = out.setdefault(prefix, {"forward": {}, "backward": {}})[r["phase"]]
            d[r["kind"]] = d.get(r["kind"], 0) + 1
    return out


def totals(table: Counts) -> dict[str, dict[str, int]]:
    return table[""]


def test_tp_input_gradient_all_reduce_is_a_backward_node_in_the_colwise_layer() -> None:
    g = fxviz.capture(tp_factory, world_size=4, backward=True)
    want = oracle(tp_factory, 4)
    assert want["mlp.up"]["backward"] == {"all_reduce": 1}  # torch's own record: the input gradient
    assert counts(g) == want  # every module, both phases
    recs = collectives(g)
    assert [(r["phase"], r["kind"], r["module"], r["bytes"]) for r in recs] == [
        ("forward", "all_reduce", "mlp.down", 4 * 16 * 4),  # the rowwise layer's partial output
        ("backward", "all_reduce", "mlp.up", 4 * 16 * 4)]  # the colwise layer's partial input gradient
    # the line of the forward op whose input redistribution it differentiates: the MLP's one line
    assert recs[1]["source"].endswith(f"test_distributed.py:{MLP.forward.__code__.co_firstlineno + 1}")
    node = g.node(recs[1]["node"])
    assert (node.kind, node.phase, node.module, node.target) == ("op", "backward", "mlp.up", recs[1]["op"])
    during = g.node(node.attrs["during"])
    assert during.phase == "backward" and during.target == "_FromTorchTensorBackward"  # DTensor.from_local's backward
    assert g.nodes.index(node) == g.nodes.index(during) + 1
    assert overlays(g)["comm"]["nodes"][node.name] == 256
    assert overlays(g)["comm"]["modules"][g.calls.calls("mlp")[0].id] == 512  # forward and backward
    g2 = Graph.from_json(g.to_json())
    assert collectives(g2) == collectives(g) and g2.node(node.name).phase == "backward"


def test_fsdp2_gradient_reduce_scatter_per_unit_equals_comm_debug_mode() -> None:
    made: list[nn.Module] = []

    def factory():
        m, args = fsdp_factory()
        made.append(m)
        return m, args

    g = fxviz.capture(factory, world_size=4, backward=True)
    want = oracle(fsdp_factory, 4)
    assert totals(want)["backward"] == {"all_gather": 2, "reduce_scatter": 2}
    units = ("", "0", "1")  # the model and both FSDP units, both phases (leaves: see the docstring)
    assert {u: counts(g)[u] for u in units} == {u: want[u] for u in units}
    bw = [r for r in collectives(g) if r["phase"] == "backward"]
    params = sum(p.numel() for p in MLP().parameters())
    scatters = [r for r in bw if r["kind"] == "reduce_scatter"]
    # block 1's gradients first (autograd runs the last block first), each the unit's whole
    # unsharded gradient (float32) going in, on the dp dimension, in the unit
    assert [(r["module"], r["bytes"], r["mesh_dim"], r["group_size"]) for r in scatters] == [
        ("1", params * 4, "dp", 4), ("0", params * 4, "dp", 4)]
    assert all(g.node(r["node"]).phase == "backward" for r in bw)
    assert [p.grad for p in made[0].parameters()] == [None] * 8  # .grad put back (FSDP2 wrote the shards')
    assert not dist.is_initialized()


def test_sequence_parallel_backward_on_2d_mesh_equals_comm_debug_mode() -> None:
    g = fxviz.capture(sp_factory, world_size=8, backward=True)
    want = oracle(sp_factory, 8)
    assert totals(want)["backward"] == {"all_gather": 5, "reduce_scatter": 4}
    # every module, leaves too: the reduce-scatter of a projection's input gradient (the backward of
    # the attention's and the MLP's input gather, which no forward op of the tracer's holds) is in
    # the projection whose backward handed it its last gradient (q_proj, gate_proj: they run last),
    # where CommDebugMode counts it; it was in the first (v_proj, up_proj)
    assert counts(g) == want
    bw = [r for r in collectives(g) if r["phase"] == "backward"]
    assert {r["mesh_dim"] for r in bw} == {"tp"} and all(r.get("node") for r in bw)
    # the backward of each layer's Shard(1) output of o_proj and down_proj gathers its gradient
    assert [r["module"] for r in bw if r["kind"] == "all_gather"] == [
        "layers.1.mlp.down_proj", "layers.1.self_attn.o_proj", "layers.0.mlp.down_proj",
        "layers.0.self_attn.o_proj", "embed_tokens"]
    assert [(t["mesh_dim"], t["count"], t["backward"]) for t in g.annotations["comm_totals"]] == [("tp", 18, 9)]
    assert any(n.startswith("collectives on mesh dimension tp") and ": 18 (9 forward, 9 backward), " in n for n in g.notes)


def _reduce_grad(g: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(g)
    return g


def hand_ddp_factory():
    """Data parallel by hand: a hook on each parameter's gradient all-reduces it."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    for p in m.parameters():
        p.register_hook(_reduce_grad)
    return m, (torch.randn(2, 8),)


def test_gradient_hook_collectives_sit_in_the_parameters_module() -> None:
    g = fxviz.capture(hand_ddp_factory, world_size=2, backward=True)
    want = oracle(hand_ddp_factory, 2)
    assert totals(want)["backward"] == {"all_reduce": 4}
    recs = collectives(g)
    assert [(r["phase"], r["kind"], r["module"], r["bytes"], r["grad_of"]) for r in recs] == [
        ("backward", "all_reduce", "2", 16, "2.bias"), ("backward", "all_reduce", "2", 128, "2.weight"),
        ("backward", "all_reduce", "0", 32, "0.bias"), ("backward", "all_reduce", "0", 256, "0.weight")]
    for r in recs:  # after the backward op that made the gradient
        node = g.node(r["node"])
        assert node.phase == "backward" and g.nodes.index(node) > g.nodes.index(g.node(node.attrs["during"]))


def test_post_accumulate_grad_hooks_not_run_are_said() -> None:
    def factory():
        m, args = hand_ddp_factory()
        m[0].weight.register_post_accumulate_grad_hook(lambda p: dist.all_reduce(p.grad))
        return m, args

    g = fxviz.capture(factory, world_size=2, backward=True)
    assert len(collectives(g)) == 4  # the gradient hooks' only: the post-accumulate one never ran
    assert any(n.startswith("1 parameters have post-accumulate-grad hooks, which this backward") for n in g.notes)


# the CLI's tensor-parallel MLP factory, with an input that requires grad
TP_FACTORY = FACTORY.replace("torch.randn(4, 16),)", "torch.randn(4, 16, requires_grad=True),)")
assert TP_FACTORY != FACTORY


def test_cli_backward_world_size(tmp_path: Any) -> None:
    from fxviz.cli import cli

    f = tmp_path / "tp.py"
    f.write_text(TP_FACTORY)
    out = tmp_path / "g.json"
    r = CliRunner().invoke(cli, ["json", f"{f}:build", "--world-size", "4", "--backward", "-o", str(out)])
    assert r.exit_code == 0, r.output
    g = Graph.from_json(out.read_text())
    assert [(c["phase"], c["kind"], c["module"], c["bytes"]) for c in collectives(g)] == [
        ("forward", "all_reduce", "down", 256), ("backward", "all_reduce", "up", 256)]
    assert not dist.is_initialized()


def _read_again(factory: Any, world_size: int) -> tuple[dict[str, int], Counter[str]]:
    """Torch's own record of the real step: each parameter's unsharded storage after the forward
    (bytes: 0 where FSDP2 resharded and freed it), and how many autograd nodes of the backward
    unpack a saved tensor on each freed one (``saved_tensors_hooks``: the node running at unpack),
    by the parameter's name."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        model, args = factory()
        unpacked: dict[Any, list[torch.Tensor]] = {}

        def unpack(t: torch.Tensor) -> torch.Tensor:
            unpacked.setdefault(torch._C._current_autograd_node(), []).append(t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, unpack):
            loss = model(*args).sum()
        params = [p for _, ps in units(model) for p in ps]
        after = {p._param_fqn: p._unsharded_param.untyped_storage().nbytes() for p in params}
        freed = {p._unsharded_param.untyped_storage()._cdata: p._param_fqn for p in params if not after[p._param_fqn]}
        loss.backward()
        read = Counter(name for ts in unpacked.values()
                       for name in {freed[t.untyped_storage()._cdata] for t in ts if t.untyped_storage()._cdata in freed})
        return after, read
    finally:
        end_world()


@pytest.mark.parametrize("factory", [gpt_factory, meta_factory], ids=["real", "meta"])
def test_the_backward_reads_a_resharded_parameter_from_its_re_gather(factory: Any) -> None:
    """FSDP2 frees a resharding unit's unsharded parameters after its forward (their storage is
    0 bytes then: torch's record) and its backward re-gather fills them again, so what each
    backward op reads of them is the re-gather's: the re-gather node gives the parameters it
    gathers (its outputs, the unsharded shapes, in ``gathers_of``'s order) and the backward ops read
    them there, not from the forward's parameter nodes. Which parameters the backward reads so and
    by how many autograd nodes equals the real step's ``saved_tensors_hooks`` record (unpacks of a
    freed storage); the root unit, never freed, is read from the forward's nodes."""
    g = fxviz.capture(factory, world_size=8, backward=True)
    after, read = _read_again(gpt_factory, 8)
    freed = {name for name, nbytes in after.items() if not nbytes}
    assert freed == {name for name in after if name.startswith("h.")}  # the root unit keeps its parameters
    gathers = [g.node(r["node"]) for r in collectives(g) if r.get("gathers_of")]
    fed: Counter[str] = Counter()
    for node in gathers:
        assert [tuple(m.shape) for m in node.outputs] == [tuple(g.node(p).outputs[0].shape) for p in node.attrs["gathers_of"]]
        for n in g.nodes:
            fed.update({node.attrs["gathers_of"][r.index] for r in n.inputs if r.node == node.name})
            assert not {r.node for r in n.inputs if r.node == node.name} or (n.phase, n.kind) == ("backward", "op")
    assert sorted(p for node in gathers for p in node.attrs["gathers_of"]) == sorted(freed)
    assert fed == read and set(read) < freed  # the ops read the weights and the norms' parameters; no bias of a linear
    stale = {r.node for n in g.nodes if n.phase == "backward" and n.kind == "op" for r in n.inputs} & freed
    assert not stale  # nothing of the backward reads a freed parameter's forward value
    kept = {r.node for n in g.nodes if n.phase == "backward" and n.kind == "op" for r in n.inputs}
    assert {"ln_f.weight", "ln_f.bias"} <= kept  # the root's, read where the forward made them
    assert not g.annotations["shapes"]["missing"]


class _BackwardComms(TorchDispatchMode):
    """torch's own record of the backward's collectives: each one the autograd engine dispatches, with
    where the forward made its autograd node (under anomaly mode: ``metadata["traceback_"]``)."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[str, str]] = []  # (kind, the innermost user line), in the order they ran

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        node = torch._C._current_autograd_node()
        if func._overloadpacket in COLLECTIVES and node is not None:
            frames = re.findall(r'File "([^"]+)", line (\d+)', "".join(node.metadata.get("traceback_", [])))
            user = [f"{f}:{line}" for f, line in frames if is_user_file(f)]
            self.made.append((_kind(str(func._overloadpacket)), user[-1] if user else ""))
        return func(*args, **(kwargs or {}))


def anomaly_lines(factory: Any, world_size: int) -> list[tuple[str, str]]:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        model, args = factory()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # anomaly mode says it is slow
            with torch.autograd.detect_anomaly(check_nan=False):
                loss = model(*args).sum()
                with _BackwardComms() as mode:
                    loss.backward()
        return mode.made
    finally:
        end_world()


def test_sequence_parallel_backward_collectives_have_the_line_torchs_autograd_record_names() -> None:
    """The reduce-scatter of a sequence-parallel input's gradient runs in the backward of the
    redistribution the attention's and the MLP's input hook made (``RedistributeBackward``), an
    autograd Function the tracer never sees: it had no line. torch's anomaly record names, for that
    autograd node, the line that called the attention or the MLP; every backward collective has
    its autograd node's line, in the module CommDebugMode counts it in."""
    g = fxviz.capture(sp_factory, world_size=8, backward=True)
    want = anomaly_lines(sp_factory, 8)
    bw = [r for r in collectives(g) if r["phase"] == "backward"]
    assert {r["kind"] for r in bw} == {"all_gather", "reduce_scatter"} and len(want) == len(bw) == 9
    assert [(r["kind"], r["source"]) for r in bw] == want
    layer = _bench().Layer.forward.__code__.co_firstlineno
    assert [(r["module"], int(r["source"].rpartition(":")[2]) - layer) for r in bw if r["kind"] == "reduce_scatter"] == [
        (f"layers.{i}.{m}", k) for i in (1, 0) for m, k in (("mlp.gate_proj", 2), ("self_attn.q_proj", 1))]
    assert counts(g) == oracle(sp_factory, 8)


class _Sent(TorchDispatchMode):
    """torch's dispatch of the step: each collective op, its phase and the bytes each rank sends."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, str, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torch.distributed.tensor import DTensor

        from fxviz.fallback.comms import SENDS

        if DTensor in types:
            return NotImplemented  # DTensor's own ops: their collectives come back here, desugared
        if func._overloadpacket in COLLECTIVES:
            t = args[SENDS[func._overloadpacket]]
            phase = "backward" if torch._C._current_graph_task_id() != -1 else "forward"
            self.ops.append((str(func._overloadpacket), phase, t.numel() * t.element_size()))
        return func(*args, **(kwargs or {}))


def attn_factory():
    """The TP attention block and MLP (colwise q/k/v/up, rowwise o/down), its input trainable."""
    from tests.test_distributed import block_factory

    m, (x,) = block_factory()
    return m, (x.requires_grad_(),)


def test_tp_attention_block_step_equals_comm_debug_mode_per_module_with_bytes() -> None:
    """Pinned agreement (the audit found none to fix): the training step of a tensor-parallel
    attention block has exactly ``CommDebugMode``'s collectives per module and phase, leaves
    included (each colwise layer's input-gradient all-reduce in that layer), and the bytes torch's
    dispatch gives each, in its order."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    g = fxviz.capture(attn_factory, world_size=4, backward=True)
    want = oracle(attn_factory, 4)
    assert {m: want[m]["backward"] for m in ("q", "k", "v", "mlp.up")} == {m: {"all_reduce": 1} for m in ("q", "k", "v", "mlp.up")}
    assert counts(g) == want
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        model, args = attn_factory()
        with _Sent() as sent:
            model(*args).sum().backward()
    finally:
        end_world()
    assert [(r["op"], r["phase"], r["bytes"]) for r in collectives(g)] == sent.ops
    assert [r["bytes"] for r in collectives(g)] == [2 * 5 * 32 * 4] * 6  # [2, 5, 32] float32, each


def hooked_sp_factory():
    """The TP+SP decoder with the user's own full backward hooks on its attention and MLP (as
    profilers and debugging tools register): each puts an identity autograd node at the module's
    input, between its projections' backward and its input redistribution's reduce-scatter."""
    m, args = sp_factory()
    for layer in m.layers:
        for mod in (layer.self_attn, layer.mlp):
            mod.register_full_backward_hook(lambda *_: None)
    return m, args


def test_a_full_backward_hook_does_not_move_a_redistributions_backward_collective() -> None:
    # CommDebugMode counts each reduce-scatter in q_proj / gate_proj (the last module whose backward
    # began), hooks or not; fxviz had it in self_attn / mlp, the module of the hook's identity node
    g = fxviz.capture(hooked_sp_factory, world_size=8, backward=True)
    want = oracle(hooked_sp_factory, 8)
    assert want["layers.0.mlp.gate_proj"]["backward"] == {"reduce_scatter": 1}
    assert counts(g) == want
    # and on the same run: CommDebugMode around the capture (it puts such a hook on every module)
    with CommDebugMode() as mode:
        g = fxviz.capture(sp_factory, world_size=8, backward=True)
    same = {k.partition(".")[2]: {_kind(str(op)): n for op, n in v["backward"].items() if n}
            for k, v in mode.comm_module_counts.items() if "." in k}  # every submodule, backward
    assert {k: v["backward"] for k, v in counts(g).items() if k} == same


class _SharedOut(nn.Module):
    """A row-parallel layer whose Shard(0) output stays a DTensor (``use_local_output=False``) and
    is read by the next module, a sequence-parallel norm: the gradient of the redistribution its
    output hook ran (Partial -> Shard(0): a reduce-scatter; backward: an all-gather) comes from
    outside the layer."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = MLP()
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.mlp(x))


def shared_out_factory():
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import SequenceParallel

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    plan = {"mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel(output_layouts=Shard(0), use_local_output=False),
            "norm": SequenceParallel(sequence_dim=0)}
    return parallelize_module(_SharedOut(), mesh, plan), (torch.randn(4, 16, requires_grad=True),)


def test_an_output_redistributions_backward_is_in_the_module_whose_hook_ran_it() -> None:
    # CommDebugMode counts the all-gather in mlp.down (its full backward pre-hook fires on the output
    # after the parallel style's hook); fxviz had it in norm, the module that handed it its gradient,
    # with mlp's line `self.down(...)` as its source
    g = fxviz.capture(shared_out_factory, world_size=2, backward=True)
    want = oracle(shared_out_factory, 2)
    assert want["mlp.down"]["backward"] == {"all_gather": 1}
    assert counts(g) == want
    (gather,) = [r for r in collectives(g) if r["kind"] == "all_gather"]
    assert (gather["module"], gather["phase"], gather["bytes"]) == ("mlp.down", "backward", 2 * 16 * 4)  # [2, 16] shard


class _SharedOutStep(_SharedOut):
    """The same step, its backward run by the forward itself (as a pipeline schedule's step does)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():
            out = super().forward(x)
            out.sum().backward()
        return out.detach()


def shared_out_step_factory():
    m, args = shared_out_factory()
    m.__class__ = _SharedOutStep
    return m, args


def test_an_output_redistributions_backward_run_by_the_forward_is_where_torch_counts_it() -> None:
    # CommDebugMode cannot count a backward the forward runs ("The Module hierarchy tracking is
    # wrong"): its table for the same step run after the forward is the reference; fxviz had the
    # all-gather in norm, on no line
    g = fxviz.capture(shared_out_step_factory, world_size=2)
    want = oracle(shared_out_factory, 2)
    got = counts(g)
    assert {m: got[m]["backward"] for m in got} == {m: want[m]["backward"] for m in want}
    (gather,) = [r for r in collectives(g) if r["kind"] == "all_gather"]
    assert (gather["module"], gather["phase"], gather["bytes"]) == ("mlp.down", "backward", 2 * 16 * 4)
    assert gather["source"].endswith("tests/test_distributed.py:45")  # MLP's `self.down(...)`, as in the step's
