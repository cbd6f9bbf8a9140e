"""Tiny models for the inside-torch.compile tests (each compiles in seconds with Inductor on CPU): a
Linear-LayerNorm-GELU block, a graph break, unfused ops, a residual add + LayerNorm pair whose fusions
cross module boundaries, a ConvNeXt-like CNN.

Run as a script (``TORCH_TRACE=DIR python tests/inside_models.py``) it makes the same training
step the in-process tests compile, so a saved trace can be checked against the live run."""

from __future__ import annotations

import torch
from torch import nn
from torch._inductor.custom_graph_pass import CustomGraphPass


class Block(nn.Module):
    """Linear -> LayerNorm -> GELU -> Linear: two extern addmm calls around one fused kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.ln = nn.LayerNorm(32)
        self.b = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(self.a(x))
        return self.b(torch.nn.functional.gelu(h))


class Broken(nn.Module):
    """A graph break (print) between two compiled graphs."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        print("break")
        return torch.sigmoid(self.b(h))


def block() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Block(), (torch.randn(8, 16),)


def broken() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Broken(), (torch.randn(8, 16),)


class SinSum(nn.Module):
    """A reduction and a pointwise op that read the same values: Inductor fuses them unless told not
    to (``max_fusion_size=1``: "exceeds max fusion")."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        a = torch.sin(h)
        s = a.sum(dim=1, keepdim=True)
        return torch.cos(a) + s


class Unfused(nn.Module):
    """Linear -> SinSum: the fusion tests' model."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.scale = SinSum()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale(self.a(x))


def unfused() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Unfused(), (torch.randn(8, 16),)


class ReluToMax(CustomGraphPass):
    """A post-grad pass that rewrites the one ``relu`` as ``clamp_min(x, 0)``: the post-grad
    stage's only change."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        for n in list(graph.nodes):
            if n.op == "call_function" and n.target is torch.ops.aten.relu.default:
                with graph.inserting_after(n):
                    new = graph.call_function(torch.ops.aten.clamp_min.default, (n.args[0], 0.0))
                new.meta.update(n.meta)
                n.replace_all_uses_with(new)
                graph.erase_node(n)

    def uuid(self) -> bytes:
        return b"fxviz-test-relu-to-clamp-min"


class Residual(nn.Module):
    """Two residual adds each fused with the LayerNorm after it, across module boundaries."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.ln = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 16)
        self.ln2 = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x + self.fc(x))
        return self.ln2(h + torch.tanh(self.fc2(h)))


class ConvNeXtBlock(nn.Module):
    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c)
        self.pw1 = nn.Linear(c, 4 * c)
        self.act = nn.GELU()
        self.pw2 = nn.Linear(4 * c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dw(x).permute(0, 2, 3, 1)
        return x + self.pw2(self.act(self.pw1(self.norm(h)))).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 4, stride=4)
        self.block = ConvNeXtBlock()
        self.head = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.stem(x)).mean((2, 3)))


if __name__ == "__main__":  # a training step, as the tests' live run makes it
    import torch._inductor.config as inductor_config

    inductor_config.force_disable_caches = True
    inductor_config.trace.provenance_tracking_level = 1
    model, args = block()
    out = torch.compile(model)(*args)
    torch.autograd.grad([out.sum()], [p for p in model.parameters()])
