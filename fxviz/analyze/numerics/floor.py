"""The eager noise floor: what an op's eager value moves between two identical eager runs.

An op whose eager result is not reproducible (a kernel that adds in a racing order, a value read
from outside torch, uninitialised memory a partial write left) differs from any other side by at
least its own noise: comparing it as if eager were exact flags it whatever the other side does.
So every numerics run runs eager twice from the same RNG state (a run the side makes anyway where
it has one: export's alignment run, the compile side's kept run) and fingerprints each op's output
(:class:`Prints`: a dot product with fixed weights of both signs, so a moved element shows too;
a difference too small to move it is far below float32's tolerance). Only where the fingerprints
differ (rare) is the size of the noise measured, by more eager runs (:func:`measure`: one keeps
those values, budgeted like the compile side's, each of :data:`SPREADS` more measures
``‖runᵢ − run₁‖₂`` and the floor is the largest), and the value's verdict is taken again
(:func:`apply`): it is beyond tolerance only when ``‖other − eager‖₂ > atol·√n + rtol·‖eager‖₂ +
NOISE·floor``: the other side's value is one more draw of the same noise, and two draws differ by up
to about twice what one pair did. One pair alone is a poor estimate for a value of few elements
(a draw twice another's is common among few: a 12-element value was flagged in 1 of 40 runs);
the largest of three makes that about a hundred times rarer, for two more eager runs paid only
where a second run already showed noise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fxviz.analyze.numerics.keep import Keeper, Want, outputs_of
from fxviz.analyze.numerics.metrics import CHUNK
from fxviz.analyze.numerics.result import Error
from fxviz.analyze.numerics.run import Watcher
from fxviz.analyze.numerics.shadow import is_uninitialised
from fxviz.ir import Node

#: How many times the eager noise floor the other side may differ beyond tolerance.
NOISE = 2.0

#: How many runs measure each noisy value's spread from the kept run (the floor is the largest).
SPREADS = 3

@dataclass(slots=True)
class Floor:
    """One value's eager noise: ``spread`` ``‖run₂ − run₁‖₂``, ``norm`` ``‖run₁‖₂``, ``n`` its size."""

    spread: float
    norm: float
    n: int


class Prints(Watcher):
    """Fingerprints each op's outputs (``prints``: node name -> a tensor of two sums per output),
    kept on the tensors' device until :meth:`read`, so a run waits on nothing."""

    def __init__(self) -> None:
        self.prints: dict[str, torch.Tensor] = {}

    def after(self, node: Node | None, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              out: Any, state: Any) -> None:
        if node is None or is_uninitialised(node):
            return
        sums = [s for t in outputs_of(out) if t is not None and (s := self._print(t)) is not None]
        if sums:
            self.prints[node.name] = torch.cat(sums) if len(sums) > 1 else sums[0]

    def read(self) -> dict[str, tuple[float, ...]]:
        """Each node's fingerprint as integers (one synchronisation)."""
        names = list(self.prints)
        if not names:
            return {}
        by_device: dict[torch.device, list[str]] = {}
        for name in names:
            by_device.setdefault(self.prints[name].device, []).append(name)
        out: dict[str, tuple[float, ...]] = {}
        for group in by_device.values():
            flat = torch.cat([self.prints[n] for n in group]).double().tolist()
            i = 0
            for n in group:
                k = self.prints[n].numel()
                out[n] = tuple(flat[i : i + k])
                i += k
        return out

    def _print(self, t: torch.Tensor) -> torch.Tensor | None:
        if t.is_sparse or t.is_quantized or t.is_meta or t.layout != torch.strided:
            return None
        x = t.detach()
        if x.is_complex():
            x = torch.view_as_real(x)
        if x.numel() == 0:
            return torch.zeros(1, device=x.device)
        if not x.is_contiguous():  # a transposed or expanded view: summed where it lies, not copied
            return torch.sum(x, dtype=torch.float64).reshape(1)
        x = x.reshape(-1)
        if x.dtype not in (torch.float32, torch.float64):
            x = x.to(torch.float32 if x.is_floating_point() else torch.float64)
        w = _weight(x.device, x.dtype)
        if x.numel() <= CHUNK:
            return torch.dot(x, w[: x.numel()]).reshape(1)
        return torch.stack([torch.dot(x[i : i + CHUNK], w[: min(CHUNK, x.numel() - i)])
                            for i in range(0, x.numel(), CHUNK)])


#: The fingerprints' weights, per device and dtype, made once per process.
_WEIGHTS: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _weight(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    w = _WEIGHTS.get((device, dtype))
    if w is None:  # fixed pseudo-random weights, both signs: a moved element changes the sum
        g = torch.Generator().manual_seed(0x5EED)
        w = (torch.rand(CHUNK, generator=g, dtype=torch.float64) + 0.5) * \
            (torch.randint(0, 2, (CHUNK,), generator=g) * 2 - 1)
        w = _WEIGHTS[(device, dtype)] = w.to(device=device, dtype=dtype)
    return w


def differing(a: Prints, b: Prints) -> set[str]:
    """The ops whose outputs differ between the two fingerprinted runs."""
    pa, pb = a.read(), b.read()
    return {name for name, p in pa.items() if not _same(p, pb.get(name, p))}


def _same(p: tuple[float, ...], q: tuple[float, ...]) -> bool:
    return len(p) == len(q) and all(x == y or (x != x and y != y) for x, y in zip(p, q, strict=True))


class _Spread(Watcher):
    """The second of :func:`measure`'s runs: each kept value against this run's."""

    def __init__(self, kept: dict[str, list[torch.Tensor | None]]) -> None:
        self.kept = kept
        self.floors: dict[str, list[Floor | None]] = {}

    def after(self, node: Node | None, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              out: Any, state: Any) -> None:
        kept = self.kept.get(node.name) if node is not None else None
        if kept is None or node is None:
            return
        floors: list[Floor | None] = []
        for a, b in zip(kept, outputs_of(out), strict=False):
            floors.append(_floor(a, b) if a is not None and b is not None else None)
        before = self.floors.get(node.name)
        if before is not None:  # an earlier run's spread: the largest stands
            floors = [f if g is None or f is not None and f.spread >= g.spread else g
                      for f, g in zip(floors, before, strict=False)]
        self.floors[node.name] = floors


def _floor(a: torch.Tensor, b: torch.Tensor) -> Floor:
    if a.shape != b.shape:
        return Floor(math.inf, 0.0, a.numel())
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    x, y = a.detach().double(), b.detach().double().to(a.device)
    d = torch.where(torch.isnan(x) & torch.isnan(y), 0.0, x - y)
    spread, norm = (float(v) for v in torch.stack([d.norm(), torch.nan_to_num(x).norm()]).tolist())
    return Floor(spread if spread == spread else math.inf, norm, a.numel())


def measure(run: Callable[[Watcher], Any], names: set[str], budget: int) -> dict[str, list[Floor | None]]:
    """The noise of each of ``names`` (node -> one :class:`Floor` per output): ``run(watcher)`` runs
    eager once, from the same RNG state each time; ``1 + SPREADS`` runs per chunk of ``budget`` bytes."""
    floors: dict[str, list[Floor | None]] = {}
    remaining = set(names)
    while remaining:
        keeper = Keeper(_wants(frozenset(remaining)), budget=budget)
        run(keeper)
        if not keeper.values:
            break
        spread = _Spread(keeper.values)
        for _ in range(SPREADS):
            run(spread)
        floors.update(spread.floors)
        remaining -= set(keeper.values)
        del keeper, spread
    return floors


def _wants(names: frozenset[str]) -> Callable[[Node], Want]:
    return lambda n: "new" if n.name in names else None


def apply(errors: dict[str, list[Error]], floors: dict[str, list[Floor | None]], rtol: float, atol: float) -> int:
    """Take each compared value's verdict again with its eager noise (see the module's docstring);
    its ``floor`` is the noise relative to its norm. How many values were beyond tolerance before
    and are not now."""
    cleared = 0
    for name, fl in floors.items():
        errs = errors.get(name)
        if not errs:
            continue
        for k, f in enumerate(fl):
            if f is not None and k < len(errs):
                cleared += retake(errs[k], f, rtol, atol)
    return cleared


def retake(e: Error, f: Floor, rtol: float, atol: float) -> bool:
    """One value's verdict taken again with its eager noise ``f``: ``e.floor`` set, ``e.exceeds``
    cleared where the distance is within tolerance plus :data:`NOISE` times the noise; True then."""
    if not e.comparable or f.spread == 0:
        return False
    e.floor = f.spread / f.norm if f.norm > 0 else math.inf
    if not e.exceeds or e.max_abs == math.inf and f.spread != math.inf:
        return False
    dist = e.rel_rms * f.norm if f.norm > 0 else math.inf
    if f.spread == math.inf or dist <= atol * math.sqrt(f.n) + rtol * f.norm + NOISE * f.spread:
        e.exceeds = False
        return True
    return False


def widest(kept: torch.Tensor, others: list[torch.Tensor]) -> Floor:
    """The noise of one value (``kept``) from several more runs' values of it: the largest spread."""
    return max((_floor(kept, o) for o in others), key=lambda f: f.spread)


def settle(errors: dict[str, list[Error]], first: Prints, second: Prints, run: Callable[[Watcher], Any],
           *, budget: int, rtol: float, atol: float) -> list[str]:
    """The whole of it: the ops whose fingerprints differ between the two runs, their noise
    measured and every verdict on them taken again; the notes to show."""
    names = differing(first, second)
    if not names:
        return []
    cleared = apply(errors, measure(run, names, budget), rtol, atol)
    return [f"{len(names)} op(s) gave other values in a second identical eager run (not reproducible): "
            f"each is beyond tolerance only past {NOISE:g}x its eager noise"
            + (f"; {cleared} value(s) within it" if cleared else "")]


__all__ = ["NOISE", "SPREADS", "Floor", "Prints", "apply", "differing", "measure", "retake", "settle", "widest"]
