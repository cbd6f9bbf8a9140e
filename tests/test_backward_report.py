"""What the report of a training step says about saved activations (the table, the headline and
the memory timeline), checked against torch's own count of a real step."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import fxviz
from fxviz.passes.training import saved_at_peak, saved_panel, saved_summary, saved_timeline
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


def _torch_peak(model: torch.nn.Module, args: tuple[Any, ...]) -> tuple[int, dict[str, int]]:
    """torch's own record of a real step's saved activations over time: a storage's bytes from
    its first pack (by the module whose forward is running, parameters, buffers and inputs cost
    nothing) until autograd frees the last saved variable holding it; the peak, and the bytes
    per module alive at it."""
    import weakref

    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers(), *args]}
    names = {m: n for n, m in model.named_modules()}
    stack: list[str] = []
    holders: dict[int, int] = {}  # storage -> live saved variables
    live: dict[int, tuple[str, int]] = {}  # storage -> (module, bytes)
    peak: tuple[int, dict[str, int]] = (0, {})

    class Hold:
        def __init__(self, t: torch.Tensor) -> None:
            self.t = t

    def note() -> None:
        nonlocal peak
        total = sum(b for _, b in live.values())
        if total > peak[0]:
            per: dict[str, int] = {}
            for m, b in live.values():
                per[m] = per.get(m, 0) + b
            peak = (total, per)

    def gone(key: int) -> None:
        holders[key] -= 1
        if not holders[key]:
            live.pop(key, None)

    def pack(t: torch.Tensor) -> Hold:
        key = t.untyped_storage().data_ptr()
        h = Hold(t)
        if key not in own:
            if not holders.get(key):
                live[key] = (stack[-1] if stack else "", t.untyped_storage().nbytes())
                note()
            holders[key] = holders.get(key, 0) + 1
            weakref.finalize(h, gone, key)
        return h

    pre = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: stack.append(names.get(m, "?")))
    post = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: (stack.pop(), None)[1])
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda h: h.t):
            loss = bm.default_loss(model(*args))
        torch.autograd.grad([loss], [p for p in model.parameters() if p.requires_grad])
    finally:
        pre.remove()
        post.remove()
    return peak


@pytest.mark.parametrize("build", [bm.mlp, lambda: (bm.Checkpointed(), (torch.randn(4, 8),))],
                         ids=["mlp", "checkpointed"])
def test_the_peak_and_the_modules_alive_at_it_are_torchs(build: Any) -> None:
    torch.manual_seed(0)
    model, args = build()
    graph = fxviz.capture(model, args, backward=True, method="eager")
    op, alive = saved_at_peak(graph)
    line = saved_timeline(graph)
    assert sum(b for _, b in alive) == max(b for _, b in line) and dict(line)[op] == max(b for _, b in line)
    total, per = _torch_peak(model, args)
    assert total > 0 and dict(alive) == {m: b for m, b in per.items() if b}, (alive, per)
    assert f"after {op} (" in saved_summary(graph)
