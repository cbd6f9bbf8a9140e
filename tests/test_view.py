"""The palette every renderer shares (fxviz.render.view): red means an error and nothing else, the
families a user told apart least (conv and pool, the greys) differ clearly, and every colour
carries readable text."""

from __future__ import annotations

import itertools
import math

import pytest

from fxviz.render.view import CATEGORY_COLORS, ERROR_COLOR, KIND_COLORS, text_color


def _linear(c: float) -> float:
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def _rgb(color: str) -> tuple[float, float, float]:
    r, g, b = (_linear(int(color[i : i + 2], 16) / 255) for i in (1, 3, 5))
    return r, g, b


def lab(color: str) -> tuple[float, float, float]:
    """CIE L*a*b* (D65) of ``#rrggbb``."""
    r, g, b = _rgb(color)
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116

    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def delta_e(a: str, b: str) -> float:
    return math.dist(lab(a), lab(b))


def contrast(a: str, b: str) -> float:
    def lum(c: str) -> float:
        r, g, bl = _rgb(c)
        return 0.2126 * r + 0.7152 * g + 0.0722 * bl

    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_red_means_an_error_only() -> None:
    assert ERROR_COLOR not in KIND_COLORS.values()
    nearest = min(KIND_COLORS, key=lambda k: delta_e(KIND_COLORS[k], ERROR_COLOR))
    assert delta_e(KIND_COLORS[nearest], ERROR_COLOR) > 25, nearest
    # output and data-dependent are not red, and not like each other
    for a, b in (("output", "data-dependent"), ("output", "input")):
        assert delta_e(KIND_COLORS[a], KIND_COLORS[b]) > 25, (a, b)


@pytest.mark.parametrize(("a", "b"), [("conv", "pool"), ("shape", "other"), ("shape", "constant"),
                                      ("constant", "other"), ("creation", "other"), ("creation", "shape")])
def test_families_users_confused_are_apart(a: str, b: str) -> None:
    assert delta_e(KIND_COLORS[a], KIND_COLORS[b]) > 20, (a, b)


def test_no_two_families_look_alike() -> None:
    families = {k: c for k, c in KIND_COLORS.items() if k != "module"}
    closest = min(itertools.combinations(families, 2), key=lambda p: delta_e(families[p[0]], families[p[1]]))
    assert delta_e(families[closest[0]], families[closest[1]]) > 9, closest


@pytest.mark.parametrize("color", [*KIND_COLORS.values(), ERROR_COLOR, *CATEGORY_COLORS])
def test_every_colour_carries_readable_text(color: str) -> None:
    assert contrast(color, text_color(color)) >= 4.5
