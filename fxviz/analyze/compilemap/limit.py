"""Dynamo's recompile limit, read from torch's own record of the run. Needs torch.

When a function (a code object: a ``forward``, a resume function after a break) has been compiled
``torch._dynamo.config.recompile_limit`` times (8), Dynamo compiles it no more: on an input no
compiled version accepts, it runs the function eagerly, then and on every later call, and says so
only in a log warning. Torch records it as a failed compile: an entry of its compilation metrics
(``torch._dynamo.utils.get_compilation_metrics()``) whose ``fail_reason`` is the
``Dynamo recompile limit exceeded`` graph break (the same text it counts in
``counters["unimplemented"]``), with the limit's name and value, the compile id ``frame/attempt``
of the function and the guard that failed last (``recompile_reason``).

:class:`LimitWatch` reads the entries each input set adds; :class:`FramedRecorder` notes which
Dynamo frame each compiled graph belongs to, so that the input sets in which a limited function ran
no compiled graph are known (:func:`limits`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fxviz.analyze.compilemap.record import GuardFailRecord, Recorder, Recording, in_words
from fxviz.analyze.compilemap.result import RecompileLimit
from fxviz.analyze.compilemap.shapes import rename

#: Dynamo's break type for a refused recompile (its graph-break registry's ``gb0039``).
LIMIT_BREAK = "Dynamo recompile limit exceeded"
_LIMIT_TYPE = re.compile(r"Limit type: (\w+)")
_LIMIT_VALUE = re.compile(r"currently set to (\d+)")
_COMPILE_ID = re.compile(r"^\[?(\d+)/(\d+)")


def _frame(compile_id: Any) -> int | None:
    m = _COMPILE_ID.match(str(compile_id or ""))
    return int(m.group(1)) if m else None


def _metrics() -> list[Any]:
    from torch._dynamo.utils import get_compilation_metrics

    return get_compilation_metrics()


@dataclass(slots=True)
class LimitHit:
    """Dynamo refused to recompile frame ``frame`` on input set ``input_set``."""

    input_set: int
    frame: int
    setting: str
    limit: int
    reason: str
    func: str = "?"
    file: str = ""
    line: int = 0


class LimitWatch:
    """The recompile limits hit while each input set ran (:meth:`start` before it, :meth:`done`
    after), and the function each Dynamo frame compiled."""

    def __init__(self) -> None:
        self.hits: list[LimitHit] = []
        self.code: dict[int, tuple[str, str, int]] = {}  # frame -> (function, file, first line)
        self._before: list[Any] = []

    def start(self) -> None:
        self._before = _metrics()  # held: their ids stay theirs while the set runs

    def done(self, input_set: int) -> None:
        seen = {id(m) for m in self._before}
        for m in _metrics():
            if id(m) in seen:
                continue
            frame = _frame(getattr(m, "compile_id", None))
            if frame is None:
                continue
            name = getattr(m, "co_name", None)
            if name:
                self.code.setdefault(frame, (name, getattr(m, "co_filename", "") or "",
                                             int(getattr(m, "co_firstlineno", 0) or 0)))
            text = str(getattr(m, "fail_reason", "") or "")
            if text.startswith(LIMIT_BREAK):
                t, v = _LIMIT_TYPE.search(text), _LIMIT_VALUE.search(text)
                setting = t.group(1) if t else "recompile_limit"
                why = re.sub(r"^\d+/\d+: ", "", str(getattr(m, "recompile_reason", "") or "").split("\n", 1)[0])
                self.hits.append(LimitHit(input_set, frame, setting,
                                          int(v.group(1)) if v else int(getattr(torch._dynamo.config, setting, 0)),
                                          in_words(why)))
        self._before = []
        for h in self.hits:
            if h.func == "?" and h.frame in self.code:
                h.func, h.file, h.line = self.code[h.frame]


class FramedRecorder(Recorder):
    """The recording backend, also noting the Dynamo frame (``CompileContext``'s compile id) of
    each graph it is handed: ``frames[i]`` is ``rec.graphs[i]``'s."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.frames: list[int | None] = []

    def backend(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        from torch._guards import CompileContext

        frame = _frame(CompileContext.current_compile_id())
        out = super().backend(gm, example_inputs)
        self.frames += [None] * (len(self.rec.graphs) - len(self.frames) - 1) + [frame]
        return out


def limits(hits: Sequence[LimitHit], rec: Recording, frames: Sequence[int | None], input_sets: int) -> list[RecompileLimit]:
    """One :class:`RecompileLimit` per function that hit a limit: the input sets from the hit on in
    which it ran no compiled graph, and the guards that failed at its recompiles up to the refused
    one."""
    ran: set[tuple[int | None, int]] = {(frames[g] if g < len(frames) else None, k) for g, k in rec.runs}
    out: dict[int, RecompileLimit] = {}
    for h in hits:
        if h.frame in out:
            continue
        if h.func == "?":  # torch's record of the frame's compiles is gone: the guard that failed there
            f = next((f for f in rec.guard_fails if f.input_set == h.input_set), None)
            if f is not None:
                h.func, h.file, h.line = f.func, f.file, f.line
        eager = [k for k in range(h.input_set, input_sets) if (h.frame, k) not in ran]
        reasons = [f.reason for f in _first_fails(rec.guard_fails, h) if f.input_set <= h.input_set]
        aliases = next((g.aliases for g in reversed(rec.graphs) if (g.func, g.file) == (h.func, h.file)), {})
        h.reason = rename(h.reason, aliases)  # the user's input (input_ids), not a decorator's args[1]
        if h.reason and (not reasons or reasons[-1] != h.reason):
            reasons.append(h.reason)
        out[h.frame] = RecompileLimit(h.input_set, h.func, h.file, h.line, h.setting, h.limit, eager, reasons)
    return list(out.values())


def _first_fails(fails: Sequence[GuardFailRecord], h: LimitHit) -> list[GuardFailRecord]:
    """The first guard failure of ``h``'s function per input set (Dynamo checks its newest compiled
    version first: that is the recompile's reason)."""
    seen: set[int] = set()
    out = []
    for f in fails:
        if (f.func, f.file, f.line) == (h.func, h.file, h.line) and f.input_set not in seen:
            seen.add(f.input_set)
            out.append(f)
    return out


def refused(limits_: Sequence[RecompileLimit]) -> set[tuple[int, str, str, int]]:
    """(input set, function, file, line) of each recompile a limit refused: a guard failed there,
    but nothing was compiled."""
    return {(lim.input_set, lim.func, lim.file, lim.line) for lim in limits_}


__all__ = ["LIMIT_BREAK", "FramedRecorder", "LimitHit", "LimitWatch", "limits", "refused"]
