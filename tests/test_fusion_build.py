"""Which ops did not fuse and why (issue 20 point 2), without torch: Inductor's fusion decisions put
on the kernel map of a real trace (tests/data/traces/train.log), and the refusals torch's fusion
logger emitted on an H200 (tests/data/inductor_cuda.json). The live capture is checked against
torch's own log in tests/test_inside_fusion.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from rich.console import Console

from fxviz.analyze.inside import fusion, overlay
from fxviz.analyze.inside.build import build
from fxviz.analyze.inside.result import Inside
from fxviz.analyze.inside.saved import from_trace
from fxviz.cli.inside import print_inside
from fxviz.ir import Graph
from fxviz.tracefile import read_events
from fxviz.tracefile.records import FUSION_LOG
from tests.test_inside_build import TRACE, _events, _of

CUDA = Path(__file__).resolve().parent / "data" / "inductor_cuda.json"
_REFUSED = re.compile(r"^cannot fuse (\S+) with (\S+): (.*)$")
_FUSED = re.compile(r"^fusing (\S+) with (\S+)$")


def _decision(first: str, second: str, reason: str | None = None, part: str = "forward", **ops: list[str]) -> dict[str, Any]:
    """A decision as fxviz's handler writes it (scheduler node names are ``op3`` or ``op3_op4``)."""
    d: dict[str, Any] = {"decision": "refused" if reason is not None else "fused", "part": part, "first": first,
                         "second": second, "first_names": first.split("_"), "second_names": second.split("_")}
    if reason is not None:
        d |= {"reason": reason, "first_ops": ops.get("first_ops", []), "second_ops": ops.get("second_ops", [])}
    return d


def _event(payload: dict[str, Any], cid: tuple[int, int] | None) -> tuple[dict[str, Any], str]:
    meta: dict[str, Any] = {"artifact": {"name": FUSION_LOG, "encoding": "json"}, "has_payload": ""}
    if cid is not None:
        meta |= {"frame_id": cid[0], "frame_compile_id": cid[1], "attempt": 0}
    return meta, json.dumps(payload)


LISTENING = _event({"listening": True}, None)


def test_refusals_torch_fused_later_are_left_out() -> None:
    """torch's own log on CUDA: ``cannot fuse op1 with op3: intermediate nodes ...`` is followed by
    ``fusing op1 with op2_op4_op3``: not a refusal that stood. The first graph's op0 (a sum over
    the other dimension) never fused: its refusals stay, in torch's order."""
    log = json.loads(CUDA.read_text())["fusion_log"]
    graphs: list[list[dict[str, Any]]] = []
    for msg in log:
        if msg.startswith("===== attempting fusion (1/10)"):
            graphs.append([])
        if (m := _REFUSED.match(msg)) is not None:
            graphs[-1].append(_decision(m.group(1), m.group(2), m.group(3)))
        elif (m := _FUSED.match(msg)) is not None:
            graphs[-1].append(_decision(m.group(1), m.group(2)))
    assert len(graphs) == 2
    refused_f, refused_g = ([r for r in g if r["decision"] == "refused"] for g in graphs)
    assert {(r["first"], r["second"], r["reason"]) for r in refused_f} == {
        ("op0", "op1", "no shared data"), ("op0", "op2", "no shared data"), ("op0", "op1_op2", "no shared data")}
    assert refused_g == [_decision("op1", "op3", "intermediate nodes between node1 & node2")]
    assert fusion.refusals(graphs[0]) == refused_f
    assert fusion.refusals(graphs[1]) == []


def _with_decisions(*decisions: tuple[dict[str, Any], str]) -> Inside:
    return build(read_events([LISTENING, *_events(), *decisions]))


def test_refusals_land_on_the_kernels_that_run_their_nodes() -> None:
    events = _events()
    mapping = json.loads(_of(events, "0/0", "inductor_provenance_tracking_node_mappings")[0])["cppCodeToPost"]
    inside = _with_decisions(
        _event(_decision("op0", "op1", "exceeds max fusion", first_ops=["addmm"], second_ops=["var_mean", "mul_4"]),
               (0, 0)),
        _event(_decision("op1", "op2", "no shared data", first_ops=["var_mean"], second_ops=["mul_4"]), (0, 0)),
        _event(_decision("op1", "op2"), (0, 0)),  # fused after all
        _event(_decision("op5", "op6", "exceeds max fusion", part="backward", first_ops=["mm"], second_ops=["sum_6"]),
               (0, 1)))
    assert fusion.NOT_IN_TRACE not in inside.notes
    g0, g1 = inside.graphs
    (nf,) = g0.not_fused
    owner = {n: h for h, nodes in mapping.items() for n in nodes}  # torch's own kernel -> node record
    assert (nf.part, nf.first, nf.second, nf.reason) == ("forward", "op0", "op1", "exceeds max fusion")
    assert nf.first_kernels == [owner["addmm"]] == ["extern_kernels.addmm:1"]
    assert nf.second_kernels == [owner["var_mean"]] == ["cpp_fused_gelu_native_layer_norm_0:2"]
    # the backward's decision goes to the backward's kernels (0/1's forward has the same node names)
    (nb,) = g1.not_fused
    assert nb.part == "backward" and nb.first_kernels == [next(k.id for k in g1.kernels if k.part == "backward"
                                                               and "mm" in k.ops)]
    assert nb.second_kernels == [next(k.id for k in g1.kernels if k.name == "cpp_fused_sum_1")]
    # the JSON's top-level "fusion" list reads back without torch
    d = json.loads(json.dumps(inside.to_dict()))
    assert [(f["graph"], f["first_kernels"], f["reason"]) for f in d["fusion"]] == [
        ("g0", ["extern_kernels.addmm:1"], "exceeds max fusion"), ("g1", nb.first_kernels, "exceeds max fusion")]
    back = Inside.from_dict(d)
    assert [n.to_dict() for n in back.not_fused] == [n.to_dict() for n in inside.not_fused]
    # the terminal's short list and the report's panels
    assert overlay.not_fused_lines(g0) == [
        "  forward: addmm in extern_kernels.addmm ✗ var_mean, mul_4 in cpp_fused_gelu_native_layer_norm_0: "
        "exceeds max fusion [a, ln]"]  # the modules: Dynamo's parameter names (no eager graph here)
    console = Console(record=True, width=300)
    print_inside(console, inside, stage=None, graph=None)
    text = console.export_text()
    assert text.count("not fused (1, Inductor's reasons):") == 2
    assert "  backward: mm in extern_kernels.mm ✗ sum_6 in cpp_fused_sum_1: exceeds max fusion" in text
    page = Graph(name="p")
    overlay.panels(page, inside)
    panels = page.annotations["panels"]
    rows = panels["not fused"]["rows"]
    assert [r["cells"][2:5] for r in rows][0] == ["addmm in extern_kernels.addmm",
                                                  "var_mean, mul_4 in cpp_fused_gelu_native_layer_norm_0",
                                                  "exceeds max fusion"]
    kernels = [(r["cells"][0], r["cells"][2], r["cells"][-1]) for r in panels["kernels"]["rows"] if r["cells"][-1]]
    assert sorted(kernels) == [
        ("cpp_fused_gelu_native_layer_norm_0", "g0", "extern_kernels.addmm (exceeds max fusion)"),
        ("cpp_fused_sum_1", "g1", "extern_kernels.mm (exceeds max fusion)"),
        ("extern_kernels.addmm", "g0", "cpp_fused_gelu_native_layer_norm_0 (exceeds max fusion)"),
        ("extern_kernels.mm", "g1", "cpp_fused_sum_1 (exceeds max fusion)")]


def test_a_side_is_the_kernel_that_writes_its_buffers() -> None:
    """A refused scheduler node's origins can hold nodes inlined into it that other kernels also run
    (torch's cppCodeToPost lists them under each): its kernel is the call that writes its buffer
    (the first call line naming it), its nodes those that kernel runs."""
    code = _of(_events(), "0/0", "inductor_output_code")[0]
    writer = next(ln.strip() for ln in code.split("\n") if "buf6" in ln and "(" in ln and " = " not in ln)
    assert writer.startswith("cpp_fused_gelu_native_layer_norm_0(")  # the line that first names buf6
    inside = _with_decisions(_event(_decision(
        "op1", "op2", "exceeds max fusion", first_ops=["mul_4", "addmm"], second_ops=["addmm_1", "mul_4"])
        | {"first_buffers": ["buf6"], "second_buffers": ["buf7"]}, (0, 0)))
    (nf,) = inside.graphs[0].not_fused
    assert (nf.first_kernels, nf.first_ops) == (["cpp_fused_gelu_native_layer_norm_0:2"], ["mul_4"])
    assert (nf.second_kernels, nf.second_ops) == (["extern_kernels.addmm:3"], ["addmm_1"])


def test_a_saved_trace_says_it_has_no_reasons() -> None:
    inside = from_trace(TRACE)[0]
    assert fusion.NOT_IN_TRACE in inside.notes
    assert inside.not_fused == [] and inside.to_dict()["fusion"] == []


def test_a_graph_the_fx_graph_cache_served_says_why_it_has_no_reasons() -> None:
    hit = ({"artifact": {"name": "fx_graph_cache_hit", "encoding": "json"}, "frame_id": 0, "frame_compile_id": 0,
            "attempt": 0, "has_payload": ""}, json.dumps({"key": "f0"}))
    notes = build(read_events([LISTENING, *_events(), hit])).notes
    assert [n for n in notes if "scheduler did not run" in n] == [
        "compile 0/0 forward: Inductor's FX graph cache served this graph, so its scheduler did not run and logged "
        "no fusion decisions (TORCHINDUCTOR_FX_GRAPH_CACHE=0 compiles it afresh)"]
    assert fusion.NOT_IN_TRACE not in notes
