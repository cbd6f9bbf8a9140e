"""``fxviz compile --backward --compiled-autograd`` (issue 21 point 4): the backward as compiled
autograd captures and Dynamo compiles (and breaks) it, checked against torch's own record of the
same run: ``counters["compiled_autograd"]`` and ``counters["graph_break"]`` (read before the map
puts Dynamo's counters back) and the structured trace's ``compiled_autograd_graph`` and compiled
autograd compiles (``!0/1/0``, ...). Backends eager and aot_eager: no Inductor."""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

import fxviz  # noqa: E402
from fxviz.analyze.compilemap import run as run_mod  # noqa: E402
from fxviz.analyze.compilemap.autograd import backward_lines  # noqa: E402
from fxviz.analyze.compilemap.backward import Autograd  # noqa: E402
from fxviz.analyze.compilemap.result import CompileMap  # noqa: E402
from fxviz.cli import cli  # noqa: E402
from fxviz.errors import TargetError  # noqa: E402
from fxviz.tracefile import read_events  # noqa: E402
from tests import compile_autograd_models as models  # noqa: E402


class Torch:
    """What torch recorded of one compile-map run: Dynamo's counters at its end and the trace."""

    counters: dict[str, Counter[Any]]
    events: list[Any]

    def ca_compiles(self) -> list[Any]:
        return [c for c in read_events(self.events).compiles if c.compiled_autograd_id is not None]

    def count(self, artifact: str) -> int:
        """How many of this artifact the compiled autograd compiles hold."""
        return sum(len(c.all(artifact)) for c in self.ca_compiles())


def _run(monkeypatch: pytest.MonkeyPatch, build: Any, backend: str) -> tuple[CompileMap, Torch, torch.nn.Module]:
    seen = Torch()
    state = run_mod.dynamo_state

    @contextlib.contextmanager
    def spied() -> Iterator[None]:
        from torch._dynamo.utils import counters

        with state():
            try:
                yield
            finally:  # before the map puts the counters back
                seen.counters = {k: Counter(v) for k, v in counters.items()}

    build_of = Autograd.build

    def keep(self: Autograd, *a: Any) -> Any:
        seen.events = self.events
        return build_of(self, *a)

    monkeypatch.setattr(run_mod, "dynamo_state", spied)
    monkeypatch.setattr(Autograd, "build", keep)
    model, args = build()
    cm = fxviz.compile_map(model, args, backend=backend, grad=True, compiled_autograd=True)
    return cm, seen, model


def _calls(cm: CompileMap) -> list[tuple[str, list[str]]]:
    assert cm.backward is not None
    return [(c.name, c.modules) for g in cm.backward.autograd for c in g.calls if not c.name.startswith("torch::")]


def test_hook_breaks_the_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor hook printing a gradient's value: the forward compiles whole, the backward is one
    compiled autograd graph that Dynamo breaks at the hook's line, as often as torch counts."""
    cm, seen, model = _run(monkeypatch, models.hooked, "eager")
    back = cm.backward
    assert back is not None
    assert cm.break_count == 0 and len(cm.graphs) == 1
    assert len(back.autograd) == seen.counters["compiled_autograd"]["captures"] == 1
    assert len(back.autograd) == seen.count("compiled_autograd_graph")
    assert back.break_count == sum(seen.counters.get("graph_break", Counter()).values()) == seen.count("dynamo_graph_break_reason") > 0
    assert len(back.graphs) == seen.count("dynamo_output_graph") > 1
    assert len(back.breaks) == 1
    b = back.breaks[0]
    assert b.where is not None and b.where.file.endswith("compile_autograd_models.py")
    assert b.where.line == models.HOOK_LINE and b.category == "item"
    # each autograd node with the module whose forward it differentiates, in the engine's order
    assert _calls(cm) == [("SumBackward0", [""]), ("AddmmBackward0", ["fc2"]), ("TBackward0", ["fc2"]),
                          ("ReluBackward0", [""]), ("AddmmBackward0", ["fc1"]), ("TBackward0", ["fc1"])]
    names = [re.search(r"code: (\S+) \(NodeCall", line).group(1)  # type: ignore[union-attr]
             for c in seen.ca_compiles() for a in c.all("compiled_autograd_graph")
             for line in str(a.payload).splitlines() if "(NodeCall" in line]
    assert [c.name for g in back.autograd for c in g.calls] == names
    assert "backward (compiled autograd): 1 graph captured" in cm.headline() and "1 cause" in cm.headline()
    assert all(p.grad is None for p in model.parameters())  # the step wrote no .grad
    panels = cm.graph.annotations["panels"]
    assert panels["backward breaks"]["rows"][0]["cells"][3] == back.break_count
    assert len(panels["compiled autograd"]["rows"]) == len(back.autograd[0].calls)


@pytest.mark.parametrize(("build", "backend"), [(models.hooked, "eager"), (models.square, "aot_eager")])
def test_backward_graphs_named_as_torch_metrics_name_them(monkeypatch: pytest.MonkeyPatch, build: Any,
                                                          backend: str) -> None:
    """Each Dynamo graph of the backward (compile ids ``!0/1/0``: compiled autograd's) names its
    function as torch's compilation metrics do: the compiled autograd graph's generated
    ``forward``, the hook, the resume function after the break, each at its first line."""
    from torch._dynamo.utils import get_compilation_metrics

    cm, seen, _ = _run(monkeypatch, build, backend)
    assert cm.backward is not None
    metrics = {str(m.compile_id): (m.co_name, m.co_filename, m.co_firstlineno) for m in get_compilation_metrics()}
    # the trace spells a restarted compile's second attempt ``!0/1/0_1``; the metrics keep one entry per compile
    made = [re.sub(r"_\d+$", "", c.compile_id) for c in seen.ca_compiles() if c.all("dynamo_output_graph")]
    assert [(g.func, g.file, g.line) for g in cm.backward.graphs] == [metrics[c] for c in made]
    assert any(f.startswith("torch_dynamo_resume_in_") for f, _, _ in (metrics[c] for c in made))


_AT = re.compile(r"Graph break in user code at (.+):(\d+)")


@pytest.mark.parametrize("build", [models.hooked, models.printed])
def test_backward_breaks_placed_where_torch_names_them(monkeypatch: pytest.MonkeyPatch, build: Any) -> None:
    """Each backward break's place is the frame torch's own break record names ("Graph break in user
    code at FILE:LINE", the structured trace's ``dynamo_graph_break_reason``), as often as torch logged
    it there. A hook that is library code (``print``) was placed at the line of compiled autograd's
    generated graph that calls it (``<eval_with_key>.3:93``, torch's code, not the user's) for the
    first break and at torch's frame for the next, one break split in two."""
    cm, seen, _ = _run(monkeypatch, build, "eager")
    assert cm.backward is not None
    named = Counter((m.group(1), int(m.group(2))) for c in seen.ca_compiles()
                    for a in c.all("dynamo_graph_break_reason") if (m := _AT.match(str(a.payload))))
    shown: Counter[tuple[str, int]] = Counter()
    for b in cm.backward.breaks:
        assert b.where is not None and not b.where.file.startswith("<eval_with_key>")
        if b.category != "skip":  # a skipped frame is placed at the function torch ran eagerly
            shown[(b.where.file, b.where.line)] += b.count
    assert shown and all(named[k] >= n for k, n in shown.items()), (shown, named)
    if build is models.printed:
        assert shown == named and len(cm.backward.breaks) == 1


def test_no_hook_no_backward_break(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same MLP without the hook: one captured graph, compiled whole, no break anywhere."""
    cm, seen, _ = _run(monkeypatch, models.mlp, "eager")
    back = cm.backward
    assert back is not None
    assert len(back.autograd) == seen.counters["compiled_autograd"]["captures"] == 1
    assert back.break_count == sum(seen.counters.get("graph_break", Counter()).values()) == 0 == len(back.breaks)
    assert len(back.graphs) == seen.count("dynamo_output_graph") == 1
    lines = backward_lines(back)
    assert not any("✗" in line for line in lines) and any(re.search(r"AddmmBackward0\s+fc1", x) for x in lines)
    assert "backward breaks" not in cm.graph.annotations["panels"]


def test_custom_function_backward_on_aot_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """A custom autograd.Function whose backward prints, on aot_eager: each compiled region's
    backward is one ``CompiledFunctionBackward`` node with the modules of the ops it stands for, the
    Function's own backward node its module, and the backward's breaks are torch's."""
    cm, seen, _ = _run(monkeypatch, models.square, "aot_eager")
    back = cm.backward
    assert back is not None
    assert len(back.autograd) == seen.counters["compiled_autograd"]["captures"] == 1
    assert back.break_count == seen.count("dynamo_graph_break_reason") > 0
    assert {b.category for b in back.breaks} == {"print"}
    calls = _calls(cm)
    aot = [m for n, m in calls if n.startswith("CompiledFunctionBackward")]
    assert aot == [["fc2"], ["", "fc1"]]  # fc2's region, then relu (the model's own) and fc1's
    assert ("SquareBackward", [""]) in calls
    # the forward's map keeps its own graphs: the backward's are b0, b1, ... beside them
    assert [g.id for g in cm.graphs] == [f"g{i}" for i in range(len(cm.graphs))]
    assert [g.id for g in back.graphs] == [f"b{i}" for i in range(len(back.graphs))]
    assert set(cm.assigned.values()) <= {g.id for g in cm.graphs} | {"eager"}


def test_json_and_cli(tmp_path: Any) -> None:
    """``--backward --compiled-autograd``: the terminal's account, ``compiled_autograd`` in the JSON
    (read back without torch), ``--fail-on-break`` on a break in the backward only."""
    out = tmp_path / "map.json"
    res = CliRunner().invoke(cli, ["compile", "tests/compile_autograd_models.py:hooked", "--backward",
                                   "--compiled-autograd", "--backend", "eager", "--json", str(out), "--fail-on-break"])
    assert res.exit_code == 1, res.output
    assert "backward (compiled autograd): 1 graph captured" in res.output
    assert f"✗ compile_autograd_models.py:{models.HOOK_LINE}" in res.output
    assert re.search(r"AddmmBackward0\s+fc2", res.output)
    d = json.loads(out.read_text())
    assert d["compiled_autograd"]["breaks"][0]["stack"]
    back = CompileMap.from_json(out.read_text()).backward
    assert back is not None and back.break_count == sum(b["count"] for b in d["compiled_autograd"]["breaks"])
    assert [c.name for c in back.autograd[0].calls] == [c["name"] for c in d["compiled_autograd"]["autograd"][0]["calls"]]
    ok = CliRunner().invoke(cli, ["compile", "tests/compile_autograd_models.py:mlp", "--backward", "--compiled-autograd",
                                  "--backend", "eager", "--fail-on-break"])
    assert ok.exit_code == 0, ok.output


def test_bad_combinations() -> None:
    """compiled autograd without a backward, or with Inductor's inside view: one line each."""
    model, args = models.mlp()
    with pytest.raises(TargetError, match="add grad=True"):
        fxviz.compile_map(model, args, backend="eager", compiled_autograd=True)
    with pytest.raises(TargetError, match="not covered with inside=True"):
        fxviz.compile_map(model, args, backend="aot_eager", grad=True, inside=True, compiled_autograd=True)
    res = CliRunner().invoke(cli, ["compile", "tests/compile_autograd_models.py:mlp", "--compiled-autograd"])
    assert res.exit_code != 0 and "add --backward" in res.output and "Traceback" not in res.output
