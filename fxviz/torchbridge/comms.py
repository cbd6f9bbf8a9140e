"""Record the collectives a run issues, with torch's own accounting (``CommDebugMode``).

DTensor inserts its collectives at dispatch level, below the tracer's torch-function mode;
``torch.distributed.tensor.debug.CommDebugMode`` is a dispatch mode that sees them, with the module
that caused them. :class:`CommRecorder` is that mode, keeping one record per collective besides
its counts: kind, process group, bytes per rank (the input's), module and user source line. The
records are plain dicts (torch-free) that :mod:`fxviz.passes.comm` writes onto the graph.
"""

from __future__ import annotations

import traceback
from typing import Any

import torch
from torch.distributed.tensor.debug import CommDebugMode

from fxviz.torchbridge.source import is_user_file

#: op name fragments -> collective kind
KINDS = (("all_reduce", "all_reduce"), ("allreduce", "all_reduce"), ("reduce_scatter", "reduce_scatter"),
         ("all_gather", "all_gather"), ("allgather", "all_gather"), ("all_to_all", "all_to_all"),
         ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("send", "send"), ("recv", "recv"))


def _kind(op: str) -> str:
    for frag, kind in KINDS:
        if frag in op:
            return kind
    return op


def _bytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_bytes(y) for y in x)
    return 0


def _group(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, int]:
    """The process group's name (functional collectives take it last, after the reduce op) and size."""
    names = [a for a in (*args, *kwargs.values()) if isinstance(a, str)]
    if not names:
        return "", 0
    try:
        from torch.distributed.distributed_c10d import _resolve_process_group
        size = _resolve_process_group(names[-1]).size()  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - not a group name after all: keep the name, size unknown
        size = 0
    return names[-1], size


def _user_line() -> str:
    for fr in reversed(traceback.extract_stack()[:-3]):
        if is_user_file(fr.filename):
            return f"{fr.filename}:{fr.lineno}"
    return ""


class CommRecorder(CommDebugMode):  # type: ignore[misc]
    """``CommDebugMode`` that also keeps one record per collective (:attr:`records`)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        before = sum(self.comm_counts.values())
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is not NotImplemented and sum(self.comm_counts.values()) > before:
            name = self.advanced_module_tracker.name
            root, _, path = name.partition(".")
            op = str(func._overloadpacket)
            group, size = _group(tuple(args), dict(kwargs or {}))
            self.records.append({
                "op": op, "kind": _kind(op), "group": group, "group_size": size,
                "bytes": _bytes(args[0]) if args else 0,
                "module": "" if name == "Global" else path,
                "phase": "backward" if self.advanced_module_tracker.is_bw else "forward",
                "source": _user_line(),
            })
        return out

    def counts_per_module(self) -> dict[str, dict[str, int]]:
        """CommDebugMode's own per-module forward counts, keyed as :attr:`records` key modules."""
        out: dict[str, dict[str, int]] = {}
        for name, d in self.comm_module_counts.items():
            key = "" if name == "Global" else name.partition(".")[2]
            out[key] = {_kind(str(op)): n for op, n in d["forward"].items() if n}
        return out


__all__ = ["CommRecorder"]
