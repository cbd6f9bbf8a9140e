"""A frame Dynamo failed to compile is one row of the compile map, as it is one frame compile in
torch's record: Mixtral's eager experts (random weights, a small config) run transformers'
``capture_outputs`` wrapper, whose ``<dictcomp>`` torch compiles once and fails (its compilation
metrics' ``fail_type``); the break that failed it is logged in the same compile, and broke no
graph. The map listed that ``<dictcomp>`` twice: once as a break, once as a function skipped."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
import torch
from torch._logging._internal import trace_log

from fxviz.analyze.compilemap import compile_map


class Trace(logging.Handler):
    """torch's structured trace of the run: per compile id, its ``compilation_metrics`` and the
    payloads of its ``dynamo_graph_break_reason`` artifacts."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: dict[str, dict[str, Any]] = {}
        self.breaks: dict[str, list[str]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        md = record.metadata  # type: ignore[attr-defined]
        if md.get("frame_id") is None:
            return
        cid = f"{md['frame_id']}/{md['frame_compile_id']}" + (f"_{md['attempt']}" if md.get("attempt") else "")
        if "compilation_metrics" in md:
            self.metrics[cid] = md["compilation_metrics"]
        elif md.get("artifact", {}).get("name") == "dynamo_graph_break_reason":
            self.breaks.setdefault(cid, []).append(str(getattr(record, "payload", "") or ""))


@pytest.fixture(scope="module")
def run() -> dict[str, Any]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
        experts_implementation="eager")
    model = transformers.MixtralForCausalLM(cfg).eval()
    h = Trace()
    trace_log.addHandler(h)
    try:
        cmap = compile_map(model, (torch.randint(0, 96, (1, 7)),), backend="aot_eager")
    finally:
        trace_log.removeHandler(h)
    return {"cmap": cmap, "torch": h}


def test_a_comprehension_torch_failed_to_compile_once_is_one_row(run: dict[str, Any]) -> None:
    cmap, t = run["cmap"], run["torch"]
    comps = {cid: m for cid, m in t.metrics.items() if m.get("co_name") == "<dictcomp>"}
    # torch's record: one compile of the comprehension, failed, with the break that failed it logged in it
    ((cid, m),) = comps.items()
    assert m["fail_type"] == "Unsupported" and t.breaks.get(cid)
    rows = [g for g in cmap.breaks if g.where is not None and g.where.func == "<dictcomp>"]
    assert len(rows) == 1, [(g.category, g.where) for g in rows]
    (row,) = rows
    assert (row.category, row.where.file, row.where.line) == ("skip", m["co_filename"], m["co_firstlineno"])
    assert row.stack[-1].line == m["fail_user_frame_lineno"]


def test_every_break_row_broke_a_compile_torch_finished(run: dict[str, Any]) -> None:
    """A break (not a function skipped) is where a frame compile torch did not fail logged one."""
    cmap, t = run["cmap"], run["torch"]
    done = [p for cid, ps in t.breaks.items() if not t.metrics.get(cid, {}).get("fail_type") for p in ps]
    for g in cmap.breaks:
        if g.category == "skip" or g.where is None:
            continue
        at = re.compile(rf'File "{re.escape(g.where.file)}", line {g.where.line}\b')
        assert any(at.search(p) for p in done), (g.category, g.where)
    # and each frame torch failed to compile (bar a logged skip naming it) is a function skipped
    failed = {(m["co_filename"], m["co_name"]) for m in t.metrics.values() if m.get("fail_type")}
    skipped = {(g.stack[0].file, g.stack[0].func) for g in cmap.breaks if g.category == "skip"}
    assert {("output_capturing.py", "<dictcomp>"), ("generic.py", "wrapper")} <= {
        (f.rsplit("/", 1)[-1], n) for f, n in failed & skipped}
