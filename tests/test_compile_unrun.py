"""An op of the eager trace that the forward runs only when not compiling (transformers'
``warn_if_padding_and_no_attention_mask``, skipped when ``is_tracing``: DeBERTa-v2 showed 99.1% of
ops compiled with no break) did not run eagerly under torch.compile: it did not run at all. Checked
against torch's own record of the same forward: ``explain`` (one graph, no break: nothing ran
outside the graph) and the graph's ops (the eager-only index is not among them)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import fxviz  # noqa: E402


class EagerOnlyCheck(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling():  # a check eager runs and compiled code skips
            ends = x[:, [-1, 0]]
            if bool((ends == 0).any()):
                print("padding?")
        return torch.relu(self.fc(x))


def _explained(model: nn.Module, x: torch.Tensor) -> object:
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            return torch._dynamo.explain(model)(x)
    finally:
        torch._dynamo.reset()


def test_an_op_only_eager_runs_is_not_run_under_compile() -> None:
    torch.manual_seed(0)
    model, x = EagerOnlyCheck(), torch.randn(2, 8) + 5
    ex = _explained(model, x)
    assert ex.graph_count == 1 and ex.graph_break_count == 0  # torch: the forward ran inside one graph
    in_graph = [str(n.target) for g in ex.graphs for n in g.graph.nodes if n.op == "call_function"]
    assert not any("getitem" in t or "any" in t for t in in_graph), in_graph
    cm = fxviz.compile_map(model, (x,), backend="eager")
    eager_only = [n.name for n in cm.graph.ops if n.source is not None
                  and "ends" in (n.source.code or "")]
    assert eager_only and all(cm.assigned[n] == "unrun" for n in eager_only)
    assert "eager" not in cm.assigned.values()
    assert cm.share == 1.0 and cm.compiled_ops == cm.ops == len(cm.assigned) - len(eager_only)
    assert cm.break_count == ex.graph_break_count and len(cm.graphs) == ex.graph_count
    assert any("did not run under torch.compile" in n for n in cm.notes)
    assert cm.ranking() == []  # no module listed with ops outside graphs
    again = type(cm).from_json(cm.to_json())
    assert again.share == 1.0 and again.assigned == cm.assigned
