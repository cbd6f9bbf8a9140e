"""How far one value of the other side is from eager (:class:`Error`), as plain data. No torch."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

_FLOATS = ("max_abs", "max_rel", "cosine", "snr_db", "rel_rms", "floor")


@dataclass(slots=True)
class Error:
    """How far one value of the other side is from eager float32.

    ``rel_rms`` is ``‖other − eager‖₂ / ‖eager‖₂`` (0 when equal; the overlay's value, bigger is
    worse), ``snr_db`` ``−20·log10(rel_rms)`` (``inf`` when equal), ``max_rel`` the largest
    ``|other − eager| / |eager|`` where eager is not near zero (NaN when every element is:
    :data:`~fxviz.analyze.numerics.metrics.NEAR_ZERO`). ``exceeds`` says the value is beyond tolerance:
    ``‖other − eager‖₂ > atol·√n + rtol·‖eager‖₂`` (the RMS form of ``allclose``, so one element
    that cancels to nearly zero does not count as a divergence), or NaN/inf where eager has none, or
    integers that differ. ``note`` says why a value was not compared (``comparable`` False).
    ``floor`` is eager's own noise, ``‖eager₂ − eager₁‖₂ / ‖eager₁‖₂`` between two identical eager
    runs (0: reproducible); a value with noise is beyond tolerance only past it
    (:mod:`fxviz.analyze.numerics.floor`).
    """

    max_abs: float = 0.0
    max_rel: float = 0.0
    cosine: float = 1.0
    snr_db: float = math.inf
    rel_rms: float = 0.0
    exceeds: bool = False
    comparable: bool = True
    note: str = ""
    floor: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in _FLOATS:
            if not math.isfinite(d[k]):
                d[k] = None if d[k] != d[k] else ("inf" if d[k] > 0 else "-inf")
        for k in ("note", "floor"):
            if not d[k]:
                del d[k]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Error:
        v = dict(d)
        for k in _FLOATS:
            if isinstance(v.get(k), str):
                v[k] = float(v[k])
            elif v.get(k) is None and k in v:
                v[k] = math.nan
        return cls(**v)

    def text(self) -> str:
        """One line for the details panel and the terminal."""
        if not self.comparable:
            return f"not comparable: {self.note}" if self.note else "not comparable"
        snr = "exact" if self.rel_rms == 0 else f"SNR {self.snr_db:.1f} dB"
        return (f"{snr} · max abs {self.max_abs:.3g} · max rel {rel_text(self.max_rel)} · cos {self.cosine:.6f}"
                + (f" · eager noise {self.floor:.3g} (not reproducible)" if self.floor else "")
                + (" · beyond tolerance" if self.exceeds else ""))

    @staticmethod
    def worst(errors: list[Error]) -> Error | None:
        compared = [e for e in errors if e.comparable]
        if not compared:
            return errors[0] if errors else None
        return max(compared, key=lambda e: (e.exceeds, e.rel_rms if e.rel_rms == e.rel_rms else math.inf))


def rel_text(max_rel: float) -> str:
    """``max_rel`` as shown: ``-`` where every element of the reference is near zero (NaN)."""
    return "-" if max_rel != max_rel else f"{max_rel:.3g}"


__all__ = ["Error", "rel_text"]
