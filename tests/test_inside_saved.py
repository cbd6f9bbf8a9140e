"""``fxviz compile --from-trace DIR`` on a trace of a plain ``TORCH_TRACE=DIR python script.py``
run, checked against torch's own record of the same compile.

A plain run has no model to match (kernels get their modules from the trace alone) and, unless the
script turns Inductor's provenance tracking on, no kernel -> node mapping (fxviz infers it). One
Inductor compile of a BERT-shaped block is written as ``TORCH_TRACE`` writes it (torch's
``TorchLogsFormatter(trace=True)`` on its ``trace_log``) with provenance tracking on, while a
recording backend keeps Dynamo's graph: its ``nn_module_stack`` and the trace's ``cppCodeToPost``
are torch's record; the same trace without the provenance records is what a plain run writes."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # Inductor compiles

from torch import nn  # noqa: E402

from fxviz.analyze.inside.build import build  # noqa: E402
from fxviz.analyze.inside.kernels import is_view  # noqa: E402
from fxviz.analyze.inside.saved import from_trace  # noqa: E402
from fxviz.torchbridge.tracelog import structured_trace  # noqa: E402
from fxviz.tracefile import read_events  # noqa: E402

_PROVENANCE = ("inductor_provenance_tracking_node_mappings", "inductor_provenance_tracking_kernel_stack_traces")


@torch.library.custom_op("fxviz_saved::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    """A custom op: Inductor calls it as a fallback, ``torch.ops.fxviz_saved.twice.default``."""
    return x * 2


@twice.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Layer(nn.Module):
    """A BERT layer's shape, its submodules named as transformers names them (``LayerNorm``: Dynamo's
    local names for their parameters are snake case, ``l_self_modules_layer_norm_parameters_weight_``);
    attention through ``scaled_dot_product_attention`` (an ATen fallback call on CPU), two
    residual adds that read an addmm and the kernel before it, and a custom op (a fallback call
    too, as MoE layers' ``transformers::grouped_mm_fallback``)."""

    def __init__(self) -> None:
        super().__init__()
        self.QKV = nn.Linear(16, 48)
        self.Out = nn.Linear(16, 16)
        self.LayerNorm = nn.LayerNorm(16)
        self.Up = nn.Linear(16, 32)
        self.Down = nn.Linear(32, 16)
        self.FinalNorm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.QKV(x).view(1, 8, 3, 4, 4).permute(2, 0, 3, 1, 4)
        a = nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, 8, 16)
        h = self.LayerNorm(self.Out(a) + x)
        return self.FinalNorm(self.Down(twice(nn.functional.gelu(self.Up(h)))) + h)


class CamelModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.Embed = nn.Embedding(32, 16)
        self.attnBlock = Layer()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.attnBlock(self.Embed(ids))


def _owner(path: str) -> str:
    """Dynamo's ``nn_module_stack`` path ``L['self'].attnBlock.LayerNorm`` -> ``attnBlock.LayerNorm``."""
    return re.sub(r"^L\['self'\]\.?", "", path)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: Any) -> dict[str, Any]:
    """The saved trace and the live events of one Inductor compile; per Dynamo op that reads a
    parameter the module it ran in, by torch's ``nn_module_stack``; the model's module names."""
    from torch._inductor.compile_fx import compile_fx
    from torch._logging._internal import TorchLogsFormatter, trace_log

    torch._dynamo.reset()
    torch._logging.trace_structured("str", lambda: ("fxviz test", -1))  # see test_tracefile_live
    path = tmp_path_factory.mktemp("trace")
    handler = logging.FileHandler(path / "dedicated_log_torch_trace_test.log")
    handler.setFormatter(TorchLogsFormatter(trace=True))
    graphs: list[Any] = []

    def record(gm: Any, example: Any) -> Any:
        graphs.append(gm)
        return compile_fx(gm, example)

    torch.manual_seed(0)
    model = CamelModel()
    import torch._inductor.config as inductor_config

    with structured_trace() as events, inductor_config.patch({"force_disable_caches": True}), torch.no_grad():
        trace_log.addHandler(handler)
        try:
            torch.compile(model, backend=record)(torch.randint(0, 32, (1, 8)))
        finally:
            trace_log.removeHandler(handler)
            handler.close()
            torch._dynamo.reset()
    assert len(graphs) == 1
    params = {n.name for n in graphs[0].graph.nodes if n.op == "placeholder" and "_parameters_" in n.name}
    reads = {n.name: {_owner(list(n.meta["nn_module_stack"].values())[-1][0])}
             for n in graphs[0].graph.nodes
             if n.op.startswith("call_") and any(a.name in params for a in n.all_input_nodes)}
    return {"path": path, "events": list(events), "reads": reads, "modules": {p for p, _ in model.named_modules()}}


def test_a_saved_traces_kernels_name_the_modules_torch_ran_their_parameters_ops_in(compiled: Any) -> None:
    """The modules were read from Dynamo's local names, which it writes in snake case:
    ``attn_block.layer_norm``, a module the model does not have."""
    reads = compiled["reads"]
    inside, _ = from_trace(compiled["path"])
    kernels = [k for k in inside.kernels if k.ops]
    assert kernels
    named = set()
    for k in kernels:
        # model-free, a kernel's eager ops are Dynamo's; an op that reads no parameter names no module
        expected = set().union(*(reads.get(e, set()) for e in k.eager))
        assert set(k.modules) == expected, (k.name, k.modules, expected)
        named |= set(k.modules)
    assert named <= compiled["modules"]
    assert {"Embed", "attnBlock.QKV", "attnBlock.LayerNorm", "attnBlock.FinalNorm"} <= named


def test_without_provenance_every_call_and_its_nodes_are_torchs(compiled: Any) -> None:
    """A plain TORCH_TRACE run records no ``cppCodeToPost`` and no debug handles: the ATen fallback
    (``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu``) was no call at all, a residual
    add (and the layer norm after it) was put in the kernel before the addmm it reads, and a custom
    op's call took another node of its source-nodes comment (its name, ``fxviz_saved::twice``, was
    read as ``fxviz_saved``).
    Each call's computing nodes must be those torch recorded for it (views apart: torch lists the
    views a call reads among its nodes, fxviz lists them as views)."""
    events = compiled["events"]
    mapping = next(json.loads(p) for m, p in events if m.get("artifact", {}).get("name") == _PROVENANCE[0] and p)
    recorded: dict[str, list[str]] = mapping["cppCodeToPost"]
    plain = []
    for meta, payload in events:
        if meta.get("artifact", {}).get("name") in _PROVENANCE:
            continue
        if "inductor_output_code" in meta and payload:
            payload = re.sub(r"\n[ \t]*# \[Provenance debug handles\][^\n]*", "", payload)
        plain.append((meta, payload))
    inside = build(read_events(plain))
    assert all(k.inferred for k in inside.kernels)
    post = next(s.graph for s in inside.graphs[0].pipeline.stages if s.name.startswith("post-grad"))

    def computing(ops: list[str]) -> list[str]:
        return sorted(n for n in ops if n in post and not is_view(post.node(n)))

    assert [k.name for k in inside.kernels] == [h.rpartition(":")[0] for h in recorded]
    # torch lists a node in every call whose code computes it (a custom op's node also in the kernel
    # that writes its input): fxviz puts each in one of those, and every node torch lists in one
    # call only in that call
    calls: dict[str, set[int]] = {}
    for i, ops in enumerate(recorded.values()):
        for n in computing(ops):
            calls.setdefault(n, set()).add(i)
    placed = {n: i for i, k in enumerate(inside.kernels) for n in computing(k.ops)}
    assert sum(len(computing(k.ops)) for k in inside.kernels) == len(placed)  # each node once
    assert set(placed) == set(calls)
    for n, i in placed.items():
        assert i in calls[n], (n, inside.kernels[i].id, [list(recorded)[c] for c in calls[n]])
    for k in inside.kernels:  # an extern or fallback call runs its one op
        assert k.kind != "extern" or len(computing(k.ops)) == 1, (k.id, k.ops)
    assert any("_scaled_dot_product" in k.name for k in inside.kernels)
    assert any(k.name == "torch.ops.fxviz_saved.twice.default" for k in inside.kernels)
