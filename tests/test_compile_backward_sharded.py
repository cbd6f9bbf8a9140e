"""``fxviz compile TARGET --world-size 2 --backward --inside`` (issue 22 points 4 and 5): a
tensor-parallel attention block compiled by Inductor as a training step in torch's fake process
group. The compiled backward's collectives are those of torch's post-grad backward graph and of
``CommDebugMode`` over the eager step, each on the module torch gives its node
(``fwd_nn_module_stack``, read by a custom post-grad pass in the same run), and its matmuls on
theirs: DTensor's parameters reach AOT Autograd as tensor subclass primals
(``SubclassGetAttrAOTInput(base=PlainAOTInput(idx=2), attr='_local_tensor')``) and the backward
may read a view of one the forward saved (``permute(W)``), which left them without a parameter.
One compile, shared by the tests."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # an Inductor compile of a forward and a backward

from torch.distributed.tensor.debug import CommDebugMode  # noqa: E402

import fxviz  # noqa: E402
from fxviz.fallback.comms import _kind  # noqa: E402
from fxviz.torchbridge.distributed import fake_world  # noqa: E402
from tests import test_distributed as td  # noqa: E402
from tests.test_compile_backward_kernels import _Modules  # noqa: E402


def _factory() -> tuple[Any, tuple[Any, ...]]:
    model, (x,) = td.block_factory()
    return model, (x.requires_grad_(),)  # q, k and v's input gradients are all-reduced too


@pytest.fixture(scope="module")
def run() -> tuple[Any, dict[str, str | None], dict[str, int]]:
    """The compile map, torch's module of each backward post-grad node, and CommDebugMode's
    backward collectives per module over the same step run eagerly."""
    import torch._inductor.config as inductor_config

    record = _Modules()
    with fake_world(2):
        model, args = _factory()
        with CommDebugMode() as mode:
            td.waited(model(*args)).sum().backward()
        eager = Counter({k.partition(".")[2]: n for k, v in mode.comm_module_counts.items() if k != "Global"
                         for op, n in v["backward"].items() if n and _kind(str(op)) == "all_reduce"})
        model, args = _factory()
        with inductor_config.patch({"force_disable_caches": True, "post_grad_custom_post_pass": record}):
            cm = fxviz.compile_map(model, args, backend="inductor", grad=True, inside=True)
    return cm, record.seen, {m: n for m, n in eager.items() if m and not any(o.startswith(m + ".") for o in eager)}


def _ancestors(path: str) -> set[str]:
    parts = path.split(".")
    return {".".join(parts[:k]) for k in range(len(parts) + 1)}


def test_backward_collectives_are_torchs_on_the_modules_torch_gives_them(run) -> None:
    cm, truth, eager = run
    assert eager == {"q": 1, "k": 1, "v": 1, "mlp.up": 1}  # CommDebugMode: each colwise input gradient
    g = cm.inside.graphs[0]
    post = next(s.graph for s in g.pipeline.stages if s.name == "post-grad passes (backward)")
    calls = [n.name for n in post.nodes if n.kind == "op" and "_c10d_functional" in n.target]
    back = [k for k in g.kernels if k.part == "backward" and k.kind == "collective"]
    assert sorted(o for k in back for o in k.ops) == sorted(calls) and len(calls) == 8  # 4 all_reduce_ + waits
    issued = [k for k in back if "all_reduce" in k.name]
    # each on torch's module of its node (first), the module's parents at most (one source line)
    assert Counter(k.modules[0] for k in issued) == Counter(eager)
    for k in back:
        (want,) = {truth[o] for o in k.ops}
        assert want is not None and k.modules[0] == want and set(k.modules) <= _ancestors(want), (k.id, k.modules, want)


def test_backward_matmuls_of_dtensor_parameters_are_on_their_modules(run) -> None:
    cm, truth, _ = run
    g = cm.inside.graphs[0]
    mms = [k for k in g.kernels if k.part == "backward" and k.kind == "extern"
           and re.search(r"\.(mm|addmm|bmm)\b", k.name)]
    assert len(mms) == 12  # each Linear's input and weight gradients
    for k in mms:
        assert k.modules == [truth[k.ops[0]]], (k.id, k.ops, k.modules, truth[k.ops[0]])


def test_saved_dtensor_parameters_are_parameters_of_their_module(run) -> None:
    """The partition's saved values that are a DTensor parameter's local shard, or a view of one,
    cost nothing and belong to that parameter's module: Dynamo's placeholder of the primal index
    AOT Autograd gives them (torch's own descriptors, in the structured trace)."""
    cm, _, _ = run
    g = cm.inside.graphs[0]
    graphs = {s.name: s.graph for s in g.pipeline.stages}
    dyn = [n for n in graphs["Dynamo graph"].nodes if n.kind in ("input", "parameter", "buffer")]
    fwd = {n.name: n for n in graphs["AOT forward"].nodes}
    owner = {}
    for name, n in fwd.items():
        m = re.match(r"SubclassGetAttrAOTInput\(base=PlainAOTInput\(idx=(\d+)\), attr='_local_tensor'\)",
                     str(n.attrs.get("aot", "")))
        if m:
            src = re.fullmatch(r"l_self_modules_(\w+?)_parameters_(weight|bias)_", dyn[int(m.group(1))].name)
            assert src is not None
            owner[name] = src.group(1).replace("_modules_", ".")
    assert g.partition is not None
    params = [s for s in g.partition.saved if s.shares == "parameter"]
    assert params and all(s.bytes == 0 and not s.inferred for s in params)
    for s in params:
        base = fwd[s.node]
        while base.name not in owner:  # a view the forward saved: down to the primal it views
            base = fwd[base.inputs[0].node]
        assert s.module == owner[base.name], (s.node, s.module, owner[base.name])
