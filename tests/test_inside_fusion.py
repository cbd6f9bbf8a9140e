"""Which ops did not fuse and why (issue 20 point 2), on a live compile: the refusals fxviz reads
from Inductor's fusion logger against the messages torch itself logged in the same run (a plain
handler on the same logger, read with regular expressions), the post-grad nodes against torch's own
candidate list (its ``origins``), the kernels against torch's ``cppCodeToPost``.

One Inductor compile (a training step, ``max_fusion_size=1`` so that torch refuses fusions it
would make, FX graph cache off so that the scheduler runs) serves every test."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # an Inductor compile

import fxviz  # noqa: E402
from fxviz.analyze.compilemap.result import CompileMap  # noqa: E402
from fxviz.torchbridge.tracelog import structured_trace  # noqa: E402
from tests import inside_models  # noqa: E402

_REFUSED = re.compile(r"^cannot fuse (\S+) with (\S+): (.*)$")
_FUSED = re.compile(r"^fusing (\S+) with (\S+)$")
_CANDIDATE = re.compile(r"name='(\w+)'\).*?origins=OrderedSet\(\[([^\]]*)\]\)")


class _TorchLog(logging.Handler):
    """Every message of torch's fusion logger, with the part being compiled: the output codes the
    structured trace has shown so far (0: the forward, 1: the backward)."""

    def __init__(self, events: list[Any]) -> None:
        super().__init__(logging.DEBUG)
        self.events = events
        self.messages: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        codes = sum(1 for meta, _ in self.events if "inductor_output_code" in meta)
        self.messages.append((("forward", "backward")[min(codes, 1)], record.getMessage()))


@pytest.fixture(scope="module")
def run() -> tuple[CompileMap, list[Any], _TorchLog]:
    return compile_with_torchs_fusion_log(*inside_models.unfused())


def compile_with_torchs_fusion_log(model: Any, args: Any) -> tuple[CompileMap, list[Any], _TorchLog]:
    """The compile map of a training step (``max_fusion_size=1``, FX graph cache off), the
    structured trace, and torch's own fusion log of the same run."""
    import torch._inductor.config as inductor_config
    from torch._inductor.scheduler import fusion_log

    level = fusion_log.level
    with structured_trace(fusion=False) as events, inductor_config.patch({"max_fusion_size": 1, "fx_graph_cache": False}):
        log = _TorchLog(events)
        fusion_log.addHandler(log)
        fusion_log.setLevel(logging.DEBUG)
        try:
            cm = fxviz.compile_map(model, args, backend="inductor", inside=True, grad=True)
        finally:
            fusion_log.removeHandler(log)
            fusion_log.setLevel(level)
    assert fusion_log.level == level and not any(isinstance(h, type(log)) for h in fusion_log.handlers)
    return cm, list(events), log


def _find(group: dict[str, str], x: str) -> str:
    while group.get(x, x) != x:
        x = group[x]
    return x


def _stood(log: _TorchLog) -> set[tuple[str, str, str, str]]:
    """torch's refusals whose operations its later "fusing X with Y" did not bring together."""
    out = set()
    for part in ("forward", "backward"):
        msgs = [m for p, m in log.messages if p == part]
        group: dict[str, str] = {}
        for m in msgs:
            if (f := _FUSED.match(m)) is not None:
                ops = (f.group(1) + "_" + f.group(2)).split("_")
                for o in ops[1:]:
                    group[_find(group, o)] = _find(group, ops[0])
        for m in msgs:
            r = _REFUSED.match(m)
            if r is not None and len({_find(group, o) for o in (r.group(1) + "_" + r.group(2)).split("_")}) > 1:
                out.add((part, r.group(1), r.group(2), r.group(3)))
    return out


def test_refusals_are_the_ones_torch_logged(run: Any) -> None:
    cm, _, log = run
    inside = cm.inside
    got = [(n.part, n.first, n.second, n.reason) for n in inside.not_fused]
    assert len(got) == len(set(got))  # torch repeats a refusal in later rounds: listed once
    assert set(got) == _stood(log)
    assert ("forward", "op1", "op2", "exceeds max fusion") in got  # op0: the extern addmm
    assert any(p == "backward" for p, *_ in got)


def test_refusals_name_torch_s_nodes_and_kernels(run: Any) -> None:
    cm, events, log = run
    origins: dict[tuple[str, str], set[str]] = {}
    for part, m in log.messages:  # torch's candidate list: SchedulerNode(name='op0'), ... origins=OrderedSet([...])
        for name, nodes in _CANDIDATE.findall(m):
            origins[(part, name)] = {x.strip() for x in nodes.split(",")}
    mappings = [json.loads(p) for meta, p in events
                if meta.get("artifact", {}).get("name") == "inductor_provenance_tracking_node_mappings"]
    forward = mappings[0]["cppCodeToPost"]
    for n in cm.inside.not_fused:
        for side, ops in ((n.first, n.first_ops), (n.second, n.second_ops)):
            mine = set().union(*(origins[(n.part, o)] for o in side.split("_")))
            assert ops and set(ops) <= mine, (n, mine)
        if n.part == "forward":
            for ops, kernels in ((n.first_ops, n.first_kernels), (n.second_ops, n.second_kernels)):
                assert set(kernels) == {h for h, nodes in forward.items() if set(nodes) & set(ops)}
        assert n.first_kernels and n.second_kernels
        # the forward's refusal is inside SinSum; the backward's reach the Linear's bias gradient too
        assert n.modules == ["scale"] if n.part == "forward" else n.modules and set(n.modules) <= {"scale", "a"}
        assert set(n.eager) <= {o.name for o in cm.graph.ops}


def test_not_fused_in_json_terminal_and_report(run: Any) -> None:
    from rich.console import Console

    from fxviz.analyze.inside.result import Inside
    from fxviz.cli.inside import print_inside

    cm, _, _ = run
    inside = cm.inside
    d = json.loads(json.dumps(cm.to_dict()))
    assert [f["reason"] for f in d["fusion"]] == [n.reason for n in inside.not_fused]
    assert [n.to_dict() for n in Inside.from_dict(d).not_fused] == d["fusion"]
    console = Console(record=True, width=300)
    print_inside(console, inside, stage=None, graph=None)
    text = console.export_text()
    first = inside.not_fused[0]
    kernel = next(k.name for k in inside.kernels if k.id == first.first_kernels[0])
    assert f"not fused ({len(inside.not_fused)}, Inductor's reasons):" in text
    assert f"  forward: {', '.join(first.first_ops)} in {kernel} ✗ " in text and ": exceeds max fusion [scale]" in text
    panel = cm.graph.annotations["panels"]["not fused"]
    assert len(panel["rows"]) == len(inside.not_fused)
    assert all(r["node"] in {o.name for o in cm.graph.ops} for r in panel["rows"])
    assert fxviz.analyze.inside.fusion.NOT_IN_TRACE not in inside.notes


def test_every_refusal_in_the_panel_a_page_in_the_tree(run: Any) -> None:
    """A model with more refusals than the tree's page (Swin logged 233): the panel, the report's
    data and the JSON keep every one (they were cut at 200); the tree prints a page and says how many
    more there are."""
    import copy

    from rich.console import Console

    from fxviz.analyze.inside.overlay import NOT_FUSED_ROWS, write
    from fxviz.analyze.inside.result import Inside
    from fxviz.render.html import view_model
    from fxviz.render.panels import panel_tables

    cm, _, _ = run
    d = cm.to_dict()
    many = NOT_FUSED_ROWS * 9 + 7
    d["fusion"] = [d["fusion"][i % len(d["fusion"])] for i in range(many)]
    inside = Inside.from_dict(d)
    graph = write(copy.deepcopy(cm.graph), inside)
    panel = graph.annotations["panels"]["not fused"]
    assert len(panel["rows"]) == many and panel["page"] == NOT_FUSED_ROWS
    assert panel["note"].startswith(f"{many} refusals logged")
    shown = next(p for p in view_model(graph)["panels"] if p["name"] == "not fused")
    assert len(shown["rows"]) == many
    console = Console(record=True, width=400)
    for t in panel_tables(graph):
        console.print(t)
    text = console.export_text()
    assert f"... {many - NOT_FUSED_ROWS} more rows (the report and the JSON list all)" in text
