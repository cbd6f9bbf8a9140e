"""Inside torch.compile from a saved trace, without torch: the builder on the reader's fixture
(tests/data/traces/train.log: compile 0/0 forward only, 0/1 a training step), checked against
the trace's own text (read here with plain regular expressions)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fxviz.analyze.inside.result import Inside
from fxviz.analyze.inside.saved import from_trace
from fxviz.cli import cli

TRACE = Path(__file__).resolve().parent / "data" / "traces" / "train.log"
_HEAD = re.compile(r"^(?:\[rank\d+\]:)?[VIWEC]\d{4} [\d:.]+ +\d+ [^\]]*\] (\{.*\})$")


def _events() -> list[tuple[dict[str, Any], str | None]]:
    out: list[tuple[dict[str, Any], str | None]] = []
    for line in TRACE.read_text().split("\n"):
        m = _HEAD.match(line)
        if m:
            out.append((json.loads(m.group(1)), None))
        elif line.startswith("\t") and out:
            meta, payload = out[-1]
            out[-1] = (meta, (payload + "\n" if payload is not None else "") + line[1:])
    return out


def _of(events: list[tuple[dict[str, Any], str | None]], cid: str, key: str) -> list[Any]:
    found = []
    for meta, payload in events:
        if f"{meta.get('frame_id')}/{meta.get('frame_compile_id')}" != cid:
            continue
        name = meta["artifact"]["name"] if "artifact" in meta else next(iter(meta))
        if name == key:
            found.append(payload if payload is not None else meta[key])
    return found


@pytest.fixture(scope="module")
def inside() -> Inside:
    return from_trace(TRACE)[0]


def test_kernels_and_nodes_are_the_traces(inside: Inside) -> None:
    events = _events()
    assert [g.compile_id for g in inside.graphs] == ["0/0", "0/1"]
    for g in inside.graphs:
        codes = _of(events, g.compile_id, "inductor_output_code")
        parts = [re.search(r"# AOT ID: \['\d+_(\w+)'\]", c).group(1) for c in codes]  # type: ignore[union-attr]
        for code, part in zip(codes, parts, strict=True):
            assert {k.id for k in g.kernels if k.part == part} == set(
                re.findall(r"# \[Provenance debug handles\] (\S+)", code))
            assert {k.name for k in g.kernels if k.part == part and k.kind != "extern"} == set(
                re.findall(r"^(\w+) = async_compile\.\w+\(", code, re.M))
        recorded = json.loads(_of(events, g.compile_id, "inductor_provenance_tracking_node_mappings")[0])
        assert {k.id: sorted(k.ops) for k in g.kernels if k.part == "forward"} == {
            h: sorted(v) for h, v in recorded["cppCodeToPost"].items()}
        posts = _of(events, g.compile_id, "inductor_post_grad_graph")
        for text, part in zip(posts, parts, strict=True):
            for name in re.findall(r"^\s+(\w+)(?:: \"[^\"]*\")? = (?:torch\.ops\.|\w+\[\d+\])", text, re.M):
                owners = [k.id for k in g.kernels if k.part == part and name in k.ops]
                assert len(owners) + (f"{part}:{name}" in g.unmapped) == 1, (g.id, part, name, owners)
        assert g.share_mapped == 1.0
    # the backward's second fused kernel makes the graph's last output (buf12 in call()'s return)
    g1 = inside.graph("0/1")
    assert next(k for k in g1.kernels if k.name == "cpp_fused_sum_1").ops == ["sum_6"]


def test_stages_branch_from_the_joint_graph(inside: Inside) -> None:
    g0, g1 = inside.graphs
    assert "AOT backward" in [s.name for s in g0.pipeline.stages]  # traced, never compiled: still a stage
    p = g1.pipeline
    names = [s.name for s in p.stages]
    assert p.before(names.index("AOT backward")) == names.index("AOT joint graph")
    assert p.before(names.index("post-grad passes (backward)")) == names.index("AOT backward")
    kernels = p.stages[names.index("kernels (forward)")]
    assert len(kernels.replaced) == 3 and len(kernels.removed) == 18


def test_costs_are_the_compilation_metrics(inside: Inside) -> None:
    events = _events()
    for g in inside.graphs:
        (metrics,) = _of(events, g.compile_id, "compilation_metrics")
        assert g.cost is not None
        for key in ("entire_frame_compile_time_s", "backend_compile_time_s", "inductor_compile_time_s"):
            assert g.cost.metrics[key] == metrics[key]
    bwd = _of(events, "0/1", "bwd_compilation_metrics")[0]
    assert inside.graphs[1].cost.bwd_metrics["inductor_compile_time_s"] == bwd["inductor_compile_time_s"]  # type: ignore[union-attr]


def test_round_trip(inside: Inside) -> None:
    for g in inside.graphs:
        for s in g.pipeline.stages:
            s.graph.validate()
    back = Inside.from_dict(json.loads(json.dumps(inside.to_dict())))
    assert back.summary() == inside.summary()
    assert [k.to_dict() for k in back.kernels] == [k.to_dict() for k in inside.kernels]
    assert [[s.name for s in g.pipeline.stages] for g in back.graphs] == [
        [s.name for s in g.pipeline.stages] for g in inside.graphs]


def test_cli_from_trace(tmp_path: Path) -> None:
    out = CliRunner().invoke(cli, ["compile", "--from-trace", str(TRACE)])
    assert out.exit_code == 0, out.output
    assert "2 compiled graphs, 12 kernels and calls (8 extern), 100% of post-grad ops mapped" in out.output
    assert "cpp_fused_sum_1" in out.output and "C++/Triton compile" in out.output
    page = tmp_path / "s.html"
    out = CliRunner().invoke(cli, ["compile", "--from-trace", str(TRACE), "--graph", "g1", "--stage", "8",
                                   "--html", str(page), "--json", str(tmp_path / "i.json")])
    assert out.exit_code == 0, out.output
    assert "change in stage 8 (kernels (backward))" in out.output and page.exists()
    assert {"stages", "kernels", "costs"} <= set(json.loads((tmp_path / "i.json").read_text()))
    out = CliRunner().invoke(cli, ["compile", "--from-trace", str(TRACE), "--graph", "g7"])
    assert out.exit_code == 2 and "g7" in out.output


def test_from_trace_with_a_target_and_graph_reads_the_trace_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--from-trace FILE TARGET --graph G`` read the file twice (the graph check before the model
    ran, then the stages): one read serves both, and the graphs are still the trace's."""
    import fxviz.tracefile.reader as reader

    files: list[str] = []
    real = reader._read_file

    def counted(path: Path, grouper: Any) -> int:
        files.append(str(path))
        return real(path, grouper)

    monkeypatch.setattr(reader, "_read_file", counted)
    out = tmp_path / "i.json"
    res = CliRunner().invoke(cli, ["compile", "--from-trace", str(TRACE), "tests/inside_models.py:block",
                                   "--graph", "g1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert files == [str(TRACE)]
    d = json.loads(out.read_text())
    assert [g["compile_id"] for g in d["inside"]["graphs"]] == ["0/0", "0/1"]
    res = CliRunner().invoke(cli, ["compile", "--from-trace", str(TRACE), "tests/inside_models.py:block",
                                   "--graph", "g7"])
    assert res.exit_code == 2 and "g7" in res.output
    assert files == [str(TRACE)] * 2  # refused before the model ran, the file read once
