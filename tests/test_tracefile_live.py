"""The live path and the saved path read one run into the same Trace.

One small training step is compiled once while torch's structured trace goes two ways at the same
time: to :func:`fxviz.torchbridge.tracelog.structured_trace` (the live events) and, through torch's
own ``TorchLogsFormatter(trace=True)`` (what ``TORCH_TRACE=DIR`` uses), to a file. The two Traces
must agree on compile ids, artifacts (names, payloads, meta), header-only events and phases.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch

from fxviz.torchbridge.tracelog import structured_trace
from fxviz.tracefile import read_events, read_trace


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def jsonable(value):
    """What the file holds for a header value: torch writes headers with ``default=repr``."""
    return json.loads(json.dumps(value, default=repr))


def summary(trace):
    return [(c.rank, c.compile_id,
             [(a.name, a.payload, jsonable(a.meta)) for a in c.artifacts],
             jsonable(c.events), [(p.name, p.start, p.seconds) for p in c.phases])
            for c in trace.compiles]


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    from torch._logging._internal import TorchLogsFormatter, trace_log

    torch._dynamo.reset()
    # Without TORCH_TRACE, torch's LazyTraceHandler removes itself from trace_log on the first
    # event of the process, while logging iterates over the handlers: the handler after it misses
    # that event. Let it go first, so that both handlers below see the same events.
    torch._logging.trace_structured("str", lambda: ("fxviz test", -1))
    path = tmp_path_factory.mktemp("trace") / "dedicated_log_torch_trace_test.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(TorchLogsFormatter(trace=True))
    torch.manual_seed(0)
    model = Small()
    compiled = torch.compile(model, backend="aot_eager")
    with structured_trace(provenance=False) as events:
        trace_log.addHandler(handler)
        try:
            compiled(torch.randn(4, 8)).sum().backward()
            compiled(torch.randn(4, 8, requires_grad=True)).sum().backward()  # a recompile
        finally:
            trace_log.removeHandler(handler)
            handler.close()
    torch._dynamo.reset()
    return read_events(list(events)), read_trace(path), path


def test_live_and_saved_read_the_same(both):
    live, saved, path = both
    assert live.problems == [] and saved.problems == []
    assert [c.compile_id for c in saved.compiles] == ["0/0", "0/1"]
    assert summary(live) == summary(saved)
    assert [(g.name, g.payload) for g in live.globals] == [(g.name, g.payload)
                                                           for g in saved.globals]
    assert live.strings == saved.strings
    assert [(p.name, p.seconds) for p in live.phases] == [(p.name, p.seconds) for p in saved.phases]
    names = [a.name for a in saved.compiles[0].artifacts]
    for name in ("dynamo_output_graph", "aot_joint_graph", "aot_forward_graph",
                 "aot_backward_graph"):
        assert name in names
    assert {"entire_frame_compile", "backend_compile"} <= {p.name for p in saved.compiles[0].phases}
    # the saved path knows where each artifact was written
    text = path.read_text().split("\n")
    for a in saved.compiles[0].artifacts:
        assert a.file == str(path)
        assert '"frame_compile_id": 0' in text[a.line - 1]
    # the live path numbers events from 1 in the order torch logged them
    assert live.compiles[0].artifacts[0].file == "<live run>"


_FIRST_EVENT = """
import json, torch
from fxviz.torchbridge.tracelog import structured_trace
with structured_trace() as events:
    torch.compile(lambda x: x.sin() + 1, backend="eager")(torch.randn(3))
meta, payload = events[0]
print(next(iter(meta)), json.loads(payload)["name"], json.loads(payload)["ph"])
"""


def test_the_live_collector_sees_the_first_event_of_a_fresh_process() -> None:
    """With TORCH_TRACE unset, torch's lazy trace handler removes itself from the logger while the
    process's first event is logged; a collector after it in the handler list missed that event
    (the ``dynamo`` phase's begin, so the phase's end had no start)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TORCH_TRACE"}
    out = subprocess.run([sys.executable, "-c", _FIRST_EVENT], capture_output=True, text=True, env=env,
                         timeout=300, check=True)
    assert out.stdout.split() == ["chromium_event", "dynamo", "B"]
