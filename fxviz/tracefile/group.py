"""Group structured-trace events into a :class:`~fxviz.tracefile.records.Trace` (no torch).

The one grouping code path: :func:`fxviz.tracefile.read_trace` (a saved ``TORCH_TRACE`` directory)
and :func:`fxviz.tracefile.read_events` (the live events of a run) both hand each event, as torch's
header dict and its payload text plus where it came from, to :class:`Grouper`.
"""

from __future__ import annotations

import json
from typing import Any

from fxviz.tracefile.records import Artifact, Compile, Phase, Problem, Trace

#: Header keys torch adds around the event's own key (``trace_structured``'s reserved names).
CONTEXT_KEYS = frozenset({
    "rank", "compiled_autograd_id", "frame_id", "frame_compile_id", "attempt", "severity",
    "timestamp", "pathname", "thread", "subgraph_name", "has_payload", "stack",
})

#: At most this many problems are kept per file; the rest are counted in one last problem.
MAX_PROBLEMS_PER_FILE = 100

_Key = tuple[Any, Any, int, int, int]


def parse_compile_id(text: str) -> tuple[int | None, int, int, int] | None:
    """torch's compile id spelling (``0/1``, ``0/1_2``, ``!3/0/1``, ``!3``) as
    ``(compiled_autograd_id, frame_id, frame_compile_id, attempt)``; None when unreadable."""
    try:
        ca: int | None = None
        attempt = 0
        body = text
        if "_" in body:
            body, _, a = body.rpartition("_")
            attempt = int(a)
        if body.startswith("!"):
            parts = body[1:].split("/")
            ca = int(parts[0])
            if len(parts) == 1:
                return ca, -1, -1, attempt
            parts = parts[1:]
        else:
            parts = body.split("/")
        if len(parts) != 2:
            return None
        return ca, int(parts[0]), int(parts[1]), attempt
    except ValueError:
        return None


class Grouper:
    """Feed events with :meth:`add` (and unreadable lines with :meth:`problem`), then take the
    :class:`Trace` from :meth:`finish`. Compiles are keyed by (rank, compiled autograd id,
    frame id, frame compile id, attempt) in first-seen order."""

    def __init__(self) -> None:
        self.trace = Trace()
        self._compiles: dict[_Key, Compile] = {}
        # latest attempt seen of each compile id, for chromium events that name only "0/1"
        self._latest: dict[tuple[Any, Any, int, int], Compile] = {}
        # open "B" events: (compile id without the attempt, name) -> stack of (start, file, line):
        # a phase that spans a restart (entire_frame_compile) begins in attempt 0 and ends in the
        # last attempt, whose compile it is put on
        self._open: dict[tuple[Any, str], list[tuple[float, str, int]]] = {}
        self._file_problems: dict[str, int] = {}

    # -- problems ---------------------------------------------------------------------------
    def problem(self, file: str, line: int, what: str) -> None:
        n = self._file_problems.get(file, 0) + 1
        self._file_problems[file] = n
        if n <= MAX_PROBLEMS_PER_FILE:
            self.trace.problems.append(Problem(file, line, what))

    def problems_in(self, file: str) -> int:
        return self._file_problems.get(file, 0)

    def drop_problems(self, file: str) -> None:
        """Forget the problems of ``file`` (the caller replaces them by one, e.g. "not a trace")."""
        self.trace.problems = [p for p in self.trace.problems if p.file != file]
        self._file_problems.pop(file, None)

    # -- events -----------------------------------------------------------------------------
    def _compile(self, meta: dict[str, Any], ca: Any, fid: int, fcid: int, attempt: int) -> Compile:
        rank = meta.get("rank")
        key = (rank, ca, fid, fcid, attempt)
        c = self._compiles.get(key)
        if c is None:
            c = Compile(rank=rank, frame_id=fid, frame_compile_id=fcid, attempt=attempt,
                        compiled_autograd_id=ca)
            self._compiles[key] = c
            self.trace.compiles.append(c)
            self._latest[(rank, ca, fid, fcid)] = c
        return c

    def _compile_of(self, meta: dict[str, Any]) -> Compile | None:
        fid = meta.get("frame_id")
        ca = meta.get("compiled_autograd_id")
        if fid is None and ca is None:
            return None
        fcid = meta.get("frame_compile_id")
        return self._compile(meta, ca, -1 if fid is None else fid, -1 if fcid is None else fcid,
                             meta.get("attempt") or 0)

    def add(self, meta: dict[str, Any], payload: str | None, file: str, line: int) -> None:
        """One event: torch's header dict, its payload (None when it has none), where it was read."""
        if not meta:
            self.problem(file, line, "an empty trace header")
            return
        key = next(iter(meta))
        value = meta[key]
        if key == "chromium_event":
            self._chromium(meta, payload, file, line)
            return
        if key == "str":
            try:
                self.trace.strings[int(value[1])] = str(value[0])
            except (TypeError, ValueError, IndexError):
                self.problem(file, line, f"an interned string that is not [text, index]: {value!r}")
            return
        compile_ = self._compile_of(meta)
        if payload is None:
            if compile_ is None:
                self.trace.globals.append(Artifact(key, None, _meta(meta, key, value), file, line))
            else:
                compile_.events.append((key, value))
            return
        name = key
        data: Any = payload
        if key == "artifact" and isinstance(value, dict):
            name = str(value.get("name", "artifact"))
            if value.get("encoding") == "json":
                try:
                    data = json.loads(payload)
                except ValueError:
                    # torch writes a str payload verbatim whatever the encoding says (e.g.
                    # recompile_reasons); its md5 was checked, so it is what torch wrote: keep it
                    data = payload
        artifact = Artifact(name, data, _meta(meta, key, value), file, line)
        if compile_ is None:
            self.trace.globals.append(artifact)
        else:
            compile_.artifacts.append(artifact)

    def _chromium(self, meta: dict[str, Any], payload: str | None, file: str, line: int) -> None:
        try:
            ev: dict[str, Any] = json.loads(payload or "null")
            name, ph, ts = ev["name"], ev["ph"], float(ev["ts"]) / 1e6
        except (ValueError, TypeError, KeyError) as e:
            self.problem(file, line, f"a chromium event that is not a timed event ({e})")
            return
        compile_ = self._compile_of(meta)
        if compile_ is None:
            cid = (ev.get("args") or {}).get("compile_id")
            parsed = parse_compile_id(cid) if isinstance(cid, str) else None
            if parsed is not None:
                ca, fid, fcid, attempt = parsed
                compile_ = self._latest.get((meta.get("rank"), ca, fid, fcid))
                if compile_ is None:
                    compile_ = self._compile(meta, ca, fid, fcid, attempt)
        phases = self.trace.phases if compile_ is None else compile_.phases
        cid = None if compile_ is None else (compile_.rank, compile_.compiled_autograd_id,
                                             compile_.frame_id, compile_.frame_compile_id)
        if ph == "X":
            phases.append(Phase(name, ts, float(ev.get("dur", 0.0)) / 1e6))
        elif ph == "B":
            self._open.setdefault((cid, name), []).append((ts, file, line))
        elif ph == "E":
            stack = self._open.get((cid, name))
            if not stack:
                # torch logs some begin events before a live collector (or a trace file) starts
                # listening (the "dynamo" phase of a later compile): with no start, no phase
                return
            start = stack.pop()[0]
            phases.append(Phase(name, start, ts - start))
        # instant events ("i": cache hits and misses) repeat artifacts torch also logs; ignored

    def finish(self) -> Trace:
        unclosed: dict[str, list[tuple[int, str]]] = {}
        for (_, name), stack in self._open.items():
            for _start, file, line in stack:
                unclosed.setdefault(file, []).append((line, name))
        for file, where in unclosed.items():
            where.sort()
            names = ", ".join(n for _, n in where[:3]) + (", ..." if len(where) > 3 else "")
            self.problem(file, where[0][0], f"{len(where)} phase(s) begin here or below but never "
                         f"end (the trace stops inside them): {names}")
        self._open.clear()
        for file, n in self._file_problems.items():
            if n > MAX_PROBLEMS_PER_FILE:
                self.trace.problems.append(Problem(
                    file, 0, f"{n - MAX_PROBLEMS_PER_FILE} more unreadable lines not listed"))
        for c in self.trace.compiles:
            c.phases.sort(key=lambda p: p.start)
        self.trace.phases.sort(key=lambda p: p.start)
        return self.trace


def _meta(meta: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """An artifact's meta: the event's own dict, plus header fields beyond the compile id
    (``subgraph_name``, ``stack``...)."""
    out = dict(value) if isinstance(value, dict) else {key: value}
    for k, v in meta.items():
        if k != key and k in CONTEXT_KEYS and k not in _ID_KEYS:
            out.setdefault(k, v)
    return out


_ID_KEYS = frozenset({"rank", "compiled_autograd_id", "frame_id", "frame_compile_id", "attempt",
                      "has_payload"})
