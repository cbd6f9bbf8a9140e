"""What torch's structured trace holds, as plain data. No torch.

A structured trace (what ``TORCH_TRACE=DIR`` writes, one file per rank, or what a handler on torch's
``torch.__trace`` logger sees in-process) is a stream of events: a glog prefix, a JSON header and,
for events with ``has_payload``, payload lines that start with a tab. :func:`fxviz.tracefile.read_trace`
turns that stream into a :class:`Trace`: its events grouped by compile id (:class:`Compile`), in the
order torch wrote them. Nothing here interprets the graphs: ``fxviz.tracefile.fxtext`` reads a graph
payload into an fxviz Graph, ``fxviz.tracefile.code`` reads ``inductor_output_code`` into kernels.
A live run's events may hold one more artifact, :data:`FUSION_LOG`, that fxviz adds (Inductor's
fusion decisions, which torch logs but does not put in its structured trace).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Problem:
    """A line fxviz could not read: the file, its 1-based line number and what was wrong. The rest
    of the trace is still read."""

    file: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.what}"


@dataclass
class Artifact:
    """One event with a payload: its name (the artifact's ``name``, or the event key for graph
    events such as ``dynamo_output_graph``, ``aot_joint_graph``, ``aot_forward_graph``,
    ``aot_backward_graph``, ``inductor_output_code``), the header's own fields (``meta``: e.g. the
    output code's ``filename``), the payload (``str``, or parsed JSON when the encoding is json) and
    where it was read (file and line of the header)."""

    name: str
    payload: Any
    meta: dict[str, Any] = field(default_factory=dict)
    file: str = ""
    line: int = 0


@dataclass
class Phase:
    """A timed phase from torch's chromium events (a ``B``/``E`` pair, or an ``X`` event): its name
    (``entire_frame_compile``, ``backend_compile``, ``GraphLowering.run``, ``Scheduler.__init__``,
    ``compile_file``, ...), start (s, torch's clock) and duration in seconds."""

    name: str
    start: float
    seconds: float


@dataclass
class Compile:
    """Everything torch recorded for one compile id of one rank: ``frame_id/frame_compile_id``,
    with ``attempt`` (a restart after a graph break compiles the frame again with attempt 1, ...).

    ``artifacts`` keeps every payload event in trace order (a training step has two
    ``inductor_post_grad_graph`` and two ``inductor_output_code``: forward, then backward);
    :meth:`all` and :meth:`first` look them up by name. ``events`` holds the header-only events
    (``dynamo_start``, ``compilation_metrics`` ...) in order as ``(key, value)``."""

    rank: int | None
    frame_id: int
    frame_compile_id: int
    attempt: int = 0
    artifacts: list[Artifact] = field(default_factory=list)
    events: list[tuple[str, Any]] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)
    #: Set for compiled autograd's compiles (torch spells them ``!0/1/0``, or ``!0`` with no frame,
    #: where ``frame_id`` and ``frame_compile_id`` are -1).
    compiled_autograd_id: int | None = None

    @property
    def compile_id(self) -> str:
        """torch's spelling: ``0/1`` (``0/1_1`` for a second attempt, ``!0/0/1`` under compiled
        autograd)."""
        base = f"{self.frame_id}/{self.frame_compile_id}"
        if self.compiled_autograd_id is not None:
            base = f"!{self.compiled_autograd_id}" + (f"/{base}" if self.frame_id >= 0 else "")
        return f"{base}_{self.attempt}" if self.attempt else base

    @property
    def label(self) -> str:
        """The compile id with its rank where the trace has ranks (ranks share compile ids):
        ``rank 1: 0/0``."""
        return self.compile_id if self.rank is None else f"rank {self.rank}: {self.compile_id}"

    def all(self, name: str) -> list[Artifact]:
        return [a for a in self.artifacts if a.name == name]

    def first(self, name: str) -> Artifact | None:
        return next((a for a in self.artifacts if a.name == name), None)

    def event(self, key: str) -> Any:
        """The value of the first header-only event ``key`` (e.g. ``compilation_metrics``)."""
        return next((v for k, v in self.events if k == key), None)


@dataclass
class Trace:
    """A whole structured trace: its compiles in the order they started, what could not be read
    (``problems``), the files read, and events outside any compile id (``globals``: e.g.
    ``torch_version``; a header-only one has ``payload=None`` and its value in ``meta``). ``phases``
    are the timed phases that name no compile (``compile_file`` of a parallel compile worker);
    ``strings`` are torch's interned strings (``{"str": [path, index]}``: the ``filename`` indices of
    ``dynamo_start`` stacks)."""

    compiles: list[Compile] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    globals: list[Artifact] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)
    strings: dict[int, str] = field(default_factory=dict)

    def ranks(self) -> list[int | None]:
        return sorted({c.rank for c in self.compiles}, key=lambda r: -1 if r is None else r)


#: The artifact fxviz adds to a live run's events (torch never writes it, so a saved ``TORCH_TRACE``
#: directory has none): one fusion decision Inductor's scheduler logged on its ``fusion`` logger, put
#: in the event stream at the moment torch logged it so that it belongs to its compile id like
#: torch's own events. The JSON payload: ``decision`` (``refused``: ``cannot fuse op0 with op1:
#: REASON``; ``fused``: ``fusing op0 with op1``), ``part`` (``forward``, ``backward``, ``inference``:
#: the graph being scheduled), ``first``/``second`` (torch's scheduler node names: ``op3``, or
#: ``op3_op4`` for nodes fused before), ``first_names``/``second_names`` (the Inductor operations
#: in each: ``["op3", "op4"]``); a refusal adds ``reason`` (torch's text), ``first_ops``/
#: ``second_ops`` (the post-grad nodes each computes: its operations' origin nodes) and
#: ``first_buffers``/``second_buffers`` (the buffers they write: ``buf3``). One such
#: artifact outside any compile id, first in the events, says fxviz listened to the fusion logger
#: from there on (payload ``{"listening": true}``): without it, no decision was looked for.
FUSION_LOG = "fxviz_fusion_log"

#: The artifact fxviz's post-grad pass writes into torch's structured trace during a live run
#: (:mod:`fxviz.torchbridge.modulerecord`), through ``torch._logging.trace_structured`` like torch's
#: own artifacts, so it is in a ``TORCH_TRACE`` directory written while fxviz ran too (a user's plain
#: run has none). One per post-grad graph Inductor compiled, as torch gives it: the JSON payload has
#: ``part`` (``forward``, ``backward``, ``inference``) and, per meta key ``fwd_nn_module_stack`` and
#: ``nn_module_stack``, node name -> that node's stack as torch holds it, outermost first:
#: ``[[path, type], ...]`` (``path`` torch's: ``L['self'].h[0].mlp``).
NODE_MODULES = "fxviz_node_modules"
