"""Dynamic shapes and guards of a Dynamo graph, read from torch's own records of the frame that
compiled it (needs torch):

* every guard of the frame, from the ``Guard`` objects Dynamo hands to ``guard_export_fn`` once it
  has built its guard manager (``source: KIND``, and each symbolic-shape check the ShapeEnv issued as
  ``SHAPE_ENV: 5 <= L['x'].size()[0]``, the text ``dynamo_cpp_guards_str`` shows);
* the symbolic sizes (``s0``, ...) of the frame's ``ShapeEnv``: the input dimension each comes from
  (its source ``L['x'].size()[0]``), its value range, the size it was traced with, the constant it was
  specialised to, and the guards on it with the user line that installed each (the ShapeEnv keeps a
  location per guard, ``ShapeGuard.sloc``);
* a recompile's failed guard mapped to the input dimension and the guard that installed it.

The ShapeEnv writes a user line as ``code  # short/path.py:12 in forward`` (the path cut relative to
torch's install); :func:`resolve` finds the full path among the files the graph's stack traces name.
That line may be library code (``F.linear`` inside ``nn.Linear``): the recorder keeps the user's
stack at each location the ShapeEnv records (:meth:`~fxviz.analyze.compilemap.record.Recorder.guard_stacks`),
so a guard's line is the user's own line and the library line is kept as ``via``.
"""

from __future__ import annotations

import linecache
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from fxviz.analyze.compilemap.frames import library_of, own_frames
from fxviz.analyze.compilemap.result import ShapeGuard, Symbol

_USER_LOC = re.compile(r"^(?P<code>.*)  # (?P<file>\S+):(?P<line>\d+) in (?P<func>\S+)$")
_SIZE = re.compile(r"((?:L\['[^']+'\]|[A-Za-z_][\w.]*)(?:\[[^\]]+\])*)\.size\(\)\[(\d+)\]")
_LOCAL = re.compile(r"^L\['([^']+)'\]")
_STATE = ("L['self']", "._modules[", "._parameters[", "._buffers[")
_STATIC = re.compile(r"tensor '(.+)' size mismatch at index (\d+)\. expected (\d+), actual (\d+)")
_SPECIALISED_01 = "0/1 specialization"
_KINDS = {"SIZE": "size", "STRIDE": "stride", "STORAGE_OFFSET": "storage_offset"}  # TensorProperty -> Symbol.kind
_PIN = re.compile(r"^Eq\((?:[a-z]+\d+, -?\d+|-?\d+, [a-z]+\d+)\)$")
# a failed check that bounds one size (``2 <= S``, ``S <= 11``): the size is outside the graph's range
_BOUND = re.compile(r"^(?:-?\d+ <=? S|S <=? -?\d+|S >=? -?\d+|-?\d+ >=? S|-?\d+ <=? S <=? -?\d+)$")
_CHAIN = re.compile(r"^(-?\d+ <=?) (\S+) (<=? -?\d+)$")  # torch writes two bounds as one check: ``2 <= s <= 4``


def _name(source: Any) -> str:
    n = getattr(source, "name", "")
    return str(n() if callable(n) else n)


def input_name(source: str, aliases: Mapping[str, str] | None = None) -> str:
    """``x`` for the frame local ``L['x']``, ``args[1]`` for ``L['args'][1]`` (as Dynamo's guard
    failures name them); other sources as torch names them. ``aliases`` renames a frame local to the
    user's input it is (:func:`user_names`)."""
    m = _LOCAL.match(source)
    name = m.group(1) + source[m.end():] if m else source
    return (aliases or {}).get(name, name)


def user_names(gm: torch.fx.GraphModule, names: Mapping[int, str]) -> dict[str, str]:
    """``{frame local: the user's input}`` for the graph's inputs that are tensors the user passed,
    found by identity (``names``: ``id(tensor)`` -> its name in the model's signature). A forward
    behind a ``*args, **kwargs`` decorator (transformers' ``deprecate_kwarg``) has the locals
    ``args[1]`` and ``kwargs['x']``, which no user can ``mark_dynamic``: ``args[1]`` -> ``input_ids``."""
    out = {}
    for n in gm.graph.nodes:
        arg = n.meta.get("grapharg") if n.op == "placeholder" else None
        source = _name(getattr(arg, "source", None)) if arg is not None else ""
        if not source.startswith("L[") or any(p in source for p in _STATE):
            continue
        try:
            name = names.get(id(getattr(arg, "example", None)))
        except Exception:  # noqa: BLE001 - a freed example: keep torch's name
            name = None
        if name is not None and name != input_name(source):
            out[input_name(source)] = name
    return out


def rename(text: str, aliases: Mapping[str, str]) -> str:
    """``text`` (a guard) with each frame local of ``aliases`` written as the user's input:
    ``2 <= args[1].size()[1]`` -> ``2 <= input_ids.size()[1]``."""
    for local, name in aliases.items():
        text = re.sub(rf"(?<![\w\].]){re.escape(local)}(?![\w\[])", name, text)
    return text


def _int(v: Any) -> int | None:
    return int(v) if getattr(v, "is_Integer", False) or isinstance(v, int) else None


def every_guard(guards: Iterable[Any]) -> list[str]:
    """Every guard Dynamo installed for a frame, as ``source: KIND`` (``KIND`` alone for global
    state) with what the check compares where its kind takes an argument (``L['kwargs']:
    DICT_NOT_CONTAINS (key='scale')``: one guard per key, as torch's guard manager checks them), the
    ShapeEnv's checks one by one as ``SHAPE_ENV: <check>``; sorted, none left out."""
    out: set[str] = set()
    for g in guards:
        try:
            name, kind = str(g.name), str(g.create_fn_name())
        except Exception:  # noqa: BLE001 - a guard kind this torch version spells differently: keep its type
            name, kind = "", type(g).__name__
        if kind == "SHAPE_ENV":
            out.update(f"SHAPE_ENV: {code}" for code in (g.code_list or ()))
        else:
            out.add((f"{name}: {kind}" if name else kind) + _argument(getattr(g, "create_fn", None)))
    return sorted(out)


def _argument(fn: Any) -> str:
    """`` (key='scale')``: the arguments a guard's builder was bound to (``functools.partial``): a
    key or attribute name, a number, a source by its name (not the tensor a TENSOR_MATCH holds a
    reference to); ``""`` for a kind that takes none."""
    bound = [*(("", a) for a in getattr(fn, "args", None) or ()), *(getattr(fn, "keywords", None) or {}).items()]
    parts = []
    for k, v in bound:
        text = repr(v) if isinstance(v, (str, int, float, bool)) else _name(v) if hasattr(v, "guard_source") else ""
        if text:
            parts.append(f"{k}={text}" if k else text)
    return f" ({', '.join(parts)})" if parts else ""


def graph_inputs(gm: torch.fx.GraphModule, aliases: Mapping[str, str] | None = None) -> list[str]:
    """The graph's tensor inputs that are the frame's own locals (parameters and buffers left out,
    also when reached through ``args[0]``, the ``self`` of a decorated forward), with their shapes
    as traced: ``x: (s77, 8)`` (a symbol for a dynamic size)."""
    out = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        arg = n.meta.get("grapharg")
        source = _name(getattr(arg, "source", None)) if arg is not None else ""
        value = n.meta.get("example_value")
        if not source.startswith("L[") or any(p in source for p in _STATE) or not isinstance(value, torch.Tensor):
            continue
        out.append(f"{input_name(source, aliases)}: ({', '.join(str(d) for d in value.shape)}{',' if value.dim() == 1 else ''})")
    return out


def resolve(short: str, files: Iterable[str]) -> str:
    """The full path of a file the ShapeEnv names by a shortened path: a known file it ends."""
    if short.startswith("/"):
        return short
    for f in files:
        if f.endswith(short):
            return f
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None) or ""
        if f.endswith(short):
            return f
    return short


Stack = Sequence[tuple[str, int, str]]


def _loc(sloc: Any, stacks: Mapping[int, tuple[Any, Stack]], files: Sequence[str]) -> tuple[str, int, str, str, str]:
    """``(file, line, code, via, framework)`` of a ShapeEnv location: the user's line (the innermost
    frame of the user's own code in the stack recorded for it, ``stacks[id(sloc)]``); ``via`` the
    library line where the innermost frame is library code (``torch/nn/modules/linear.py:134``);
    ``framework`` torch's own note where torch installed the guard itself. Without a recorded stack,
    the line the ShapeEnv names."""
    floc = getattr(sloc, "framework_loc", None)
    framework = floc if isinstance(floc, str) else ""
    stack = stacks.get(id(sloc), (None, None))[1] if sloc is not None else None
    if stack:
        mine = own_frames([fr[0] for fr in stack])
        if mine:
            f, n, code = stack[mine[-1]]
            inner = stack[-1]
            via = f"{library_of(inner[0])}:{inner[1]}" if library_of(inner[0]) and mine[-1] != len(stack) - 1 else ""
            return f, n, code or linecache.getline(f, n).strip(), via, framework
    m = _USER_LOC.match(getattr(sloc, "maybe_user_loc", None) or "")
    if not m:
        return "", 0, "", "", framework
    return resolve(m.group("file"), files), int(m.group("line")), m.group("code").strip(), "", framework


def read_shape_env(env: Any, stacks: Mapping[int, tuple[Any, Stack]], files: Sequence[str],
                   aliases: Mapping[str, str] | None = None) -> tuple[list[Symbol], list[ShapeGuard]]:
    """The symbols of a frame's ShapeEnv that stand for its inputs' sizes, and its guards;
    ``stacks``: the user's stack at each ShapeEnv location (:meth:`Recorder.guard_stacks`), ``files``
    the files the graph's stack traces name, ``aliases`` the user's names of frame locals."""
    if env is None:
        return [], []
    guards = []
    for g in getattr(env, "guards", ()):
        file, line, code, via, framework = _loc(g.sloc, stacks, files)
        guards.append(ShapeGuard(str(g.expr), sorted(str(s) for s in g.expr.free_symbols), file, line, code,
                                 framework, via, _printed(g.expr)))
    symbols = []
    values = getattr(env, "backed_var_to_val", None) or getattr(env, "var_to_val", {})
    for s, sources in getattr(env, "var_to_sources", {}).items():
        if not sources:
            continue
        # every symbol torch created (its create_symbol records): an input's size, its stride or
        # storage offset (a non-contiguous view's, which its sizes do not give), or an int input
        src = sources[0]
        prop = getattr(getattr(src, "prop", None), "name", "")
        base = getattr(src, "base", None) if prop else None
        if prop and (base is None or prop not in _KINDS):
            continue
        r = env.var_to_range.get(s)
        spec = _int(env.replacements.get(s)) if s in getattr(env, "replacements", {}) else None
        lo_sloc = getattr(getattr(env, "var_to_range_sloc", {}).get(s), "lower", None)
        sym = Symbol(str(s), _name(src), input_name(_name(base if prop else src), aliases), getattr(src, "idx", None),
                     _int(r.lower) if r is not None else None, _int(r.upper) if r is not None else None,
                     _int(values.get(s)), spec,
                     zero_one=_SPECIALISED_01 in str(getattr(lo_sloc, "framework_loc", "") or ""),
                     kind=_KINDS.get(prop, "value"))
        on = [g for g in guards if sym.name in g.symbols and g.line]
        where = next((g for g in on if spec is not None and _pins(g.expr)), None) or next(iter(on), None)
        if where is not None:
            sym.file, sym.line, sym.code = where.file, where.line, where.code
        sym.advice = advice(sym, [g for g in on if not _pins(g.expr)])
        symbols.append(sym)
    return symbols, guards


def advice(sym: Symbol, branches: Sequence[ShapeGuard]) -> str:
    """Whether to ``torch._dynamo.mark_dynamic`` this dimension, and why: not a specialised one,
    and not to avoid the graph a guard from the user's code asks for. Nothing for a dimension that
    is dynamic and unguarded (any size in its range reuses the graph), or for a local Dynamo made
    (``___stack0`` of a resume function: the user cannot mark it)."""
    dim = f"{sym.input} dim {sym.dim}"
    if sym.input.startswith("___") or sym.kind != "size":  # mark_dynamic marks sizes only
        return ""
    if sym.specialised is not None:
        at = f" at {_short(sym.file)}:{sym.line} ({sym.code})" if sym.line else ""
        return (f"{dim} was specialised to {sym.specialised}{at}: leave it static "
                f"(torch._dynamo.mark_dynamic({sym.input}, {sym.dim}) would raise)")
    if branches:
        b = branches[0]
        return (f"{dim} is dynamic, but the guard {b.expr} from {_short(b.file)}:{b.line} holds it to one side: "
                "a size on the other side compiles another graph (mark_dynamic does not avoid that)")
    return ""


def framework_loc() -> Any:
    """The location a ShapeEnv names as ``framework_loc`` for a guard installed now: the first
    frame, from the caller out, outside torch's own files (what ``ShapeEnv._get_user_frame`` finds
    when nothing wraps ``_get_sloc``; a wrapper's own frame would be found instead)."""
    import traceback

    from torch.fx.experimental.symbolic_shapes import uninteresting_files

    skip = uninteresting_files()
    frame: Any = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename in skip:
        frame = frame.f_back
    return None if frame is None else traceback.FrameSummary(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


def _printed(expr: Any) -> str:
    """A ShapeEnv guard as Dynamo's guard code writes it, over the symbols: ``((s27 // 2) % 2) == 0``
    for ``Eq(Mod((s27//2), 2), 0)`` (a recompile's failed guard is that text over the inputs)."""
    try:
        from torch.utils._sympy.printers import PythonPrinter

        return str(PythonPrinter().doprint(expr))
    except Exception:  # noqa: BLE001 - another torch's printer: the guard is not matched by its text
        return ""


def _pins(expr: str) -> bool:
    """Whether a guard pins a symbol to a constant (``Eq(s27, 6)``: a specialisation), not a
    condition the code branched on (``Eq(Mod((s27//2), 2), 0)``)."""
    return _PIN.match(expr) is not None


def _short(file: str) -> str:
    return file.rsplit("/", 1)[-1]


def explain_fail(guard: str, symbols: Sequence[Symbol], guards: Sequence[ShapeGuard]) -> tuple[str, int | None, str, str]:
    """``(input, dim, words, advice)`` for a failed guard (Dynamo's text, ``0/0:`` cut), given the
    symbols and shape guards of the graph it failed on; ``words`` is ``""`` where the guard is not
    on an input's size. A check that bounds the size (``x.size()[1] <= 11``) says the size left the
    graph's range; any other (``((x.size()[1] // 2) % 2) == 0``, a branch on the size's parity) says
    the size fails that guard, whose user line is found among the graph's guards by its text."""
    m = _STATIC.search(guard)
    if m:
        name, dim = m.group(1), int(m.group(2))
        return name, dim, "", (f"torch._dynamo.mark_dynamic({name}, {dim}) before the first call (or dynamic=True) "
                               f"compiles one graph for every size of {name} dim {dim}")
    check = guard.split("  # ", 1)[0].strip()
    m = _SIZE.search(check)
    if not m:
        return "", None, "", ""
    name, dim = input_name(m.group(1)), int(m.group(2))
    sym = next((s for s in symbols if (s.kind, s.input, s.dim) == ("size", name, dim)), None)
    if sym is None:
        return name, dim, f"{name} dim {dim} failed the guard {check}", ""

    def symbol(size: re.Match[str]) -> str:
        of = next((s for s in symbols if (s.kind, s.input, s.dim) == ("size", input_name(size.group(1)), int(size.group(2)))), None)
        return of.name if of is not None else size.group(0)

    over = _SIZE.sub(symbol, check)  # the check over the symbols, as the graph's guards print
    chain = _CHAIN.match(over)
    texts = (over, f"{chain.group(1)} {chain.group(2)}", f"{chain.group(2)} {chain.group(3)}") if chain else (over,)
    failed = next((g for t in texts for g in guards if g.check and g.check == t and g.line), None)
    bound = _BOUND.match(_SIZE.sub("S", check)) is not None
    if bound:
        span = sym.text().split(" in ", 1)[-1]
        words = f"{name} dim {dim} ({sym.name}) is outside {span}, the range the graph was compiled for (guard {check}"
    else:
        words = f"{name} dim {dim} ({sym.name}) does not satisfy the guard {check} the graph was compiled under ("
    if failed is not None and failed.line:
        at = f"{_short(failed.file)}:{failed.line}"
        words += f"{', ' if bound else ''}from {failed.code} at {at})"
        return name, dim, words, (f"mark_dynamic does not avoid this recompile: the code branches on {name} dim {dim} "
                                  f"at {at}; make it size-independent (torch.cond) to keep one graph")
    words = words + ")" if bound else words.removesuffix(" (")
    if sym.zero_one and over == f"2 <= {sym.name}":
        return name, dim, words, (f"a size of 0 or 1 compiles its own graph (0/1 specialisation): "
                                  f"torch._dynamo.mark_unbacked({name}, {dim}) avoids it only where no code branches on "
                                  f"that size (a branch on it, as transformers' causal-mask check does, breaks the graph "
                                  f"instead)")
    return name, dim, words, ""


__all__ = ["advice", "every_guard", "explain_fail", "framework_loc", "graph_inputs", "input_name", "read_shape_env", "rename", "resolve",
           "user_names"]
