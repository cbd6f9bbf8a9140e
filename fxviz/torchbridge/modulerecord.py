"""torch's own module of each post-grad node, written into torch's structured trace. Needs torch.

torch records no kernel -> node mapping for a compiled backward and prints its graphs with the
forward's source line only, but it does know each backward node's module: AOT Autograd copies the
forward op's ``nn_module_stack`` (same ``seq_nr``) into the backward node's
``meta["fwd_nn_module_stack"]``. :func:`recorded_modules` adds, for the block, a post-grad custom pass
(:class:`Record`) after any the user set (``torch._inductor.config.post_grad_custom_post_pass``, a
pass or a list of them: theirs still run, first, inside one :class:`Chain`, and the setting is put
back after the block) that
reads those stacks and writes them with ``torch._logging.trace_structured`` as the
:data:`~fxviz.tracefile.records.NODE_MODULES` artifact of the graph's compile, so the torch-free
trace reader finds them in a live run's events and in a ``TORCH_TRACE`` directory written meanwhile.

The pass changes nothing in the graph. It is a ``CustomGraphPass`` with a fixed :meth:`Record.uuid`,
so Inductor's FX graph cache still serves the graph: its key holds the user's passes' uuids and
fxviz's, so entries made with the pass are not those of the user's plain runs. A graph the cache
serves runs no post-grad pass, so :class:`_Replay`, a handler on torch's structured-trace logger for
the block, keeps each record beside the cache entry it went with (``fx_graph_cache_miss``'s key and
the compile's Dynamo graph, which names the modules, in ``<Inductor cache dir>/fxviz_node_modules``)
and logs it again, the same way, when torch logs a hit of that key (``fx_graph_cache_hit``). Where no
record was kept (a cache filled outside fxviz), the reader falls back, and says so.

Installed where backward kernels are named (:mod:`fxviz.analyze.inside.live`). Not needed elsewhere,
measured on torch 2.13: under compiled autograd the AOT backward is inlined into the captured graph
(``aot0_*`` nodes) with no ``fwd_nn_module_stack`` or ``nn_module_stack`` on any node, of the
Dynamo graph or of the AOT graph compiled from it, so there is nothing to record
(:mod:`fxviz.analyze.compilemap.autograd` names autograd nodes, not kernels); numerics' per-kernel
watch compiles under ``torch.no_grad()``, inference graphs only, whose kernels take their modules
from the Dynamo nodes' own ``nn_module_stack`` (``postToPre``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

try:  # torch >= 2.12 calls a pass of this kind with ``is_inference`` as well
    from torch._inductor.custom_graph_pass import CustomInferenceAwareGraphPass as _Pass

    _AWARE: Any = _Pass
except ImportError:  # torch 2.11 and before call every post-grad pass with the graph alone
    _Pass = CustomGraphPass  # type: ignore[misc, assignment]
    _AWARE = None

from fxviz.tracefile.records import NODE_MODULES

#: The meta keys recorded: torch's module stack of the forward op a backward node differentiates,
#: and of the op itself (forward graphs, recomputed forward ops in a backward).
KEYS = ("fwd_nn_module_stack", "nn_module_stack")


def _type(t: Any) -> str:
    if isinstance(t, type):
        return f"{t.__module__}.{t.__qualname__}"
    return str(t)


def stacks(graph: torch.fx.Graph, paths: Mapping[int, str] | None = None) -> dict[str, dict[str, list[list[str]]]]:
    """Per meta key of :data:`KEYS`: node name -> its stack, ``[[path, type], ...]`` outermost first;
    with ``paths`` (``id(module)`` -> its path in the model), a module torch keys by its id (as
    ``nn_module_stack`` does: ``"140109678211920"``, ``"…@1"``) is named by its path there
    (``backbone.layers.0.mixer``, not the frame's ``L['args'][0].backbone.layers[0].mixer``)."""
    out: dict[str, dict[str, list[list[str]]]] = {k: {} for k in KEYS}
    for n in graph.nodes:
        for key in KEYS:
            stack = n.meta.get(key)
            if isinstance(stack, dict) and stack:
                out[key][n.name] = [[_path(str(k), v, paths), _type(v[1])] if isinstance(v, tuple) and len(v) >= 2
                                    else [str(v), ""] for k, v in stack.items()]
    return out


def _path(key: str, value: tuple[Any, ...], paths: Mapping[int, str] | None) -> str:
    head = key.split("@", 1)[0]
    if paths is not None and head.isdigit() and int(head) in paths:
        return paths[int(head)]
    return str(value[0])


class Record(_Pass):
    """Writes each node's module stacks (:func:`stacks`) as a :data:`NODE_MODULES` artifact; ``graph``
    in it says whose nodes they are (``post-grad``, or ``aot``: AOT Autograd's forward or backward
    graph, as ``aot_eager`` compiles it)."""

    def __init__(self, graph: str = "post-grad", paths: Mapping[int, str] | None = None) -> None:
        self.graph = graph
        self.paths = paths

    def __call__(self, graph: torch.fx.Graph, is_inference: bool = False) -> None:
        try:
            backward = any(n.op == "placeholder" and n.name.startswith("tangents") for n in graph.nodes)
            payload = {"part": "backward" if backward else "inference" if is_inference else "forward",
                       "graph": self.graph, **stacks(graph, self.paths)}
            text = json.dumps(payload)
        except Exception:  # noqa: BLE001 - never break the user's compile over fxviz's record
            return
        _log(text)

    def uuid(self) -> bytes:
        return b"fxviz-node-modules-1"


def _log(text: str) -> None:
    torch._logging.trace_structured("artifact", metadata_fn=lambda: {"name": NODE_MODULES, "encoding": "json"},
                                    payload_fn=lambda: text)


def _name(meta: dict[str, Any]) -> str:
    art = meta.get("artifact")
    return str(art.get("name", "")) if isinstance(art, dict) else ""


class _Replay(logging.Handler):
    """Keeps each record with its FX graph cache entry and logs it again on a hit (module docstring)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.graph: dict[tuple[Any, ...], str] = {}  # compile id -> its Dynamo graph's text
        self.pending: dict[tuple[Any, ...], str] = {}  # compile id -> its last record, not yet kept
        self.replaying = False

    def emit(self, record: logging.LogRecord) -> None:
        meta, payload = getattr(record, "metadata", None), getattr(record, "payload", None)
        if self.replaying or not isinstance(meta, dict) or not isinstance(payload, str):
            return
        with contextlib.suppress(Exception):  # never break torch's compile over fxviz's record
            cid = tuple(meta.get(k) for k in ("compiled_autograd_id", "frame_id", "frame_compile_id", "attempt"))
            name = _name(meta)
            if "dynamo_output_graph" in meta:
                self.graph[cid] = payload
            elif name == NODE_MODULES:
                self.pending[cid] = payload
            elif name in ("fx_graph_cache_miss", "fx_graph_cache_hit"):
                path = self._path(json.loads(payload).get("key"), cid)
                if name == "fx_graph_cache_miss" and cid in self.pending:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with open(path, "w") as f:
                        f.write(self.pending.pop(cid))
                elif name == "fx_graph_cache_hit" and os.path.exists(path):
                    with open(path) as f:
                        text = f.read()
                    self.replaying = True
                    try:
                        _log(text)
                    finally:
                        self.replaying = False

    def _path(self, key: Any, cid: tuple[Any, ...]) -> str:
        """Where the record of FX graph cache entry ``key`` made in compile ``cid`` is kept (Inductor's
        cache folder: asked only once Inductor has logged a cache event, so it exists)."""
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        h = hashlib.sha256(f"{key}\n{self.graph.get(cid, '')}".encode()).hexdigest()[:40]
        return os.path.join(cache_dir(), "fxviz_node_modules", f"{h}.json")


class Chain(_Pass):
    """The user's post-grad custom passes (:attr:`theirs`, in their order), then :class:`Record`: one
    pass, since torch 2.11 takes one only (2.12 and later also take a list)."""

    def __init__(self, theirs: Any) -> None:
        self.theirs: tuple[Any, ...] = tuple(theirs) if isinstance(theirs, (list, tuple)) else (theirs,) if theirs else ()
        self.record = Record()

    def __call__(self, graph: torch.fx.Graph, is_inference: bool = False) -> None:
        for p in self.theirs:
            if _AWARE is not None and isinstance(p, _AWARE):
                p(graph, is_inference=is_inference)
            else:
                p(graph)
        self.record(graph, is_inference)

    def uuid(self) -> bytes | None:
        """Their uuids and fxviz's; none where one of theirs has none (a plain function), which makes
        Inductor bypass its FX graph cache, as their pass alone does."""
        ids = [p.uuid() if isinstance(p, CustomGraphPass) else None for p in self.theirs]
        if not all(ids):
            return None
        return hashlib.sha256(repr([*ids, self.record.uuid()]).encode()).digest()


def aot_eager_recorded(paths: Mapping[int, str] | None = None) -> Any:
    """torch's ``aot_eager`` backend whose forward and backward compilers (``boxed_nop``, as
    ``aot_eager``'s own) first write the AOT graph's module stacks (:class:`Record`, ``graph="aot"``):
    ``aot_eager`` runs no Inductor pass, so this is where torch's own module of each AOT node is
    (``nn_module_stack``; ``fwd_nn_module_stack`` in the backward)."""
    from torch._dynamo.backends.debugging import aot_eager, boxed_nop

    record = Record("aot", paths)

    def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        record(gm.graph)
        return boxed_nop(gm, example_inputs)

    def backend(gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        return aot_eager(gm, example_inputs, fw_compiler=compiler, bw_compiler=compiler, **kwargs)

    return backend


@contextlib.contextmanager
def recorded_modules() -> Iterator[None]:
    """:class:`Record` runs after the user's post-grad custom passes while the block runs, and
    :class:`_Replay` logs the records of the graphs Inductor's FX graph cache serves."""
    from torch._inductor import config
    from torch._logging._internal import trace_log

    chain = Chain(config.post_grad_custom_post_pass)
    replay = _Replay()
    trace_log.addHandler(replay)
    try:
        with config.patch({"post_grad_custom_post_pass": chain}):
            yield
    finally:
        trace_log.removeHandler(replay)


__all__ = ["KEYS", "Chain", "Record", "aot_eager_recorded", "recorded_modules", "stacks"]
