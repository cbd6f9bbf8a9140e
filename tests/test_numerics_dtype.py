"""`fxviz numerics --against dtype:...`: the default tolerance follows the compared dtype (from
torch.finfo), relative error is not taken where the reference is near zero, and the headline says
whether the drift is what the dtype is expected to give. Checked against torch's own record: the
same module run directly in bfloat16, judged by torch.testing's default bfloat16 tolerances."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from click.testing import CliRunner
from torch import nn
from torch.testing._comparison import default_tolerances

from fxviz.analyze.numerics import numerics
from fxviz.analyze.numerics.metrics import FLOAT32, NEAR_ZERO, compare, tolerance
from fxviz.cli import cli

WITHIN = "all within what bfloat16 is expected to give"


def test_default_tolerance_comes_from_the_dtypes_unit_roundoff() -> None:
    for dtype in (torch.bfloat16, torch.float16):
        assert tolerance(dtype) == (4 * torch.finfo(dtype).eps / 2, 1e-5)
    assert tolerance(torch.bfloat16)[0] == 2.0**-6  # 4 x 2^-8: bfloat16's 8-bit significand
    # torch.testing's own default for bfloat16 (rtol 1.6e-2, atol 1e-5) is the same, within 3%
    t_rtol, t_atol = default_tolerances(torch.bfloat16)
    assert abs(tolerance(torch.bfloat16)[0] - t_rtol) / t_rtol < 0.03 and tolerance(torch.bfloat16)[1] == t_atol
    assert FLOAT32 == tolerance(torch.float32) == default_tolerances(torch.float32)
    torch.manual_seed(0)
    r = numerics(nn.Linear(8, 4).eval(), (torch.randn(2, 8),), against="dtype:float16")
    assert r.rtol == 4 * torch.finfo(torch.float16).eps / 2 and r.expected == "float16"
    r = numerics(nn.Linear(8, 4).eval(), (torch.randn(2, 8),), against="dtype:bfloat16", rtol=1e-4)
    assert r.expected == "" and "beyond tolerance (rtol 0.0001" in r.headline()


def _modules() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    return {"linear": nn.Linear(16, 8), "layernorm": nn.LayerNorm(16), "gelu": nn.GELU(), "softmax": nn.Softmax(-1),
            "tanh": nn.Tanh()}


@pytest.mark.parametrize("name", sorted(_modules()))
def test_an_op_torch_calls_close_in_bfloat16_is_within(name: str) -> None:
    """torch.testing's tolerances are per op (its OpInfo tests): one op each."""
    model = _modules()[name].eval()
    torch.manual_seed(1)
    x = torch.randn(4, 16)
    with torch.no_grad():
        ref = model(x)
        low = copy.deepcopy(model).to(torch.bfloat16)(x.to(torch.bfloat16))
    # torch's record: where the reference is not near zero, the bfloat16 run is close by
    # torch.testing's default bfloat16 tolerances (the bfloat16 side picks them)
    away = ref.abs() >= NEAR_ZERO * ref.pow(2).mean().sqrt()
    torch.testing.assert_close(low[away], ref[away], check_dtype=False)
    r = numerics(model, (x,), against="dtype:bfloat16")
    assert r.expected == "bfloat16" and r.first is None
    assert not any(e.exceeds for e in r.nodes.values())
    assert WITHIN in r.headline()
    out = r.modules[""]
    d = (low.float() - ref).abs()
    assert out.rel_rms == pytest.approx(float(d.norm() / ref.norm()), rel=1e-4)  # the same run as torch's
    assert out.max_rel == pytest.approx(float((d[away] / ref[away].abs()).max()), rel=1e-4)
    assert out.max_rel < default_tolerances(torch.bfloat16)[0] * 1.1


class Cancels(nn.Module):
    """``(x + 256) - 256``: in bfloat16 the spacing at 256 is 2, so x is lost."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + 256) - 256


def test_what_bfloat16_loses_is_beyond_and_born_where_it_is_lost() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    low = Cancels()(x.to(torch.bfloat16))
    with pytest.raises(AssertionError):
        torch.testing.assert_close(low, x, check_dtype=False)  # torch's record: beyond
    r = numerics(Cancels(), (x,), against="dtype:bfloat16")
    assert r.first == "sub" and r.nodes["sub"].exceeds and not r.nodes["add"].exceeds
    assert "1 beyond what bfloat16 is expected to give" in r.headline()


def test_relative_error_is_not_taken_where_the_reference_is_near_zero() -> None:
    eager = torch.tensor([1.0, -2.0, 1.5, 1e-6])
    e = compare(eager, torch.tensor([1.001, -2.0, 1.5, 1e-3]), *tolerance(torch.bfloat16))
    assert e.max_rel == pytest.approx(1e-3, rel=1e-3)  # not 1e-3 / 1e-6: the last element is near zero
    assert e.max_abs == pytest.approx(1e-3, rel=1e-2) and not e.exceeds
    e = compare(torch.zeros(3), torch.full((3,), 1e-3), *tolerance(torch.bfloat16))
    assert math.isnan(e.max_rel) and e.exceeds and "max rel - " in e.text()


@pytest.mark.slow
def test_cli_bfloat16_gpt2_is_within_what_bfloat16_gives(tmp_path: object) -> None:
    from tests.transformers_zoo import gpt2

    model, args, kwargs = gpt2(2)
    r = numerics(model, args, kwargs, against="dtype:bfloat16")
    assert r.first is None and WITHIN in r.headline()
    compared = [e for e in r.nodes.values() if e.comparable and e.rel_rms > 0]
    assert len(compared) > 40 and all(e.max_rel < 1 for e in compared if e.max_rel == e.max_rel)
    assert 30 < r.worst_snr() < 60  # bfloat16 does drift: about 8 bits' worth
    res = CliRunner().invoke(cli, ["numerics", "tests/transformers_zoo.py:gpt2", "--against", "dtype:bfloat16"])
    assert res.exit_code == 0, res.output
    head = res.output.splitlines()[0]
    assert head.startswith("GPT2LMHeadModel against dtype:bfloat16:") and WITHIN in " ".join(res.output.split())
    assert "first divergence:" not in res.output


@pytest.mark.parametrize(("flag", "value"), [("--rtol", "-1"), ("--atol", "nan")])
def test_a_tolerance_below_zero_is_refused_in_one_line(flag: str, value: str) -> None:
    # before: --rtol -1 ran and put every value beyond tolerance ("the error is born at linear")
    r = CliRunner().invoke(cli, ["numerics", "fxviz.examples:cnn", flag, value])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.output.strip().splitlines()[-1] == f"error: {flag} {float(value)}: a tolerance is a number >= 0 (0: only exact values are within)"
    with pytest.raises(Exception, match="a tolerance is a number >= 0"):
        numerics(nn.Linear(2, 2), (torch.randn(1, 2),), rtol=-1.0)
