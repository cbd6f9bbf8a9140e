"""The collectives' recorder of a sharded capture: every collective of the forward is recorded,
including those no torch-function mode sees, and the recorder (a dispatch mode, which every op
pays for) is on for the model's run only, not for the rest of the capture (issue 22, benchmark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import fxviz
import fxviz.fallback.comms as comms
import fxviz.torchbridge.guard as guard
from fxviz.passes.comm import collectives
from fxviz.passes.overlays import overlays
from tests.test_distributed import counts, fsdp_factory, mlp_factory, oracle, sp_factory, waited


class Implicit(nn.Module):
    """A softmax over the dimension its DTensor weight is sharded on: DTensor gathers the weight
    inside the softmax's own dispatch, below any torch-function call (no hook, no user line of its own)."""

    def __init__(self) -> None:
        super().__init__()
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        self.w = nn.Parameter(distribute_tensor(torch.randn(8, 16), mesh, [Shard(1)]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.w, dim=1).to_local() + x


def implicit_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Implicit(), (torch.randn(8, 16),)


def test_collective_inside_a_dtensor_op_is_recorded() -> None:
    """The all-gather DTensor runs inside ``torch.softmax``'s dispatch is seen by no torch-function
    mode: a recorder at that level alone would drop it. It belongs to the softmax's node (its
    bytes in the comm overlay, its kind in the node's ``collectives``), not to a node of its own."""
    g = fxviz.capture(implicit_factory, world_size=4)
    want = oracle(implicit_factory, 4)
    assert want[""] == {"all_gather": 1}  # torch's own record: one collective, inside the softmax
    assert counts(g) == want
    (r,) = collectives(g)
    assert (r["kind"], r["group_size"], r["bytes"]) == ("all_gather", 4, 8 * 16 // 4 * 4)
    softmax = g.node(r["node"])
    assert softmax.target == "torch.softmax" and softmax.attrs["collectives"] == ["all_gather"]
    assert overlays(g)["comm"]["nodes"] == {softmax.name: r["bytes"]}
    assert not [n for n in g.nodes if n.kind == "op" and "c10d" in n.target]


@pytest.mark.parametrize(("factory", "world_size"), [(mlp_factory, 8), (sp_factory, 8), (fsdp_factory, 4),
                                                     (implicit_factory, 4)])
def test_a_dropped_collective_is_caught(factory: Any, world_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-module comparison with ``CommDebugMode`` (tensor parallel, sequence parallel,
    FSDP2, implicit redistribution) fails when the recorder loses one collective."""
    record = comms.CommRecorder._record

    def drop_first(self: comms.CommRecorder, *a: Any) -> dict[str, Any]:
        r = record(self, *a)
        if getattr(self, "_dropped", False) is False:
            self._dropped = True  # type: ignore[attr-defined]
            self.records.pop()
        return r

    want = oracle(factory, world_size)
    assert counts(fxviz.capture(factory, world_size=world_size)) == want
    monkeypatch.setattr(comms.CommRecorder, "_record", drop_first)
    assert counts(fxviz.capture(factory, world_size=world_size)) != want


def test_recorder_is_on_for_the_forward_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's snapshot (each DTensor parameter's ``.data`` is a DTensor op) runs without
    the recorder's dispatch mode, which would see each of its ops; the forward runs under it."""
    modes_at_snapshot: list[int] = []
    init = guard.ModelState.__init__

    def spy(self: guard.ModelState, *a: Any, **k: Any) -> None:
        modes_at_snapshot.append(torch._C._len_torch_dispatch_stack())
        init(self, *a, **k)

    monkeypatch.setattr(guard.ModelState, "__init__", spy)
    g = fxviz.capture(mlp_factory, world_size=4)
    assert modes_at_snapshot and set(modes_at_snapshot) == {0}
    assert [r["kind"] for r in collectives(g)] == ["all_reduce"]



class Unseen(nn.Module):
    """Calls on plain tensors where the recorder must stay on: a ``ProcessGroup`` method (a
    collective no torch-function mode sees) and a custom op (``torch.ops``: its kernel may be a
    collective; this one's Python kernel all-reduces, which no dispatch mode sees, torch's
    ``CommDebugMode`` included)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        dist.group.WORLD.allreduce([y]).wait()
        return torch.ops.fxviz_test.reduce_twice(y) + 1


_LIB = torch.library.Library("fxviz_test", "DEF")  # noqa: TOR901 - a test op for the whole session
_LIB.define("reduce_twice(Tensor x) -> Tensor")


def _reduce_twice(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    dist.all_reduce(y)
    return y


_LIB.impl("reduce_twice", _reduce_twice, "CompositeExplicitAutograd")


def unseen_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Unseen(), (torch.randn(2, 8),)


def test_recorder_off_only_for_torch_ops_on_plain_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorder's dispatch mode is off while the tracer runs torch's own ops on plain tensors
    (the relu between the MLP's sharded linears: no ATen op of it reaches the recorder), and on for
    every call that can communicate: a DTensor's op, the collectives DTensor's hooks call, a
    ``ProcessGroup`` method, a custom op. Counts per module are torch's own (``CommDebugMode``)."""
    seen: list[str] = []
    dispatch = comms.CommRecorder.__torch_dispatch__

    def spy(self: comms.CommRecorder, func: Any, *a: Any, **k: Any) -> Any:
        seen.append(str(func.overloadpacket))
        return dispatch(self, func, *a, **k)

    monkeypatch.setattr(comms.CommRecorder, "__torch_dispatch__", spy)
    g = fxviz.capture(mlp_factory, world_size=4)
    assert counts(g) == oracle(mlp_factory, 4)
    relu = next(n for n in g.nodes if n.target == "torch.relu")  # the tracer recorded it, on a plain shard
    assert "aten.relu" not in seen and "aten.relu_" not in seen
    assert "aten.mm" in seen or "aten.addmm" in seen  # the sharded linears' local ops: still seen
    assert "_c10d_functional.all_reduce" in seen
    assert relu.inputs

    seen.clear()
    g = fxviz.capture(unseen_factory, world_size=4)
    want = oracle(unseen_factory, 4)
    assert want == {"": {"all_reduce": 1}}
    assert counts(g) == want
    assert [r["op"] for r in collectives(g)] == ["c10d.allreduce_"]
    assert "fxviz_test.reduce_twice" in seen  # the custom op reached the recorder
    assert "aten.addmm" not in seen  # the plain linear ran with the recorder off


def test_metadata_reads_skip_the_recorder_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The attribute reads DTensor's and the parallel styles' own code makes (``.dtype``,
    ``.requires_grad``, ``.ndim``: most of the calls a tensor-parallel forward hands the tracer)
    leave at the first check: neither the recorder nor the tracer's handler is asked about them,
    only about real ops."""
    import fxviz.fallback.recorder as recorder
    from fxviz.fallback.classify import Action, kind_of

    asked: list[Any] = []
    observed: list[Any] = []
    needs, observer = comms.CommRecorder.needs, recorder.observer

    def spy(self: comms.CommRecorder, func: Any, *a: Any) -> bool:
        asked.append(func)
        return needs(self, func, *a)

    def spy_observer(rec: Any) -> Any:  # the tracer's handler, however the mode calls it
        hot = observer(rec)

        def spied(mode: Any, func: Any, *a: Any) -> Any:
            observed.append(func)
            return hot(mode, func, *a)
        return spied

    monkeypatch.setattr(comms.CommRecorder, "needs", spy)
    monkeypatch.setattr(recorder, "observer", spy_observer)
    g = fxviz.capture(mlp_factory, world_size=4)
    assert counts(g) == oracle(mlp_factory, 4)
    for seen in (asked, observed):
        kinds = [kind_of(f, "function") for f in seen]
        assert {k.name for k in kinds} >= {"linear", "relu"}
        assert [k.target for k in kinds if k.action is Action.SKIP] == []


def test_recorder_dispatch_pays_no_dynamo_wrapper_and_dynamo_still_skips_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``TorchDispatchMode`` wraps a subclass's ``__torch_dispatch__`` in ``torch._disable_dynamo``,
    which every op of a sharded forward paid for; the recorder's code is marked for Dynamo to skip
    instead. Under a compiled function Dynamo's frame callback still sees none of fxviz's frames
    (the recorder's nor what it calls), as with the wrapper, and the collective is recorded."""
    import torch._dynamo
    import torch.distributed._functional_collectives as funcol

    from fxviz.torchbridge.distributed import fake_world

    # the method is the recorder's own function, no wrapper of torch's around it
    assert comms.CommRecorder.__dict__["__torch_dispatch__"].__code__.co_filename == comms.__file__
    seen: list[str] = []
    wrapper = torch._dynamo.convert_frame.CatchErrorsWrapper
    call = wrapper.__call__

    def spy(self: Any, frame: Any, *a: Any, **k: Any) -> Any:
        seen.append(frame.f_code.co_filename)
        return call(self, frame, *a, **k)

    monkeypatch.setattr(wrapper, "__call__", spy)

    @torch.compile(backend="eager")
    def reduce(x: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(x * 2, "sum", dist.group.WORLD) + 1

    package = str(Path(comms.__file__).parent.parent)
    try:
        with fake_world(4):
            recorder = comms.CommRecorder()
            with torch.no_grad(), recorder:
                reduce(torch.ones(4))
    finally:
        torch._dynamo.reset()
    assert [(r["kind"], r["bytes"]) for r in recorder.records] == [("all_reduce", 16)]
    assert any("_functional_collectives" in s for s in seen)  # the callback ran on torch's frames
    assert not [s for s in seen if s.startswith(package)]


def test_a_dtensor_op_is_one_node_not_its_local_ops() -> None:
    """The tracer records the DTensor call the model makes (``F.linear``) once: the ATen ops DTensor
    runs for it, as DTensor ops and again on the local shards (``t``, ``addmm``: torch's own record,
    ``CommDebugMode``'s operations per module), are not ops of the graph; the collective the row-wise
    layer's hook issues is, as torch counts it."""
    from torch.distributed.tensor.debug import CommDebugMode

    from fxviz.torchbridge.distributed import fake_world

    with fake_world(4):
        model, args = mlp_factory()
        mode = CommDebugMode()
        with torch.no_grad(), mode:
            waited(model(*args))
        torch_ops = {path.rpartition(".")[2]: [str(o["name"]) for o in v["operations_list"]]
                     for path, v in mode.comm_module_operation_counts.items()}
    g = fxviz.capture(mlp_factory, world_size=4)
    for layer in ("up", "down"):
        assert torch_ops[layer].count("aten.addmm.default") == 2  # the DTensor op and its local op
        assert "aten.t.default" in torch_ops[layer]
        (call,) = g.calls.calls(layer)
        ops = [g.node(name).target for name in call.ops]
        assert ops.count("torch.nn.functional.linear") == 1
        assert not [t for t in ops if t.startswith("aten") or t in ("Tensor.t", "torch.addmm")]
    assert [t for t in ops if "c10d" in t] == [
        "_c10d_functional::all_reduce", "_c10d_functional::_wrap_tensor_autograd.default"]
    assert torch_ops["down"].count("_c10d_functional.all_reduce.default") == 1


def test_comm_overlay_reads_the_call_tree_the_passes_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sharded capture builds its module call tree once: the passes' serves the ``comm`` overlay
    written after them. Where backward collectives add nodes the overlay reads a tree of the final
    graph: each module's bytes sit on that module's first call."""
    import fxviz.calls as calls
    import fxviz.ir as ir
    import fxviz.passes.tree as tree
    from fxviz.passes.overlays import overlays
    from tests.test_distributed_backward import tp_factory

    built: list[int] = []

    def counted(nodes: Any) -> Any:
        built.append(len(nodes))
        return calls.call_tree(nodes)

    monkeypatch.setattr(tree, "call_tree", counted)
    monkeypatch.setattr(ir, "call_tree", counted)
    forward = fxviz.capture(mlp_factory, world_size=8)
    assert len(built) == 1 and counts(forward) == oracle(mlp_factory, 8)
    for g in (forward, fxviz.capture(tp_factory, world_size=8, backward=True)):
        t = calls.call_tree(g.nodes)
        spec = overlays(g, t)["comm"]
        bytes_of: dict[str, int] = {}
        for r in collectives(g):
            parts = r["module"].split(".") if r["module"] else []
            for k in range(len(parts) + 1):
                path = ".".join(parts[:k])
                bytes_of[path] = bytes_of.get(path, 0) + r["bytes"]
        assert spec["modules"] == {(t.calls(p)[0] if p else t.root).id: b for p, b in bytes_of.items()}
    assert any(r["phase"] == "backward" for r in collectives(g))


def test_forward_only_capture_takes_no_parameter_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorder's id -> name map serves gradient hooks only: a forward-only capture does not
    walk the parameters for it; a backward one does, and names the parameters."""
    made: list[dict[int, str]] = []
    init = comms.CommRecorder.__init__

    def spy(self: comms.CommRecorder, params: dict[int, str] | None = None) -> None:
        init(self, params)
        made.append(self.params)

    monkeypatch.setattr(comms.CommRecorder, "__init__", spy)
    fxviz.capture(mlp_factory, world_size=4)
    fxviz.capture(mlp_factory, world_size=4, backward=True)
    assert made[0] == {}
    assert sorted(made[1].values()) == ["down.bias", "down.weight", "up.bias", "up.weight"]


def test_mesh_names_read_only_until_the_groups_are_named() -> None:
    """The first DTensor names the collectives' group: no further parameter is read; without the
    groups wanted, every one is (the same names either way)."""
    from fxviz.torchbridge.distributed import fake_world

    with fake_world(4):
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        ts = [distribute_tensor(torch.randn(4, 4), mesh, [Shard(0), Shard(1)]) for _ in range(3)]
        read: list[int] = []

        def walk() -> Any:
            for i, t in enumerate(ts):
                read.append(i)
                yield t
        tp = mesh.get_group("tp").group_name
        assert comms.mesh_dims(walk(), {tp}) == {tp: "tp", mesh.get_group("dp").group_name: "dp"}
        assert read == [0]
        read.clear()
        everything = comms.mesh_dims(walk())
        assert read == [0, 1, 2] and everything == comms.mesh_dims(iter(ts), {tp})
        assert comms.mesh_dims(iter(ts), set()) == {}


def test_placements_formatted_once_per_mesh_and_placements(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sharded forward's DTensor outputs share a few placements: each is formatted once per
    recording, and every node still carries its own attrs, as formatting each anew gives them."""
    import fxviz.torchbridge.distributed as distributed

    real = distributed.format_placement
    formatted: list[dict[str, str]] = []

    def spy(placements: Any, mesh: Any) -> dict[str, str]:
        formatted.append(real(placements, mesh))
        return formatted[-1]

    monkeypatch.setattr(distributed, "format_placement", spy)
    g = fxviz.capture(sp_factory, world_size=8)
    placed = [n for n in g.nodes if "placements" in n.attrs]
    assert len(placed) >= 20
    assert len({id(n.attrs) for n in placed}) == len(placed)
    kinds = {(n.attrs["placements"], n.attrs["mesh"]) for n in placed}
    ops = {(n.attrs["placements"], n.attrs["mesh"]) for n in placed if n.kind != "parameter"}
    params = {(n.attrs["placements"], n.attrs["mesh"]) for n in placed if n.kind == "parameter"}
    # the embedding's MaskPartial and the linears' Partial: two placements, one text (``P(sum)``);
    # the parameters' placements, after the recording, each once too
    assert len(formatted) == len(ops) + 1 + len(params) < len(placed)
    assert kinds == {(f["placements"], f["mesh"]) for f in formatted}
