"""numerics(backward=True): each parameter's gradient against eager float32, per module, and the
first module in backward order whose gradient diverges (issue 21 point 5)."""

from __future__ import annotations

import json

import torch
from torch import nn

from fxviz.analyze.numerics import Numerics, numerics


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x.clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        return g * 1.01


class Layer(nn.Module):
    def __init__(self, perturb: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.perturb = perturb

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.lin(x))
        if self.perturb and torch.compiler.is_compiling():  # only the compiled side: its gradient 1% off
            y = _Scale.apply(y)
        return y


class Net(nn.Module):
    def __init__(self, perturb: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = Layer(), Layer(perturb), Layer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.b(self.a(x)))


def _x() -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(1))


def test_perturbed_module_is_first_gradient_divergence_and_grads_are_kept() -> None:
    m = Net(perturb=True)
    m.c.lin.bias.grad = torch.full((8,), 7.0)  # an existing gradient: kept, not accumulated into
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    rng = torch.get_rng_state()
    r = numerics(m, (_x(),), against="compile:aot_eager", backward=True)
    g = r.grads
    assert g is not None
    # backward order is torch's: c's gradients are finished before b's, b's before a's
    assert [n.rpartition(".")[0] for n in g.order] == ["c.lin"] * 2 + ["b.lin"] * 2 + ["a.lin"] * 2
    assert g.first == "b.lin"
    assert not g.params["c.lin.weight"].exceeds and not g.params["c.lin.bias"].exceeds
    assert g.params["c.lin.weight"].rel_rms < 1e-6
    assert g.params["b.lin.weight"].exceeds and abs(g.params["b.lin.weight"].rel_rms - 0.01) < 1e-3
    # the model: same weights, the existing gradient kept, no gradient where there was none
    assert all(torch.equal(p, before[n]) for n, p in m.named_parameters())
    assert torch.equal(m.c.lin.bias.grad, torch.full((8,), 7.0))
    assert m.a.lin.weight.grad is None
    assert torch.equal(torch.get_rng_state(), rng)
    # the overlay on the parameter nodes and the module calls, and JSON that reads back
    ov = r.graph.annotations["overlays"]["grad_error"]
    params = {n.name: str(n.target) for n in r.graph.nodes if n.kind == "parameter"}
    assert {params[k] for k in ov["nodes"]} == set(g.params)
    b_call = next(c.id for c in r.graph.calls.walk() if c.stack and c.path == "b.lin")
    assert abs(ov["modules"][b_call] - g.modules["b.lin"].rel_rms) < 1e-12
    back = Numerics.from_json(r.to_json())
    assert back.grads is not None and back.grads.first == "b.lin"
    assert json.loads(r.to_json())["grads"]["order"] == g.order
    assert "b.lin" in g.headline()


def test_clean_model_every_gradient_within_tolerance() -> None:
    for against in ("compile:aot_eager", "export"):
        r = numerics(Net(), (_x(),), against=against, backward=True)
        assert r.grads is not None and r.grads.first is None, against
        assert len(r.grads.params) == 6 and not r.grads.beyond()


def test_bf16_gradients_differ_by_about_bfloat16_rounding() -> None:
    r = numerics(Net(), (_x(),), against="bf16", backward=True)
    assert r.against == "dtype:bfloat16" and r.grads is not None
    errs = [e.rel_rms for e in r.grads.params.values()]
    assert all(0 < e < 0.05 for e in errs)  # bf16 rounding (u = 2^-8), not zero and not garbage


def test_cli_backward_prints_and_writes_gradients(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import shutil
    from pathlib import Path

    from click.testing import CliRunner

    from fxviz.cli import cli

    models = tmp_path / "numerics_models.py"
    shutil.copy(Path(__file__).parent / "numerics_models.py", models)
    out = tmp_path / "n.json"
    res = CliRunner().invoke(cli, ["numerics", f"{models}:deterministic", "--against", "export", "--backward",
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "gradients:" in res.output and "0 beyond tolerance; every gradient within tolerance" in res.output
    grads = json.loads(out.read_text())["grads"]
    assert grads["first"] is None and grads["order"] and set(grads["order"]) == set(grads["params"])
    assert all(f"grad {n}:" in res.output for n in grads["order"])


class NoisyGrads(nn.Module):
    """Noise no seed reproduces (the operating system's entropy) added after ``fc1``: ``fc2``'s
    weight gradient reads the noisy activations and differs between two eager steps."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        return self.fc2(torch.relu(h + 1e-3 * _entropy_noise(h)))


@torch.compiler.disable
def _entropy_noise(h: torch.Tensor) -> torch.Tensor:
    import os

    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    return torch.randn(h.shape, generator=g)


def test_unreproducible_gradients_get_their_noise_as_floor_from_several_steps(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """fc2's weight gradient reads the noisy activations: eager's own steps differ, so its floor
    is their largest spread (three more steps than the two-step premise) and nothing is flagged."""
    import fxviz.analyze.numerics.grads as grads
    from fxviz.analyze.numerics import floor

    steps: list[int] = []

    def spy(kept: torch.Tensor, others: list[torch.Tensor]) -> floor.Floor:
        steps.append(len(others))
        return floor.widest(kept, others)

    monkeypatch.setattr(grads, "widest", spy)
    torch.manual_seed(0)
    r = numerics(NoisyGrads(), (torch.randn(6, 8),), against="compile:aot_eager", backward=True)
    assert r.grads is not None and r.grads.first is None and not r.grads.beyond()
    w = r.grads.params["fc2.weight"]
    assert w.rel_rms > 1e-5 and w.floor > 1e-5  # it differs, within its noise
    assert steps and set(steps) == {floor.SPREADS}  # each gradient's floor from SPREADS steps
