"""Every recompile of the compile map against torch's own record of the same run: the structured
trace's ``compilation_metrics`` record of each frame compile (what TORCH_TRACE writes and tlparse
reads), whose ``recompile_reason`` is set on each recompile, with its compile id
``frame_id/frame_compile_id``. Each recompile torch made appears once, in order, with its function,
input set and failed guard, in the list, the header, the report's panel and the JSON; a recompile
Dynamo refused at its limit is no recompile."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import compile_models as cm
import pytest
import torch
from torch._logging._internal import trace_log

from fxviz.analyze.compilemap import CompileMap, compile_map
from fxviz.analyze.compilemap.limit import LIMIT_BREAK, LimitWatch
from fxviz.passes.panels import panels

Row = tuple[int, str, str, int, str]  # input set, compile id, function, its first line, the failed guard


class Compiles(logging.Handler):
    """torch's ``compilation_metrics`` records, each with the input set that was running (counted
    at the start of each input set the compile map runs)."""

    def __init__(self) -> None:
        super().__init__()
        self.input_set = -1
        self.records: list[tuple[int, str, dict[str, Any]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        md = record.metadata  # type: ignore[attr-defined]
        if "compilation_metrics" in md:
            self.records.append((self.input_set, f"{md['frame_id']}/{md['frame_compile_id']}", md["compilation_metrics"]))

    def recompiles(self) -> list[Row]:
        """Each recompile torch compiled (not those its limit refused), in order."""
        return [(k, cid, m["co_name"], m["co_firstlineno"],
                 re.sub(r"^\d+/\d+: ", "", m["recompile_reason"]).split("\n", 1)[0])
                for k, cid, m in self.records
                if m.get("recompile_reason") and not str(m.get("fail_reason") or "").startswith(LIMIT_BREAK)]


@pytest.fixture
def torch_record(monkeypatch: pytest.MonkeyPatch) -> Iterator[Compiles]:
    h = Compiles()
    start = LimitWatch.start

    def counted(self: LimitWatch) -> None:
        h.input_set += 1
        start(self)

    monkeypatch.setattr(LimitWatch, "start", counted)
    trace_log.addHandler(h)
    try:
        yield h
    finally:
        trace_log.removeHandler(h)


def _agrees(cmap: CompileMap, truth: list[Row]) -> None:
    """The map's recompiles are torch's, one for one, in its list, header, panel and JSON."""
    assert [(r.input_set, r.func, r.line, r.guard) for r in cmap.recompiles] == [(k, f, ln, g) for k, _, f, ln, g in truth]
    assert [r.compile_id for r in cmap.recompiles] == [cid for _, cid, *_ in truth]
    n = len(truth)
    assert f"{n} recompile{'' if n == 1 else 's'}" in cmap.header()
    rows = [r for r in panels(cmap.graph)["recompiles"]["rows"] if r["level"] == "warn"]
    assert [(r["cells"][0], r["cells"][2]) for r in rows] == [(k, cid) for k, cid, *_ in truth]
    d = json.loads(cmap.to_json())
    assert d["summary"]["recompiles"] == n
    assert [(r["input_set"], r["compile_id"], r["guard"]) for r in d["recompiles"]] == [(k, cid, g) for k, cid, _, _, g in truth]
    assert CompileMap.from_json(cmap.to_json()).recompiles == cmap.recompiles


def test_a_function_recompiled_in_one_input_set_is_listed_each_time(torch_record: Compiles) -> None:
    # act is called with widths 6, 10 and 3 in one forward: torch recompiles it twice (1/1, 1/2);
    # the old map kept one recompile per function and input set
    model, args = cm.widths()
    cmap = compile_map(model, args, backend="eager", dynamic=False)
    truth = torch_record.recompiles()
    line = cm.Widths.act.__code__.co_firstlineno
    assert [(k, f, ln) for k, _, f, ln, _ in truth] == [(0, "act", line)] * 2
    assert [g for *_, g in truth] == ["tensor 'x' size mismatch at index 1. expected 6, actual 10",
                                      "tensor 'x' size mismatch at index 1. expected 10, actual 3"]
    _agrees(cmap, truth)
    assert [r.reason for r in cmap.recompiles] == ["x: size of dim 1 is 10, the graph was compiled for 6",
                                                   "x: size of dim 1 is 3, the graph was compiled for 10"]
    assert "1 input set, 2 recompiles" in panels(cmap.graph)["recompiles"]["note"]


def test_automatic_dynamic_recompiles_once_then_reuses_the_dynamic_graph(torch_record: Compiles) -> None:
    # dynamic=None: act's first recompile makes the width dynamic, so width 3 reuses that graph; a
    # second input set with a new batch size recompiles it once more, on the batch dimension
    model, args = cm.widths()
    cmap = compile_map(model, args, backend="eager", inputs=[(cm.x(3)[:, :4],)])
    truth = torch_record.recompiles()
    assert [(k, f) for k, _, f, _, _ in truth] == [(0, "act"), (1, "act")]
    _agrees(cmap, truth)
    first, second = cmap.recompiles
    assert (first.input, first.dim, second.input, second.dim) == ("x", 1, "x", 0)


def test_one_function_recompiled_on_three_input_sets(torch_record: Compiles) -> None:
    model, args = cm.batch_sized()
    cmap = compile_map(model, args, backend="eager", dynamic=False, inputs=[(cm.x(b),) for b in (3, 4, 5)])
    truth = torch_record.recompiles()
    assert [(k, cid) for k, cid, *_ in truth] == [(1, "0/1"), (2, "0/2"), (3, "0/3")]
    _agrees(cmap, truth)
    assert [r.reason for r in cmap.recompiles] == [f"x: size of dim 0 is {b}, the graph was compiled for {b - 1}"
                                                   for b in (3, 4, 5)]


def test_two_functions_each_recompiling(torch_record: Compiles) -> None:
    model, args = cm.two_batch_sized()
    cmap = compile_map(model, args, backend="eager", dynamic=False, inputs=[(cm.x(b),) for b in (3, 4)])
    truth = torch_record.recompiles()
    resume = f"torch_dynamo_resume_in_forward_at_{cm.LINES['two-batch-sized']}"
    assert [(k, f) for k, _, f, _, _ in truth] == [(1, "forward"), (1, resume), (2, "forward"), (2, resume)]
    _agrees(cmap, truth)


def test_recompiles_within_one_input_set_count_toward_the_limit(torch_record: Compiles,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # ten widths in one forward: act compiles 8 times (1 + 7 recompiles), the 9th is refused and
    # runs eagerly, as does the 10th (torch records that one nowhere); the old map dropped all
    # seven recompiles as the refused one and said act ran eagerly on "no set"
    model, args = cm.widths(tuple(range(5, 15)))
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    accepted: list[int] = []  # widths some cached version of act accepts, by torch's own guards
    done = LimitWatch.done

    def checked(self: LimitWatch, input_set: int) -> None:
        entries = _debug_get_cache_entry_list(type(model).act.__code__)
        accepted[:] = [w for w in range(5, 15)
                       if any(e.guard_manager.check({"self": model, "x": torch.randn(2, w)}) for e in entries)]
        done(self, input_set)

    monkeypatch.setattr(LimitWatch, "done", checked)
    cmap = compile_map(model, args, backend="eager", dynamic=False, inputs=[(args[0] + 1,)])
    truth = torch_record.recompiles()
    refused = [(k, cid) for k, cid, m in torch_record.records if str(m.get("fail_reason") or "").startswith(LIMIT_BREAK)]
    assert len(truth) == 7 and refused == [(0, "1/8")]
    _agrees(cmap, truth)
    (lim,) = cmap.limits
    assert (lim.input_set, lim.func, lim.compile_id) == (0, "act", "1/8")
    assert len([r for r in cmap.recompiles if r.compile_id.split("/")[0] == "1"]) == lim.limit - 1
    # the guard that failed at each compile that led there, the refused one last
    assert lim.reasons == [r.reason for r in cmap.recompiles] + ["x: size of dim 1 is 13, the graph was compiled for 12"]
    # input set 1 ran act's 8 graphs again and its last two widths eagerly: torch's own guards of
    # act's cached versions accept widths 5-12 and none of 13, 14 (Dynamo's guard-complete hook saw
    # those calls miss, and no frame was handed to its compiler); it was marked on set 0 only
    assert accepted == list(range(5, 13))
    assert lim.eager_sets == [0, 1] and [g.runs for g in cmap.graphs] == [2] * 8
    assert cmap.header().endswith("✗ recompile limit hit (recompile_limit=8): act ran eagerly on input sets 0-1")
    (note,) = cmap.notes
    assert "at input set 0: it compiles that function no more and ran it eagerly on input sets 0-1 (last guard" in note
    assert "; from then on it runs eagerly on every call no compiled version accepts; " in note
    errors = [r["cells"] for r in panels(cmap.graph)["recompiles"]["rows"] if r["level"] == "error"]
    assert [(c[0], c[2]) for c in errors] == [(0, "1/8"), (1, None)]


def test_olmoe_activation_recompiles_as_often_as_torch_says(torch_record: Compiles) -> None:
    # OLMoE's eager experts call the activation once per expert with the tokens routed to it: with
    # static shapes each new token count recompiles it, in one input set; the old map listed one
    pytest.importorskip("transformers")
    model, args = cm.olmoe()
    cmap = compile_map(model, args, backend="eager", dynamic=False)
    truth = torch_record.recompiles()
    act = [row for row in truth if row[4].startswith("tensor 'input' size mismatch at index 0")]
    assert len(act) >= 2 and len({cid.split("/")[0] for _, cid, *_ in act}) == 1
    _agrees(cmap, truth)
    assert sum(r.file.endswith("activations.py") for r in cmap.recompiles) == len(act)
