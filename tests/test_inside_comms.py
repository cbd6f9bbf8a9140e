"""``fxviz compile --world-size 2 --inside`` with Inductor's communication passes on (issue 22 point
4 with issue 20): a small sharded model whose two parameters are all-gathered, compiled once on CPU
in torch's fake process group with ``bucket_all_gathers_fx`` and ``reorder_for_compute_comm_overlap``
(``sink_waits_iterative``, ``reorder_communication_preserving_peak_memory``). The stages show the
bucket torch formed (its collective tied to its members) and the collective's wait that runs later
in the output code than in the post-grad graph, each checked against torch's own records of the run
(the bucket artifact, the post-grad graph, the output code, ``cppCodeToPost``, the collective
schedule). torch logs its scheduler passes' summaries only under
``config_comms.reorder_sink_verbose_logging``, which fxviz's structured trace turns on."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # an Inductor compile

import fxviz  # noqa: E402
from fxviz.torchbridge.distributed import fake_world  # noqa: E402
from fxviz.torchbridge.tracelog import structured_trace  # noqa: E402
from tests.test_inside_comms_trace import expected_moves  # noqa: E402
from tests.test_inside_comms_trace import order as _order  # noqa: E402

PASSES = {"force_disable_caches": True, "bucket_all_gathers_fx": "all", "reorder_for_compute_comm_overlap": True,
          "deterministic": False,
          "reorder_for_compute_comm_overlap_passes": ["sink_waits_iterative",
                                                      "reorder_communication_preserving_peak_memory"]}


def _model(device: str = "cpu") -> tuple[Any, tuple[Any, ...]]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    class Gathered(torch.nn.Module):
        """Local work first, then two independent all-gathers (FSDP-like parameters)."""

        def __init__(self, mesh: Any) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(16, 16, device=device))
            self.a = torch.nn.Parameter(distribute_tensor(torch.randn(8, 16, device=device), mesh, [Shard(0)]))
            self.b = torch.nn.Parameter(distribute_tensor(torch.randn(8, 16, device=device), mesh, [Shard(0)]))

        def forward(self, x: Any) -> Any:
            h = torch.sin(torch.relu(x @ self.w.t())) * 2
            return h @ self.a.full_tensor().t() + h @ self.b.full_tensor().t()

    torch.manual_seed(0)
    mesh = init_device_mesh(device, (2,))
    return Gathered(mesh), (torch.randn(4, 16, device=device),)


def compiled(device: str = "cpu") -> tuple[Any, dict[str, list[Any]]]:
    """The model compiled with the passes on, and torch's records of that compile by artifact name
    (tests/test_cuda_sharded.py runs this module's checks on the GPU)."""
    import torch._inductor.config as inductor_config

    with fake_world(2), structured_trace() as events, inductor_config.patch(PASSES):
        model, args = _model(device)
        cm = fxviz.compile_map(model, args, backend="inductor", inside=True)
    recorded: dict[str, list[Any]] = {}
    for meta, payload in events:
        name = meta.get("artifact", {}).get("name") or next((k for k in ("inductor_output_code", "aot_inference_graph")
                                                            if k in meta), None)
        if name:
            recorded.setdefault(name, []).append(payload)
    return cm, recorded


@pytest.fixture(scope="module")
def run() -> tuple[Any, dict[str, list[Any]]]:
    return compiled()


def test_the_bucket_torch_formed_is_the_post_grad_stage_change(run) -> None:
    cm, recorded = run
    members = re.findall(r"\w+", recorded["fx_bucketing_passes_all_gather_buckets"][0])
    assert len(members) == 2  # torch bucketed the two all-gathers
    post_text = recorded["inductor_post_grad_graph"][0]
    bucket = [n for n in _order(post_text) if re.search(rf"{n}: \"[^\"]*\" = torch\.ops\._c10d_functional\."
                                                         r"all_gather_into_tensor", post_text)]
    assert len(bucket) == 1
    g = cm.inside.graphs[0]
    stage = next(s for s in g.pipeline.stages if s.name.startswith("post-grad passes"))
    base = g.pipeline.stages[g.pipeline.before(stage.index)]
    assert set(members) <= {n.name for n in base.graph.nodes}  # torch's names, as AOT Autograd's graph has them
    assert set(members) <= set(stage.removed)
    assert stage.links[bucket[0]] == [(m, "exact") for m in members]
    assert bucket[0] in stage.replaced
    assert any(n.startswith("bucket of 2 all_gathers") and bucket[0] in n for n in stage.notes), \
        stage.notes
    # its kernel row names both eager all-gathers: the model's full_tensor calls, which ran one each
    # (one node each, paired op for op with Dynamo's Tensor.full_tensor)
    gathers = [n.name for n in cm.graph.nodes if n.kind == "op" and n.target.endswith("DTensor.full_tensor")]
    dynamo = g.pipeline.stages[0].graph
    assert [n.target for n in dynamo.nodes if n.kind == "op" and "full_tensor" in n.target] == ["Tensor.full_tensor"] * 2
    assert len(gathers) == 2
    row = next(k for k in g.kernels if bucket[0] in k.ops)
    assert [e for e in row.eager if e in gathers] == gathers, row.eager


def test_the_wait_the_scheduler_sank_is_moved_in_the_kernels_stage(run) -> None:
    cm, recorded = run
    to_post = json.loads(recorded["inductor_provenance_tracking_node_mappings"][0])["cppCodeToPost"]
    expect = expected_moves(recorded["inductor_output_code"][0], to_post, recorded["inductor_post_grad_graph"][0])
    comm = list(expect)
    wait = next(h for h in comm if "wait_tensor" in h)
    assert expect[wait], "torch's output code runs the wait where the post-grad graph has it: nothing to show"
    g = cm.inside.graphs[0]
    kernels = next(s for s in g.pipeline.stages if s.name.startswith("kernels"))
    ids = {n.name: n.attrs["kernel"] for n in kernels.graph.nodes if n.kind == "op"}
    assert sorted(ids[n] for n in kernels.moved) == sorted(h for h in comm if expect[h])
    note = next(n for n in kernels.notes if n.startswith(wait))
    assert all(o in note for o in expect[wait]) and "later" in note
    # the collectives in the order torch's scheduler left them (its own record)
    schedule = recorded["inductor_collective_schedule"][0]
    schedule = json.loads(schedule) if isinstance(schedule, str) else schedule
    assert [n.target for n in kernels.graph.nodes if n.kind == "op" and n.attrs.get("kind") == "collective"] == schedule
    # torch's summary of its reordering pass, word for word
    head = recorded["reorder_communication_preserving_peak_memory"][0].splitlines()[0]
    assert any(head in n for n in kernels.notes), kernels.notes
    assert kernels.name + " · 1 moved" in [str(c) for c in _cells(kernels)]


def _cells(stage: Any) -> list[Any]:
    from fxviz.analyze.pipeline.views import stage_cells

    return stage_cells(stage)


def test_terminal_json_and_report_carry_the_changes(run) -> None:
    from rich.console import Console

    from fxviz.analyze.compilemap.result import CompileMap
    from fxviz.analyze.pipeline.views import annotate
    from fxviz.cli.inside import print_inside

    cm, _ = run
    g = cm.inside.graphs[0]
    kernels = next(s for s in g.pipeline.stages if s.name.startswith("kernels"))
    back = CompileMap.from_json(cm.to_json())
    again = next(s for s in back.inside.graphs[0].pipeline.stages if s.name == kernels.name)
    assert again.moved == kernels.moved and again.notes == kernels.notes
    out = io.StringIO()
    print_inside(Console(file=out, width=400), cm.inside, stage=None, graph=None)
    text = out.getvalue()
    assert "1 moved" in text and "bucket of 2 all_gathers" in text
    assert all(n[:60] in text for n in kernels.notes)
    from fxviz.analyze.inside.overlay import panels

    report = fxviz.Graph.from_json(cm.graph.to_json())
    panels(report, cm.inside)  # the report's drawer: the stages table says what torch recorded of each
    note = report.annotations["panels"]["stages"]["note"]
    assert all(n in note for n in kernels.notes)
    shown = annotate(g.pipeline, kernels.index)
    overlay = shown.annotations["overlays"]["pass_change"]
    assert [k for k, v in overlay["nodes"].items() if v == "moved"] == kernels.moved


#: Overlap scheduling on CPU: torch estimates a matmul's time from the GPU's memory bandwidth
#: (``estimate_roofline_runtime_ms`` -> ``get_gpu_dram_gbps``, which imports triton), so the model
#: has no matmul, the estimates are given, and fusion regions (estimated the same way) are off.
OVERLAP = {"force_disable_caches": True, "aten_distributed_optimizations.enable_overlap_scheduling": True,
           "aten_distributed_optimizations.enable_fusion_regions": False}


def _estimate(node: Any, *rest: Any) -> float:
    return 1.0


@pytest.fixture(scope="module")
def overlap() -> tuple[Any, dict[str, list[Any]]]:
    import torch._inductor.config as inductor_config
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    class Pointwise(torch.nn.Module):
        def __init__(self, mesh: Any) -> None:
            super().__init__()
            self.a = torch.nn.Parameter(distribute_tensor(torch.randn(8, 16), mesh, [Shard(0)]))
            self.b = torch.nn.Parameter(distribute_tensor(torch.randn(8, 16), mesh, [Shard(0)]))

        def forward(self, x: Any) -> Any:
            return torch.cos(torch.sin(x) * 2) * self.a.full_tensor()[:4] + self.b.full_tensor()[4:]

    with fake_world(2), structured_trace() as events, inductor_config.patch(
            {**OVERLAP, "aten_distributed_optimizations.custom_runtime_estimation": _estimate}):
        torch.manual_seed(0)
        cm = fxviz.compile_map(Pointwise(init_device_mesh("cpu", (2,))), (torch.randn(4, 16),), backend="inductor",
                               inside=True)
    recorded: dict[str, list[Any]] = {}
    for meta, payload in events:
        name = meta.get("artifact", {}).get("name")
        if name:
            recorded.setdefault(name, []).append(payload)
    return cm, recorded


def test_overlap_scheduling_is_a_stage_of_its_own(overlap) -> None:
    """torch logs the overlap scheduling pass's graph before and after it: the post-grad stage
    splits there, each part torch's own graph; the FSDP pre-bucketing it ran first is on the stage
    before it, as torch logged it."""
    cm, recorded = overlap
    before, after = (_order(recorded[k][0]) for k in ("overlap_scheduling_graph_before", "overlap_scheduling_graph_after"))
    post = _order(recorded["inductor_post_grad_graph"][0])
    stages = {s.name: s for s in cm.inside.graphs[0].pipeline.stages}
    split = [stages[f"{w} (inference)"] for w in ("post-grad passes before overlap scheduling", "overlap scheduling",
                                                  "post-grad passes after overlap scheduling")]
    for stage, want in zip(split, (before, after, post), strict=True):
        assert [n.name for n in stage.graph.nodes if n.kind == "op"] == want
    assert split[1].changed == (before != after)
    assert split[2].index == split[1].index + 1 == split[0].index + 2
    text = recorded["pre_bucketing_fsdp_collectives"][0].splitlines()[0]
    assert any(text in n for n in split[0].notes) and any(n.startswith("bucket of 2 all_gathers") for n in split[0].notes)
