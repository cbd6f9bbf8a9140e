"""What the report of a training step says about saved activations (the table, the headline and
the memory timeline), checked against torch's own count of a real step."""

from __future__ import annotations

import pytest

import fxviz
from fxviz.passes.training import saved_panel, saved_summary, saved_timeline
from tests import backward_models as bm


@pytest.mark.parametrize("method", ["export", "eager"])
def test_saved_table_headline_and_timeline_agree_with_torch(method: str) -> None:
    graph = fxviz.capture(*bm.mlp(), backward=True, method=method)
    saved, _ = bm.torch_step(*bm.mlp())
    panel = saved_panel(graph)
    assert panel is not None and len(panel["rows"]) == len(graph.saved)
    assert sum(r["cells"][4] for r in panel["rows"]) == saved == 16384
    # a record that costs nothing says why (the input x and the weight b reads)
    assert sorted(r["cells"][5].split(",")[0] for r in panel["rows"] if r["cells"][4] == 0) == ["a parameter", "an input"]
    line = saved_timeline(graph)
    ops = [n.name for n in graph.nodes if n.kind == "op"]
    assert [name for name, _ in line] == ops
    live = [b for _, b in line]
    peak = max(live)
    # every activation is alive when the forward ends, none once the backward has read them all
    last_forward = max(k for k, n in enumerate(ops) if graph.node(n).phase == "forward")
    assert peak == live[last_forward] == saved and live[0] == 0 and live[-1] == 0
    text = saved_summary(graph)
    assert f"{saved:,} bytes" in text and "most in act" in text and f"peak 16.0 KB after {ops[live.index(peak)]}" in text


def test_a_forward_graph_has_no_saved_table() -> None:
    model, args = bm.mlp()
    graph = fxviz.capture(model, args)
    assert saved_panel(graph) is None and saved_timeline(graph) == [] and saved_summary(graph) == ""
