"""`--against dtype:bfloat16` measures the model cast with ``model.to(bfloat16)`` even where the
model reads dtypes from its own tensors (``h.to(input_dtype)`` after a norm computed in float32,
``x.to(self.weight.dtype)``): shadow execution runs on the float32 model, so those reads say
float32. Before, every linear layer after a LLaMA norm raised on mixed dtypes in the shadow (not
compared, and what followed restarted from eager's value): the headline said "all within" at
55 dB where the cast model is at 45 dB. Checked against torch's own run of the cast model, per
module, through forward hooks."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from fxviz.analyze.numerics import numerics
from tests import transformers_zoo as zoo


class Norm(nn.Module):
    """LLaMA's RMSNorm: computed in float32, cast back to the dtype it read from its input."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        input_dtype = h.dtype
        h = h.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(input_dtype)


class Block(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.norm, self.up, self.down = Norm(width), nn.Linear(width, 2 * width), nn.Linear(2 * width, width)
        self.scale = nn.Buffer(torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(self.norm(x)) * self.scale.to(self.up.weight.dtype)
        return x + self.down(torch.relu(h))


def _truth(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, float]:
    """rel RMS error of each linear layer's output in ``model.to(bfloat16)`` (its float inputs cast too, as
    the side is defined) against float32: torch's own run."""
    outs: dict[str, dict[str, torch.Tensor]] = {"f32": {}, "bf16": {}}

    def run(m: nn.Module, key: str) -> None:
        low = key == "bf16"

        def cast(t: Any) -> Any:
            return t.to(torch.bfloat16) if low and isinstance(t, torch.Tensor) and t.is_floating_point() else t

        hooks = [mod.register_forward_hook(lambda _m, _a, o, n=n: outs[key].__setitem__(n, o))
                 for n, mod in m.named_modules() if isinstance(mod, nn.Linear)]
        with torch.no_grad():
            m(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})
        for h in hooks:
            h.remove()

    run(model, "f32")
    run(copy.deepcopy(model).to(torch.bfloat16), "bf16")
    return {n: float((outs["bf16"][n].float() - e).norm() / e.norm()) for n, e in outs["f32"].items()}


def _check(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    truth = _truth(model, args, kwargs)
    answers = []
    for _ in range(3):
        r = numerics(model, args, kwargs, against="dtype:bfloat16")
        dtype_faults = [n for n, e in r.nodes.items() if not e.comparable and "dtype" in e.note]
        assert dtype_faults == []
        for name, want in truth.items():
            got = r.modules[f"{name}#0"].rel_rms  # the first call of the module
            assert want / 2 < got < want * 2, (name, got, want)
        answers.append({n: e.rel_rms for n, e in r.modules.items()})
    assert answers[0] == answers[1] == answers[2]


def test_a_norm_that_casts_back_to_its_inputs_dtype_is_the_cast_models() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(Block(), Block()).eval()
    _check(model, (torch.randn(4, 32),), {})


def test_llama_in_bfloat16_is_the_cast_models() -> None:
    model, args, kwargs = zoo.llama()
    _check(model, args, kwargs)


class Inverse(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.inv(x) * 2


def test_an_op_that_raises_in_bfloat16_is_said() -> None:
    x = torch.randn(3, 3) + 3 * torch.eye(3)
    try:  # torch's own record: the op has no bfloat16 kernel here
        torch.linalg.inv(x.to(torch.bfloat16))
        raised = ""
    except RuntimeError as e:
        raised = str(e)
    assert raised
    r = numerics(Inverse(), (x,), against="dtype:bfloat16")
    inv = next(n.name for n in r.graph.ops if "inv" in n.target)
    assert not r.nodes[inv].comparable and raised[:40] in r.nodes[inv].note
    # before: no note, and the panel said every value was within what bfloat16 gives
    assert any(note.startswith(f"1 op(s) raised in torch.bfloat16 ({inv})") for note in r.notes)
