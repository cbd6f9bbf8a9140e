"""The same facts in the terminal, the JSON and the report: what each analysis prints under its
answer (``note: ...``, the gradients' answer) is kept whole in its JSON and shown under the answer
in its report, and a saved analysis JSON renders the report the live run wrote."""

from __future__ import annotations

import dataclasses
import html
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import compile_models as cm
import torch
from click.testing import CliRunner
from torch import nn

from fxviz.analyze.compilemap.overlay import write
from fxviz.analyze.inside.result import Inside
from fxviz.cli import cli
from fxviz.ir import Graph
from fxviz.passes.panels import headline
from fxviz.render.html import to_html, view_model
from tests.viewmodel import page_data

TARGET = str(Path(cm.__file__).parent / "compile_models.py")


def invoke(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(cli, list(args), env={"COLUMNS": "2000"})
    return r.exit_code, r.stdout


def said(out: str, prefix: str) -> list[str]:
    """The lines the terminal printed starting with ``prefix``, the prefix cut."""
    return [ln[len(prefix):] for ln in out.splitlines() if ln.startswith(prefix)]


def under_answer(page: str) -> tuple[list[str], list[str]]:
    """What a report shows under its answer: the script's data (``analysis.nt``) and the page's own
    HTML (what a page whose script is off shows)."""
    data = page_data(page)
    static = re.search(r'<ul class="fx-analysis-notes">(.*?)</ul>', page, re.S)
    items = [html.unescape(t) for t in re.findall(r"<li>(.*?)</li>", static.group(1), re.S)] if static else []
    return data["analysis"].get("nt", []), items


def torch_eager_sets(model: nn.Module, sets: list[tuple[torch.Tensor]]) -> list[int]:
    """The oracle: the input sets in which torch.compile (dynamic=False) ran none of its graphs,
    counted by a backend that counts its graphs' calls."""
    import torch._dynamo as dynamo

    calls = [0]

    def counting(gm: torch.fx.GraphModule, _: list[torch.Tensor]) -> Callable[..., Any]:
        def f(*a: Any) -> Any:
            calls[0] += 1
            return gm.forward(*a)
        return f

    dynamo.reset()
    compiled, eager = torch.compile(model, backend=counting, dynamic=False), []
    try:
        with torch.no_grad():
            for k, (t,) in enumerate(sets):
                before = calls[0]
                compiled(t)
                if calls[0] == before:
                    eager.append(k)
    finally:
        dynamo.reset()
    return eager


def test_the_recompile_limit_note_is_whole_in_the_terminal_the_json_and_the_report(tmp_path: Path) -> None:
    import torch._dynamo as dynamo

    model, (x,) = cm.batch_sized()
    eager = torch_eager_sets(model, [(x,), *cm.eleven_batches()])
    limit = dynamo.config.recompile_limit
    assert eager == [limit, limit + 1, limit + 2]  # torch's record: the sets past the limit ran eagerly
    js, page = tmp_path / "map.json", tmp_path / "map.html"
    code, out = invoke("compile", f"{TARGET}:batch_sized", "-b", "eager", "--no-dynamic", "--inputs",
                       f"{TARGET}:eleven_batches", "--json", str(js), "--html", str(page))
    assert code == 0
    (note,) = said(out, "note: ")
    assert f"torch._dynamo.config.recompile_limit ({limit})" in note and f"input sets {eager[0]}-{eager[-1]}" in note
    assert note.endswith("raise torch._dynamo.config.recompile_limit or remove the recompiles' cause "
                         "(dynamic=True, torch._dynamo.mark_dynamic)")  # the config to change, not cut
    d = json.loads(js.read_text())
    assert d["notes"] == [note] and d["eager_input_sets"] == eager
    text = page.read_text()
    assert under_answer(text) == ([note], [note])
    analysis = page_data(text)["analysis"]
    # the header mark is the report's answer, and its button opens the table of the sets that ran eagerly
    assert analysis["text"] == d["headline"] and analysis["lv"] == "error" and analysis["p"] == "recompiles"
    # the saved map is a target: the tree prints the answer and the note first, the report is the live one
    code, again = invoke("tree", str(js))
    assert code == 0 and again.splitlines()[0] == d["headline"] and said(again, "note: ") == [note]
    code, _ = invoke("html", str(js), "-o", str(tmp_path / "again.html"))  # coloured as the live one
    assert code == 0 and page_data((tmp_path / "again.html").read_text()) == page_data(text)
    probe = ("import sys; from click.testing import CliRunner; from fxviz.cli import cli; "
             f"r = CliRunner().invoke(cli, ['tree', {str(js)!r}]); print(r.exit_code, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.stdout.split() == ["0", "False"]  # read back without torch, as the README promises


def test_inside_notes_are_under_the_compile_answer() -> None:
    """What ``--inside`` prints under its summary (torch recorded no kernel mapping, unreliable
    times, post-grad ops without a kernel) is in the report's notes too, after the map's own."""
    model, (x,) = cm.clean()
    from fxviz.analyze.compilemap import compile_map

    cmap = compile_map(model, (x,), backend="eager")
    cmap.notes.append("a note of the map")
    cmap.inside = Inside([], ["compile 0/0 backward: torch recorded no kernel -> node mapping"])
    write(cmap)
    assert cmap.graph.annotations["headline"]["notes"] == ["a note of the map", cmap.inside.notes[0]]
    assert under_answer(to_html(cmap.graph)) == (["a note of the map", cmap.inside.notes[0]],) * 2


def test_numerics_gradients_and_notes_are_in_every_output(tmp_path: Path) -> None:
    js, page = tmp_path / "n.json", tmp_path / "n.html"
    code, out = invoke("numerics", "fxviz.examples:cnn", "--against", "dtype:bfloat16", "--backward",
                       "--json", str(js), "--html", str(page))
    assert code == 0
    lines = out.splitlines()
    grads = next(ln for ln in lines if ln.startswith("gradients: "))
    d = json.loads(js.read_text())
    from fxviz.examples import cnn

    model, _ = cnn()
    assert d["grads"]["order"] and set(d["grads"]["params"]) == {n for n, _ in model.named_parameters()}
    first = d["grads"]["first"]
    assert first and f"first module whose gradient diverges (backward order): {first} " in grads
    nt, static = under_answer(page.read_text())
    assert nt == static == [grads, *said(out, "note: ")] == [grads, *d["notes"]]
    # a gradient beyond tolerance is not an all-clear
    assert page_data(page.read_text())["analysis"]["lv"] == "warn"
    # the saved result renders the live report, coloured by the error as it was
    code, _ = invoke("html", str(js), "-o", str(tmp_path / "again.html"))
    again = page_data((tmp_path / "again.html").read_text())
    assert code == 0 and again == page_data(page.read_text()) and again["overlay"] == "error"


def test_passes_summary_is_under_the_pipeline_answer() -> None:
    """On meta inputs the pipeline says it compared no numbers: the terminal prints it under the
    table, the report under the answer (it was in neither the panel nor the headline)."""
    from fxviz.analyze.pipeline import pipeline
    from fxviz.analyze.pipeline.views import annotate, summary_lines

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        x = torch.rand(2, 4)
    p = pipeline(model, (x,))
    assert x.device.type == "meta"
    lines = summary_lines(p, False)
    assert "note: inputs or weights are on the meta device: no numbers to compare" in lines
    g = annotate(p, len(p.stages) - 1)
    shown = [ln.removeprefix("note: ") for ln in lines]
    assert g.annotations["headline"]["notes"] == shown and headline(g) == p.headline()
    assert under_answer(to_html(g)) == (shown, shown)


def test_a_capture_note_reaches_the_report_and_a_bad_analysis_json_still_fails(tmp_path: Path) -> None:
    """The capture's notes (the tree's ``ℹ`` lines) are banners of the report: in its data, which
    the script draws (web/src/panels.js), and in the page's own HTML (they were in neither's view:
    the script never read them); a JSON that is neither a graph nor an analysis's is still refused
    with one line."""
    import fxviz

    g = fxviz.capture(nn.Sequential(nn.LazyLinear(3)), (torch.rand(2, 5),))
    assert g.notes and any("lazy" in n.lower() for n in g.notes)
    assert "ℹ lazy modules 0 (LazyLinear) were initialised" in str(g)  # the tree's
    page = to_html(g)
    banners = re.findall(r'<div class="fx-banner fx-banner-info">ℹ (.*?)</div>', page, re.S)
    assert page_data(page)["notes"] == [html.unescape(b) for b in banners] == g.notes
    bundle = (Path(fxviz.__file__).parent / "render" / "static" / "report.js").read_text()
    assert "fx-banner-info" in bundle and "fx-analysis-notes" in bundle  # the script draws both (web/src)
    assert Graph.from_json(g.to_json()).notes == g.notes
    # the saved graph's report is the live one's: no second rounding of an attempt's seconds
    g.attempts = [dataclasses.replace(g.attempts[0], seconds=0.00149)]
    assert view_model(Graph.from_json(g.to_json()))["attempts"] == view_model(g)["attempts"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"graph": 3}))
    code, _ = invoke("tree", str(bad))
    assert code == 2
    bad.write_text(json.dumps({"headline": "x", "stages": [{}, {}], "notes": []}))
    r = CliRunner().invoke(cli, ["tree", str(bad)])
    assert r.exit_code == 2 and "fxviz passes' JSON, a pipeline of 2 stages, not one graph" in r.stderr
    assert "--stage N --html" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_inside_from_a_trace_every_kernel_and_note_in_every_output() -> None:
    """``--from-trace``: the summary and notes the terminal prints first are the report's answer; the
    kernel table's "(inferred)" part is in the report's cells; the report lists every kernel, as the
    terminal's "N more (--json and --html list every one)" says (it cut at 200), the tree a page."""
    from rich.console import Console

    from fxviz.analyze.inside import overlay
    from fxviz.analyze.inside.saved import from_trace
    from fxviz.cli.inside import print_inside
    from fxviz.render.tree import tree_text
    from tests.test_inside_build import TRACE

    inside, _ = from_trace(str(TRACE))
    inferred = [k for k in inside.kernels if k.inferred]
    assert inferred and all(k.part == "backward" for k in inferred)  # torch recorded no backward mapping
    g0 = inside.graphs[0]
    g0.kernels += [dataclasses.replace(g0.kernels[0], id=f"copy:{i}", name=f"copy_{i}") for i in range(200)]
    console = Console(record=True, width=400)
    print_inside(console, inside, stage=None, graph=None)
    text = console.export_text()
    page = Graph(name="p")
    overlay.write(page, inside)
    spec = page.annotations["headline"]
    assert f"inside torch.compile: {spec['text'].removeprefix('inside torch.compile: ')}" in text
    assert spec["notes"] == inside.notes and all(f"note: {n}" in text for n in inside.notes)
    assert under_answer(to_html(page)) == (inside.notes, inside.notes)
    rows = page.annotations["panels"]["kernels"]["rows"]
    assert len(rows) == len(inside.kernels) == 212 and "more (--json and --html list every one)" in text
    assert sorted(r["cells"][0] for r in rows if r["cells"][3] == "backward (inferred)") == sorted(k.name for k in inferred)
    assert " backward (inferred) " in text
    assert "... 187 more rows (the report and the JSON" in tree_text(page, width=400)  # a caption, wrapped


def test_partition_rows_name_their_graph_and_partitioner() -> None:
    """A training step broken in two has a partition per compiled graph: the terminal prints a table
    per graph titled with its partitioner; the report's rows say which graph each value is of, its
    note which partitioner (torch's events) split each."""
    from rich.console import Console

    from fxviz.analyze.inside import overlay
    from fxviz.analyze.inside.saved import from_trace
    from fxviz.cli.inside import partition_table
    from tests.test_inside_build import TRACE

    inside, _ = from_trace(str(TRACE))
    parted = [g for g in inside.graphs if g.partition is not None]
    assert parted and all(g.partition.partitioner for g in parted)  # type: ignore[union-attr]
    console = Console(record=True, width=300)
    for g in parted:
        console.print(partition_table(g))
    text = console.export_text()
    page = Graph(name="p")
    overlay.write(page, inside)
    spec = page.annotations["panels"]["partition"]
    for g in parted:
        p = g.partition
        assert p is not None and f"{g.id} ({g.compile_id}) partition ({p.partitioner} partitioner)" in text
        assert f"{g.id}: {p.partitioner} partitioner" in spec["note"]
        mine = [r["cells"][2] for r in spec["rows"] if r["cells"][0] == g.id]
        assert mine == [s.node for s in p.saved] + [c.node for c in p.recomputed]


def test_a_training_steps_answer_is_printed_saved_and_reported(tmp_path: Path) -> None:
    """``--backward``: the report opens with the saved activations' total and peak; the tree now
    prints the same sentence first, live and from the saved graph. The total is what torch's
    saved_tensors_hooks packs (parameters and the input cost nothing: they are alive anyway)."""
    from fxviz.passes.training import saved_summary

    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    x = torch.rand(2, 8)
    kept: dict[int, int] = {}
    free = {p.untyped_storage().data_ptr() for p in model.parameters()} | {x.untyped_storage().data_ptr()}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in free:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum()
    factory = tmp_path / "m.py"
    factory.write_text("import torch\nfrom torch import nn\n\ndef build():\n    torch.manual_seed(0)\n"
                       "    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)), (torch.rand(2, 8),)\n")
    for method in ("eager", "export"):
        code, out = invoke("tree", f"{factory}:build", "--backward", "--method", method)
        js = tmp_path / f"{method}.json"
        assert code == 0 and invoke("json", f"{factory}:build", "--backward", "--method", method, "-o", str(js))[0] == 0
        saved = Graph.from_json(js.read_text())
        answer = saved_summary(saved)
        assert answer.startswith(f"{sum(kept.values())} B of saved activations ({sum(kept.values())} bytes")
        assert out.splitlines()[0] == answer == page_data(to_html(saved))["analysis"]["text"]
        code, again = invoke("tree", str(js))
        assert code == 0 and again == out


def test_a_long_numerics_note_is_the_same_whole_note_in_every_output(tmp_path: Path, monkeypatch: Any) -> None:
    """The terminal printed each numerics note cut at 400 characters while the report kept 1,000:
    a 1,500-character note (what a long list of ops not comparable makes) is whole in all three."""
    import fxviz.analyze.numerics as numerics_pkg
    from fxviz.analyze.numerics.result import annotate

    real = numerics_pkg.numerics
    note = "ops not comparable: " + ", ".join(f"aten.op_{k}.default" for k in range(80))
    assert 1400 < len(note) < 2000

    def with_long_note(*a: Any, **k: Any) -> Any:
        result = real(*a, **k)
        result.notes.append(note)
        annotate(result)  # as numerics() ends: its graph's answer and notes
        return result

    monkeypatch.setattr(numerics_pkg, "numerics", with_long_note)
    js, page = tmp_path / "n.json", tmp_path / "n.html"
    code, out = invoke("numerics", "fxviz.examples:cnn", "--against", "dtype:bfloat16", "--json", str(js),
                       "--html", str(page))
    assert code == 0
    assert note in said(out, "note: ")
    assert note in json.loads(js.read_text())["notes"]
    nt, static = under_answer(page.read_text())
    assert note in nt and note in static
