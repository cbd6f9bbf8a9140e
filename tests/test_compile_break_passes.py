"""A break's passes where part of the calls ran eagerly past Dynamo's recompile limit, and the line
that names a compiled graph's function, both against torch's own record of the same run.

The shape is transformers' BART with ``output_attentions=True``: its sdpa attention logs a warning
on each call (a graph break), and its attention's wrapper recompiles for the cross-attention calls
until the recompile limit: those calls ran eagerly and passed no break."""

from __future__ import annotations

import logging
import sys
from types import FrameType
from typing import Any

import torch
import torch._dynamo as dynamo
from torch import nn
from torch._dynamo.utils import get_compilation_metrics

from fxviz.analyze.compilemap import CompileMap, compile_map

_log = logging.getLogger("fxviz.tests.attention")


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, kv: torch.Tensor | None = None) -> torch.Tensor:
        q, k = self.q(x), self.k(x if kv is None else kv)
        _log.warning("attention weights are not returned")  # a graph break on every compiled pass
        return (q @ k.transpose(-1, -2)).softmax(-1) @ k


class _EncoderDecoder(nn.Module):
    """Three self-attention calls, then two cross-attention calls (``kv`` given): the second
    version of ``_Attention.forward`` is past a recompile limit of 1."""

    def __init__(self) -> None:
        super().__init__()
        self.selfs = nn.ModuleList(_Attention() for _ in range(3))
        self.cross = nn.ModuleList(_Attention() for _ in range(2))

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        for a in self.selfs:
            x = x + a(x)
        for c in self.cross:
            x = x + c(x, memory)
        return x


class _Passes(logging.Handler):
    """Python's own record of each call of the break: whether the frame that made it ran
    ``_Attention.forward``'s own code (eagerly) or the code Dynamo compiled from it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []  # "compiled" or "eager", in call order

    def emit(self, record: logging.LogRecord) -> None:
        f: FrameType | None = sys._getframe(1)
        while f is not None and not (f.f_code.co_name == "forward" and f.f_code.co_filename == __file__):
            f = f.f_back
        assert f is not None
        self.calls.append("eager" if f.f_code is _Attention.forward.__code__ else "compiled")


def _run() -> tuple[CompileMap, _Passes, list[Any]]:
    torch.manual_seed(0)
    model, x, memory = _EncoderDecoder().eval(), torch.randn(1, 6, 8), torch.randn(1, 4, 8)
    passes = _Passes()
    _log.addHandler(passes)
    _log.propagate = False
    before = get_compilation_metrics()  # held, so that their ids stay theirs: torch keeps the last 64 only
    try:
        with dynamo.config.patch(recompile_limit=1), torch.no_grad():
            cmap = compile_map(model, (x, memory), backend="eager")
        seen = {id(m) for m in before}
        metrics = [m for m in get_compilation_metrics() if id(m) not in seen]
    finally:
        _log.removeHandler(passes)
        _log.propagate = True
    return cmap, passes, metrics


def test_a_break_counts_the_passes_that_broke_not_the_calls_that_ran_eagerly_past_the_limit() -> None:
    cmap, passes, metrics = _run()
    # torch's record: _Attention.forward's second compile (the cross-attention call) was refused
    refused = [m for m in metrics if str(getattr(m, "fail_reason", "") or "").startswith("Dynamo recompile limit")]
    assert len(refused) == 1
    # Python's record of the compiled run (the map's first forward; its eager trace follows): the 3
    # self-attention calls broke in compiled code, the 2 cross-attention calls ran eagerly
    # (Dynamo's RUN_ONLY: no version of forward accepts kv, and none may be compiled)
    assert passes.calls[:5] == ["compiled"] * 3 + ["eager"] * 2, passes.calls
    line = _Attention.forward.__code__.co_firstlineno + 2
    counts = {(b.category, b.where.line): b.count for b in cmap.breaks if b.where is not None}
    # (the loop over the layers holds a break: Dynamo ran _EncoderDecoder.forward eagerly, a skip)
    assert counts == {("print", line): passes.calls[:5].count("compiled"),
                      ("skip", _EncoderDecoder.forward.__code__.co_firstlineno + 2): 1}, counts
    limit = cmap.limits[0]
    assert (limit.func, limit.line, limit.eager_sets) == ("forward", _Attention.forward.__code__.co_firstlineno, [0])


def test_a_graphs_function_is_named_as_torchs_metrics_and_the_recompiles_name_it() -> None:
    cmap, _, metrics = _run()
    # torch's record of each frame that produced a graph: its code's name, file and first line
    named = {(m.co_name, m.co_filename, m.co_firstlineno) for m in metrics
             if getattr(m, "graph_op_count", None)}
    shown = {(g.func, g.file, g.line) for g in cmap.graphs}
    assert shown == named, (shown, named)
    # one line for one function: the graphs of forward and the recompile limit of forward
    forward = {g.line for g in cmap.graphs if g.func == "forward" and g.file == __file__}
    assert forward == {_Attention.forward.__code__.co_firstlineno}  # not q's line, its first op's
    assert cmap.limits[0].line in forward
    payload = cmap.to_json()  # JSON and the graphs panel carry the same line
    assert f'"line": {_Attention.forward.__code__.co_firstlineno}' in payload
