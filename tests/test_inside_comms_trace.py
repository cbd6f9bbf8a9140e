"""Inductor's communication passes read from a saved trace, without torch (``fxviz compile
--from-trace``): tests/data/traces/comms.log is a real ``TORCH_TRACE`` of a sharded model compiled on
the CPU with two all-gathers bucketed and the scheduler's reordering on (made by gen_comms.py). The
stages are checked against the trace's own text, read here with plain regular expressions."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from fxviz.analyze.inside.saved import from_trace

TRACE = Path(__file__).resolve().parent / "data" / "traces" / "comms.log"
_HEAD = re.compile(r"^(?:\[rank\d+\]:)?[VIWEC]\d{4} [\d:.]+ +\d+ [^\]]*\] (\{.*\})$")


def recorded(path: Path = TRACE) -> dict[str, list[Any]]:
    """Artifact (or graph event) name -> its payloads, in trace order."""
    events: list[tuple[dict[str, Any], str | None]] = []
    for line in path.read_text().split("\n"):
        m = _HEAD.match(line)
        if m:
            events.append((json.loads(m.group(1)), None))
        elif line.startswith("\t") and events:
            meta, payload = events[-1]
            events[-1] = (meta, (payload + "\n" if payload is not None else "") + line[1:])
    out: dict[str, list[Any]] = {}
    for meta, payload in events:
        name = meta["artifact"]["name"] if "artifact" in meta else next(iter(meta))
        out.setdefault(name, []).append(payload)
    return out


def order(graph_text: str) -> list[str]:
    """The nodes of a graph torch printed, in its order."""
    return re.findall(r"^ {8}(\w+)(?:: \"[^\"]*\")? = ", graph_text, re.M)


def expected_moves(code: str, to_post: dict[str, list[str]], post_text: str) -> dict[str, list[str]]:
    """Each collective or wait call of the output code -> the calls that run before it although
    all their post-grad nodes come after its own (torch's call order, ``cppCodeToPost``, graph order)."""
    handles = re.findall(r"\[Provenance debug handles\] (\S+)", code)
    place = {n: i for i, n in enumerate(order(post_text))}
    first = {h: min(place[n] for n in to_post[h]) for h in handles}
    last = {h: max(place[n] for n in to_post[h]) for h in handles}
    comm = [h for h in handles if "_c10d_functional" in h]
    return {h: [o for o in handles[:handles.index(h)] if o not in comm and first[o] > last[h]] for h in comm}


def test_a_saved_trace_shows_the_bucket_and_the_moved_wait() -> None:
    rec = recorded()
    inside, _ = from_trace(TRACE)
    g = inside.graphs[0]
    members = re.findall(r"\w+", rec["fx_bucketing_passes_all_gather_buckets"][0])
    post_text = rec["inductor_post_grad_graph"][0]
    bucket = [n for n in order(post_text) if re.search(rf"^ {{8}}{n}: \"[^\"]*\" = torch\.ops\._c10d_functional\."
                                                       r"all_gather_into_tensor", post_text, re.M)]
    post = next(s for s in g.pipeline.stages if s.name.startswith("post-grad passes"))
    assert len(members) == 2 and len(bucket) == 1
    assert post.links[bucket[0]] == [(m, "exact") for m in members] and bucket[0] in post.replaced
    mapping = json.loads(rec["inductor_provenance_tracking_node_mappings"][0])
    want = {h: later for h, later in expected_moves(rec["inductor_output_code"][0], mapping["cppCodeToPost"],
                                                     post_text).items() if later}
    assert want  # the output code runs a wait later than the post-grad graph has it
    kernels = next(s for s in g.pipeline.stages if s.name.startswith("kernels"))
    ids = {n.name: n.attrs["kernel"] for n in kernels.graph.nodes if n.kind == "op"}
    assert sorted(ids[n] for n in kernels.moved) == sorted(want)
    for h, later in want.items():
        note = next(n for n in kernels.notes if n.startswith(h))
        assert all(o in note for o in later)
    schedule = rec["inductor_collective_schedule"][0]
    schedule = json.loads(schedule) if isinstance(schedule, str) else schedule
    assert any(n.endswith(", ".join(schedule)) for n in kernels.notes)
    head = rec["reorder_communication_preserving_peak_memory"][0].splitlines()[0]
    assert any(head in n for n in kernels.notes)


SP_TRACE = TRACE.with_name("comms_sp.log")


def test_a_collective_torch_records_as_its_wait_runs_the_collective_that_wait_awaits() -> None:
    """tests/data/traces/comms_sp.log: a sequence-parallel MLP (input all-gathered, output
    reduce-scattered). torch's ``cppCodeToPost`` gives each collective call its wait's node; the
    row runs the collective node the wait awaits (read from torch's post-grad graph), inferred, and
    every post-grad op is mapped."""
    rec = recorded(SP_TRACE)
    to_post = json.loads(rec["inductor_provenance_tracking_node_mappings"][0])["cppCodeToPost"]
    post_text = rec["inductor_post_grad_graph"][0]
    awaits = dict(re.findall(r"^ {8}(\w+)(?:: \"[^\"]*\")? = torch\.ops\._c10d_functional\.wait_tensor\.default\((\w+)\)",
                             post_text, re.M))
    calls = {h: ns for h, ns in to_post.items() if "_c10d_functional" in h and "wait_tensor" not in h}
    assert {re.sub(r"\.default:\d+$", "", h).rsplit(".", 1)[-1] for h in calls} == {
        "all_gather_into_tensor", "reduce_scatter_tensor"}
    assert all(set(ns) <= set(awaits) for ns in calls.values())  # torch: the waits, not the collectives
    inside, _ = from_trace(SP_TRACE)
    g = inside.graphs[0]
    rows = {k.id: k for k in g.kernels}
    for h, ns in calls.items():
        assert rows[h].ops == [awaits[n] for n in ns] and rows[h].inferred, (h, rows[h].ops)
    assert g.mapped == g.ops and g.ops > 0
