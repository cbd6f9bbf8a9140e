"""The ``stages`` panel's note (every record torch made of its passes, one per stage note) is whole
in the terminal, the JSON, the report's view-model, the page's own HTML and what Chromium shows:
the report cut it at 400 characters. tests/data/traces/comms.log is a real TORCH_TRACE of
Inductor's communication passes (tests/data/traces/gen_comms.py); torch's own records in it are
read with plain regular expressions (tests/test_inside_comms_trace.py) and must be in the note whole."""

from __future__ import annotations

import html
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from fxviz.analyze.inside.overlay import panels
from fxviz.analyze.inside.saved import from_trace
from fxviz.ir import Graph
from fxviz.render.html import to_html
from fxviz.render.panels import panel_tables
from tests.irbuild import GraphBuilder
from tests.test_inside_comms_trace import TRACE, recorded
from tests.viewmodel import page_data


def _report() -> tuple[Graph, Any, list[str]]:
    """A small graph with the trace's panels on it, the trace's Inside, and torch's records the
    stages panel must carry: the collective schedule, the scheduler's reordering summary and the
    bucket's members."""
    b = GraphBuilder("m")
    x = b.input("x", (4, 16))
    b.output("out", b.op("mm", "aten.mm.default", [x], (4, 16)))
    g = b.build()
    inside, _ = from_trace(TRACE)
    panels(g, inside)
    rec = recorded()
    schedule = rec["inductor_collective_schedule"][0]
    schedule = json.loads(schedule) if isinstance(schedule, str) else schedule
    head = rec["reorder_communication_preserving_peak_memory"][0].splitlines()[0]
    members = re.findall(r"\w+", rec["fx_bucketing_passes_all_gather_buckets"][0])
    return g, inside, [", ".join(schedule), head, *members]


def test_the_stages_note_is_whole_in_every_output() -> None:
    g, inside, torch_said = _report()
    stage_notes = [f"{x.id} stage {s.index} ({s.name}): {n}" for x in inside.graphs for s in x.pipeline.stages
                   for n in s.notes]
    note = g.annotations["panels"]["stages"]["note"]
    assert len(note) > 400 and all(n in note for n in stage_notes) and all(t in note for t in torch_said)
    # the JSON keeps it; the report's view-model and the page's own HTML show it whole
    assert Graph.from_json(g.to_json()).annotations["panels"]["stages"]["note"] == note
    page = to_html(g)
    (shown,) = [p["note"] for p in page_data(page)["panels"] if p["name"] == "stages"]
    assert shown == note
    static = [html.unescape(t) for t in re.findall(r'<p class="fx-muted fx-panel-note">(.*?)</p>', page, re.S)]
    assert note in static
    # the terminal: the tree's panel caption, and fxviz compile --inside's lines, one per stage note
    from rich.console import Console

    (table,) = [t for t in panel_tables(g) if str(getattr(t, "title", "")) == "Inductor stages"]
    assert str(table.caption) == note
    from fxviz.cli.inside import print_inside

    out = io.StringIO()
    print_inside(Console(file=out, width=100_000, color_system=None), inside, stage=None, graph=None)
    printed = out.getvalue()
    assert all(f"  stage {n.split(' stage ', 1)[1]}" in printed for n in stage_notes)


@pytest.mark.browser
@pytest.mark.usefixtures("bundle")
def test_chromium_shows_the_stages_note_whole(browser: Any, tmp_path: Path) -> None:
    from tests.report_browser import ReportPage, page_from_data

    g, _, torch_said = _report()
    note = g.annotations["panels"]["stages"]["note"]
    r = ReportPage(browser, page_from_data(g, tmp_path / "stages.html"), width=1600, height=1000)
    try:
        r.page.locator("[data-ref=drawerBar] .fx-drawer-tab[data-panel=stages]").click()
        p = r.page.locator("[data-ref=findings] [data-panel=stages] .fx-panel-note")
        assert p.text_content() == note and all(t in p.inner_text() for t in torch_said)
        # wrapped, not clipped: the paragraph is as wide as the drawer at most and nothing of it is hidden
        box = p.evaluate("e => [e.scrollWidth, e.clientWidth, e.scrollHeight, e.clientHeight]")
        assert box[0] <= box[1] and box[2] <= box[3], box
        assert r.errors == []
    finally:
        r.close()
