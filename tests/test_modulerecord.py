"""fxviz's post-grad pass that writes torch's module of each node into the structured trace
(:mod:`fxviz.torchbridge.modulerecord`): it changes no graph, runs after the user's own passes and
puts their setting back, and a graph Inductor's FX graph cache serves (no post-grad pass runs) still
gets torch's record, the one kept when that cache entry was made."""

from __future__ import annotations

import json
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch._inductor.custom_graph_pass import CustomGraphPass  # noqa: E402

from fxviz.tracefile.records import NODE_MODULES  # noqa: E402


class _Seen(CustomGraphPass):
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.calls += 1

    def uuid(self) -> bytes:
        return b"fxviz-test-seen"


@pytest.mark.parametrize("shape", ["one", "list", "none", "function"])
def test_the_users_passes_run_first_and_their_setting_is_put_back(shape: str) -> None:
    """In a real compile the user's passes run, first and once each; the setting inside the block is
    one ``CustomGraphPass`` (torch 2.11 takes no list), whose uuid keeps the FX graph cache usable
    exactly where theirs does; their setting is put back, their list untouched."""
    import torch._inductor.config as inductor_config

    from fxviz.torchbridge.modulerecord import Chain, recorded_modules
    from fxviz.torchbridge.tracelog import structured_trace

    a, b = _Seen(), _Seen()
    plain_calls: list[int] = []
    users = {"one": a, "list": [a, b], "none": None, "function": lambda g: plain_calls.append(1)}[shape]
    torch._dynamo.reset()
    with inductor_config.patch({"post_grad_custom_post_pass": users, "fx_graph_cache": False}), structured_trace(provenance=False) as events:
        with recorded_modules():
            chain = inductor_config.post_grad_custom_post_pass
            assert isinstance(chain, Chain) and isinstance(chain, CustomGraphPass)
            assert list(chain.theirs) == {"one": [a], "list": [a, b], "none": [], "function": [users]}[shape]
            assert (chain.uuid() is None) == (shape == "function")
            torch.compile(lambda x: torch.relu(x) * 2)(torch.randn(4))
        assert inductor_config.post_grad_custom_post_pass is users
        if isinstance(users, list):
            assert users == [a, b]  # the user's list itself is left alone
    ran = {"one": [a.calls], "list": [a.calls, b.calls], "none": [], "function": [len(plain_calls)]}[shape]
    assert ran == [1] * len(ran)
    records = [m for m, _ in events if m.get("artifact", {}).get("name") == NODE_MODULES]
    assert len(records) == 1  # and fxviz's own record after theirs


def test_the_pass_changes_no_graph_and_logs_each_nodes_stack() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    from fxviz.torchbridge.modulerecord import Record
    from fxviz.torchbridge.tracelog import structured_trace

    gm = make_fx(lambda x: torch.relu(x) + 1)(torch.randn(3))
    relu = next(n for n in gm.graph.nodes if n.op == "call_function")
    relu.meta["nn_module_stack"] = {"L__self___act": ("L['self'].act", torch.nn.ReLU)}
    before = (str(gm.graph), [dict(n.meta) for n in gm.graph.nodes])
    with structured_trace(provenance=False) as events:
        Record()(gm.graph)
    assert (str(gm.graph), [dict(n.meta) for n in gm.graph.nodes]) == before
    payloads = [json.loads(p or "") for m, p in events if m.get("artifact", {}).get("name") == NODE_MODULES]
    assert payloads == [{"part": "forward", "graph": "post-grad", "fwd_nn_module_stack": {},
                         "nn_module_stack": {relu.name: [["L['self'].act", "torch.nn.modules.activation.ReLU"]]}}]


@pytest.mark.slow  # two Inductor compiles of a small MLP's training step (a cold one, then a cache hit)
def test_a_graph_the_fx_graph_cache_serves_gets_the_record_kept_with_its_entry(tmp_path: Any,
                                                                               monkeypatch: Any) -> None:
    import fxviz
    from fxviz.analyze.inside.backward import FROM_TORCH
    from tests import compile_backward_models as models

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    runs = []
    for _ in range(2):
        model, args = models.mlp()
        cm = fxviz.compile_map(model, args, backend="inductor", grad=True, inside=True)
        assert cm.inside is not None
        runs.append(cm.inside)
    first, second = runs
    hit = [n for n in second.notes if "FX graph cache served" in n]
    assert any("backward" in n for n in hit), second.notes  # the second run's backward was a cache hit
    for inside in runs:
        assert any(FROM_TORCH in n for n in inside.notes), inside.notes
    mods = [{k.id: k.modules for g in i.graphs for k in g.kernels if k.part == "backward"} for i in runs]
    assert mods[0] == mods[1] and mods[0]
    assert mods[0]["extern_kernels.mm:4"] == ["fc1"]
