"""torch's structured trace of a live run, as the events a saved ``TORCH_TRACE`` directory holds.

:func:`structured_trace` listens on torch's own structured-trace logger (``torch.__trace``, what
``TORCH_TRACE=DIR`` writes to files) for the duration of a ``with`` block, with Inductor's provenance
tracking on, and collects each event as ``(metadata, payload)``: the JSON header torch would write
and the payload text. :func:`fxviz.tracefile.read_events` reads them exactly as it reads a saved
directory, so a live run and someone else's trace go through one reader.

Inductor's fusion decisions are not in the structured trace: its scheduler logs them on the
``fusion`` artifact logger (``torch._inductor.scheduler.fusion_log``; ``TORCH_LOGS=fusion``), a
refusal as a ``WhyNoFuse`` record (``cannot fuse op0 with op1: exceeds max fusion``), a fusion as
``fusing op0 with op1``. With ``fusion`` on, a handler on that logger (its level DEBUG for the
block, then put back) turns each into one :data:`~fxviz.tracefile.records.FUSION_LOG` event in the
same list, stamped with the compile id torch's own events of that moment carry; a refusal carries
the post-grad nodes of both scheduler nodes (their operations' origin nodes) and the buffers they
write (the names the output code uses), read from the graph Inductor is lowering.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any

from fxviz.tracefile.records import FUSION_LOG

#: One structured-trace event: torch's header dict and its payload (``None`` when it has none).
Event = tuple[dict[str, Any], str | None]


class _Collect(logging.Handler):
    def __init__(self, events: list[Event]) -> None:
        super().__init__(logging.DEBUG)
        self.events = events

    def emit(self, record: logging.LogRecord) -> None:
        meta = getattr(record, "metadata", None)
        if isinstance(meta, dict):
            self.events.append((meta, getattr(record, "payload", None)))


class _Decisions(logging.Handler):
    """Each fusion decision of Inductor's fusion logger as a :data:`FUSION_LOG` event: a
    ``WhyNoFuse`` record (once per compile, graph, pair and reason: the scheduler asks again in later
    rounds) and each ``fusing X with Y``."""

    def __init__(self, events: list[Event]) -> None:
        super().__init__(logging.DEBUG)
        self.events = events
        self.seen: set[tuple[Any, ...]] = set()

    def emit(self, record: logging.LogRecord) -> None:
        why = record.msg
        first, second = getattr(why, "name1", None), getattr(why, "name2", None)
        decision = "refused"
        if why == "fusing %s with %s" and isinstance(record.args, tuple) and len(record.args) == 2:
            first, second = record.args
            decision = "fused"
        if not isinstance(first, str) or not isinstance(second, str):
            return  # the logger's other messages: rounds, candidates, benchmarks
        with contextlib.suppress(Exception):  # never break torch's compile over a log record
            self._add(decision, why, first, second)

    def _add(self, decision: str, why: Any, first: str, second: str) -> None:
        from torch._guards import CompileContext
        from torch._inductor.virtualized import V

        graph = V.graph
        part = ("backward" if getattr(graph, "is_backward", False) else
                "inference" if getattr(graph, "is_inference", False) else "forward")
        meta: dict[str, Any] = {"artifact": {"name": FUSION_LOG, "encoding": "json"}}
        trace_id = CompileContext.current_trace_id()
        if trace_id is not None:
            cid = trace_id.compile_id
            if cid.compiled_autograd_id is not None:
                meta["compiled_autograd_id"] = cid.compiled_autograd_id
            if cid.frame_id is not None:
                meta["frame_id"] = cid.frame_id
            if cid.frame_compile_id is not None:
                meta["frame_compile_id"] = cid.frame_compile_id
            meta["attempt"] = trace_id.attempt
        ops = getattr(graph, "name_to_op", {})
        first_names, second_names = _operations(first, ops), _operations(second, ops)
        payload: dict[str, Any] = {"decision": decision, "part": part, "first": first, "second": second,
                                   "first_names": first_names, "second_names": second_names}
        if decision == "refused":
            text = str(why)
            head = f"cannot fuse {first} with {second}: "
            reason = text[len(head):] if text.startswith(head) else text
            key = (meta.get("compiled_autograd_id"), meta.get("frame_id"), meta.get("frame_compile_id"),
                   meta.get("attempt"), id(graph), first, second, reason)
            if key in self.seen:
                return
            self.seen.add(key)
            payload |= {"reason": reason, "first_ops": _origins(first_names, ops),
                        "second_ops": _origins(second_names, ops), "first_buffers": _buffers(first_names, ops),
                        "second_buffers": _buffers(second_names, ops)}
        meta["has_payload"] = ""
        self.events.append((meta, json.dumps(payload)))


def _operations(name: str, ops: dict[str, Any]) -> list[str]:
    """The Inductor operations of scheduler node ``name``: a fused node's name is its operations'
    names joined by ``_`` (``op3_op4``; a subgraph's operations are prefixed with its name)."""
    out: list[str] = []
    token = ""
    for part in name.split("_"):
        token = f"{token}_{part}" if token else part
        if token in ops:
            out.append(token)
            token = ""
    return out


def _origins(names: list[str], ops: dict[str, Any]) -> list[str]:
    """The post-grad nodes Inductor operations ``names`` compute: each one's origin node (all its
    origins where it has none)."""
    out: list[str] = []
    for name in names:
        op = ops[name]
        node = getattr(op, "origin_node", None)
        found = [node] if node is not None else list(getattr(op, "origins", ()) or ())
        for n in found:
            n_name = getattr(n, "name", None)
            if isinstance(n_name, str) and n_name not in out:
                out.append(n_name)
    return out


def _buffers(names: list[str], ops: dict[str, Any]) -> list[str]:
    """The buffers Inductor operations ``names`` write (``buf3``: the names the output code uses)."""
    out: list[str] = []
    for name in names:
        for buf in ops[name].get_outputs():
            b = buf.get_name()
            if isinstance(b, str) and b not in out:
                out.append(b)
    return out


@contextlib.contextmanager
def structured_trace(*, provenance: bool = True, fusion: bool = False) -> Iterator[list[Event]]:
    """Collect torch's structured-trace events while the block runs (and Inductor's provenance
    tracking, ``torch._inductor.config.trace.provenance_tracking_level = 1``, when ``provenance``,
    with the summaries of the scheduler's communication passes, which torch logs only under
    ``torch._inductor.config_comms.reorder_sink_verbose_logging``; and Inductor's fusion decisions as :data:`~fxviz.tracefile.records.FUSION_LOG` events when
    ``fusion``). The list fills as torch logs; a ``TORCH_TRACE`` the user set keeps writing its
    files, and a ``TORCH_LOGS=fusion`` the user set keeps printing."""
    from torch._inductor import config as inductor_config
    from torch._inductor import config_comms
    from torch._logging._internal import trace_log

    events: list[Event] = []
    handler = _Collect(events)
    level = trace_log.level
    patch = (inductor_config.patch({"trace.provenance_tracking_level": 1}) if provenance
             else contextlib.nullcontext())
    comms = (config_comms.patch({"reorder_sink_verbose_logging": True}) if provenance  # type: ignore[attr-defined]
             else contextlib.nullcontext())
    # first in line: torch's own lazy file handler (TORCH_TRACE unset) removes itself from the list
    # while the first event is logged, and the handler after it in the list would miss that event
    trace_log.handlers.insert(0, handler)
    if not trace_log.isEnabledFor(logging.DEBUG):
        trace_log.setLevel(logging.DEBUG)
    try:
        with patch, comms, (_fresh_handles() if provenance else contextlib.nullcontext()), \
                (_fusion_log(events) if fusion else contextlib.nullcontext()):
            yield events
    finally:
        trace_log.removeHandler(handler)
        trace_log.setLevel(level)


@contextlib.contextmanager
def _fresh_handles() -> Iterator[None]:
    """Inductor's provenance debug handles (``extern_kernels.mm:4``) counted from 0 for the block, as
    in a fresh process, then put back: torch resets the counter around a forward's compile only, so
    a backward's handles (compiled later, lazily) go on from whatever compiled before in the process,
    and would differ from those of the same program's ``TORCH_TRACE``."""
    from torch._inductor import debug

    before = getattr(debug, "_inductor_kernel_provenance_debug_handle", None)
    if not isinstance(before, int):
        yield
        return
    debug._inductor_kernel_provenance_debug_handle = 0
    try:
        yield
    finally:
        debug._inductor_kernel_provenance_debug_handle = before


@contextlib.contextmanager
def _fusion_log(events: list[Event]) -> Iterator[None]:
    """Inductor's ``fusion`` artifact logger at DEBUG with :class:`_Decisions` on it for the block
    (what ``torch._logging.set_logs(fusion=True)`` enables, without resetting the user's other log
    settings, and without printing: the logger does not propagate unless the user enabled it)."""
    from torch._inductor.scheduler import fusion_log

    handler = _Decisions(events)
    events.append(({"artifact": {"name": FUSION_LOG, "encoding": "json"}, "has_payload": ""},
                   json.dumps({"listening": True})))
    level = fusion_log.level
    fusion_log.addHandler(handler)
    fusion_log.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        fusion_log.removeHandler(handler)
        fusion_log.setLevel(level)
