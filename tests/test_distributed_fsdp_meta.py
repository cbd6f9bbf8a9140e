"""FSDP2 on a model built and sharded on ``meta`` (too big to load): the capture runs on fake shards,
runs the ops a model built for real runs, and leaves FSDP2's state as it was; the LLaMA-70B shape.
Checked against the model's own ``FSDPParam`` objects and ``CommDebugMode``. Split from
``test_distributed_fsdp`` (its factories and helpers)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

import fxviz
from fxviz.passes.comm import collectives
from fxviz.torchbridge.distributed import end_world
from tests.test_distributed import counts, oracle, waited
from tests.test_distributed_fsdp import (
    captured,
    fsdp_tp_factory,
    gpt_factory,
    inputs,
    meta_factory,
    producer,
    units,
)


def _fsdp_state(model: nn.Module) -> list[Any]:
    """What the capture must leave as it was: each parameter by identity and device, and FSDP2's
    own state of each unit (not initialised, its shards the meta ones, no gathered buffers)."""
    out: list[Any] = [(n, p, p.device.type) for n, p in model.named_parameters()]
    for path, params in units(model):
        state = model.get_submodule(path)._get_fsdp_state()
        group = state._fsdp_param_group
        out.append((path, state._is_root, group._reset_sharded_params, len(state._state_ctx.all_states),
                    len(group._module_to_pre_save_state_dict_hook_handle)))
        out += [(p.sharded_param, p._sharded_param_data, p._sharded_param_data.device.type,
                 hasattr(p, "_unsharded_param"), list(p.all_gather_outputs)) for p in params]
    return out


def _fqn(model: nn.Module, p: Any) -> str:
    """An ``FSDPParam``'s name in ``model`` (its ``_param_fqn`` is set by FSDP2's lazy init only)."""
    path = next(path for path, m in model.named_modules() if m is p._module_info.module)
    return f"{path}.{p._module_info.param_name}" if path else p._module_info.param_name


def test_a_model_sharded_on_meta_captures_on_fake_shards_and_is_left_as_it_was() -> None:
    """FSDP2's lazy init refuses parameters on ``meta``; the capture runs the step on fake CPU
    shards instead (no memory) and gives the graph of the materialised model: each unit's
    all-gather reads its shards by name, with the shapes of the model's own ``FSDPParam`` objects,
    each op reads its unsharded parameter by name, and the collectives per module equal
    ``CommDebugMode``'s on the same model. The model is left on meta, FSDP2 uninitialised."""
    made: list[tuple[nn.Module, list[Any]]] = []

    def factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
        m, args = meta_factory()
        made.append((m, _fsdp_state(m)))
        return m, args

    g = fxviz.capture(factory, world_size=8)
    model, before = made[0]
    fqn = _fqn
    assert g.error is None and "fake" in g.method
    gathers = {r["module"]: g.node(r["node"]) for r in collectives(g)}
    assert list(gathers) == [path for path, _ in units(model)] == ["", "h.0", "h.1"]
    for path, params in units(model):
        copy_in = producer(g, gathers[path], 0)
        shards = [producer(g, copy_in, k) for k in range(len(params))]
        assert [n.name for n in shards] == [f"{fqn(model, p)}.shard" for p in params]
        for n, p in zip(shards, params, strict=True):
            assert n.kind == "parameter" and n.attrs["shard_of"] == fqn(model, p)
            assert n.attrs["shard_shape"] == list(p.sharded_param._local_tensor.shape)
            assert tuple(n.outputs[0].shape) == tuple(p._sharded_param_data.shape)  # padded, flat
            full = g.node(fqn(model, p))  # the unsharded parameter, read by the unit's ops
            assert full.kind == "parameter" and tuple(full.outputs[0].shape) == tuple(p._orig_size)
        record = next(r for r in collectives(g) if r["module"] == path)
        assert record["bytes"] == sum(p._sharded_param_data.numel() * 4 for p in params)
    reads = {r.node for n in g.nodes if n.kind == "op" for r in n.inputs}
    assert {fqn(model, p) for _, ps in units(model) for p in ps} <= reads
    assert sum(n.outputs[0].numel for n in g.nodes if n.kind == "parameter" and "shard_of" not in n.attrs) \
        == sum(p._orig_size.numel() for _, ps in units(model) for p in ps)
    assert counts(g) == oracle(gpt_factory, 8)  # CommDebugMode on the same model, materialised
    after = _fsdp_state(model)
    assert len(after) == len(before)
    for a, b in zip(after, before, strict=True):  # by identity: the very same tensors and state
        assert all(x is y or x == y for x, y in zip(a, b, strict=True)), (a, b)


def test_the_llama_70b_shape_sharded_on_meta_by_fsdp2_captures_without_weights() -> None:
    """Two layers of the 70B shape (hidden 8192, MLP 28672, vocab 128256) on meta, FSDP2 over 8
    ranks, each layer a unit: one all-gather per unit, each sending the unit's padded shards as the
    model's ``FSDPParam`` objects hold them (1.38 GB per rank in all), without their memory."""
    from tests.test_distributed import _bench

    bench = _bench()
    made: list[nn.Module] = []

    def factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
        with torch.device("meta"):
            m = bench.Decoder(**{**bench.L70B, "layers": 2})
        for layer in m.layers:
            fully_shard(layer, mesh=mesh)
        made.append(fully_shard(m, mesh=mesh))
        return m, (torch.zeros(1, 128, dtype=torch.long),)

    g = fxviz.capture(factory, world_size=8)
    model = made[0]
    recs = collectives(g)
    assert g.error is None and [r["module"] for r in recs] == [path for path, _ in units(model)] \
        == ["", "layers.0", "layers.1"]
    for r, (_, params) in zip(recs, units(model), strict=True):
        assert r["kind"] == "all_gather" and r["bytes"] == sum(p._sharded_param_data.numel() * 4 for p in params)
    assert sum(r["bytes"] for r in recs) == 1_380_995_072
    assert all(p.is_meta for p in model.parameters()) and not dist.is_initialized()


def test_a_backward_all_gather_reads_the_shards_of_the_unit_it_gathers_and_the_ops_read_the_same_parameters() -> None:
    """With ``reshard_after_forward`` (every unit but the root) FSDP2 frees a unit's unsharded
    parameters after its forward and gathers them again in the backward. Each such all-gather says
    which unit's parameters it gathers (``gathers_of``, in FSDP2's order) and reads their shards,
    as the forward's does; the backward ops read the very parameter nodes the forward read, not a
    new value. Checked against the model's own units (which reshard) and ``CommDebugMode`` on the
    same step (per module: it names the unit whose backward ran the gather, FSDP2 prefetching)."""
    from tests.test_distributed_backward import counts as step_counts
    from tests.test_distributed_backward import oracle as step_oracle

    g, model = captured(backward=True)
    resharded = [(path, params) for path, params in units(model)
                 if model.get_submodule(path)._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is not None]
    assert [path for path, _ in resharded] == ["h.0", "h.1"]  # the root keeps its parameters
    gathers = [r for r in collectives(g) if r["phase"] == "backward" and r["kind"] == "all_gather"]
    assert [r["gathers_of"] for r in gathers] == [[p._param_fqn for p in ps] for _, ps in reversed(resharded)]
    for r, (_, params) in zip(gathers, reversed(resharded), strict=True):
        node = g.node(r["node"])
        assert node.attrs["gathers_of"] == r["gathers_of"]
        assert inputs(g, node.name) == [f"{p._param_fqn}.shard" for p in params]
        assert all(g.node(f"{p._param_fqn}.shard").attrs["shard_of"] == p._param_fqn for p in params)
        assert r["bytes"] == sum(p._sharded_param_data.numel() * 4 for p in params)  # as the forward's
    want = step_oracle(gpt_factory, 8)
    assert {p: step_counts(g).get(p, {}).get("backward", {}).get("all_gather", 0) for p in want} \
        == {p: want[p]["backward"].get("all_gather", 0) for p in want}
    # one parameter node a name: the backward makes none (it reads the re-gathers': see below)
    names = [p._param_fqn for _, ps in resharded for p in ps]
    params = [n.name for n in g.nodes if n.kind == "parameter" and "shard_of" not in n.attrs]
    assert len(params) == len(set(params)) and set(names) <= set(params)
    assert not [n.name for n in g.nodes if n.phase == "backward" and n.kind == "parameter"]


def _scattered(factory: Any, world_size: int) -> list[int]:
    """Torch's own record of the real step (a dispatch mode over the model built for real, its
    loss the output's sum, as fxviz's): the bytes each gradient reduce-scatter reads, in order."""
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[int] = []

    class Scatters(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if "reduce_scatter" in func.__name__:  # (output, input, ...): what each rank sends
                seen.append(args[1].numel() * args[1].element_size())
            return func(*args, **(kwargs or {}))

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        model, args = factory()
        with Scatters():
            model(*args).sum().backward()
        return seen
    finally:
        end_world()


def test_a_training_step_of_a_model_sharded_on_meta_runs_on_fake_shards_and_is_left_as_it_was() -> None:
    """``backward=True`` on the model of :func:`meta_factory`: the whole step, forward and backward,
    runs on the fake shards its forward runs on, so the graph holds the backward's re-gathers and
    gradient reduce-scatters per FSDP unit. Collectives per module (count and kind, both phases)
    equal ``CommDebugMode``'s on the same model built for real, every reduce-scatter's bytes equal
    what the real step's reduce-scatters read, and the model is left on meta, FSDP2 uninitialised."""
    from tests.test_distributed_backward import counts as step_counts
    from tests.test_distributed_backward import oracle as step_oracle

    made: list[tuple[nn.Module, list[Any]]] = []

    def factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
        m, args = meta_factory()
        made.append((m, _fsdp_state(m)))
        return m, args

    g = fxviz.capture(factory, world_size=8, backward=True)
    model, before = made[0]
    assert g.error is None and g.method == "eager (fake) (backward)"
    want = step_oracle(gpt_factory, 8)
    paths = [path for path, _ in units(model)]  # the model and the units (leaves: see that module's docstring)
    assert paths == ["", "h.0", "h.1"]
    assert {p: step_counts(g)[p] for p in paths} == {p: want[p] for p in paths}
    assert want[""]["backward"] == {"all_gather": 2, "reduce_scatter": 3}
    scatters = [r for r in collectives(g) if r["kind"] == "reduce_scatter"]
    assert [r["bytes"] for r in scatters] == _scattered(gpt_factory, 8)
    for r, (path, params) in zip(scatters, reversed(units(model)), strict=True):  # the last unit's first
        assert r["module"] == path and r["grads_of"] == [_fqn(model, p) for p in params]
        assert r["bytes"] == sum(p._sharded_param_data.numel() for p in params) * 8 * 4
    grads = {n.attrs["grad_of"] for n in g.nodes if n.kind == "output" and "grad_of" in n.attrs}
    assert grads == {_fqn(model, p) for _, ps in units(model) for p in ps}
    after = _fsdp_state(model)
    assert len(after) == len(before)
    for a, b in zip(after, before, strict=True):  # by identity: the very same tensors and state
        assert all(x is y or x == y for x, y in zip(a, b, strict=True)), (a, b)
    assert all(p.grad is None for p in model.parameters()) and not dist.is_initialized()



def meta_tp_factory() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """:func:`fsdp_tp_factory`'s model built on ``meta``: FSDP2 over tensor parallel, sharded there."""
    return fsdp_tp_factory(meta=True)


def _op(target: str) -> str:
    """``_c10d_functional::wait_tensor``, ``_c10d_functional.wait_tensor.default`` -> ``wait_tensor``."""
    return target.removesuffix(".default").replace("::", ".").rpartition(".")[2]


def fake_swaps(factory: Any, world_size: int) -> list[tuple[str, str]]:
    """torch's own record, without fxviz: the collective ops (``c10d``, ``_c10d_functional``) the
    model's forward dispatches for real and under torch's ``FakeTensorMode``, as (real, fake) where
    they differ. Functional collectives wait at once where a fake mode is on
    (``_functional_collectives._are_we_tracing``: "we are almost definitely compiling/tracing"):
    ``wait_tensor`` where the real run wraps the result (``_wrap_tensor_autograd``) to wait later."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._python_dispatch import TorchDispatchMode

    class Log(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func.namespace in ("c10d", "_c10d_functional"):
                self.ops.append(_op(str(func)))
            return func(*args, **(kwargs or {}))

    runs = []
    for fake in (False, True):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
        try:
            model, (x,) = factory()
            mode = FakeTensorMode(allow_non_fake_inputs=True)
            with mode if fake else torch.no_grad(), Log() as log:
                out = model(mode.from_tensor(x) if fake else x)
            runs.append(log.ops)
            waited(out)  # after the log: the wait is the test's, not the forward's
        finally:
            end_world()
    assert len(runs[0]) == len(runs[1])
    return [(r, f) for r, f in zip(*runs, strict=True) if r != f]


@pytest.mark.parametrize(("method", "backward"), [("eager", False), ("eager-aten", False), ("eager", True)])
@pytest.mark.parametrize(("on_meta", "built"), [(meta_factory, gpt_factory), (meta_tp_factory, fsdp_tp_factory)],
                         ids=["fsdp", "fsdp+tp"])
def test_a_model_sharded_on_meta_runs_the_ops_the_model_built_for_real_runs(method: str, backward: bool, on_meta: Any,
                                                                            built: Any) -> None:
    """FSDP2 makes each unsharded parameter with ``nn.Parameter``: on a real tensor that runs no op,
    on the fake one of a capture on meta it runs ``detach`` and ``requires_grad_``, fxviz's fake
    run's, not the model's. The graph of the model sharded on meta holds the ops, in order, that
    the graph of the model built for real holds, each in the same module, with the same names, but
    where torch's own code takes another path on fake tensors: over tensor parallel, the row-parallel
    layer's all-reduce is followed by ``wait_tensor`` on meta and ``_wrap_tensor_autograd`` for real,
    exactly as torch's own forward of the same model does under ``FakeTensorMode`` (:func:`fake_swaps`)."""
    meta = fxviz.capture(on_meta, world_size=8, method=method, backward=backward)
    real = fxviz.capture(built, world_size=8, method=method, backward=backward)
    assert "fake" in meta.method and "fake" not in real.method
    ops = [[(n.name, n.target, n.module, n.phase) for n in g.nodes if n.kind == "op"] for g in (meta, real)]
    assert len(ops[0]) == len(ops[1]) > 50
    swaps = [(_op(r[1]), _op(m[1])) for m, r in zip(*ops, strict=True) if m != r]
    want = fake_swaps(built, 8)
    assert swaps == want == ([("_wrap_tensor_autograd", "wait_tensor")] * 2 if built is fsdp_tp_factory else [])
    same = [[o[2:] for o in g] for g in ops]  # the swapped ops too: same module, same phase
    assert same[0] == same[1]
    made = [[n.name for n in g.nodes if n.target in ("Tensor.detach", "Tensor.requires_grad_", "aten.detach.default")]
            for g in (meta, real)]
    assert made[0] == made[1]  # none of nn.Parameter's own on fake tensors; DTensor's detach over tensor parallel
    params = [[(n.name, [r.node for r in n.inputs]) for n in g.nodes if n.kind == "parameter"] for g in (meta, real)]
    assert params[0] == params[1]  # each parameter reads the as_strided of its unit's copy-out on both
