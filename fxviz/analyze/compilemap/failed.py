"""The frames Dynamo failed to compile, from torch's own record of them. Needs torch.

A frame whose compile raised (an ``Unsupported`` Dynamo could not turn into a graph break: a break
inside a ``try`` block of a decorator's wrapper, in a comprehension) runs eagerly, whole, and its
callees are compiled as frames of their own. Dynamo logs the break that caused it once, at the
callee's line, so the break log does not say the frame was skipped; torch's compilation metrics do
(``torch._dynamo.utils.get_compilation_metrics()``: one per frame compile, ``fail_type`` and
``fail_reason`` set where it failed, ``fail_user_frame_filename``/``_lineno`` the user line it
blames). :class:`FailedFrames` reads the ones the run added.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from fxviz.analyze.compilemap.limit import limit_refusal
from fxviz.analyze.compilemap.records import BreakRecord, Recording, compile_id

#: torch keeps its last 64 compilation metrics: raised for the run so that none is dropped.
_KEEP = 1 << 20


class FailedFrames:
    """The failed frame compiles of one run (:meth:`kept` around the run, :meth:`take` after each
    input set), as ``skipped`` break records of ``rec``."""

    def __init__(self, rec: Recording) -> None:
        self.rec = rec
        self.seen: int | None = None

    @contextlib.contextmanager
    def kept(self) -> Iterator[None]:
        from torch._dynamo import utils

        limit = utils._compilation_metrics.maxlen
        utils.set_compilation_metrics_limit(_KEEP)
        self.seen = len(utils.get_compilation_metrics())
        try:
            yield
        finally:
            self.take()
            utils.set_compilation_metrics_limit(limit or 64)

    def take(self) -> None:
        """A break record (``skipped``) for each forward frame whose compile failed since the last
        call: its type the first line of torch's ``fail_reason`` (the break type that failed it, or the
        ``fail_type``), its reason torch's ``fail_type: fail_reason``; its stack the frame's function (at its
        first line) and the user line torch blames; the current input set's."""
        from torch._dynamo.utils import get_compilation_metrics

        metrics = get_compilation_metrics()
        new = metrics[self.seen if self.seen is not None else len(metrics):]
        self.seen = len(metrics)
        rec = self.rec
        for m in new:
            fail, reason = getattr(m, "fail_type", None), str(getattr(m, "fail_reason", "") or "")
            # a recompile refused at the limit (torch's registry's type): the map's recompile limits say it
            # (:mod:`.limit`), with the input sets that ran eagerly
            if not fail or getattr(m, "is_forward", True) is False or limit_refusal(m) is not None:
                continue
            stack = [(str(m.co_filename or ""), int(m.co_firstlineno or 0), str(m.co_name or ""), "")]
            blamed = getattr(m, "fail_user_frame_filename", None)
            if blamed:
                stack.append((str(blamed), int(getattr(m, "fail_user_frame_lineno", 0) or 0), "", ""))
            kind = reason.split("\n", 1)[0].strip() or str(fail)  # the break type that failed it, as torch names it
            cid = compile_id(getattr(m, "compile_id", None))
            # torch's id says the phase: ``!0/3/0`` is a frame compiled from a compiled autograd graph (the
            # backward), whatever phase the run is in when the metrics are read
            phase = "backward" if cid.startswith("!") else rec.phase
            rec.breaks.append(BreakRecord(kind, f"{fail}: {reason}".strip(), stack, rec.input_set, phase,
                                          skipped=True, compile_id=cid))


__all__ = ["FailedFrames"]
