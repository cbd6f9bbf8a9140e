"""What a CLI target is, told apart without torch, and saved graphs read without it.

    g.json                    a graph written by ``fxviz json TARGET -o g.json`` (``-``: stdin)
    model.pt2                 a program written by ``torch.export.save``
    path/to/file.py:build     a factory in a file
    package.module:build      a factory in an importable module

A saved graph needs nothing but this module and the torch-free layers below it, so
``fxviz tree g.json`` runs where torch is not installed. :mod:`fxviz.targets.factory` (torch) does
the rest: it calls factories and loads ``.pt2`` files.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Literal

from fxviz.errors import GraphFormatError, TargetError
from fxviz.ir import Graph

#: Every capture method ``fxviz.capture(method=...)`` takes, without importing torch to ask it
#: (``fxviz.api.METHODS`` is the source; a test keeps the two equal).
METHODS: tuple[str, ...] = ("auto", "export", "export-strict", "export-decomposed", "fx", "eager", "eager-aten")

TargetKind = Literal["graph", "pt2", "factory"]

#: The largest tensor dimension (and element count) torch can index: int64.
MAX_SIZE = 2**63 - 1

_USAGE = (
    "give path/to/file.py:factory, package.module:factory, a saved graph (g.json, from "
    "fxviz json TARGET -o g.json) or a program saved by torch.export.save (model.pt2)"
)


@dataclass(frozen=True)
class TargetSpec:
    """A target as the user wrote it (``text``) and what it is: ``path`` is the file (``"-"`` for
    a graph on stdin), ``module`` the module of a factory given as ``package.module:factory``,
    ``attr`` the factory's name."""

    text: str
    kind: TargetKind
    path: str = ""
    module: str = ""
    attr: str = ""

    @property
    def captures(self) -> bool:
        """Whether the target runs a model (a factory) rather than naming a graph made before."""
        return self.kind == "factory"

    @property
    def what(self) -> str:
        return {"graph": "a saved graph", "pt2": "an exported program (.pt2)", "factory": "a factory"}[self.kind]


def recognise(text: str) -> TargetSpec:
    """Tell what ``text`` names, by its form (and, for a factory in a file, check the file is there).

        >>> recognise("runs/g.json").kind, recognise("m.py:build").path
        ('graph', 'm.py')
    """
    lower = text.lower()
    if text == "-" or lower.endswith(".json"):
        return TargetSpec(text, "graph", path=text)
    if lower.endswith(".pt2"):
        return TargetSpec(text, "pt2", path=text)
    spec, sep, attr = text.rpartition(":")
    if not sep or not spec or not attr:
        if os.path.isdir(text):
            raise TargetError(f"{text!r} is a directory: {_USAGE}")
        raise TargetError(f"target {text!r} is not one fxviz knows: {_USAGE}")
    if spec.endswith(".py") or os.sep in spec or "/" in spec:
        if os.path.isdir(spec):
            example = os.path.join(spec, "model.py")
            raise TargetError(
                f"{spec!r} is a directory: give the Python file that defines {attr!r} "
                f"({example}:{attr}) or its module (package.module:{attr})"
            )
        if not os.path.isfile(spec):
            raise TargetError(f"file {spec!r} does not exist")
        return TargetSpec(text, "factory", path=spec, attr=attr)
    return TargetSpec(text, "factory", module=spec, attr=attr)


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1,3,32,32"`` -> ``(1, 3, 32, 32)``; sizes must be positive and fit in a tensor (int64)."""
    parts = [p.strip() for p in text.split(",")]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        raise TargetError(f"--input-shape {text!r} is not a list of positive integers like 1,3,32,32")
    numel = 1
    for d in shape:
        numel *= d
    if numel > MAX_SIZE:
        too_big = next((d for d in shape if d > MAX_SIZE), None)
        what = f"size {too_big}" if too_big is not None else f"{numel} elements"
        raise TargetError(f"--input-shape {text!r}: {what} does not fit in a tensor (at most 2**63-1)")
    return shape


def read_graph(path: str) -> Graph:
    """The graph saved in ``path`` (``"-"``: standard input). A file that cannot be read is a
    :class:`TargetError`; one that is not a saved graph a :class:`GraphFormatError`, both naming
    the file."""
    name = "<stdin>" if path == "-" else repr(path)
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except FileNotFoundError as e:
        raise TargetError(f"saved graph {name} does not exist: write one with fxviz json TARGET -o {path}") from e
    except IsADirectoryError as e:
        raise TargetError(f"{name} is a directory, not a saved graph (fxviz json TARGET -o g.json)") from e
    except UnicodeDecodeError as e:
        raise GraphFormatError(f"{name} is not a saved graph: not UTF-8 text ({e.reason} at byte {e.start})") from e
    except OSError as e:
        raise TargetError(f"cannot read {name}: {e.strerror or e}") from e
    try:
        return Graph.from_json(text)
    except GraphFormatError as e:  # the one error the validating reader raises
        inner = _analysis_graph(text)
        if isinstance(inner, Graph):  # fxviz compile/numerics --json: the graph they wrote their findings on
            return inner
        if inner:
            raise GraphFormatError(f"{name} is {inner}") from e
        raise GraphFormatError(
            f"{name} is not a saved fxviz graph: {e} (write one with fxviz json TARGET -o FILE)"
        ) from e


def _analysis_graph(text: str) -> Graph | str | None:
    """The graph an analysis's JSON carries under ``graph`` (``fxviz compile --json``, ``fxviz
    numerics --json``), with the overlays, panels and headline it wrote on it; what a pass
    pipeline's JSON is and what to do instead; ``None`` for any other text."""
    import json

    try:
        d = json.loads(text)
    except ValueError:
        return None
    if not isinstance(d, dict) or "schema" in d:
        return None
    if isinstance(d.get("stages"), list) and "graph" not in d:
        return (f"fxviz passes' JSON, a pipeline of {len(d['stages'])} stages, not one graph: write a stage's "
                "report with fxviz passes TARGET --stage N --html FILE")
    return Graph.from_json(json.dumps(d["graph"])) if isinstance(d.get("graph"), dict) else None


__all__ = ["MAX_SIZE", "METHODS", "TargetKind", "TargetSpec", "parse_shape", "read_graph", "recognise"]
