"""Pass results in a saved graph's ``annotations``: those the renderers and replay read are checked
field by field (statistics, folded runs, overlays, panels, headline); any other is a free-form value."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from fxviz.schema.values import (
    MAX_INT,
    Where,
    _array,
    _at,
    _fail,
    _int,
    _number,
    _object,
    _source,
    _text,
    check_value,
    show,
)

# ---- annotations: pass results -------------------------------------------------------------------


def _fields(d: Any, where: str, fields: dict[str, Callable[[Any, Where], Any]]) -> None:
    """Check an annotation object: each known field, when present, with its checker; other fields
    as free-form values."""
    d = _object(d, lambda: where)
    for key, v in d.items():
        _text(key, lambda: f"{where} (a key)")
        fn = fields.get(key, check_value)
        fn(v, _at(lambda: where, f" {show(key)}"))


def _counts(v: Any, where: Where) -> None:
    for key, n in _object(v, where).items():
        _text(key, lambda: f"{where()} (a key)")
        _int(n, _at(where, f"[{show(key)}]"))


def _stats(v: Any, where: str) -> None:
    def modules(m: Any, at: Where) -> None:
        for path, s in _object(m, at).items():
            if type(path) is str and path.isascii() and type(s) is dict and all(
                type(k) is str and k.isascii() and type(x) is int and 0 <= x <= MAX_INT for k, x in s.items()
            ):
                continue  # the common case, {"params": 7087872, "ops": 31}, one per module
            _text(path, lambda: f"{at()} (a module path)")
            _fields(s, f"{at()}[{show(path)}]", {"params": _int, "ops": _int})

    _fields(v, where, {"total_params": _int, "total_ops": _int, "op_counts": _counts, "modules": modules})


def _fold(v: Any, where: str) -> None:
    def paths(p: Any, at: Where) -> None:
        if not _array(p, at):
            _fail(at(), "a non-empty list of module paths", p)
        for k, x in enumerate(p):
            _text(x, _at(at, f"[{k}]"))

    for k, run in enumerate(_array(v, lambda: where)):
        at = f"{where}[{k}]"
        run = _object(run, _at(lambda: where, f"[{k}]"))
        for key in ("paths", "label", "count"):
            if key not in run:
                _fail(at, f"a run with {show(key)}", run)
        _fields(run, at, {"paths": paths, "label": _text, "count": _int, "cls": _text, "parent": _text})


def _shapes(v: Any, where: str) -> None:
    def names(x: Any, at: Where) -> None:
        for k, name in enumerate(_array(x, at)):
            _text(name, _at(at, f"[{k}]"))

    _fields(v, where, {"missing": names})


def _failure(v: Any, where: str) -> None:
    def opt_text(x: Any, at: Where) -> None:
        if x is not None:
            _text(x, at)

    _fields(v, where, {"module": _text, "call": _int, "node": opt_text, "source": _source})


def _replay(v: Any, where: str) -> None:
    def flag(x: Any, at: Where) -> None:
        if not isinstance(x, bool):
            _fail(at(), "true or false", x)

    _fields(v, where, {"ok": flag, "reason": _text})


OVERLAY_KINDS = ("number", "category")
OVERLAY_SCALES = ("linear", "log")
#: How a box's value is made from its nodes' values where the overlay gives none.
OVERLAY_REDUCES = ("sum", "max", "min", "mean")
_COLOR = re.compile(r"#[0-9a-fA-F]{6}")


def check_overlay(name: Any, spec: Any, where: str) -> dict[str, Any]:
    """One overlay (:mod:`fxviz.passes.overlays`): ``kind`` ``number`` or ``category``; text
    ``label``, ``unit``, ``description``; ``scale`` and ``reduce`` from their lists; ``categories``
    key -> ``{"label", "color": "#rrggbb"}``; ``nodes`` (node name -> value) and ``modules`` (call
    id -> value), each value a finite number (number) or a string (category), or null."""
    at = f"{where}[{show(_text(name, lambda: f'{where} (a name)', empty=False))}]"
    d = _object(spec, lambda: at)
    kind = d.get("kind")
    allowed = {"kind": OVERLAY_KINDS, "scale": OVERLAY_SCALES, "reduce": (None, *OVERLAY_REDUCES)}
    for key, choices in allowed.items():
        if (key == "kind" or key in d) and d.get(key) not in choices:
            _fail(f"{at} {show(key)}", " or ".join(repr(c) for c in choices), d.get(key))
    for key in ("label", "unit", "description"):
        if key in d:
            _text(d[key], _at(lambda: at, f" {show(key)}"))

    def color(v: Any, w: Where) -> None:
        if v is not None and not (isinstance(v, str) and _COLOR.fullmatch(v)):
            _fail(w(), "a colour '#rrggbb' or null", v)

    for key, c in _object(d.get("categories", {}), lambda: f"{at} 'categories'").items():
        _text(key, lambda: f"{at} 'categories' (a key)")
        _fields(c, f"{at} 'categories'[{show(key)}]", {"label": _text, "color": color})
    for field in ("nodes", "modules"):
        _overlay_values(d.get(field, {}), f"{at} {show(field)}", kind == "number")
    for key, v in d.items():
        if key not in ("kind", "label", "unit", "description", "scale", "reduce", "categories", "nodes", "modules"):
            check_value(v, _at(lambda: at, f" {show(key)}"))
    return d


def _overlay_values(values: Any, at: str, number: bool) -> None:
    """Node name or call id -> a finite number (``number``) or a category string, or null."""
    d = _object(values, lambda: at)
    if _plain(d, number):
        return
    for key, v in d.items():
        if type(key) is str and key.isascii() and (  # the common cases first, without a closure
                v is None or (type(v) is str and not number and v.isascii())
                or (number and type(v) is int and abs(v) <= MAX_INT) or (number and type(v) is float and math.isfinite(v))):
            continue
        where_v = _at(lambda: at, f"[{show(key)}]")
        _text(key, where_v)
        if v is None:
            continue
        if not number:
            if not isinstance(v, str):
                _fail(where_v(), "a category (a string) or null", v)
            _text(v, where_v)
        elif type(v) is bool or not isinstance(v, int | float):
            _fail(where_v(), "a number or null", v)
        else:
            _number(v, where_v)


_INT, _FLOAT, _STR = frozenset({int}), frozenset({float}), frozenset({str})


def _plain(d: dict[Any, Any], number: bool) -> bool:
    """Whether every entry of ``d`` passes :func:`_overlay_values`' first test, checked in C (an
    overlay of a capture holds a value per op and per call: the loop was most of writing one):
    ASCII text keys, and values that are all ints within range, all finite floats or (a category)
    all ASCII text. Anything else is checked entry by entry."""
    if not d:
        return True
    if set(map(type, d)) != _STR or not all(map(str.isascii, d)):
        return False
    values = d.values()
    kinds = set(map(type, values))
    if not number:
        return kinds == _STR and all(map(str.isascii, values))
    if kinds == _INT:
        return max(values) <= MAX_INT and min(values) >= -MAX_INT
    return kinds == _FLOAT and all(map(math.isfinite, values))


def _overlays(v: Any, where: str) -> None:
    for name, spec in _object(v, lambda: where).items():
        check_overlay(name, spec, where)


def _const(text: str) -> Where:
    return lambda: text


#: A row may link to another page written beside the report (a pipeline's other stages): a bare
#: file name, so a saved graph cannot point a reader's browser anywhere else.
_SIBLING = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,200}\.html")

PANEL_LEVELS = ("error", "warn", "ok", "info")


def check_panel(name: Any, spec: Any, where: str) -> dict[str, Any]:
    """One panel (:mod:`fxviz.passes.panels`): text ``title`` and ``note``; ``columns``, a list of
    text; ``rows``, each ``{"cells": [text | number | null, ...] (one per column), "node": a node
    name or null, "module": a call id or null, "level": one of PANEL_LEVELS or null, "href": a
    sibling .html file or null, "sort": a number or null per cell, what the report sorts by}``."""
    at = f"{where}[{show(_text(name, _const(f'{where} (a name)'), empty=False))}]"
    d = _object(spec, lambda: at)
    for key in ("title", "note"):
        if key in d:
            _text(d[key], _at(lambda: at, f" {show(key)}"))
    columns = _array(d.get("columns", []), _const(f"{at} 'columns'"))
    for k, c in enumerate(columns):
        _text(c, _at(lambda: at, f" 'columns'[{k}]"))
    for k, row in enumerate(_array(d.get("rows", []), _const(f"{at} 'rows'"))):
        rat = f"{at} 'rows'[{k}]"
        row = _object(row, _const(rat))
        cells = _array(row.get("cells", []), _const(f"{rat} 'cells'"))
        if len(cells) != len(columns):
            _fail(f"{rat} 'cells'", f"{len(columns)} cells, one per column", cells)
        for j, v in enumerate(cells):
            if v is not None and not isinstance(v, str):
                if type(v) is bool or not isinstance(v, int | float):
                    _fail(f"{rat} 'cells'[{j}]", "text, a number or null", v)
                _number(v, _const(f"{rat} 'cells'[{j}]"))
            elif v is not None:
                _text(v, _const(f"{rat} 'cells'[{j}]"))
        for key in ("node", "module"):
            if row.get(key) is not None:
                _text(row[key], _const(f"{rat} {show(key)}"))
        if "sort" in row:
            keys = _array(row["sort"], _const(f"{rat} 'sort'"))
            if len(keys) != len(columns):
                _fail(f"{rat} 'sort'", f"{len(columns)} numbers or nulls, one per column", keys)
            for j, v in enumerate(keys):
                if v is not None and (type(v) is bool or not isinstance(v, int | float)):
                    _fail(f"{rat} 'sort'[{j}]", "a number or null", v)
                if v is not None:
                    _number(v, _const(f"{rat} 'sort'[{j}]"))
        href = row.get("href")
        if href is not None and not (isinstance(href, str) and _SIBLING.fullmatch(href)):
            _fail(f"{rat} 'href'", "the name of a sibling .html file (letters, digits, '.', '_', '-')", href)
        if row.get("level") not in (None, *PANEL_LEVELS):
            _fail(f"{rat} 'level'", " or ".join(repr(c) for c in PANEL_LEVELS) + " or null", row.get("level"))
    return d


def check_headline(spec: Any, where: str) -> dict[str, Any]:
    """An analysis's answer in words (:func:`fxviz.passes.panels.set_headline`): ``{"text": the
    sentence, "level": one of PANEL_LEVELS or null, "panel": the panel holding the facts behind it or
    null, "node": a node name or null, "module": a call id or null, "notes": the notes printed under
    it, a list of text (optional), "overlay": the overlay its report opens with or null}``."""
    d = _object(spec, lambda: where)
    _text(d.get("text"), _const(f"{where} 'text'"), empty=False)
    if d.get("notes") is not None:
        notes = d["notes"]
        if not isinstance(notes, list):
            _fail(f"{where} 'notes'", "a list of text", notes)
        for k, note in enumerate(notes):
            _text(note, _const(f"{where} 'notes'[{k}]"), empty=False)
    for key in ("panel", "node", "module", "overlay"):
        if d.get(key) is not None:
            _text(d[key], _const(f"{where} {show(key)}"))
    if d.get("level") not in (None, *PANEL_LEVELS):
        _fail(f"{where} 'level'", " or ".join(repr(c) for c in PANEL_LEVELS) + " or null", d.get("level"))
    return d


def _headline(v: Any, where: str) -> None:
    check_headline(v, where)


def _panels(v: Any, where: str) -> None:
    for name, spec in _object(v, lambda: where).items():
        check_panel(name, spec, where)


#: Pass results the renderers and replay read, by annotation name; any other annotation is kept
#: as a free-form value.
ANNOTATIONS: dict[str, Callable[[Any, str], None]] = {
    "stats": _stats, "fold": _fold, "shapes": _shapes, "failure": _failure, "replay": _replay,
    "overlays": _overlays, "panels": _panels, "headline": _headline,
}


def _annotations(v: Any) -> dict[str, Any]:
    d = _object(v, lambda: "'annotations'")
    for key, value in d.items():
        _text(key, lambda: "'annotations' (a key)")
        fn = ANNOTATIONS.get(key)
        if fn is not None:
            fn(value, f"annotation {show(key)}")
        else:
            check_value(value, _at(lambda: "annotation", f" {show(key)}"))
    return dict(d)
