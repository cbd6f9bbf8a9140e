"""``fxviz compile TARGET --world-size 2 --inside`` (issue 22 point 4 with issue 20): a
tensor-parallel MLP compiled by Inductor in torch's fake process group shows its collectives as
calls of kind ``collective`` on the post-grad nodes torch's ``cppCodeToPost`` gives them, and every
stage (Dynamo's graph of DTensor values included) is read."""

from __future__ import annotations

import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # an Inductor compile

import fxviz  # noqa: E402
from fxviz.torchbridge.distributed import fake_world  # noqa: E402
from fxviz.torchbridge.tracelog import structured_trace  # noqa: E402
from tests import test_distributed as td  # noqa: E402


def test_collectives_of_a_compiled_tensor_parallel_mlp() -> None:
    import torch._inductor.config as inductor_config

    with fake_world(2), structured_trace() as events, inductor_config.patch({"force_disable_caches": True}):
        model, args = td.mlp_factory()
        cm = fxviz.compile_map(model, args, backend="inductor", inside=True)
    maps = [json.loads(p) for meta, p in events
            if meta.get("artifact", {}).get("name") == "inductor_provenance_tracking_node_mappings"]
    torch_map: dict[str, Any] = maps[0]["cppCodeToPost"]
    inside = cm.inside
    assert inside is not None and len(inside.graphs) == 1
    g = inside.graphs[0]
    assert [s.name for s in g.pipeline.stages][:2] == ["Dynamo graph", "pre-grad passes"]
    assert not [n for n in inside.notes if "not read" in n], inside.notes
    collective = [k for k in g.kernels if k.kind == "collective"]
    assert collective and {k.id for k in collective} == {h for h in torch_map if "_c10d_functional" in h}
    for k in collective:
        assert sorted(k.ops) == sorted(torch_map[k.id])
    assert "collective)" in inside.summary()
    # timed like any compiled graph (the trace of a process-group run has rank 0: the live run's
    # calls are matched to it all the same), collectives included
    assert inside.timed and all(k.time_us is not None and k.time_us > 0 for k in g.kernels), \
        [(k.id, k.time_us) for k in g.kernels]
    assert sum(k.share or 0 for k in g.kernels) == pytest.approx(1.0)
    # the compile map counts the all_reduce as compiled (one graph, no break)
    assert cm.share == 1.0
