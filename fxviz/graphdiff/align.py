"""The alignment at the heart of a comparison: a longest common subsequence of two sequences of
names that does not depend on which sequence comes first, so that ``diff(a, b)`` is ``diff(b, a)``
mirrored by construction. No torch.

    >>> align(["view", "linear", "relu"], ["linear", "contiguous", "relu"])
    [(1, 0), (2, 2)]
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

#: Past this many cells an exact alignment of one call's ops costs seconds: difflib takes over.
MAX_CELLS = 4_000_000


def align(xs: Sequence[str], ys: Sequence[str]) -> list[tuple[int, int]]:
    """Index pairs of a longest common subsequence of ``xs`` and ``ys``, in order.

    Symmetric: ``align(ys, xs)`` is the same pairs swapped. Equal prefixes and suffixes (most of a
    comparison of two captures of one model) are matched without the quadratic table; when the rest
    is beyond :data:`MAX_CELLS` cells, difflib's heuristic matcher takes over.
    """
    n, m = len(xs), len(ys)
    lo = 0
    while lo < n and lo < m and xs[lo] == ys[lo]:
        lo += 1
    hi = 0
    while hi < n - lo and hi < m - lo and xs[n - 1 - hi] == ys[m - 1 - hi]:
        hi += 1
    pairs = [(i, i) for i in range(lo)]
    a, b = xs[lo : n - hi], ys[lo : m - hi]
    if a and b:
        if len(a) * len(b) > MAX_CELLS:
            sm = difflib.SequenceMatcher(None, list(a), list(b), autojunk=False)
            for blk in sm.get_matching_blocks():
                pairs.extend((lo + blk.a + k, lo + blk.b + k) for k in range(blk.size))
        else:
            pairs.extend((lo + i, lo + j) for i, j in _lcs(a, b))
    pairs.extend((n - hi + k, m - hi + k) for k in range(hi))
    return pairs


def _lcs(a: Sequence[str], b: Sequence[str]) -> list[tuple[int, int]]:
    """Exact LCS; when skipping either element keeps the optimum, the smaller *name* is skipped,
    so the result does not depend on which sequence is ``a``."""
    n, m = len(a), len(b)
    table = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        row, below, ai = table[i], table[i + 1], a[i]
        for j in range(m - 1, -1, -1):
            if ai == b[j]:
                row[j] = below[j + 1] + 1
            else:
                r, d = row[j + 1], below[j]
                row[j] = r if r > d else d
    out: list[tuple[int, int]] = []
    i = j = 0
    while i < n and j < m:
        if a[i] == b[j]:
            out.append((i, j))
            i += 1
            j += 1
        elif table[i + 1][j] > table[i][j + 1] or (table[i + 1][j] == table[i][j + 1] and a[i] < b[j]):
            i += 1
        else:
            j += 1
    return out


__all__ = ["MAX_CELLS", "align"]
