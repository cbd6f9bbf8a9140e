"""``.pt2`` files written by ``torch.export.save`` -> IR, without the model that made them.

A saved program keeps everything a live capture reads: each node's ``nn_module_stack`` (whose
values carry the module path and, once loaded, the class's qualified name as a string), ``val``
(fake tensors: shapes and dtypes), ``stack_trace`` and ``torch_fn``, and the graph signature,
which names parameters, buffers and user inputs. The conversion is the live one
(:func:`~fxviz.symbolic.export.graph_from_exported`); this module only supplies what a live capture
takes from the model: its class, its modules' classes, and the names of inputs and outputs, read
from the program's call spec.

    >>> g = graph_from_pt2("model.pt2")
    >>> g.method, g.name
    ('export (.pt2)', 'CoolCNN')

``torch.export.load`` unpickles parts of the file: load only files you trust.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx
from torch.export.graph_signature import InputKind

from fxviz.errors import TargetError
from fxviz.ir import Attempt, Graph, ModuleInfo
from fxviz.symbolic.convert import EXPORT_ROOT
from fxviz.symbolic.export import graph_from_exported, leaf_paths, output_names
from fxviz.torchbridge.normalize import key_str

METHOD = "export (.pt2)"

# torch.export.load logs the real reason a file does not load, then raises a generic RuntimeError
_UNREGISTERED = re.compile(r"Deserializing (?P<type>[\w.]+) in pytree is not registered")


def graph_from_pt2(path: str | os.PathLike[str]) -> Graph:
    """Load the ``ExportedProgram`` in ``path`` (``torch.export.load``) and convert it to a graph
    (not yet annotated: run :func:`fxviz.passes.run_passes` on it, as a capture does).

    A program whose outputs are a registered pytree class (transformers' ``ModelOutput``) loads only
    once that class is registered again; the module that defines it is imported and the load is
    tried once more. Anything else that keeps the file from loading is a :class:`TargetError`."""
    name = os.fspath(path)
    if not os.path.isfile(name):
        what = "is a directory" if os.path.isdir(name) else "does not exist"
        raise TargetError(f"{name!r} {what}: give a file written by torch.export.save(program, 'model.pt2')")
    t0 = time.perf_counter()
    ep = _load(name)
    graph = graph_from_program(ep, method=METHOD)
    if not graph.name:
        graph.name = os.path.splitext(os.path.basename(name))[0]
    graph.attempts = [Attempt(METHOD, True, time.perf_counter() - t0)]
    return graph


def graph_from_program(ep: torch.export.ExportedProgram, *, method: str = METHOD) -> Graph:
    """The IR of an ``ExportedProgram`` exported without fxviz (``torch.export.export(model, args)``)."""
    _restore_none_values(ep)
    box = {"outputs": [(path, None) for path in output_names(ep)]}
    graph = graph_from_exported(ep, None, None, box, method=method, prefix="", input_names=input_names(ep))
    graph.modules = modules_of(ep)
    root = graph.modules.get("")
    graph.name = root.cls if root is not None else ""
    return graph


def _restore_none_values(ep: torch.export.ExportedProgram) -> None:
    """Give back ``meta["val"] = None`` to ops that return nothing (``aten._assert_tensor_metadata``):
    a live program has it, saving drops it, and the converter tells "returns nothing" from
    "unknown" by it."""
    for gm in ep.graph_module.modules():
        if not isinstance(gm, torch.fx.GraphModule):
            continue
        for n in gm.graph.nodes:
            schema = getattr(n.target, "_schema", None)
            if n.op == "call_function" and "val" not in n.meta and schema is not None and not schema.returns:
                n.meta["val"] = None


def modules_of(ep: torch.export.ExportedProgram) -> dict[str, ModuleInfo]:
    """Module path -> class, from the ``nn_module_stack`` of every node (bodies of higher-order ops
    included). Only modules the forward called are known; the ``module_paths`` pass adds the rest
    of the paths the nodes mention, without a class."""
    infos: dict[str, ModuleInfo] = {}
    out: dict[str, ModuleInfo] = {}
    for gm in ep.graph_module.modules():
        if not isinstance(gm, torch.fx.GraphModule):
            continue
        for n in gm.graph.nodes:
            for value in (n.meta.get("nn_module_stack") or {}).values():
                if not isinstance(value, tuple) or len(value) < 2:
                    continue
                # strict export names the model ``_export_root`` inside bodies of higher-order ops
                path = str(value[0])
                if path == EXPORT_ROOT:
                    continue
                path = path.removeprefix(EXPORT_ROOT + ".")
                if path in out:
                    continue
                qualname = _qualname(value[1])
                info = infos.get(qualname)
                if info is None:
                    info = infos[qualname] = ModuleInfo(qualname.rpartition(".")[2], qualname)
                out[path] = info
    return out


def _qualname(cls: Any) -> str:
    """``"torch.nn.modules.conv.Conv2d"`` from the class a live program holds or the string a loaded
    one holds."""
    if isinstance(cls, type):
        return f"{cls.__module__}.{cls.__qualname__}"
    return str(cls)


def input_names(ep: torch.export.ExportedProgram) -> list[str]:
    """The user inputs as a live capture names them (``input_ids``, ``attention_mask``,
    ``x[0]``): positional ones by the forward's argument names, keyword ones by key. Empty when
    the call spec and the signature disagree (the placeholders' names are used then)."""
    spec = ep.call_spec.in_spec
    signature = ep.module_call_graph[0].signature if ep.module_call_graph else None
    arg_names = list(getattr(signature, "forward_arg_names", None) or [])
    n_user = sum(1 for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT)
    paths = leaf_paths(spec)
    if paths is None or len(paths) != n_user:
        return []
    names = []
    for path in paths:
        if len(path) < 2:
            return []
        top, first, *rest = path
        if getattr(top, "idx", None) == 0:  # positional
            i = getattr(first, "idx", -1)
            base = arg_names[i] if 0 <= i < len(arg_names) else f"args[{i}]"
        else:
            base = str(getattr(first, "key", first))
        names.append(base + "".join(key_str(k) for k in rest))
    return names


def _load(path: str) -> torch.export.ExportedProgram:
    """``torch.export.load(path)``, its log held back; a failure is a one-line TargetError."""
    imported: set[str] = set()
    while True:
        with _held_log() as records:
            try:
                return torch.export.load(path)
            except Exception as e:
                error: BaseException = e
        # the reason torch logged, not the generic "error when deserializing" it raises after
        for r in records:
            if r.exc_info and r.exc_info[1] is not None:
                error = r.exc_info[1]
        m = _UNREGISTERED.search(str(error))
        if m is not None and m["type"] not in imported:
            imported.add(m["type"])
            try:
                importlib.import_module(m["type"].rpartition(".")[0])  # registers the class
            except ImportError as e:
                raise TargetError(
                    f"{path!r} holds a {m['type']} (a pytree class of its inputs or outputs) and its "
                    f"module cannot be imported ({e}): install the package that defines it"
                ) from error
            continue
        raise TargetError(
            f"cannot load {path!r} with torch.export.load ({type(error).__name__}: {error}): "
            "give a file written by torch.export.save with this torch version"
        ) from error


@contextlib.contextmanager
def _held_log() -> Iterator[list[logging.LogRecord]]:
    """Keep what ``torch.export`` logs while a file loads (the real reason a load failed) out of
    the terminal, and hand the records to the caller."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("torch.export")
    handlers, propagate = logger.handlers, logger.propagate  # torch gives it a handler of its own
    logger.handlers, logger.propagate = [Keep()], False
    try:
        yield records
    finally:
        logger.handlers, logger.propagate = handlers, propagate


__all__ = ["METHOD", "graph_from_program", "graph_from_pt2", "input_names", "modules_of", "output_names"]
