"""`--against compile:aot_eager`: a tensor a compiled graph makes and then writes in place leaves the
graph as the write left it (Mamba's cache: ``torch.zeros`` filled by ``copy_``), so it is compared
with the eager value of the write, not with the zeros. Before, Mamba's four cache buffers were
flagged beyond tolerance (SNR -inf) where the compiled run and eager agree exactly."""

from __future__ import annotations

import torch
from torch import nn

from fxviz.analyze.numerics import numerics


class Cache(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state = torch.zeros(x.shape)  # the cache Dynamo hands out as a graph output
        self.state.copy_(torch.tanh(x))
        return self.state * 3


def test_a_buffer_written_in_its_graph_is_compared_as_written() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    model = Cache().eval()
    eager_state = (model(x), model.state.clone())
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager")
    out = compiled(x)
    # torch's own record: the compiled run's cache and output are eager's, bit for bit
    assert torch.equal(out, eager_state[0]) and torch.equal(model.state, eager_state[1])
    torch._dynamo.reset()
    for _ in range(3):
        r = numerics(Cache().eval(), (x,), against="compile:aot_eager")
        assert [n for n, e in r.nodes.items() if e.exceeds] == []
        zeros = next(n.name for n in r.graph.ops if n.target == "torch.zeros")
        assert r.nodes[zeros].comparable and r.nodes[zeros].rel_rms == 0
        assert r.first is None
