"""The saved graph's JSON format, checked before the IR is built from it. No torch, no IR.

A graph file comes from anywhere: another fxviz version, a hand edit, a hostile upload. The reader
takes it as plain data and checks every field it or a renderer will read (types, names defined
before they are read, output indices in range, the pass results the renderers draw), so that a
graph that loads also renders; anything else is one :class:`~fxviz.errors.GraphFormatError` that
names the field or node and what was expected. No other exception escapes (:func:`parse` turns
JSON syntax errors, nesting too deep for the parser and undecodable bytes into it too), no check
recurses, and the work is linear in the size of the text.

:func:`check` returns the data normalised for :mod:`fxviz.ir` (stacks and references as tuples,
absent fields filled in), which builds its objects from it without looking again::

    >>> check({"schema": 1, "nodes": [{"name": "x", "kind": "input"}]})["nodes"][0]["inputs"]
    []
    >>> check({"schema": 1, "nodes": [{"name": "y", "kind": "op", "inputs": ["x"]}]})
    Traceback (most recent call last):
    fxviz.errors.GraphFormatError: graph JSON: node 'y' (nodes[0]) reads 'x', which no node defines

Strings with a lone surrogate (``"\\ud800"``, legal in JSON escapes, not a character) are refused
here rather than carried on: a surrogate cannot be encoded as UTF-8, so every writer downstream
(the HTML file, Graphviz, a terminal) would fail on it, and no capture produces one.
Numbers must be finite (``NaN`` is not JSON, and the report's browser parser rejects it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, NoReturn

from fxviz.errors import GraphFormatError
from fxviz.schema.annotations import (
    ANNOTATIONS,
    OVERLAY_KINDS,
    OVERLAY_REDUCES,
    OVERLAY_SCALES,
    _annotations,
    check_overlay,
)
from fxviz.schema.compact import Expander, _tables
from fxviz.schema.saved import phase, saved
from fxviz.schema.values import (
    MAX_INT,
    MAX_NESTING,
    MAX_STACK,
    MAX_STACK_CELLS,
    NODE_KINDS,
    READABLE_SCHEMAS,
    SCHEMA_VERSION,
    Where,
    _array,
    _fail,
    _int,
    _item,
    _node_at,
    _number,
    _object,
    _opt_text,
    _source,
    _text,
    check_value,
    show,
    source,
)

# ---- parts of a graph ----------------------------------------------------------------------------


def _meta(v: Any, where: Where) -> dict[str, Any]:
    d = _object(v, where)
    shape = _array(d.get("shape"), lambda: f"{where()} 'shape'")
    numel = 1
    for k, dim in enumerate(shape):
        if type(dim) is int and 0 <= dim <= MAX_INT:  # the common cases first, without a closure
            numel *= dim
        elif not (isinstance(dim, str) and dim and dim.isascii()):
            if isinstance(dim, str):
                _text(dim, _item(where, " 'shape'", k), empty=False)
            else:
                _int(dim, _item(where, " 'shape'", k, " (a size or a symbol such as 's0')"))
    if numel > MAX_INT:
        _fail(f"{where()} 'shape'", "at most 2**63 elements", list(shape))
    return {
        "shape": tuple(shape),
        "dtype": _opt_text(d, "dtype", where, None, empty=False) or _text(None, lambda: f"{where()} 'dtype'"),
        "device": _opt_text(d, "device", where),
        "value": _opt_text(d, "value", where, None),
    }


Stack = tuple[tuple[str, int], ...]


def stack_indexer(table: list[list[Any]]) -> Callable[[Stack], int]:
    """A function that gives a stack's index in ``table``, adding its levels on first sight: each
    level ``[parent index, path, call index]``, the path relative to the parent's (``.attn``) when it
    extends it. What :meth:`fxviz.ir.Graph.to_dict` writes as ``stacks``,
    read back by :func:`_stack_table`."""
    index: dict[Stack, int] = {}
    by_id: dict[int, tuple[Stack, int]] = {}  # stacks are shared tuples: skip the hash

    def of(stack: Stack) -> int:
        seen = by_id.get(id(stack))
        if seen is not None and seen[0] is stack:
            return seen[1]
        missing = []
        s = stack
        while s and s not in index:
            missing.append(s)
            s = s[:-1]
        parent = index[s] if s else -1
        for level in reversed(missing):
            outer = level[-2][0] if len(level) > 1 else ""
            path, call = level[-1]
            rel = "." + path[len(outer) + 1:] if outer and path.startswith(outer + ".") else path
            table.append([parent, rel, call])
            parent = index[level] = len(table) - 1
        by_id[id(stack)] = (stack, index[stack])
        return index[stack]

    return of


def _stack_table(v: Any, ex: Expander) -> list[Stack]:
    """The graph's table of call levels (``stacks``: ``[parent, path, call index]``, a path that
    starts with ``.`` relative to the parent's, ``[j, k, suffix]`` after level ``j``'s path), as
    the stack each level ends."""
    out: list[Stack] = []
    paths: list[str] = []
    cells = 0
    for k, entry in enumerate(_array(v, lambda: "'stacks'")):
        if not isinstance(entry, list) or len(entry) != 3:
            _fail(f"'stacks'[{k}]", "[parent index, module path, call index]", entry)
        parent, path, index = entry
        if type(parent) is not int or not -1 <= parent < k:
            _fail(f"'stacks'[{k}] parent", f"an index of an earlier level (-1 to {k - 1})", parent)
        outer = out[parent] if parent >= 0 else ()
        if isinstance(path, list):
            at = _item(lambda: "'stacks'", "", k, " module path")
            path = _text(ex.front(path, paths, at), at)
        elif isinstance(path, str) and path.startswith(".") and outer:
            path = outer[-1][0] + path
        if not (isinstance(path, str) and path and not path.startswith(".")):
            _fail(f"'stacks'[{k}] module path", "a non-empty string (a '.' first only below a parent)", path)
        if type(index) is not int or not 0 <= index <= MAX_INT:
            _fail(f"'stacks'[{k}] call index", "a non-negative integer", index)
        if len(outer) >= MAX_STACK:
            _fail(f"'stacks'[{k}]", f"at most {MAX_STACK} module calls", entry)
        cells += len(outer) + 1
        if cells > MAX_STACK_CELLS:
            raise GraphFormatError(f"graph JSON: the table of module stacks holds more than {MAX_STACK_CELLS:,} levels "
                                   "in all, more than fxviz draws")
        out.append((*outer, (path, index)))
        paths.append(path)
    return out


def _stack(v: Any, where: Where, stacks: dict[Stack, Stack], table: list[Stack] | None = None) -> Stack:
    """A module call stack: its levels, or 1 + an index in the graph's table (``0``: none);
    equal stacks are one tuple (as capture makes them: cheaper to keep, and passes cache per
    stack object)."""
    if type(v) is int:
        if not 0 <= v <= len(table or ()):
            _fail(where(), f"a stack (1 + an index of 'stacks', below {len(table or ()) + 1})", v)
        if v == 0:
            return ()
        stack = (table or [])[v - 1]
        return stacks.setdefault(stack, stack)
    levels = _array(v, where)
    if len(levels) > MAX_STACK:
        _fail(where(), f"at most {MAX_STACK} module calls", levels)
    out = []
    for k, level in enumerate(levels):
        if not isinstance(level, list | tuple) or len(level) != 2:
            _fail(f"{where()}[{k}]", "[module path, call index]", level)
        path, index = level
        if not (isinstance(path, str) and path and path.isascii()):  # the common case, without a closure
            _text(path, _item(where, "", k, " module path"), empty=False)
        if type(index) is not int or not 0 <= index <= MAX_INT:
            _int(index, _item(where, "", k, " call index"))
        out.append((path, index))
    stack = tuple(out)
    return stacks.setdefault(stack, stack)


def _node(
    d: Any, i: int, outputs_of: dict[str, int], later: Callable[[str], bool], stacks: dict[Stack, Stack],
    table: list[Stack] | None, names: list[str], ex: Expander,
) -> dict[str, Any]:
    """One node, checked against the nodes before it (``outputs_of``: name -> number of outputs;
    ``names``: their names in order, which ``[j, k, suffix]`` names and index references read)."""
    d = _object(d, lambda: f"nodes[{i}]")
    name = ex.front(d.get("name"), names, lambda: f"nodes[{i}] 'name'")
    if not (type(name) is str and name and name.isascii()):
        _text(name, lambda: f"nodes[{i}] 'name'", empty=False)

    def at() -> str:
        return _node_at(i, name)

    if name in outputs_of:
        raise GraphFormatError(f"graph JSON: duplicate node name {show(name)} (nodes[{i}]): names are unique")
    kind = d.get("kind")
    if not isinstance(kind, str) or kind not in NODE_KINDS:
        raise GraphFormatError(
            f"graph JSON: node {show(name)} has unknown kind {show(kind)}: expected one of {', '.join(NODE_KINDS)}"
        )
    inputs = []
    for k, r in enumerate(_array(d.get("inputs", []), lambda: f"{at()} 'inputs'")):
        if isinstance(r, list | tuple) and len(r) == 2:
            r, index = r[0], _int(r[1], _item(at, " 'inputs'", k, " output index"))
            if not isinstance(r, str | int) or isinstance(r, bool):
                _fail(f"{at()} 'inputs'[{k}]", "a node name or [node name, output index]", [r, index])
        else:
            index = 0
        if type(r) is int:
            if not 0 <= r < i:
                _fail(f"{at()} 'inputs'[{k}]", f"the index of an earlier node (0 to {i - 1})", r)
            src = names[r]
        elif isinstance(r, str):
            src = r
        else:
            _fail(f"{at()} 'inputs'[{k}]", "a node name or [node name, output index]", r)
        count = outputs_of.get(src)
        if count is None:
            _text(src, _item(at, " 'inputs'", k))
            if src == name or later(src):
                raise GraphFormatError(
                    f"graph JSON: node {show(name)} reads {show(src)} before it is defined "
                    "(nodes are listed in execution order, each after the nodes it reads)"
                )
            raise GraphFormatError(f"graph JSON: node {show(name)} (nodes[{i}]) reads {show(src)}, which no node defines")
        if count and index >= count:
            raise GraphFormatError(
                f"graph JSON: node {show(name)} reads output {index} of {show(src)}, which has {count}"
            )
        inputs.append((src, index))
    outputs = [
        _meta(m, _item(at, " 'outputs'", k))
        for k, m in enumerate(_array(d.get("outputs", []), lambda: f"{at()} 'outputs'"))
    ]
    attrs = _object(d.get("attrs", {}), lambda: f"{at()} 'attrs'")
    check_value(attrs, lambda: f"{at()} 'attrs'")
    stack = _stack(d.get("stack", []), lambda: f"{at()} 'stack'", stacks, table)
    if kind == "call" and (inputs or outputs or not stack):
        raise GraphFormatError(
            f"graph JSON: {at()} is a module call that ran no op: it has a module stack and no inputs or outputs"
        )
    outputs_of[name] = len(outputs)
    names.append(name)
    target = d.get("target")
    if isinstance(target, list):
        target = _text(ex.after(target, name, lambda: f"{at()} 'target'"), lambda: f"{at()} 'target'")
    else:
        target = _opt_text(d, "target", at)
    return {
        "name": name,
        "kind": kind,
        "target": target,
        "inputs": inputs,
        "stack": stack,
        "outputs": outputs,
        "source": _source(d.get("source"), lambda: f"{at()} 'source'"),
        "attrs": attrs,
        "error": _opt_text(d, "error", at, None),
        "phase": phase(d, at),
    }


def _attempt(d: Any, k: int) -> dict[str, Any]:
    def at() -> str:
        return f"attempts[{k}]"

    d = _object(d, at)
    ok = d.get("ok")
    if not isinstance(ok, bool):
        _fail(f"{at()} 'ok'", "true or false", ok)
    return {
        "method": _text(d.get("method"), lambda: f"{at()} 'method'"),
        "ok": ok,
        "seconds": _number(d.get("seconds", 0.0), lambda: f"{at()} 'seconds'"),
        "error_type": _opt_text(d, "error_type", at),
        "message": _opt_text(d, "message", at),
        "source": _source(d.get("source"), lambda: f"{at()} 'source'"),
        "skipped": _bool(d.get("skipped", False), lambda: f"{at()} 'skipped'"),
    }


def _assumption(d: Any, k: int) -> dict[str, Any]:
    def at() -> str:
        return f"assumptions[{k}]"

    d = _object(d, at)
    holds = d.get("holds")
    if holds is not None:
        _bool(holds, lambda: f"{at()} 'holds'")
    kind = d.get("kind", "guard")
    if kind not in ("guard", "assertion"):
        _fail(f"{at()} 'kind'", "'guard' or 'assertion'", kind)
    return {
        "expr": _text(d.get("expr"), lambda: f"{at()} 'expr'"),
        "source": _source(d.get("source"), lambda: f"{at()} 'source'"),
        "holds": holds,
        "kind": kind,
    }


def _bool(v: Any, where: Where) -> bool:
    if not isinstance(v, bool):
        _fail(where(), "true or false", v)
    return v


def _module(path: Any, d: Any) -> dict[str, str]:
    _text(path, lambda: "'modules' (a module path)")

    def at() -> str:
        return f"modules[{show(path)}]"

    d = _object(d, at)
    return {"cls": _text(d.get("cls"), lambda: f"{at()} 'cls'"), "qualname": _opt_text(d, "qualname", at)}


def _keyed_tables(v: Any, ex: Expander) -> Any:
    """The annotations with their tables keyed by module path as objects (schema 2 writes each as a
    list of ``[path, entry]``, :func:`fxviz.schema.compact.keyed`); what :func:`_annotations` checks."""
    return _tables(v, lambda t, where: ex.keyed(t, lambda: where))


# ---- the whole graph -----------------------------------------------------------------------------


def check(data: Any) -> dict[str, Any]:
    """Check a graph as plain data (``json.loads`` of a saved graph, or ``Graph.to_dict()``) and
    return it normalised for :mod:`fxviz.ir`; raise :class:`GraphFormatError` naming the first
    problem."""
    if not isinstance(data, dict):
        _fail("the document", "an object with 'schema' and 'nodes'", data)
    schema = data.get("schema")
    if type(schema) is not int or schema not in READABLE_SCHEMAS:
        raise GraphFormatError(
            f"graph JSON has schema {show(schema)}, this fxviz reads schemas "
            f"{', '.join(map(str, READABLE_SCHEMAS))}: re-capture the model with this version"
        )
    raw = _array(data.get("nodes", []), lambda: "'nodes'")
    outputs_of: dict[str, int] = {}
    names: set[str] | None = None

    def later(name: str) -> bool:  # only asked once, to word the error
        nonlocal names
        if names is None:
            names = {n["name"] for n in raw if isinstance(n, dict) and isinstance(n.get("name"), str)}
        return name in names

    stacks: dict[Stack, Stack] = {}
    ex = Expander()
    table = _stack_table(data["stacks"], ex) if "stacks" in data else None
    order: list[str] = []
    nodes = [_node(d, i, outputs_of, later, stacks, table, order, ex) for i, d in enumerate(raw)]
    cells = sum(len(s) * (len(s) + 1) // 2 for s in stacks)
    if cells > MAX_STACK_CELLS:
        raise GraphFormatError(
            f"graph JSON: {len(stacks)} distinct module stacks, up to {max(map(len, stacks))} levels deep, "
            f"are more than fxviz draws (the sum of their depths squared / 2 is capped at {MAX_STACK_CELLS:,}): "
            "real models nest tens of levels"
        )
    error = data.get("error")
    return {
        "name": _opt_text(data, "name", lambda: "graph"),
        "method": _opt_text(data, "method", lambda: "graph"),
        "nodes": nodes,
        "attempts": [_attempt(a, k) for k, a in enumerate(_array(data.get("attempts", []), lambda: "'attempts'"))],
        "modules": {p: _module(p, m) for p, m in _object(ex.keyed(data.get("modules", {}), lambda: "'modules'"),
                                                            lambda: "'modules'").items()},
        "annotations": _annotations(_keyed_tables(data.get("annotations", {}), ex)),
        "error": None if error is None else _text(error, lambda: "graph 'error'"),
        "assumptions": [
            _assumption(a, k) for k, a in enumerate(_array(data.get("assumptions", []), lambda: "'assumptions'"))
        ],
        "notes": [_text(t, _item(lambda: "", "'notes'", k))
                  for k, t in enumerate(_array(data.get("notes", []), lambda: "'notes'"))],
        "saved": saved(data.get("saved", []), outputs_of),
    }


def _reject_constant(name: str) -> NoReturn:
    raise GraphFormatError(f"graph JSON holds {name}, which JSON does not allow: numbers must be finite")


def _finite(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise GraphFormatError(f"graph JSON holds the number {text[:40]}, which is too large for a float")
    return v


def parse(text: str | bytes | bytearray) -> dict[str, Any]:
    """Parse graph JSON text and :func:`check` it. Every failure, a syntax error or nesting too
    deep for the parser included, is a :class:`GraphFormatError`."""
    if not isinstance(text, str | bytes | bytearray):
        raise GraphFormatError(f"graph JSON must be text, got {show(text)}")
    try:
        data = json.loads(text, parse_constant=_reject_constant, parse_float=_finite)
    except GraphFormatError:
        raise
    except RecursionError as e:
        raise GraphFormatError("graph JSON is nested too deeply to parse: a graph nests a few levels") from e
    except json.JSONDecodeError as e:
        raise GraphFormatError(
            f"graph JSON is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
        ) from e
    except (ValueError, TypeError) as e:  # undecodable bytes, an integer with too many digits
        raise GraphFormatError(f"graph JSON cannot be read: {show(str(e), 200)}") from e
    return check(data)


__all__ = ["ANNOTATIONS", "MAX_INT", "MAX_NESTING", "MAX_STACK", "MAX_STACK_CELLS", "NODE_KINDS", "OVERLAY_KINDS",
           "OVERLAY_REDUCES", "OVERLAY_SCALES", "READABLE_SCHEMAS", "SCHEMA_VERSION", "check", "check_overlay", "check_value", "parse",
           "show", "source", "stack_indexer"]
