"""The diff page's data and file (fxviz/render/diffpage.py): what the report's script draws side by
side for every way to look at a diff (``Diff.to_html``, a notebook cell, ``fxviz diff --html``,
``fxviz passes --before-after``). The drawing itself is tested in Chromium (test_diff_browser.py)."""

from __future__ import annotations

import html as html_lib
import json
import re
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from fxviz.cli import cli
from fxviz.graphdiff import Diff, diff
from fxviz.ir import Attempt, Graph
from fxviz.render.diffpage import DIFF_COLORS, diff_view_model
from tests.irbuild import stack_graph

DATA = re.compile(r'<script type="application/json" id="fxviz-data">(.*?)</script>', re.S)


def stack_diff() -> Diff:
    """Two 2-block stacks; block h.1's linear is a matmul in ``new``."""
    a = stack_graph(layers=2)
    b = Graph.from_json(a.to_json())
    b.node("fc_1").target = "aten.matmul.default"
    return diff(a, b, labels=("old", "new"))


def page_data(text: str) -> dict[str, Any]:
    """The data block the report's script reads (the one a graph's report has)."""
    m = DATA.search(text)
    assert m is not None, "the page has no data block for the report's script"
    data: dict[str, Any] = json.loads(m.group(1))
    return data


def test_the_pairs_drawn_are_the_alignments_rows() -> None:
    d = stack_diff()
    data = diff_view_model(d)["diff"]
    na, nb = data["a"]["nodes"]["n"], data["b"]["nodes"]["n"]
    drawn = {(na[i], nb[j]) for i, j in data["pairs"]}
    rows = [(r.a, r.b) for m in d.modules for r in m.rows]
    aligned = {(x, y) for a, b in rows if a and b for x in a for y in b}
    assert drawn <= aligned
    # every node a row pairs is drawn paired, and nothing else is
    assert {x for x, _ in drawn} == {x for a, b in rows if a and b for x in a}
    assert {y for _, y in drawn} == {y for a, b in rows if a and b for y in b}
    assert ("ln_1", "ln_1") in drawn and ("add_1", "add_1") in drawn
    assert not any("fc_1" in pair for pair in drawn)  # linear on one side, matmul on the other


def test_what_differs_is_coloured_on_both_sides_and_matched_is_muted() -> None:
    d = stack_diff()
    data = diff_view_model(d)["diff"]
    for side, status in (("a", "only_in_a"), ("b", "only_in_b")):
        vm = data[side]
        overlay = next(o for o in vm["overlays"] if o["name"] == "diff")
        assert vm["overlay"] == "diff"
        names = vm["nodes"]["n"]
        assert overlay["nodes"][names.index("fc_1")] == status
        assert overlay["nodes"][names.index("ln_1")] == overlay["nodes"][names.index("fc_0")] == "matched"
        boxes = [g["l"] for g in vm["groups"]]
        assert overlay["groups"][boxes.index("h.1 (Block)")] == "differs"
        assert overlay["groups"][boxes.index("h.0 (Block)")] == "matched"
        # the folded run h.0-1 holds a block that differs: it says so while closed
        assert overlay["groups"][boxes.index("h.0-1 ×2")] == "differs"
        assert overlay["categories"][status]["label"] == f"only in {'old' if side == 'a' else 'new'}"
        assert overlay["categories"]["matched"]["label"] == "matched"
        colours = {k: c["color"] for k, c in overlay["categories"].items()}
        assert colours[status] != colours["matched"] and colours["differs"] != colours["matched"]
    # muted: a grey, so that the colours of what differs stand out
    r, g, b = (int(DIFF_COLORS["matched"][k:k + 2], 16) for k in (1, 3, 5))
    assert max(r, g, b) - min(r, g, b) < 40


def test_each_difference_names_its_nodes_and_its_module_box_on_both_sides() -> None:
    d = stack_diff()
    data = diff_view_model(d)["diff"]
    na, nb = data["a"]["nodes"]["n"], data["b"]["nodes"]["n"]
    ga, gb = [g["path"] for g in data["a"]["groups"]], [g["path"] for g in data["b"]["groups"]]
    by_kind = {x["kind"]: x for x in data["differences"]}
    assert set(by_kind) == {x.kind for x in d.differences}
    for x in d.differences:
        page = next(p for p in data["differences"] if p["id"] == x.id)
        assert [na[i] for i in page["a"]] == list(x.a.nodes if x.a else ())
        assert [nb[i] for i in page["b"]] == list(x.b.nodes if x.b else ())
    only_a = by_kind["only_in_a"]
    assert only_a["words"] == "only in old" and only_a["b"] == []
    # an op only in old is shown on new's side at the box of its module call there
    assert only_a["at"] == [ga.index("h.1.fc"), gb.index("h.1.fc")]
    assert [ga.index("h.1.fc"), gb.index("h.1.fc")] in data["groupPairs"]


def test_each_capture_is_named_and_a_failure_repeated_by_a_retry_once() -> None:
    why = ("GuardOnDataDependentSymNode", "Could not guard on data-dependent expression u0 > 0")
    failed = Graph(name="Net", attempts=[Attempt("export (symbolic sizes)", False, 0.1, *why),
                                         Attempt("export", False, 0.1, *why)])
    d = diff(failed, stack_graph(layers=1), labels=("export", "eager"))
    d.seconds = {"a": 0.2, "b": 0.05}
    data = diff_view_model(d)["diff"]
    assert data["captures"][0]["failed"] == [
        "export (symbolic sizes), export: GuardOnDataDependentSymNode: Could not guard on data-dependent expression u0 > 0"]
    assert data["captures"][1] == {"method": "export", "ops": len(d.b.ops), "seconds": 0.05, "failed": []}
    assert data["failure"]["side"] == "a" and data["failure"]["method"] == "export"
    # the other side is drawn whole, every op only in it
    overlay = next(o for o in data["b"]["overlays"] if o["name"] == "diff")
    names = data["b"]["nodes"]["n"]
    assert {overlay["nodes"][names.index(n.name)] for n in d.b.ops} == {"only_in_b"}


def test_the_page_is_the_reports_page_drawing_the_diff(bundle: Any, tmp_path: Path) -> None:
    from fxviz.render.html import BUNDLE_DIR

    d = stack_diff()
    text = d.to_html(str(tmp_path / "d.html"))
    assert (tmp_path / "d.html").read_text(encoding="utf-8") == text
    data = page_data(text)
    assert data == json.loads(json.dumps(diff_view_model(d)))
    assert (BUNDLE_DIR / "report.js").read_text(encoding="utf-8") in text  # the report's own script
    assert "<title>Stack: old vs new — fxviz</title>" in text
    # a notebook shows the same page, isolated in an iframe
    frame = d._repr_html_()
    m = re.search(r"<iframe [^>]*srcdoc='([^']*)'", frame)
    assert m is not None and html_lib.unescape(m.group(1)) == text


def test_the_commands_write_the_side_by_side_page(bundle: Any, tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    d = stack_diff()
    a.write_text(d.a.to_json(), encoding="utf-8")
    b.write_text(d.b.to_json(), encoding="utf-8")
    out = tmp_path / "diff.html"
    r = CliRunner().invoke(cli, ["diff", str(a), str(b), "--html", str(out)])
    assert r.exit_code == 0, r.output
    data = page_data(out.read_text(encoding="utf-8"))["diff"]
    assert data["labels"] == [str(a), str(b)] and data["pairs"] and data["differences"]
    side = tmp_path / "side.html"
    r = CliRunner().invoke(cli, ["passes", "fxviz.examples:cnn", "--before-after", str(side), "--no-numbers"])
    assert r.exit_code == 0, r.output
    data = page_data(side.read_text(encoding="utf-8"))["diff"]
    assert data["labels"] == ["stage 0 (export)", "stage 1 (decompose)"]
    names = {(data["a"]["nodes"]["n"][i], data["b"]["nodes"]["n"][j]) for i, j in data["pairs"]}
    assert ("linear", "addmm") in names or any(x == "linear" for x, _ in names)


# ---- the answer and the differences, as every analysis page has them ---------------------------

STATIC_ANSWER = re.compile(r'<div class="fx-analysis[^"]*" data-ref="analysis" role="status">\s*'
                           r'<strong class="fx-analysis-text" data-ref="headline">(.*?)</strong>', re.S)
STATIC_ROWS = re.compile(r'<section class="fx-panel" data-panel="([^"]+)">.*?<tbody>(.*?)</tbody>', re.S)
CELLS = re.compile(r"<td>(.*?)</td>", re.S)


def static_tables(text: str) -> dict[str, list[list[str]]]:
    """The tables the page writes as plain HTML (what a reader sees with the script off)."""
    body = text[: text.index("<script>")]
    return {name: [[html_lib.unescape(c) for c in CELLS.findall(tr)] for tr in rows.split("</tr>") if "<td>" in tr]
            for name, rows in STATIC_ROWS.findall(body)}


def test_the_diffs_answer_is_the_terminals_sentence_and_its_differences_the_drawers_table() -> None:
    from fxviz.render.diff import report_text

    d = stack_diff()
    data = diff_view_model(d)["diff"]
    # the answer: the very sentence the terminal report opens with, after the model's name
    assert data["analysis"] == {"text": "✗ 2 differences", "lv": "warn", "p": "differences"}
    assert f"Stack  {d.headline()}" in report_text(d).splitlines()
    (panel,) = data["panels"]
    assert panel["name"] == "differences" and panel["columns"] == ["difference", "what", "old", "new", "module", "line"]
    na, nb = data["a"]["nodes"]["n"], data["b"]["nodes"]["n"]
    assert len(panel["rows"]) == len(d.differences) == 2
    for k, (x, row) in enumerate(zip(d.differences, panel["rows"], strict=True)):
        # a row stands for its difference (shown on both sides) and is about each node it names
        assert row["key"] == f"d{k}" and row["c"][:2] == [d.describe(x.kind), x.message]
        named = {f"a:n{na.index(n)}" for n in (x.a.nodes if x.a else ())} | {f"b:n{nb.index(n)}" for n in (x.b.nodes if x.b else ())}
        assert named and named <= set(row["at"])
        assert row["c"][4] == x.module == "h.1.fc"
    only_a, only_b = panel["rows"]
    assert (only_a["c"][2], only_a["c"][3], only_b["c"][2], only_b["c"][3]) == ("linear", "", "", "matmul")
    # on the side without the op, the row is about the box of the call it would be in
    box_b = data["differences"][0]["at"][1]
    assert box_b is not None and f"b:g{box_b}" in only_a["at"]
    # the cell of a side's nodes shows the difference on that side; an empty cell goes nowhere
    assert only_a["ck"] == [None, None, "d0:a", None, None, None] and only_b["ck"] == [None, None, None, "d1:b", None, None]
    # a row carries its difference's long explanation (a failed capture's exception), bounded,
    # for the details of the nodes it names
    assert "detail" not in only_a
    d.differences[0].detail = "Traceback ...\n" + "x" * 5000
    (row0, _) = diff_view_model(d)["diff"]["panels"][0]["rows"]
    assert row0["detail"].startswith("Traceback ...\n") and len(row0["detail"]) <= 4000


def test_the_diff_page_says_its_answer_and_lists_its_differences_without_its_script(bundle: Any) -> None:
    d = stack_diff()
    d.differences[0].message = "only in old: <img src=x onerror=alert(1)> linear"
    text = d.to_html()
    m = STATIC_ANSWER.search(text)
    assert m is not None and html_lib.unescape(m.group(1)) == d.headline()
    rows = static_tables(text)["differences"]
    assert [r[:2] for r in rows] == [[d.describe(x.kind), x.message] for x in d.differences]
    assert "<img src=x" not in text[: text.index("<script>")]  # written as text, escaped


def test_an_analysis_page_says_its_answer_without_its_script_and_a_plain_one_nothing(bundle: Any) -> None:
    from fxviz.passes.panels import row, set_headline, set_panel
    from fxviz.render.html import to_html

    g = stack_diff().a
    plain = to_html(g)
    assert STATIC_ANSWER.search(plain) is None and static_tables(plain) == {}
    assert 'data-ref="analysis" role="status" hidden' in plain and 'data-ref="drawer" aria-label="The analysis\'s tables" hidden' in plain
    set_panel(g, "breaks", title="graph breaks", columns=["line", "reason", "count"],
              rows=[row("m.py:3", "Tensor.item() & <b>", 2, node="fc"), row("m.py:9", "print", 1)])
    set_headline(g, "1 graph, 2 breaks, 80% of ops compiled", level="warn", panel="breaks")
    text = to_html(g)
    m = STATIC_ANSWER.search(text)
    assert m is not None and m.group(1) == "1 graph, 2 breaks, 80% of ops compiled"
    assert static_tables(text) == {"breaks": [["m.py:3", "Tensor.item() & <b>", "2"], ["m.py:9", "print", "1"]]}
