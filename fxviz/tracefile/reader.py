"""Read a saved structured trace (``TORCH_TRACE=DIR``) or a live run's events into a Trace (no torch).

A trace file is a stream of events. Each starts with a line: an optional rank prefix
(``[rank0]:``), a glog prefix (``V1125 21:22:29.318000 11594 torch/_logging/_internal.py:1328] ``)
and a JSON header; when the header has ``has_payload`` (the payload's md5), the lines that follow and
start with a tab are the payload (one tab stripped from each, joined with newlines).

The file is read in large binary chunks cut at event boundaries; within a chunk events are found with
``str.find`` and the payload is taken in one slice (``"\\n\\t"`` -> ``"\\n"``), so a payload's lines
are never handled one by one. Nothing stops the read: an unreadable line, a bad header, a payload cut
short becomes a :class:`~fxviz.tracefile.records.Problem` with its file and line, and the rest is kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fxviz.tracefile.errors import TraceFileError
from fxviz.tracefile.group import Grouper
from fxviz.tracefile.records import Trace

#: Bytes read at a time (cut at the last event boundary in it).
CHUNK = 32 << 20

_PREFIX = re.compile(r"(?:\[rank(\d+)\]:)?[VIWEC]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\]\n]*\] ")
_NOT_PAYLOAD = re.compile(r"\n(?!\t)")
_HINT = ("run the program with TORCH_TRACE=DIR (torch's structured trace) and pass that directory "
         "or one of its files")


def read_events(events: Iterable[tuple[dict[str, Any], str | None]], *,
                file: str = "<live run>") -> Trace:
    """The :class:`Trace` of a live run's events (``(header, payload)``, as collected by
    :func:`fxviz.torchbridge.tracelog.structured_trace`). A problem names ``file`` and the event's
    1-based index as its line."""
    grouper = Grouper()
    for i, (meta, payload) in enumerate(events, 1):
        if not isinstance(meta, dict):
            grouper.problem(file, i, f"an event whose header is not a dict: {type(meta).__name__}")
            continue
        grouper.add(meta, payload, file, i)
    trace = grouper.finish()
    trace.files.append(file)
    return trace


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """The :class:`Trace` of a saved structured trace: a directory (every rank's file in it) or one
    file. Raises :class:`TraceFileError` when the path is missing or holds no trace lines at all;
    every other defect is a problem in ``Trace.problems`` and the rest is read."""
    p = Path(path)
    if not p.exists():
        raise TraceFileError(f"{p}: no such file or directory; {_HINT}")
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and not f.name.startswith("."))
        logs = [f for f in files if f.suffix == ".log"]
        files = logs or files
        if not files:
            raise TraceFileError(f"{p}: the directory is empty; {_HINT}")
    else:
        files = [p]
    grouper = Grouper()
    events = 0
    for f in files:
        n = _read_file(f, grouper)
        events += n
        grouper.trace.files.append(str(f))
    if not events:
        where = str(p) if len(files) == 1 else f"{p} ({len(files)} files)"
        first = grouper.trace.problems[0] if grouper.trace.problems else None
        why = f" (first: {first})" if first else ""
        raise TraceFileError(f"{where}: no structured-trace lines found{why}; {_HINT}")
    return grouper.finish()


def _read_file(path: Path, grouper: Grouper) -> int:
    """Read one file's events into ``grouper``; the number of events read."""
    name = str(path)
    scan = _Scanner(name, grouper)
    try:
        _scan_file(path, scan)
    except OSError as e:
        grouper.problem(name, 0, f"cannot be read ({e.strerror or e})")
    if scan.events == 0 and scan.lines > 0:
        grouper.drop_problems(name)
        grouper.problem(name, 1, "not a structured trace file: no line has torch's trace format")
    return scan.events


def _scan_file(path: Path, scan: _Scanner) -> None:
    with open(path, "rb") as fh:
        pending: list[bytes] = []
        while True:
            chunk = fh.read(CHUNK)
            if not chunk:
                break
            cut = _last_boundary(chunk)
            if cut < 0:
                pending.append(chunk)
                continue
            head = memoryview(chunk)[:cut]  # decoded without a copy of the bytes
            data = b"".join([*pending, head]) if pending else head
            scan.text(str(data, "utf-8", "replace"), final=False)
            del head, data
            pending = [chunk[cut:]]
        if pending:
            scan.text(b"".join(pending).decode("utf-8", "replace"), final=True)


def _last_boundary(chunk: bytes) -> int:
    """The offset just past the last newline in ``chunk`` that starts a new event (the next byte is
    known and is not a tab); -1 when there is none."""
    end = len(chunk) - 1
    while True:
        i = chunk.rfind(b"\n", 0, end)
        if i < 0:
            return -1
        if chunk[i + 1] != 9:
            return i + 1
        end = i


class _Scanner:
    """Finds events in successive pieces of one file's text (each piece ends at an event boundary
    or at the end of the file) and hands them to the grouper."""

    def __init__(self, file: str, grouper: Grouper) -> None:
        self.file = file
        self.grouper = grouper
        self.line = 1  # the line number of the start of the next piece
        self.events = 0
        self.lines = 0

    def text(self, text: str, *, final: bool) -> None:
        file, grouper, add = self.file, self.grouper, self.grouper.add
        line = self.line
        pos, n = 0, len(text)
        if final and text.endswith("\n"):
            n -= 1  # the newline ending the last line does not start another one
        while pos < n:
            eol = text.find("\n", pos, n)
            if eol < 0:
                eol = n
            self.lines += 1
            if text.startswith("\t", pos):
                stop = self._payload_end(text, pos, n)
                count = text.count("\n", pos, stop) + 1
                grouper.problem(file, line, f"{count} payload line(s) with no event header before "
                                "them (a line above was not a trace line)")
                line += count
                pos = stop + 1
                continue
            m = _PREFIX.match(text, pos, eol)
            if m is None:
                grouper.problem(file, line, f"not a structured-trace line: {_clip(text[pos:eol])}")
                line += 1
                pos = eol + 1
                continue
            header_line = line
            payload_text: str | None = None
            if eol < n and text.startswith("\t", eol + 1):
                stop = self._payload_end(text, eol + 1, n)
                payload_text = text[eol + 2:stop].replace("\n\t", "\n")
                line += text.count("\n", eol + 1, stop) + 1
                next_pos = stop + 1
            else:
                next_pos = eol + 1
            line += 1
            pos = next_pos
            try:
                meta = json.loads(text[m.end():eol])
            except ValueError as e:
                grouper.problem(file, header_line, f"the event header is not valid JSON ({e})")
                continue
            if not isinstance(meta, dict):
                grouper.problem(file, header_line, "the event header is not a JSON object")
                continue
            self.events += 1
            if m.group(1) is not None and "rank" not in meta:
                meta["rank"] = int(m.group(1))
            digest = meta.get("has_payload")
            if digest is None:
                if payload_text is not None:
                    grouper.problem(file, header_line + 1, "payload lines after an event that has "
                                    "none; they are left out")
                add(meta, None, file, header_line)
                continue
            if payload_text is None:
                grouper.problem(file, header_line, f"the payload of {_name(meta)} is missing "
                                "(the trace is cut short); the event is left out")
                continue
            at_end = final and next_pos >= n
            if (at_end or CHECK_MD5) and isinstance(digest, str) and hashlib.md5(
                    payload_text.encode("utf-8", "surrogatepass")).hexdigest() != digest:
                why = ("the file ends inside it" if at_end else "its md5 differs from the header's")
                grouper.problem(file, header_line, f"the payload of {_name(meta)} is cut short "
                                f"({why}); the event is left out")
                continue
            add(meta, payload_text, file, header_line)
        self.line = line

    @staticmethod
    def _payload_end(text: str, start: int, n: int) -> int:
        """The offset of the newline ending the payload block that starts at ``start`` (or n)."""
        m = _NOT_PAYLOAD.search(text, start, n)
        return n if m is None else m.start()


#: Check every payload's md5 against its header (the last payload of each file is always checked:
#: that is where a trace is cut short).
CHECK_MD5 = True


def _clip(s: str, n: int = 80) -> str:
    s = s.strip()
    return repr(s if len(s) <= n else s[:n] + "...")


def _name(meta: dict[str, Any]) -> str:
    key = next(iter(meta), "?")
    value = meta.get(key)
    if key == "artifact" and isinstance(value, dict):
        return repr(value.get("name", key))
    return repr(key)
