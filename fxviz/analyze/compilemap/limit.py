"""Dynamo's recompile limit, read from torch's own record of the run. Needs torch.

When a function (a code object: a ``forward``, a resume function after a break) has been compiled
``torch._dynamo.config.recompile_limit`` times (8), Dynamo compiles it no more: on an input no
compiled version accepts, it runs the function eagerly, then and on every later such call (its
compiled versions still run where their guards hold), and says so only in a log warning, once.
Torch records the refused recompile as a failed compile: an entry of its compilation metrics
(``torch._dynamo.utils.get_compilation_metrics()``) whose ``fail_type`` is Dynamo's ``Unsupported``
and whose break type (the first line of ``fail_reason``, as ``format_graph_break_message`` writes
it) is, in torch's graph-break registry, ``GB0039`` (:func:`limit_refusal`: by the id, so that every
name torch has given the type counts), with the limit's name in the break's context (``Limit type:
recompile_limit``), the limit's value in the dynamo config torch recorded with it, the compile id
``frame/n`` of the refused compile and the guard that failed last (``recompile_reason``).

The later eager calls are in no record: the frame is run-only, so on a call no compiled version
accepts Dynamo's C++ frame evaluation runs it as it is, without calling its Python callback (no
compile, no metrics entry, no ``counters["frames"]["total"]``). What torch does say about each
such call is its guard-complete hook (``torch._C._dynamo.eval_frame.set_guard_complete_hook``,
called with whether a cached version accepted the call, for every frame that has one): a miss
after which no frame was handed to Dynamo's compiler is a run-only call that ran eagerly. The hook
does not say which function; while one function has hit its limit, it is that one.

:class:`LimitWatch` reads the entries each input set adds and the hook's misses; the compile id the
recorder keeps with each compiled graph names its Dynamo frame, so that the input sets in which a
limited function ran no compiled graph, or ran eagerly on some calls, are known (:func:`limits`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fxviz.analyze.compilemap.breaks import registry
from fxviz.analyze.compilemap.record import GuardFailRecord, Recording, compile_id, in_words, recompile_fails
from fxviz.analyze.compilemap.result import RecompileLimit
from fxviz.analyze.compilemap.shapes import rename

#: The id of Dynamo's break type for a refused recompile in torch's graph-break registry.
LIMIT_ID = "GB0039"
#: That type's name in torch 2.13 (formerly ``Dynamo cache limit exceeded``): what tests read torch's record by.
LIMIT_BREAK = "Dynamo recompile limit exceeded"
_LIMIT_TYPE = re.compile(r"Limit type: (\w+)")
_LIMIT_VALUE = re.compile(r"currently set to (\d+)")
_COMPILE_ID = re.compile(r"^\[?(\d+)/(\d+)")
#: a compile id's function: ``0`` of ``0/3``, ``!0/1`` of ``!0/1/0`` (a frame Dynamo compiled from
#: a compiled autograd graph; ``!0`` alone is the capture, no frame)
_CODE_KEY = re.compile(r"^\[?((?:!\d+/)?\d+)/\d+")


def limit_refusal(m: Any) -> tuple[str, int] | None:
    """``(setting, value)`` when compilation metrics entry ``m`` is a recompile Dynamo refused at
    its limit, else ``None``: a compile that raised Dynamo's ``Unsupported`` (``fail_type``) of the
    break type the registry files as :data:`LIMIT_ID`. The setting is the break's context (``Limit
    type: ...``, ``recompile_limit`` without one); its value the dynamo config torch recorded with
    the compile (``torch.compile(recompile_limit=)`` included), else as torch's explanation states it."""
    from torch._dynamo.exc import Unsupported

    if getattr(m, "fail_type", None) != Unsupported.__qualname__:
        return None
    text = str(getattr(m, "fail_reason", "") or "")
    if registry().get(text.split("\n", 1)[0].strip()) != LIMIT_ID:
        return None
    t = _LIMIT_TYPE.search(text)
    setting = t.group(1) if t else "recompile_limit"
    try:
        recorded = json.loads(getattr(m, "dynamo_config", None) or "{}").get(setting)
    except (TypeError, ValueError, AttributeError):
        recorded = None
    if isinstance(recorded, int):
        return setting, recorded
    v = _LIMIT_VALUE.search(text)
    return setting, int(v.group(1)) if v else int(getattr(torch._dynamo.config, setting, 0))


def _frame(compile_id: Any) -> int | None:
    m = _COMPILE_ID.match(str(compile_id or ""))
    return int(m.group(1)) if m else None


def _code_key(compile_id: Any) -> str | None:
    m = _CODE_KEY.match(str(compile_id or ""))
    return m.group(1) if m else None


def _metrics() -> list[Any]:
    from torch._dynamo.utils import get_compilation_metrics

    return get_compilation_metrics()


def _frames() -> Any:
    """Dynamo's frame counters: ``total`` counts the frames its callback was handed to convert (a
    compile, or a refusal)."""
    from torch._dynamo.utils import counters

    return counters["frames"]


@dataclass(slots=True)
class LimitHit:
    """Dynamo refused to recompile frame ``frame`` on input set ``input_set`` (the refused
    compile's id: ``compile_id``)."""

    input_set: int
    frame: int
    setting: str
    limit: int
    reason: str
    compile_id: str = ""
    func: str = "?"
    file: str = ""
    line: int = 0


class LimitWatch:
    """The recompile limits hit while each input set ran (:meth:`start` before it, :meth:`done`
    after), and the function each Dynamo frame compiled."""

    def __init__(self) -> None:
        self.hits: list[LimitHit] = []
        # a frame's compile id less its count (:func:`_code_key`) -> (function, file, first line)
        self.code: dict[str, tuple[str, str, int]] = {}
        #: torch's compile id -> its ``guard_count`` (compilation metrics: the frame's Guard objects)
        self.guard_counts: dict[str, int] = {}
        #: torch's compile id -> its ``graph_op_count`` (compilation metrics: the call nodes of its graph)
        self.op_counts: dict[str, int] = {}
        #: input set -> how many calls of a function Dynamo no longer compiles ran eagerly in it
        self.run_only: dict[int, int] = {}
        self._before: list[Any] = []
        self._missed: int | None = None  # Dynamo's frame count at the last miss, until the next call
        self._eager = 0
        self._prev: Any = None
        self._frames: Any = None
        self._hooked = False

    def start(self) -> None:
        from torch._C._dynamo.eval_frame import set_guard_complete_hook

        self._before = _metrics()  # held: their ids stay theirs while the set runs
        self._missed, self._eager = None, 0
        self._frames = _frames()
        self._prev, self._hooked = set_guard_complete_hook(self._guarded), True

    def _guarded(self, cache_hit: bool) -> bool:
        """Dynamo's guard-complete hook: called, once the guards of a frame with compiled versions
        are checked, with whether one accepted the call. A miss is compiled (Dynamo's callback
        counts the frame in ``counters["frames"]["total"]``) unless the frame is run-only, as a
        function past its recompile limit is: then it runs eagerly and torch counts nothing."""
        if self._prev is not None:
            cache_hit = bool(self._prev(cache_hit))
        self._settle()
        if not cache_hit:  # compiled now (Dynamo's callback counts the frame first) or run as it is
            self._missed = self._frames["total"]
        return cache_hit

    def _settle(self) -> None:
        """The last miss ran eagerly if no frame went to Dynamo's compiler since."""
        if self._missed is not None:
            self._eager += self._frames["total"] == self._missed
            self._missed = None

    def name_graphs(self, rec: Recording) -> None:
        """Each graph's function as torch's compilation metrics name its frame (``co_name``,
        ``co_filename``, ``co_firstlineno``: the function's first line, as tlparse and the
        recompiles show it), not its first op's line, a frame compiled from a compiled autograd
        graph (``!0/1/0``) as well; a graph of a frame torch recorded no metrics for keeps the
        function its ops' stack traces name."""
        for g in rec.graphs:
            key = _code_key(g.compile_id)
            if key is not None and key in self.code:
                g.func, g.file, g.line = self.code[key]
            g.torch_guard_count = self.guard_counts.get(g.compile_id)
            g.torch_op_count = self.op_counts.get(g.compile_id)

    def stop(self) -> None:
        """Put back the hook that was there (``done`` does; call it when a set raised)."""
        if self._hooked:
            from torch._C._dynamo.eval_frame import set_guard_complete_hook

            set_guard_complete_hook(self._prev)
            self._hooked = False

    def done(self, input_set: int) -> None:
        self.stop()
        self._settle()
        if self._eager:
            self.run_only[input_set] = self._eager
        seen = {id(m) for m in self._before}
        for m in _metrics():
            if id(m) in seen:
                continue
            key = _code_key(getattr(m, "compile_id", None))
            name = getattr(m, "co_name", None)
            if key is not None and name:
                self.code.setdefault(key, (name, getattr(m, "co_filename", "") or "",
                                           int(getattr(m, "co_firstlineno", 0) or 0)))
            count = getattr(m, "guard_count", None)
            if isinstance(count, int):
                self.guard_counts[compile_id(getattr(m, "compile_id", None))] = count
            ops = getattr(m, "graph_op_count", None)
            if isinstance(ops, int):
                self.op_counts[compile_id(getattr(m, "compile_id", None))] = ops
            frame = _frame(getattr(m, "compile_id", None))
            hit = limit_refusal(m) if frame is not None else None
            if frame is not None and hit is not None:
                why = re.sub(r"^\d+/\d+: ", "", str(getattr(m, "recompile_reason", "") or "").split("\n", 1)[0])
                self.hits.append(LimitHit(input_set, frame, *hit, in_words(why),
                                          compile_id(getattr(m, "compile_id", None))))
        self._before = []
        for h in self.hits:
            if h.func == "?" and str(h.frame) in self.code:
                h.func, h.file, h.line = self.code[str(h.frame)]


def limits(hits: Sequence[LimitHit], rec: Recording, input_sets: int,
           run_only: dict[int, int] | None = None) -> list[RecompileLimit]:
    """One :class:`RecompileLimit` per function that hit a limit: the input set of the hit and the
    later ones in which it ran no compiled graph, or ran eagerly on some calls (``run_only``: the
    calls per set that Dynamo's guard-complete hook saw miss every compiled version of a run-only
    function, told to a function while only one has hit its limit), and the guards that failed at
    each of its recompiles up to the refused one."""
    ran: set[tuple[int | None, int]] = {(_frame(rec.graphs[g].compile_id), k) for g, k in rec.runs}
    first = sorted({h.frame: h.input_set for h in reversed(hits)}.items(), key=lambda fk: fk[1])
    run_only = run_only or {}
    out: dict[int, RecompileLimit] = {}
    for h in hits:
        if h.frame in out:
            continue
        if h.func == "?":  # torch's record of the frame's compiles is gone: the guard that failed there
            f = next((f for f in rec.guard_fails if f.input_set == h.input_set), None)
            if f is not None:
                h.func, h.file, h.line = f.func, f.file, f.line
        # the refused call ran eagerly; so does a later call no compiled version accepts
        eager = [k for k in range(h.input_set, input_sets) if k == h.input_set or (h.frame, k) not in ran
                 or (k in run_only and [f for f, at in first if at <= k] == [h.frame])]
        fails = [f for f in recompile_fails(rec.guard_fails) if _of_frame(f, h) and f.input_set <= h.input_set]
        reasons = [f.reason for f in fails]
        aliases = next((g.aliases for g in reversed(rec.graphs) if (g.func, g.file) == (h.func, h.file)), {})
        h.reason = rename(h.reason, aliases)  # the user's input (input_ids), not a decorator's args[1]
        if h.reason and not (fails and (fails[-1].compile_id == h.compile_id or reasons[-1] == h.reason)):
            reasons.append(h.reason)
        out[h.frame] = RecompileLimit(h.input_set, h.func, h.file, h.line, h.setting, h.limit, eager, reasons,
                                      h.compile_id)
    return list(out.values())


def _of_frame(f: GuardFailRecord, h: LimitHit) -> bool:
    """Is ``f`` a guard failure of ``h``'s function: by its compile id's frame, else by the function."""
    return _frame(f.compile_id) == h.frame if f.compile_id else (f.func, f.file, f.line) == (h.func, h.file, h.line)


def refused(limits_: Sequence[RecompileLimit]) -> Callable[[GuardFailRecord], bool]:
    """Whether a recompile's guard failure is one a limit refused (nothing was compiled): by the
    refused compile's id; where torch gave none, by input set and function."""
    ids = {lim.compile_id for lim in limits_ if lim.compile_id}
    places = {(lim.input_set, lim.func, lim.file, lim.line) for lim in limits_}
    return lambda f: f.compile_id in ids if f.compile_id else (f.input_set, f.func, f.file, f.line) in places


__all__ = ["LIMIT_BREAK", "LIMIT_ID", "LimitHit", "LimitWatch", "limit_refusal", "limits", "refused"]
