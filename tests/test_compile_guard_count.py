"""fxviz counts each distinct guard once; torch's ``guard_count`` (its compilation metrics, what
tlparse shows) counts the ``Guard`` objects Dynamo installed, and Dynamo installs some checks many
times (a Qwen3-shaped model: ``L['args'][0].config: NOT_PRESENT_IN_GENERIC_DICT`` 51 times, 724
distinct guards against torch's 862). Every place fxviz shows a guard count says which it counts and
gives torch's own beside it, checked against the compilation metrics of the same run."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import fxviz  # noqa: E402
from fxviz.analyze.compilemap.overlay import guard_lines  # noqa: E402


def _qwen3() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    return transformers.Qwen3ForCausalLM(cfg).eval(), torch.randint(0, 128, (1, 8))


def test_guard_counts_say_what_they_count_with_torchs_beside() -> None:
    from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

    model, x = _qwen3()
    clear_compilation_metrics()
    cm = fxviz.compile_map(model, (x,), backend="eager")
    theirs = {str(m.compile_id): m.guard_count for m in get_compilation_metrics() if m.guard_count is not None}
    assert theirs and cm.graphs
    for g in cm.graphs:  # torch's own count, of the frame compile that made the graph
        assert g.compile_id in theirs and g.torch_guard_count == theirs[g.compile_id]
    assert any(len(g.guards) != g.torch_guard_count for g in cm.graphs)  # the two counts differ here
    summary = cm.to_dict()["summary"]
    assert summary["torch_guard_count"] == sum(theirs[g.compile_id] for g in cm.graphs)
    assert summary["guards_distinct"] == sum(len(g.guards) for g in cm.graphs)
    page = "\n".join(guard_lines(cm))
    g0 = cm.graphs[0]
    assert f"distinct guards: {g0.id} {len(g0.guards)} (torch {theirs[g0.compile_id]})" in page
    assert "torch's guard_count counts the Guard objects" in page
    panels = cm.graph.annotations["panels"]
    assert f"torch's guard_count {summary['torch_guard_count']}" in panels["guards"]["note"]
    assert "distinct guard" in panels["guards"]["note"]
    assert panels["graphs"]["columns"][5:7] == ["guards (distinct)", "torch guard_count"]
    assert panels["graphs"]["rows"][0]["cells"][5:7] == [len(g0.guards), theirs[g0.compile_id]]
    again = type(cm).from_json(cm.to_json())
    assert [g.torch_guard_count for g in again.graphs] == [g.torch_guard_count for g in cm.graphs]
