"""Nothing leaks from a capture of an FSDP2 model the caller built in its own process group (issue
22, must hold): FSDP2 keeps its state outside the modules (its ``FSDPState``, parameter groups and
``FSDPParam`` objects), which a forward changes (the root's lazy init, the root's parameters left
unsharded) and a failed attempt leaves half-changed (export's). After the capture, the model's next
training step is the one torch runs on a model never captured: ``CommDebugMode``'s per-module
counts of its collectives, forward and backward, and its loss; the process group is the caller's."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor.debug import CommDebugMode

import fxviz
from fxviz.torchbridge.distributed import end_world
from tests.test_distributed_fsdp import gpt_factory

Step = tuple[dict[str, dict[str, dict[str, int]]], float]


def _step(model: Any, args: tuple[Any, ...]) -> Step:
    """torch's record of one training step: CommDebugMode's counts per module and phase, the loss."""
    with CommDebugMode() as mode:
        loss = model(*args).sum()
        loss.backward()
    counts = {k: {ph: {str(op): n for op, n in v[ph].items() if n} for ph in ("forward", "backward")}
              for k, v in mode.comm_module_counts.items()}
    return counts, float(loss)


@pytest.mark.parametrize("options", [{"world_size": 2}, {}, {"backward": True}], ids=["world_size", "auto", "backward"])
def test_an_fsdp2_model_trains_after_a_capture_as_one_never_captured(options: dict[str, Any]) -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        group = dist.distributed_c10d._get_default_group()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # FSDP2 on a view it returns
            fresh, args = gpt_factory()
            want = _step(fresh, args)
            model, args = gpt_factory()
            before = {k: v.to_local().clone() for k, v in model.state_dict().items()}
            g = fxviz.capture(model, args, **options)  # auto: export fails (FSDP2's hooks), eager captures
            assert g.method.startswith("eager")
            assert {k: v.to_local() for k, v in model.state_dict().items()}.keys() == before.keys()
            assert all(torch.equal(model.state_dict()[k].to_local(), v) for k, v in before.items())
            assert all(p.grad is None for p in model.parameters())
            got = _step(model, args)
        assert got[0] == want[0] and got[1] == pytest.approx(want[1])
        assert dist.is_initialized() and dist.distributed_c10d._get_default_group() is group
    finally:
        end_world()


def test_an_fsdp2_model_compiles_as_torch_compiles_it_and_trains_after_as_one_never_compiled() -> None:
    """``fxviz compile`` on an FSDP2 model: the compiled forward leaves FSDP2 initialised and the root's
    parameters unsharded, and the eager trace that follows it raised "mixed torch.Tensor and DTensor"
    (the compile map's own snapshot of the model missed FSDP2's state). Checked against torch's own
    compile of a model never captured (a recording backend, its compilation metrics: the root's
    forward refused, a block's forward compiled once and run twice) and its next training step."""
    from torch._dynamo.utils import get_compilation_metrics
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from fxviz.analyze.compilemap import compile_map

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            fresh, args = gpt_factory()
            want = _step(fresh, args)
            ref, _ = gpt_factory()
            torch._dynamo.reset()
            graphs: list[torch.fx.GraphModule] = []
            seen = {id(m) for m in get_compilation_metrics()}

            def record(gm: torch.fx.GraphModule, _inputs: Any) -> Any:
                graphs.append(gm)
                return gm.forward

            with torch.no_grad():
                torch.compile(ref, backend=record)(*args)
            metrics = [m for m in get_compilation_metrics() if id(m) not in seen]
            torch._dynamo.reset()
            model, args = gpt_factory()
            cmap = compile_map(model, args, backend="aot_eager")
            torch._dynamo.reset()
            got = _step(model, args)
        refused = [(m.co_name, m.co_firstlineno) for m in metrics if m.fail_type]
        compiled = [(m.co_name, m.co_firstlineno, m.graph_op_count) for m in metrics if m.graph_op_count]
        assert len(refused) == 1 and len(compiled) == len(graphs) == 1
        assert [(g.func, g.line, g.ops, g.runs) for g in cmap.graphs] == [(*compiled[0], 2)]
        (group,) = cmap.breaks
        assert group.where is not None and group.where.func == refused[0][0]
        assert refused[0][1] < group.where.line <= refused[0][1] + 5  # inside GPT.forward: `x = block(x)`
        assert got[0] == want[0] and got[1] == pytest.approx(want[1])
    finally:
        end_world()


def test_a_model_sharded_in_the_callers_group_has_its_collectives_recorded_without_world_size() -> None:
    """In a group the caller made, ``capture(model, args)`` on a tensor-parallel block recorded its
    collectives as nodes with no kind or bytes (only ``world_size=`` turned the recorder on): now a
    ``DTensor`` parameter turns it on at the group's size. Checked against CommDebugMode's per-module
    counts on torch's own run of the same model; the group stays the caller's."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from tests.test_distributed import block_factory, collectives, counts, oracle

    want = oracle(block_factory, 4)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        group = dist.distributed_c10d._get_default_group()
        model, args = block_factory()
        g = fxviz.capture(model, args)
        assert counts(g) == want and sum(want[""].values()) >= 1
        assert all(r["kind"] and r["bytes"] > 0 for r in collectives(g))
        assert g.annotations["rank"] == 0
        assert dist.is_initialized() and dist.distributed_c10d._get_default_group() is group
    finally:
        end_world()


#: the graph's own data: its call tree's calls point to their parent (a cycle by design, holding
#: names, shapes and lines, nothing of the model's or torch's; its boundaries and its calls' nodes,
#: worked out on first read, point back at the root)
_IR = ("fxviz.ir", "fxviz.calls", "fxviz.callbounds", "fxviz.callnodes", "fxviz.nodelist", "fxviz.facts")


def _fxviz_garbage(garbage: list[Any]) -> list[str]:
    """The objects of fxviz's own classes and functions among what the collector freed, but the
    graph's data (:data:`_IR`)."""
    import types

    out = []
    for o in garbage:
        fn = o.__func__ if isinstance(o, types.MethodType) else o
        where = fn.__module__ if isinstance(fn, types.FunctionType) else type(o).__module__
        if (where or "").startswith("fxviz") and where not in _IR:
            out.append(f"{type(o).__name__} {getattr(fn, '__qualname__', '')}".strip())
    return out


@pytest.mark.parametrize("options", [{}, {"backward": True}], ids=["forward", "backward"])
def test_a_sharded_capture_leaves_no_reference_cycle_of_fxvizs(options: dict[str, Any]) -> None:
    """After a capture nothing of fxviz's is left for the collector: reference counting frees the
    recording, and the model the factory made (a tensor-parallel decoder on a 2-D mesh) with its
    parameters. torch's own objects may be (a DeviceMesh, FSDP2's state hold themselves); fxviz's
    were not: the checkpoint patch's per-capture class held the recording (its ``Recorder``,
    ``Watch``, names, versions) until the collector ran."""
    import gc
    import weakref

    from tests.test_distributed import sp_factory

    made: list[Any] = []

    def factory() -> Any:
        model, args = sp_factory()
        made.append(weakref.ref(model))
        made.extend(weakref.ref(p) for p in model.parameters())
        return model, args

    fxviz.capture(sp_factory, world_size=8, **options)  # warm: torch's lazy state, made once per process
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.garbage.clear()
        fxviz.capture(factory, world_size=8, **options)
        alive = [r() is not None for r in made]
        gc.collect()
        left = _fxviz_garbage(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()
    assert len(made) > 10 and not any(alive)  # the model and its parameters: freed by reference counting
    assert left == []
    assert not dist.is_initialized()
