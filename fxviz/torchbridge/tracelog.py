"""torch's structured trace of a live run, as the events a saved ``TORCH_TRACE`` directory holds.

:func:`structured_trace` listens on torch's own structured-trace logger (``torch.__trace``, what
``TORCH_TRACE=DIR`` writes to files) for the duration of a ``with`` block, with Inductor's provenance
tracking on, and collects each event as ``(metadata, payload)``: the JSON header torch would write
and the payload text. :func:`fxviz.tracefile.read_events` reads them exactly as it reads a saved
directory, so a live run and someone else's trace go through one reader.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

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


@contextlib.contextmanager
def structured_trace(*, provenance: bool = True) -> Iterator[list[Event]]:
    """Collect torch's structured-trace events while the block runs (and Inductor's provenance
    tracking, ``torch._inductor.config.trace.provenance_tracking_level = 1``, when ``provenance``).
    The list fills as torch logs; a ``TORCH_TRACE`` the user set keeps writing its files."""
    from torch._inductor import config as inductor_config
    from torch._logging._internal import trace_log

    events: list[Event] = []
    handler = _Collect(events)
    level = trace_log.level
    patch = (inductor_config.patch({"trace.provenance_tracking_level": 1}) if provenance
             else contextlib.nullcontext())
    # first in line: torch's own lazy file handler (TORCH_TRACE unset) removes itself from the list
    # while the first event is logged, and the handler after it in the list would miss that event
    trace_log.handlers.insert(0, handler)
    if not trace_log.isEnabledFor(logging.DEBUG):
        trace_log.setLevel(logging.DEBUG)
    try:
        with patch:
            yield events
    finally:
        trace_log.removeHandler(handler)
        trace_log.setLevel(level)
