"""fxviz.tracefile.read_trace on a real Inductor trace and on broken copies of it (no torch).

The fixture ``tests/data/traces/train.log`` is a real ``TORCH_TRACE`` file of
/work/wt/samples/gen.py (see tests/data/traces/make_fixtures.py): compile 0/0 (forward only) and
compile 0/1 (forward, then the backward compiled lazily). The reference facts are taken from the file
itself with a deliberately naive line-by-line reading, not from fxviz.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fxviz.errors import FxvizError, GraphFormatError
from fxviz.tracefile import TraceFileError, read_events, read_trace
from fxviz.tracefile import reader as reader_mod

TRACE = Path(__file__).parent / "data" / "traces" / "train.log"
PREFIX = re.compile(r"[VIWEC]\d{4} [\d:.]+ +\d+ [^\]]*\] ")


def naive_events(path: Path) -> list[tuple[int, dict, str | None]]:
    """(line, header, payload) of each event, the slow obvious way."""
    lines = path.read_text().split("\n")
    out = []
    i = 0
    while i < len(lines):
        if not lines[i]:
            i += 1
            continue
        m = PREFIX.match(lines[i])
        assert m is not None
        header = json.loads(lines[i][m.end():])
        start = i + 1
        i += 1
        body = []
        while i < len(lines) and lines[i].startswith("\t"):
            body.append(lines[i][1:])
            i += 1
        out.append((start, header, "\n".join(body) if "has_payload" in header else None))
    return out


def summary(trace):
    return [(c.compile_id, [(a.name, a.payload, a.meta) for a in c.artifacts], c.events,
             [(p.name, p.start, p.seconds) for p in c.phases]) for c in trace.compiles]


@pytest.fixture(scope="module")
def trace():
    return read_trace(TRACE)


def test_compiles_and_their_artifacts_are_torch_s(trace):
    events = naive_events(TRACE)
    assert [c.compile_id for c in trace.compiles] == ["0/0", "0/1"]
    assert trace.problems == []
    assert trace.files == [str(TRACE)]
    for c in trace.compiles:
        expected = []
        for line, h, payload in events:
            key = next(iter(h))
            if (h.get("frame_id"), h.get("frame_compile_id")) != (c.frame_id, c.frame_compile_id):
                continue
            if payload is None or key == "chromium_event":
                continue
            name = h[key]["name"] if key == "artifact" else key
            expected.append((name, line))
        assert [(a.name, a.line) for a in c.artifacts] == expected
        assert all(a.file == str(TRACE) for a in c.artifacts)
    # the training compile: two post-grad graphs and two output codes (forward, backward)
    train = trace.compiles[1]
    assert len(train.all("inductor_output_code")) == 2
    assert len(train.all("inductor_post_grad_graph")) == 2
    assert train.all("inductor_output_code")[1].payload.startswith("# AOT ID: ['1_backward']")


def test_payloads_meta_and_header_only_events(trace):
    events = naive_events(TRACE)
    c0 = trace.compiles[0]
    graph = c0.first("dynamo_output_graph")
    line, h, payload = next(e for e in events if "dynamo_output_graph" in e[1])
    assert graph.payload == payload and graph.line == line
    assert graph.meta["sizes"] == h["dynamo_output_graph"]["sizes"]
    code = c0.first("inductor_output_code")
    assert code.meta["filename"].endswith(".py")
    mappings = c0.first("inductor_provenance_tracking_node_mappings")
    assert isinstance(mappings.payload, dict) and "cppCodeToPost" in mappings.payload
    assert mappings.meta["encoding"] == "json"
    # header-only events of a compile, in order; compilation_metrics as torch wrote it
    assert [k for k, _ in c0.events][:2] == ["dynamo_start", "describe_storage"]
    assert c0.event("compilation_metrics")["compile_id"] == "0/0"
    # a "json" artifact whose payload torch wrote as plain text is kept as the text
    reasons = trace.compiles[1].first("recompile_reasons")
    assert reasons is not None and "requires_grad mismatch" in reasons.payload
    # outside any compile: torch_version and the interned file names of dynamo_start's stacks
    assert [g.name for g in trace.globals] == ["torch_version"]
    assert trace.strings[1] == "/tmp/lead/gen.py"
    assert c0.event("dynamo_start")["stack"][0]["filename"] == 1


def test_phases_match_compilation_metrics(trace):
    for c in trace.compiles:
        metrics = c.event("compilation_metrics")
        by_name = {p.name: p for p in c.phases}
        for phase, key in [("entire_frame_compile", "entire_frame_compile_time_s"),
                           ("backend_compile", "backend_compile_time_s")]:
            assert by_name[phase].seconds == pytest.approx(metrics[key], abs=2e-6)
        assert by_name["entire_frame_compile"].start == pytest.approx(metrics["start_time"],
                                                                      abs=1e-3)
    # the backward's inductor_compile is the second one of 0/1 (bwd_compilation_metrics)
    bwd = trace.compiles[1].event("bwd_compilation_metrics")
    inductor = [p for p in trace.compiles[1].phases if p.name == "inductor_compile"]
    assert inductor[1].seconds == pytest.approx(bwd["inductor_compile_time_s"], abs=2e-6)
    # compile_file of the parallel compile workers names no compile
    assert {p.name for p in trace.phases} == {"compile_file"}


def test_small_chunks_read_the_same(monkeypatch, trace):
    monkeypatch.setattr(reader_mod, "CHUNK", 4093)
    assert summary(read_trace(TRACE)) == summary(trace)


def lines_of(path: Path) -> list[str]:
    return path.read_text().split("\n")


def write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    p = tmp_path / name
    p.write_text("\n".join(lines))
    return p


def artifact_names(trace):
    return {c.compile_id: [a.name for a in c.artifacts] for c in trace.compiles}


def test_truncated_inside_a_payload(tmp_path, trace):
    lines = lines_of(TRACE)
    code_line = [a.line for a in trace.compiles[1].all("inductor_output_code")][1]
    cut = write(tmp_path, "cut.log", lines[:code_line + 40] + [lines[code_line + 40][:7]])
    got = read_trace(cut)
    first, unclosed = got.problems
    assert (first.file, first.line) == (str(cut), code_line)
    assert "cut short" in first.what and "file ends" in first.what
    assert str(first).startswith(f"{cut}:{code_line}: ")
    # the phases the trace stops inside: one problem at the first of them
    assert unclosed.file == str(cut) and unclosed.line < code_line
    assert "never end" in unclosed.what and "inductor_compile" in unclosed.what
    assert [c.compile_id for c in got.compiles] == ["0/0", "0/1"]
    names = artifact_names(trace)
    assert artifact_names(got)["0/0"] == names["0/0"]
    # 0/1 keeps everything before the cut backward output code
    index = [a.line for a in trace.compiles[1].artifacts].index(code_line)
    assert artifact_names(got)["0/1"] == names["0/1"][:index]


def test_foreign_line_and_bad_json(tmp_path, trace):
    lines = lines_of(TRACE)
    graph_line = trace.compiles[0].first("aot_joint_graph").line
    header = trace.compiles[1].first("dynamo_output_graph").line
    bad = list(lines)
    bad[header - 1] = bad[header - 1].replace('{"dynamo_output_graph"', '{"dynamo_output_graph" ', 1)
    bad[header - 1] = bad[header - 1][:-3]  # the header's JSON is cut
    bad.insert(graph_line + 5, "hello from another program")  # inside the joint graph's payload
    p = write(tmp_path, "bad.log", bad)
    got = read_trace(p)
    problems = [(q.line, q.what.split(" (")[0]) for q in got.problems]
    assert problems[0] == (graph_line, "the payload of 'aot_joint_graph' is cut short")
    assert problems[1][0] == graph_line + 6 and problems[1][1].startswith("not a structured-trace")
    assert problems[2][0] == graph_line + 7 and "no event header" in problems[2][1]
    # the bad header is one line lower (the foreign line was inserted above it)
    assert problems[3] == (header + 1, "the event header is not valid JSON")
    assert len(problems) == 4
    names = artifact_names(trace)
    expected0 = [n for n in names["0/0"] if n != "aot_joint_graph"]
    expected1 = [n for n in names["0/1"] if n != "dynamo_output_graph"]
    assert artifact_names(got) == {"0/0": expected0, "0/1": expected1}


def test_md5_mismatch_is_a_problem(tmp_path, trace):
    lines = lines_of(TRACE)
    line = trace.compiles[0].first("inductor_post_grad_graph").line
    lines[line] = lines[line] + " changed"
    got = read_trace(write(tmp_path, "md5.log", lines))
    assert [(q.line, "md5 differs" in q.what) for q in got.problems] == [(line, True)]
    assert trace.compiles[0].first("inductor_post_grad_graph") is not None
    assert got.compiles[0].first("inductor_post_grad_graph") is None


def test_ranks_and_directories(tmp_path, trace):
    lines = lines_of(TRACE)
    for rank in (1, 0):
        write(tmp_path, f"dedicated_log_torch_trace_rank_{rank}_x.log",
              [f"[rank{rank}]:{x}" if x and not x.startswith("\t") else x for x in lines])
    (tmp_path / "notes.txt").write_text("not a trace\n")
    got = read_trace(tmp_path)
    assert got.ranks() == [0, 1]
    assert [(c.rank, c.compile_id) for c in got.compiles] == [
        (0, "0/0"), (0, "0/1"), (1, "0/0"), (1, "0/1")]
    assert got.problems == []
    assert [Path(f).name for f in got.files] == ["dedicated_log_torch_trace_rank_0_x.log",
                                                "dedicated_log_torch_trace_rank_1_x.log"]
    assert summary(got)[2:] == summary(trace)


def test_unreadable_paths_raise_one_clear_error(tmp_path):
    assert issubclass(TraceFileError, GraphFormatError) and TraceFileError.exit_code == 2
    with pytest.raises(TraceFileError, match="no such file.*TORCH_TRACE=DIR"):
        read_trace(tmp_path / "missing")
    with pytest.raises(TraceFileError, match="empty.*TORCH_TRACE=DIR"):
        read_trace(tmp_path)
    (tmp_path / "a.log").write_text("just some log\nlines\n")
    with pytest.raises(FxvizError, match=r"no structured-trace lines.*a\.log:1.*TORCH_TRACE=DIR"):
        read_trace(tmp_path)
    # a foreign file next to a real one is one problem, not one per line
    (tmp_path / "b.log").write_text(TRACE.read_text())
    got = read_trace(tmp_path)
    assert [(Path(p.file).name, p.line) for p in got.problems] == [("a.log", 1)]
    assert "not a structured trace file" in got.problems[0].what


def test_read_events_groups_like_the_file(trace):
    events = [(h, p) for _, h, p in naive_events(TRACE)]
    live = read_events(events)
    assert summary(live) == summary(trace)
    assert live.files == ["<live run>"]
    assert [a.line for a in live.compiles[0].artifacts][0] == next(
        i for i, (h, _) in enumerate(events, 1) if "dynamo_output_graph" in h)
    broken = read_events([({"artifact": {"name": "x", "encoding": "json"}, "frame_id": 0,
                            "frame_compile_id": 0, "has_payload": "0"}, "{"), ("oops", None)],
                         file="run")  # type: ignore[list-item]
    assert [(p.file, p.line) for p in broken.problems] == [("run", 2)]
    assert broken.compiles[0].first("x").payload == "{"


def test_the_tracefile_package_imports_no_torch():
    code = ("import sys, fxviz.tracefile, fxviz.tracefile.reader, fxviz.tracefile.group; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
