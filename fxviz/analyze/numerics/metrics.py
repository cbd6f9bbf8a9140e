"""Reduce two values to an :class:`~fxviz.analyze.numerics.result.Error` the moment both exist, so
no activation outlives its comparison; and the default tolerance of each side."""

from __future__ import annotations

import math

import torch

from fxviz.analyze.numerics.result import Error

#: Default (rtol, atol) by the dtype the other side computes in. For a low-precision side rtol is
#: the dtype's unit roundoff (2⁻⁸ for bfloat16, 2⁻¹¹ for float16): one rounding moves a value by
#: at most that much of itself, about half of it in RMS, so a relative RMS error beyond it is error
#: that was carried and grown, not just rounded. float32 gets torch.testing's tolerance.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1.3e-6, 1e-5),
    "bfloat16": (2.0**-8, 1e-5),
    "float16": (2.0**-11, 1e-5),
}


def compare(eager: torch.Tensor, other: torch.Tensor, rtol: float, atol: float) -> Error:
    """The error of ``other`` against ``eager`` (see :class:`Error`). Computed in float64 on one
    value at a time: the temporaries are a few copies of one op's output."""
    if eager.shape != other.shape:
        return Error(comparable=False, note=f"shapes differ: {tuple(eager.shape)} vs {tuple(other.shape)}")
    if eager.is_complex() or other.is_complex():
        eager, other = torch.view_as_real(eager), torch.view_as_real(other)
    if not eager.is_floating_point():
        if eager.numel() == 0:
            return Error()
        wrong = int((eager != other.to(eager.dtype)).sum())
        return Error(max_abs=float(wrong), max_rel=wrong / eager.numel(), rel_rms=wrong / eager.numel(),
                     snr_db=math.inf if not wrong else -10 * math.log10(wrong / eager.numel()),
                     cosine=1.0 if not wrong else math.nan, exceeds=wrong > 0)
    a = eager.detach().to(torch.float64)
    b = other.detach().to(device=a.device, dtype=torch.float64)
    if a.numel() == 0:
        return Error()
    finite = torch.isfinite(a) & torch.isfinite(b)
    bad = 0
    if not bool(finite.all()):
        same = (a == b) | (torch.isnan(a) & torch.isnan(b))
        bad = int((~finite & ~same).sum())
        a, b = torch.where(finite, a, 0.0), torch.where(finite, b, 0.0)
    d = a - b
    ad = d.abs()
    max_abs = float(ad.max())
    max_rel = float((ad / (a.abs() + atol)).max())
    ss_a, ss_b, ss_d, dot = float((a * a).sum()), float((b * b).sum()), float((d * d).sum()), float((a * b).sum())
    del a, b, d, ad
    norm = math.sqrt(ss_a)
    if ss_d == 0:
        rel, snr = 0.0, math.inf
    elif ss_a == 0:
        rel, snr = math.inf, -math.inf
    else:
        rel, snr = math.sqrt(ss_d / ss_a), 10 * math.log10(ss_a / ss_d)
    cosine = dot / math.sqrt(ss_a * ss_b) if ss_a > 0 and ss_b > 0 else (1.0 if ss_a == ss_b else 0.0)
    exceeds = bad > 0 or math.sqrt(ss_d) > atol * math.sqrt(eager.numel()) + rtol * norm
    if bad:
        max_abs, max_rel, rel, snr = math.inf, math.inf, math.inf, -math.inf
    return Error(max_abs, max_rel, cosine, snr, rel, exceeds)


__all__ = ["TOLERANCES", "compare"]
