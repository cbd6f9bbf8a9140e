"""Reduce two values to an :class:`~fxviz.analyze.numerics.result.Error` the moment both exist, so
no activation outlives its comparison; and the default tolerance of each side."""

from __future__ import annotations

import math

import torch

from fxviz.analyze.numerics.result import ROUNDINGS, Error

#: The absolute tolerance of every side (torch.testing's for every floating dtype).
ATOL = 1e-5
#: float32 sides (export, compile) round nothing to fewer bits; they differ by the order of a sum:
#: torch.testing's float32 tolerance.
FLOAT32 = (1.3e-6, ATOL)


def unit_roundoff(dtype: torch.dtype) -> float:
    """The most one rounding to ``dtype`` moves a value, relative to it (``finfo.eps / 2``: 2⁻⁸ for
    bfloat16's 8-bit significand, 2⁻¹¹ for float16, 2⁻²⁴ for float32)."""
    return torch.finfo(dtype).eps / 2


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """Default ``(rtol, atol)`` of a side that computes in ``dtype``: :data:`ROUNDINGS` unit
    roundoffs of a lower precision than float32, :data:`FLOAT32` otherwise."""
    if torch.finfo(dtype).eps <= torch.finfo(torch.float32).eps:
        return FLOAT32
    return ROUNDINGS * unit_roundoff(dtype), ATOL


#: Default (rtol, atol) by the dtype the other side computes in (:func:`tolerance`).
TOLERANCES: dict[str, tuple[float, float]] = {
    name: tolerance(getattr(torch, name)) for name in ("float32", "bfloat16", "float16")
}

#: Where the reference is *near zero* its relative error is not taken: an element smaller than
#: this fraction of the value's RMS (or than atol) carries the absolute error of the value's scale
#: (a sum that cancels), so ``|other − eager| / |eager|`` there measures the cancellation, not the
#: precision (GPT-2 in bfloat16 showed "max rel 143" on such an element).
NEAR_ZERO = 0.1


def compare(eager: torch.Tensor, other: torch.Tensor, rtol: float, atol: float) -> Error:
    """The error of ``other`` against ``eager`` (see :class:`Error`), in eager's precision (float64
    where float32 would overflow), one value at a time."""
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
    a = eager.detach()
    a = a if a.dtype in (torch.float32, torch.float64) else a.float()
    b = other.detach().to(device=a.device)
    if a.numel() == 0:
        return Error()
    bad = 0
    # dot products and one sync. A NaN or inf on either side (or a square past float32's range)
    # shows in the sums: only then is the slow path taken
    stats = _stats(a, b, atol)
    if not all(math.isfinite(x) for x in stats[:5]) or stats[5] != stats[5] or stats[5] == math.inf:
        finite = torch.isfinite(a) & torch.isfinite(b)
        same = (a == b) | (torch.isnan(a) & torch.isnan(b))
        if other.is_floating_point() and other.dtype.itemsize < a.dtype.itemsize:
            # a value beyond the other dtype's range (a mask's finfo(float32).min) becomes inf
            # there: saturation, not an error
            same |= torch.isinf(b) & (a.abs() >= torch.finfo(other.dtype).max) & (a.sign() == b.sign())
        bad = int((~finite & ~same).sum())
        # in float64: float32 squares overflow past 1.8e19 (attention masks hold finfo.min)
        stats = _stats(torch.where(finite, a, 0.0).double(), torch.where(finite, b.to(a.dtype), 0.0), atol)
    ss_a, ss_b, ss_d, dot, max_abs, max_rel = stats
    if max_rel == -math.inf:  # every element is near zero: no relative error to show
        max_rel = math.nan
    del a, b
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


#: Elements compared at a time: the temporaries of a comparison are a few chunks, not a few copies
#: of the value (the logits of a language model are the largest activation by far).
CHUNK = 1 << 20


def _stats(a: torch.Tensor, b: torch.Tensor, atol: float) -> list[float]:
    """Sums of squares of ``a``, ``b`` and ``a − b``, ``a·b``, max ``|a − b|`` and max
    ``|a − b| / |a|`` over the elements not near zero (:data:`NEAR_ZERO`; ``-inf`` when every one
    is), chunk by chunk (``b`` is cast to ``a``'s dtype a chunk at a time), with one
    synchronisation at the end."""
    a, b = a.reshape(-1), b.reshape(-1)
    near = torch.clamp_min(torch.dot(a, a).div(a.numel()).sqrt().mul(NEAR_ZERO), max(atol, torch.finfo(a.dtype).tiny))
    parts = []
    for i in range(0, a.numel(), CHUNK):
        x, y = a[i : i + CHUNK], b[i : i + CHUNK].to(a.dtype)
        d = x - y
        sums = [torch.dot(x, x), torch.dot(y, y), torch.dot(d, d), torch.dot(x, y)]
        d.abs_()
        m = x.abs()
        rel = torch.where(m >= near, d / m, -math.inf)
        parts.append(torch.stack([*sums, d.max(), rel.max().to(d.dtype)]))
    p = torch.stack(parts)
    out = torch.cat([p[:, :4].sum(0), p[:, 4:].amax(0)])
    return [float(x) for x in out.tolist()]


__all__ = ["ATOL", "FLOAT32", "NEAR_ZERO", "ROUNDINGS", "TOLERANCES", "compare", "tolerance", "unit_roundoff"]
