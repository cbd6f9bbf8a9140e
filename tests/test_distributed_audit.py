"""Issue 22 audit: what a sharded graph shows against torch's own record of the same run, on the
configurations a new user tries that the other tests do not (meta and fake tensors, explicit
redistributions)."""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.overrides import TorchFunctionMode, resolve_name
from torch.utils._python_dispatch import TorchDispatchMode

import fxviz
from fxviz.fallback.comms import COLLECTIVES, _kind
from fxviz.ir import Graph, Ref
from fxviz.passes.comm import collectives
from fxviz.passes.overlays import overlays
from fxviz.torchbridge.distributed import fake_world
from fxviz.torchbridge.source import is_user_file
from tests.test_distributed import _bench, mlp_factory, waited

Factory = Callable[[], tuple[nn.Module, tuple[Any, ...]]]


class _Readers(TorchFunctionMode):
    """torch's own record of who reads a module's output: each torch-function call (named as
    ``resolve_name`` names it) that takes, by identity, the output of one of ``outputs``' modules."""

    def __init__(self, outputs: dict[int, str]) -> None:
        super().__init__()
        self.outputs = outputs
        self.reads: Counter[tuple[str, str]] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        for a in (*args, *(kwargs or {}).values()):
            module = self.outputs.get(id(a)) if isinstance(a, torch.Tensor) else None
            if module is not None:
                name = resolve_name(func) or str(func)  # a method as fxviz names it: Tensor.view
                self.reads[(name.removeprefix("torch.") if name.startswith("torch.Tensor.") else name, module)] += 1
        return func(*args, **(kwargs or {}))


def readers_in_torch(factory: Factory, world_size: int, kind: type[nn.Module] = nn.Linear) -> Counter[tuple[str, str]]:
    """(reader, module) for every call outside a ``kind`` module that reads that module's output,
    as torch runs the model (forward hooks give the outputs, a function mode the readers)."""
    with fake_world(world_size):
        model, args = factory()
        outputs: dict[int, str] = {}
        keep: list[torch.Tensor] = []  # ids stay those of live tensors
        def hook(name: str) -> Any:
            def h(mod: nn.Module, inputs: Any, out: Any) -> None:
                outputs[id(out)] = name
                keep.append(out)
            return h
        handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if isinstance(m, kind)]
        mode = _Readers(outputs)
        try:
            with torch.no_grad(), mode:
                waited(model(*args))
        finally:
            for h in handles:
                h.remove()
    return mode.reads


def readers_in_graph(g: Graph, kind: str = "Linear") -> Counter[tuple[str, str]]:
    """The same from the graph: each op outside a ``kind`` module call that reads a value made
    inside one (its output)."""
    calls = {c.path: c for c in g.calls.walk() if c.path and g.modules[c.path].cls == kind}
    made_in = {n: path for path, c in calls.items() for n in c.nodes}
    out: Counter[tuple[str, str]] = Counter()
    for n in g.nodes:
        if n.kind != "op":
            continue
        inside = g.calls.of(n.name).path
        for r in n.inputs:
            src = made_in.get(r.node)
            if src is not None and not (inside == src or inside.startswith(src + ".")):
                out[(n.target, src)] += 1
    return out


def llama_on_meta() -> tuple[nn.Module, tuple[torch.Tensor]]:
    return _bench().llama70b(1)


def test_on_meta_each_column_parallel_output_is_read_by_the_ops_torch_runs_on_it() -> None:
    """The LLaMA-70B shape sharded 8 ways on meta: a column-parallel linear's DTensor output
    reaches the next op as its local shard (``to_local`` in the layer's output hook). The graph
    read those shards as constants no op made (14 in two layers): the shards of fake tensors, which
    have no data pointer, were never matched with the DTensor that holds them."""
    g = fxviz.capture(llama_on_meta, world_size=8)
    assert not [n.name for n in g.nodes if n.kind == "constant"]
    want = readers_in_torch(llama_on_meta, 8)
    assert want and readers_in_graph(g) == want
    assert not dist.is_initialized()


def test_the_compile_maps_skimmed_trace_of_a_sharded_model_keeps_its_data_flow(monkeypatch: pytest.MonkeyPatch) -> None:
    """``fxviz compile --world-size 2`` may trace the eager graph with the products skipped
    (:mod:`fxviz.analyze.compilemap.skim`; it traced on fake tensors before, where the
    column-parallel ``up``'s output reached ``relu`` as a constant and the tree drew ``up`` as a
    call that raised, ``→ ✗``): the DTensor's local shards still carry the data flow."""
    from fxviz.analyze.compilemap import compile_map, skim

    monkeypatch.setattr(skim.Arithmetic, "worth_skimming", lambda self: True)  # as a large model gets
    from torch._C._distributed_c10d import _get_work_registry_size

    with fake_world(2):
        model, args = mlp_factory()
        before = _get_work_registry_size()
        cmap = compile_map(model, args, backend="eager")
        # the compiled run's row-parallel output was left unwaited (torch warned of it at exit)
        assert _get_work_registry_size() == before
    g = cmap.graph
    assert g.method == "eager" and not [n.name for n in g.nodes if n.kind == "constant"]
    assert g.calls.calls("up")[0].outputs
    assert readers_in_graph(g) == readers_in_torch(mlp_factory, 2)


class Redistributes(nn.Module):
    """DTensor's redistributions called in the model's own code: Shard(0) -> Shard(1) (an
    all-to-all, or a gather where the rows do not split evenly), -> Replicate (an all-gather), and a
    partial sum -> Shard(0) (a reduce-scatter); a DTensor in, a DTensor out."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(12, 12)

    def forward(self, x: Any) -> Any:
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

        y = x.redistribute(x.device_mesh, [Shard(1)])
        z = y.redistribute(x.device_mesh, [Replicate()])
        p = DTensor.from_local(self.lin(z.to_local()), x.device_mesh, [Partial()])
        return p.redistribute(x.device_mesh, [Shard(0)])


def redistributes_factory() -> tuple[nn.Module, tuple[Any]]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    return Redistributes(), (distribute_tensor(torch.randn(10, 12), mesh, [Shard(0)]),)


@pytest.mark.parametrize("world_size", [3, 4])
def test_a_dtensor_the_model_takes_or_returns_has_its_own_shape_and_placement(world_size: int) -> None:
    """The model's DTensor input and output as torch has them (``.shape``, ``.placements``): the
    output showed the shape of the shard the reduce-scatter left on rank 0 (``[4, 12]`` at world
    size 3, of ``[10, 12]``), and neither said how it lies on the mesh."""
    from fxviz.render.tree import tree_text

    g = fxviz.capture(redistributes_factory, world_size=world_size)
    with fake_world(world_size):
        model, (x,) = redistributes_factory()
        with torch.no_grad():
            out = model(x)
        want = {"x": (tuple(x.shape), str(x.placements[0])), "output": (tuple(out.shape), str(out.placements[0]))}
    got = {n.target: (tuple(n.outputs[0].shape), n.attrs.get("placements")) for n in g.nodes if n.kind in ("input", "output")}
    assert got == want == {"x": ((10, 12), "S(0)"), "output": ((10, 12), "S(0)")}
    text = tree_text(g, width=200)
    assert "▶ x  [10, 12] S(0) float32" in text and "◀ output  [10, 12] S(0) float32" in text
    assert Graph.from_json(g.to_json()).node("output").attrs["placements"] == "S(0)"


def test_fsdp2_backward_all_gathers_are_in_the_unit_whose_backward_began_as_torch_counts_them() -> None:
    """FSDP2 over tensor parallel: each unit's re-gather (and its prefetch of the next unit's) runs
    in the unit's pre-backward hook. The graph put both in ``1.down``, the submodule whose backward
    op ran first; ``CommDebugMode`` counts them in ``1``, every module compared, leaves too."""
    from tests.test_distributed_backward import counts as step_counts
    from tests.test_distributed_backward import oracle as step_oracle
    from tests.test_distributed_fsdp import fsdp_tp_factory

    g = fxviz.capture(fsdp_tp_factory, world_size=8, backward=True)
    want, got = step_oracle(fsdp_tp_factory, 8), step_counts(g)

    def gathers(table: dict[str, Any]) -> dict[str, int]:
        return {p: n for p, v in table.items() if (n := v["backward"].get("all_gather", 0))}

    assert gathers(want) == {"": 2, "1": 2} and gathers(got) == gathers(want)
    assert [g.node(r["node"]).module for r in collectives(g)
            if r["phase"] == "backward" and r["kind"] == "all_gather"] == ["1", "1"]


def mesh_2x4_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from tests.test_distributed import MLP

    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    return parallelize_module(MLP(), mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()}), (torch.randn(4, 16),)


def cuda_mesh_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    from torch.distributed.device_mesh import init_device_mesh

    from tests.test_distributed import MLP

    init_device_mesh("cuda", (dist.get_world_size(),))
    return MLP().cuda(), (torch.randn(4, 16),)


def test_a_world_size_the_mesh_cannot_use_or_a_factory_that_needs_a_gpu_says_what_to_do(tmp_path: Any) -> None:
    """The line named torch's complaint and nothing to do about it: now the world size the mesh
    asks for (torch's own mesh, built at that size, has it), or that the fake group runs on the CPU."""
    from fxviz.errors import TargetError

    with pytest.raises(TargetError) as e:
        fxviz.capture(mesh_2x4_factory, world_size=6)
    assert "\n" not in str(e.value) and str(e.value).endswith("pass --world-size 8 (world_size=8)")
    with fake_world(8):
        model, _ = mesh_2x4_factory()
        assert model.up.weight.device_mesh._get_root_mesh().size() == 8  # torch's mesh, at the size asked for
    assert collectives(fxviz.capture(mesh_2x4_factory, world_size=8))
    if not torch.cuda.is_available():  # on a GPU, the fake group takes a CUDA mesh (tests/test_cuda_sharded.py)
        with pytest.raises(TargetError, match=r"runs in this process, on its CPU: build the mesh with init_device_mesh\('cpu'"):
            fxviz.capture(cuda_mesh_factory, world_size=2)
    assert not dist.is_initialized()


def test_a_world_size_that_does_not_divide_a_sharded_dimension_is_named() -> None:
    """At world size 6 the column-parallel ``up`` (64 output features) shards unevenly; torch's own
    run fails in the next layer's sharding propagation (a [4, 66] global shape). The line said only
    torch's complaint; it names the parameter and dimension torch sharded unevenly."""
    from fxviz.errors import ModelError

    with fake_world(6):
        model, args = mlp_factory()
        with pytest.raises(RuntimeError, match="Sharding propagation failed"):  # torch's own run
            model(*args)
        w = model.up.weight
        assert (w.placements[0].dim, w.shape[0], w.device_mesh.size()) == (0, 64, 6) and 64 % 6
    with pytest.raises(ModelError) as e:
        fxviz.capture(mlp_factory, world_size=6)
    assert "Sharding propagation failed" in str(e.value)  # torch's words, then what to do
    assert str(e.value).endswith("; up.weight's dimension 0 (64) does not split evenly over the 6 ranks of the "
                                 "mesh, and the tensor-parallel styles take even shards: use a world size that divides it")
    assert e.value.graph is not None and collectives(e.value.graph) == []


def test_the_cli_says_what_it_captures_while_a_sharded_capture_runs(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sharded capture takes seconds to tens of them (GPT-2 small under FSDP2 at world size 8,
    its step with the capture and CommDebugMode's run: 81 s here) and printed nothing meanwhile; a
    terminal now shows a spinner saying what runs, around the whole of it (the fake group is made
    and destroyed inside)."""
    import contextlib

    from click.testing import CliRunner

    import fxviz.cli.base as base
    from fxviz.cli import cli
    from tests.test_distributed import FACTORY

    shown: list[tuple[str, bool]] = []

    @contextlib.contextmanager
    def spinner(text: str) -> Any:
        shown.append((text, dist.is_initialized()))
        yield
        shown.append(("done", dist.is_initialized()))

    monkeypatch.setattr(base, "spinner", spinner)
    f = tmp_path / "tp.py"
    f.write_text(FACTORY)
    r = CliRunner().invoke(cli, ["tree", f"{f}:build", "--world-size", "8"])
    assert r.exit_code == 0, r.output
    assert shown == [(f"capturing {f}:build in a fake process group of 8 ranks …", False), ("done", False)]


class UserCalls(nn.Module):
    """Each of DTensor's redistribution calls in the model's own code, one a line: Shard(0) -> Shard(1)
    (an all-gather, as torch plans it here), -> Replicate (an all-gather), ``to_local``, ``from_local`` as a partial sum,
    Partial -> Shard(0) (a reduce-scatter), ``full_tensor`` (an all-gather). Keeps what each returned."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(12, 12)
        self.kept: list[Any] = []

    def forward(self, x: Any) -> Any:
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

        y = x.redistribute(x.device_mesh, [Shard(1)])
        z = y.redistribute(x.device_mesh, [Replicate()])
        local = z.to_local()
        p = DTensor.from_local(self.lin(local), x.device_mesh, [Partial()])
        s = p.redistribute(x.device_mesh, [Shard(0)])
        full = s.full_tensor()
        self.kept[:] = [x, y, z, local, p, s, full]
        return full


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = UserCalls()

    def forward(self, x: Any) -> Any:
        return self.block(x) * 2


def user_calls_factory() -> tuple[nn.Module, tuple[Any]]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    return Outer(), (distribute_tensor(torch.randn(8, 12), mesh, [Shard(0)]),)


class _Issued(TorchDispatchMode):
    """torch's record of the collectives a run dispatches: each one's kind and the innermost frame
    of a user file on the Python stack when it was issued (the line that caused it)."""

    def __init__(self) -> None:
        super().__init__()
        self.issued: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func._overloadpacket in COLLECTIVES:
            user = [f"{f.filename}:{f.lineno}" for f in traceback.extract_stack()[:-1] if is_user_file(f.filename)]
            self.issued.append((_kind(str(func._overloadpacket)), user[-1]))
        return func(*args, **(kwargs or {}))


def test_the_models_own_redistributions_are_nodes_on_its_lines_with_placements_on_their_edges() -> None:
    """``x.redistribute(...)``, ``to_local``, ``DTensor.from_local``, ``full_tensor`` in the model's
    code: each is one node on its line, in its module, reading the DTensor it is given (the model's
    input read as a constant before: its shard was never matched with it) and giving the DTensor it
    returns, with its global shape and placement, as torch has them; the collective it ran (kind,
    mesh dimension, bytes) is on that node. The graph showed DTensor's inner ops on the local shards
    (``chunk``, ``narrow``, the collective, its wait, ``cat``), and no DTensor after any of them."""
    from tests.test_distributed import counts, oracle

    g = fxviz.capture(user_calls_factory, world_size=4)
    with fake_world(4):
        model, args = user_calls_factory()
        with torch.no_grad(), _Issued() as mode:
            waited(model(*args))
        kept = model.block.kept
    assert counts(g) == oracle(user_calls_factory, 4)  # CommDebugMode's per-module counts
    first = UserCalls.forward.__code__.co_firstlineno
    assert [(k, int(line.rpartition(":")[2]) - first) for k, line in mode.issued] == [
        ("all_gather", 3), ("all_gather", 4), ("reduce_scatter", 7), ("all_gather", 8)]
    recs = collectives(g)
    assert [(r["kind"], r["source"], r["module"], r["mesh_dim"]) for r in recs] == [
        (k, line, "block", "tp") for k, line in mode.issued]
    calls = [n for n in g.nodes if n.kind == "op" and n.module == "block" and n.target.startswith("torch.distributed")]
    names = ["redistribute", "redistribute", "to_local", "from_local", "redistribute", "full_tensor"]
    assert [n.target.rpartition(".")[2] for n in calls] == names
    assert [n.source.line - first for n in calls] == [3, 4, 5, 6, 7, 8]
    assert [r["node"] for r in recs] == [calls[i].name for i in (0, 1, 4, 5)]  # each collective on its call
    assert [n.attrs.get("collectives", []) for n in calls] == [["all_gather"], ["all_gather"], [], [], ["reduce_scatter"],
                                                               ["all_gather"]]
    comm = overlays(g)["comm"]["nodes"]
    assert [comm.get(n.name, 0) for n in calls] == [0 if not n.attrs.get("collectives") else r["bytes"]
                                                    for n, r in zip(calls, [recs[0], recs[1], {}, {}, recs[2], recs[3]],
                                                                    strict=True)]

    def placed(t: Any) -> tuple[tuple[int, ...], str | None]:
        where = ", ".join(str(p) for p in t.placements) if hasattr(t, "placements") else None
        return tuple(t.shape), where

    def shown(ref: Any) -> tuple[tuple[int, ...], str | None]:
        n = g.node(ref.node)
        return tuple(n.outputs[ref.index].shape), n.attrs.get("placements")

    x, y, z, local, p, s, full = kept
    ins = [x, y, z, local, p, s]  # what each call is given (from_local: the linear of the local tensor)
    outs = [y, z, local, p, s, full]
    assert [shown(n.inputs[0]) for n in calls if n.target.rpartition(".")[2] != "from_local"] == \
        [placed(t) for t in ins if t is not local]
    assert [shown(Ref(n.name)) for n in calls] == [placed(t) for t in outs]
    assert g.node(calls[0].inputs[0].node).kind == "input" and not [n for n in g.nodes if n.kind == "constant"]


def user_calls_step_factory() -> tuple[nn.Module, tuple[Any]]:
    model, (x,) = user_calls_factory()
    return model, (x.requires_grad_(),)


def test_a_training_step_of_the_models_own_redistributions_has_torchs_lines_and_modules() -> None:
    """With ``--backward`` each call is a node the autograd record maps to (its backward,
    ``RedistributeBackward``, differentiates it): the backward's collectives have the line torch's
    anomaly record names for their autograd node, in the module of the call."""
    from tests.test_distributed_backward import anomaly_lines
    from tests.test_distributed_backward import counts as step_counts
    from tests.test_distributed_backward import oracle as step_oracle

    g = fxviz.capture(user_calls_step_factory, world_size=4, backward=True)
    calls = {n.name for n in g.nodes if n.kind == "op" and n.target.startswith("torch.distributed.tensor.DTensor.")}
    assert len(calls) == 6
    assert [r["node"] in calls for r in collectives(g)] == [r["phase"] == "forward" for r in collectives(g)]
    bw = [r for r in collectives(g) if r["phase"] == "backward"]
    assert [(r["kind"], r["source"]) for r in bw] == anomaly_lines(user_calls_step_factory, 4) and bw
    got, want = step_counts(g), step_oracle(user_calls_step_factory, 4)
    # CommDebugMode names, for a backward collective, the last module whose backward began: the
    # first redistribution's backward runs after lin's, so it names block.lin for it; fxviz the
    # module whose code made the call (block); every module holding others agrees
    assert {m: got[m] for m in ("", "block")} == {m: want[m] for m in ("", "block")}
    assert want["block.lin"]["backward"] == {"all_gather": 1} and "block.lin" not in got


def sharded_input_factory() -> tuple[nn.Module, tuple[Any]]:
    """A DTensor input (Shard(0)) that the column-parallel layer's input hook redistributes (all-gathers)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from tests.test_distributed import MLP

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    plan = {"up": ColwiseParallel(input_layouts=Shard(0)), "down": RowwiseParallel()}
    return parallelize_module(MLP(), mesh, plan), (distribute_tensor(torch.randn(8, 16), mesh, [Shard(0)]),)


def test_a_collective_on_a_dtensor_inputs_shard_reads_the_input() -> None:
    """torch's record: the hook's all-gather is given the input's own shard (``x._local_tensor``,
    by identity); the graph read that shard as a constant no op made, cutting the input off."""
    read: list[bool] = []

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func._overloadpacket in COLLECTIVES:
                read.append(args[0] is x._local_tensor)
            return func(*args, **(kwargs or {}))

    with fake_world(4):
        model, (x,) = sharded_input_factory()
        with torch.no_grad(), Reads():
            waited(model(x))
    assert read == [True, False]  # the input's gather, then the row-parallel all-reduce
    g = fxviz.capture(sharded_input_factory, world_size=4)
    first = g.node(collectives(g)[0]["node"])
    assert [r.node for r in first.inputs] == ["x"] and not [n for n in g.nodes if n.kind == "constant"]


def test_under_torchrun_rank_0_says_what_it_captures(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun the capture printed nothing while it ran (the spinner was the fake group's
    alone); rank 0 now shows one, the other ranks none (they share the terminal). The launch is
    played in this process: a fake group of 2 as the launch's, this process rank 0 or 1."""
    import contextlib

    from click.testing import CliRunner

    import fxviz.cli.base as base
    import fxviz.targets.factory as factory
    from fxviz.cli import cli
    from tests.test_distributed import FACTORY

    f = tmp_path / "tp.py"
    f.write_text(FACTORY)
    for rank in (0, 1):
        shown: list[str] = []

        @contextlib.contextmanager
        def spinner(text: str, shown: list[str] = shown) -> Any:
            shown.append(text)
            yield

        @contextlib.contextmanager
        def launched(rank: int = rank) -> Any:
            with fake_world(2):
                yield rank

        monkeypatch.setattr(base, "spinner", spinner)
        monkeypatch.setattr(factory, "launched_world_size", lambda: 2)
        monkeypatch.setattr(factory, "launched_world", launched)
        monkeypatch.setattr(factory, "exchange_graphs", lambda text, patient=True, rank=rank: [text, text] if rank == 0
                            else None, raising=False)
        monkeypatch.setattr(factory, "gather_to_rank0", lambda text, rank=rank: [text, text] if rank == 0 else None,
                            raising=False)  # before the store: the same, by a collective
        r = CliRunner().invoke(cli, ["tree", f"{f}:build"])
        assert r.exit_code == 0, r.output
        assert shown == ([f"capturing {f}:build: rank 0 of 2 (torchrun) …"] if rank == 0 else [])
        assert ("all_reduce" in r.output) == (rank == 0)
