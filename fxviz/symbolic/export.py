"""Capture through torch.export (non-strict and strict, optionally decomposed) -> IR."""

from __future__ import annotations

import contextlib
import re
import traceback
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch import nn
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils import _pytree as pytree

from fxviz.errors import TargetError
from fxviz.ir import Assumption, Graph, NodeKind, SourceLoc
from fxviz.symbolic.check import ProgramRun, has_checks, python_spelling, run_program, runtime_assertions
from fxviz.symbolic.checkpoint import plain_checkpoints_as_selective
from fxviz.symbolic.convert import Converter, Placeholder
from fxviz.symbolic.silent import fake_run_calls, logged_calls, uncovered, with_silent_calls
from fxviz.torchbridge.checkpoint import STAMP, Checkpoints
from fxviz.torchbridge.checks import RejectedInputs, confirm_forward, first_line, real_inputs
from fxviz.torchbridge.guard import named_modules
from fxviz.torchbridge.normalize import FlatInputs, NormalizedModel, flatten_inputs
from fxviz.torchbridge.source import is_user_file
from fxviz.torchbridge.values import mark_tied, mark_tied_state, module_infos

_INPUT_KINDS: dict[InputKind, NodeKind] = {
    InputKind.PARAMETER: "parameter",
    InputKind.BUFFER: "buffer",
    InputKind.CONSTANT_TENSOR: "constant",
    InputKind.CUSTOM_OBJ: "constant",
    InputKind.USER_INPUT: "input",
}


def capture_export(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    strict: bool = False,
    dynamic_shapes: Any = None,
    decompose: bool = False,
    validate: bool = True,
) -> Graph:
    """Capture with ``torch.export.export`` through :class:`NormalizedModel`; ``decompose=True``
    lowers the training IR (``aten.linear``) to core ATen (``aten.addmm``) with
    ``ExportedProgram.run_decompositions()``.

    On real inputs (and ``validate``) the program is run once on them (:mod:`fxviz.symbolic.check`):
    that records the branch each ``torch.cond`` takes and whether each runtime assertion holds,
    and what the program raises is a :class:`~fxviz.torchbridge.checks.RejectedInputs` carrying the
    graph, not a success. Non-strict export runs the model's own Python, so a check on tensor data
    either stops it or stays in the graph as an assertion; Dynamo (``strict``) may drop one, so
    there the model itself runs once (and the program too when it holds a ``cond`` or an assertion)."""
    flat = flatten_inputs(model, args, kwargs)
    box: dict[str, Any] = {}
    wrapper = NormalizedModel(model, flat, box)
    # non-strict export runs the forward's Python, hooks too (they do nothing inside a cond's
    # branches, which Dynamo traces); strict export fails on a global hook: none there
    logged: contextlib.AbstractContextManager[list[Any]] = contextlib.nullcontext([]) if strict else logged_calls(model)
    # strict: torch 2.13 fails on plain checkpoints; non-strict: which op each checkpoint call made
    plain = plain_checkpoints_as_selective() if strict else Checkpoints().attach(stamp=True)
    with logged as called, plain:
        ep = torch.export.export(
            wrapper, flat.tensors, strict=strict, dynamic_shapes=_flat_dynamic_shapes(dynamic_shapes, flat)
        )
    if decompose:
        ep = keep_stamps(ep, ep.run_decompositions())
    method = ("export-strict" if strict else "export") + ("-decomposed" if decompose else "")
    check = validate and real_inputs(flat.tensors)
    run = run_program(ep, flat) if check and (not strict or has_checks(ep)) else None
    graph = graph_from_exported(ep, model, flat, box, method=method, run=run)
    if strict and uncovered(graph.nodes, model):  # Dynamo ran no hook: which modules ran without ops?
        called = fake_run_calls(model, flat) or []
    graph.nodes = with_silent_calls(graph.nodes, called, dict(named_modules(model)))
    if run is not None and run.error is not None:
        raise _rejected(graph, run) from run.error
    if check and strict:
        # Dynamo may evaluate a check on tensor data while it traces and leave nothing of it in the
        # graph (``torch._check(n == 2)`` after ``.item()``): only the model itself can say
        confirm_forward(model, flat, graph)
    return graph


def _rejected(graph: Graph, run: ProgramRun) -> RejectedInputs:
    """What to say when the exported program raised on the example inputs: the assertion that
    failed, with its line, or the error and the op that raised it."""
    assert run.error is not None
    failed = next((a for a in graph.assumptions if a.holds is False), None)
    if failed is not None:
        at = f" ({failed.source.short()} `{failed.source.code}`)" if failed.source is not None else ""
        return RejectedInputs(
            f"the exported graph asserts {failed.expr}{at}, which is false for these inputs: the graph "
            "does not hold for them", graph, failed)
    where = f" at {run.failed.name}" if run.failed is not None else ""
    return RejectedInputs(f"the exported graph does not run on these inputs{where}: {first_line(run.error)}", graph)


def keep_stamps(ep: Any, decomposed: Any) -> Any:
    """``decomposed`` with the checkpoint call of each op (``meta[STAMP]``) its op in ``ep`` had: a
    decomposition keeps the op's name in its provenance (``from_node``), not the meta."""
    stamps = {n.name: n.meta[STAMP] for n in ep.graph.nodes if STAMP in n.meta}
    if stamps:
        for n in decomposed.graph.nodes:
            todo = list(n.meta.get("from_node") or ())
            while todo and STAMP not in n.meta:
                src = todo.pop(0)
                if src.name in stamps:
                    n.meta[STAMP] = stamps[src.name]
                todo += list(getattr(src, "from_node", None) or ())
    return decomposed


def _flat_dynamic_shapes(dynamic_shapes: Any, flat: FlatInputs) -> Any:
    """Map a user's ``dynamic_shapes`` (shaped like ``args``/``kwargs``, or a dict keyed by argument
    name) onto the flat tensor inputs of :class:`NormalizedModel`."""
    if dynamic_shapes is None:
        return None
    if isinstance(dynamic_shapes, dict):
        specs = [dynamic_shapes.get(name.split("[", 1)[0].split(".", 1)[0]) for name in flat.names]
    else:
        specs = list(dynamic_shapes)
        if len(specs) != len(flat.names):
            raise TargetError(
                f"dynamic_shapes has {len(specs)} entries but the inputs hold {len(flat.names)} tensors "
                f"({', '.join(flat.names)}): give one entry per tensor, or a dict by argument name"
            )
    return (tuple(specs),)


def graph_from_exported(
    ep: torch.export.ExportedProgram,
    model: nn.Module | None,
    flat: FlatInputs | None,
    box: dict[str, Any],
    *,
    method: str,
    prefix: str = NormalizedModel.PREFIX,
    input_names: Sequence[str] = (),
    run: ProgramRun | None = None,
) -> Graph:
    """The IR of an exported program. A live capture passes the model and its flattened inputs and
    exports through :class:`NormalizedModel` (whose ``prefix`` is stripped from module paths).
    A program exported elsewhere (a ``.pt2`` file, see :mod:`fxviz.symbolic.pt2`) has neither:
    ``model`` and ``flat`` are ``None``, ``prefix`` is ``""``, user inputs are named by
    ``input_names`` (else by their placeholders), outputs by ``box["outputs"]``, and the caller
    fills in the graph's name and modules. ``run`` is what running the program on the example
    inputs found (:func:`~fxviz.symbolic.check.run_program`): the branch each ``cond`` took and the
    runtime assertions that held; every runtime assertion is listed in ``graph.assumptions``."""
    placeholders: dict[str, Placeholder] = {}
    user_inputs = iter(flat.names if flat is not None else input_names)
    for spec in ep.graph_signature.input_specs:
        kind = _INPUT_KINDS.get(spec.kind, "constant")
        arg_name = getattr(spec.arg, "name", None)
        if arg_name is None:
            continue
        if kind == "input":
            name = next(user_inputs, arg_name)
            placeholders[arg_name] = Placeholder("input", name, name)
        else:
            target = spec.target or arg_name
            target = target[len(prefix) + 1 :] if target.startswith(prefix + ".") else target
            placeholders[arg_name] = Placeholder(kind, target, target)

    conv = Converter(placeholders, strip=prefix, modules=dict(named_modules(model)) if model is not None else {},
                     taken=run.taken if run is not None else {})
    conv.convert(ep.graph, ep.graph_module)

    out_node = next(n for n in reversed(ep.graph.nodes) if n.op == "output")
    returned = list(out_node.args[0])
    user_outputs = [
        r for r, s in zip(returned, ep.graph_signature.output_specs, strict=True)
        if s.kind == OutputKind.USER_OUTPUT
    ]
    # a forward traced by Dynamo (strict export) never ran NormalizedModel's Python, which fills the
    # box: its outputs are named by the keys of the dict it returns, read from the program's spec
    leaves = box.get("outputs") or [(name, None) for name in output_names(ep)]
    tensor_iter = iter(user_outputs)
    items = [(path, next(tensor_iter, None) if const is None else None, const) for path, const in leaves]
    for r, s in zip(returned, ep.graph_signature.output_specs, strict=True):
        if s.kind != OutputKind.USER_OUTPUT:
            target = str(s.target or "")
            target = target[len(prefix) + 1 :] if target.startswith(prefix + ".") else target
            items.append((f"{s.kind.name.lower()}:{target}", r, None))
    conv.add_outputs(items)  # type: ignore[arg-type]
    asserted = [a for _, a in runtime_assertions(ep, run)]
    if model is None:
        mark_tied_state(conv.nodes, ep.state_dict)
        return Graph(nodes=conv.nodes, method=method, assumptions=asserted)
    mark_tied(conv.nodes, model)

    return Graph(
        name=type(model).__name__, nodes=conv.nodes, method=method, modules=module_infos(model),
        assumptions=(assumptions_of(ep, flat) if flat is not None else []) + asserted,
    )


def output_names(ep: torch.export.ExportedProgram) -> list[str]:
    """The user outputs as a live capture names them: ``output`` for one tensor, ``output[1]``
    in a tuple, ``logits`` in a ``ModelOutput``. Positional names when the spec cannot be walked."""
    n_user = len(ep.graph_signature.user_outputs)
    paths = leaf_paths(ep.call_spec.out_spec)
    if paths is None or len(paths) != n_user:
        return [f"output[{i}]" for i in range(n_user)]
    names = []
    for path in paths:
        name = "output"
        for k in path:
            key = getattr(k, "key", getattr(k, "name", None))
            if isinstance(k, pytree.SequenceKey):
                name += f"[{k.idx}]"
            elif isinstance(key, str):
                name = key if name == "output" else f"{name}.{key}"
            else:
                name += f"[{key!r}]"
        names.append(name)
    return names


def leaf_paths(spec: pytree.TreeSpec | None) -> list[tuple[Any, ...]] | None:
    """The key path of every leaf of ``spec`` (rebuilding the tree with integers as leaves)."""
    if spec is None:
        return None
    try:
        tree = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
        return [tuple(path) for path, _ in pytree.tree_flatten_with_path(tree)[0]]
    except Exception:  # a class whose unflatten wants real values: fall back to positions
        return None


# how export names an input size of NormalizedModel's forward(*tensors): L['tensors'][0].size()[1]
_SIZE_SOURCE = re.compile(r"\['tensors'\]\[(\d+)\]\.size\(\)\[(\d+)\]")
_SYMBOL = re.compile(r"\b[su]\d+\b")


def assumptions_of(ep: torch.export.ExportedProgram, flat: FlatInputs) -> list[Assumption]:
    """The shape guards export added while running user code, as conditions on named inputs
    (``x.shape[0] > 2`` at ``model.py:12``). Only symbolic sizes leave guards: with all sizes
    static, export specialises silently and there is nothing to record. Guards raised inside torch
    (a matmul needing equal inner sizes) are consequences, not the user's choices, and stay out."""
    env = None
    for n in ep.graph.nodes:
        if n.op == "placeholder":
            env = next((d.node.shape_env for d in getattr(n.meta.get("val"), "shape", ())
                        if isinstance(d, torch.SymInt)), None)
            if env is not None:
                break
    if env is None:
        return []
    names: dict[str, str] = {}
    for sym, sources in env.var_to_sources.items():
        for src in sources:
            text = src.name() if callable(src.name) else str(src.name)  # a method in some releases
            m = _SIZE_SOURCE.search(text)
            if m and int(m[1]) < len(flat.names):
                names[str(sym)] = f"{flat.names[int(m[1])]}.shape[{m[2]}]"
                break
    out: list[Assumption] = []
    for guard in env.guards:
        frame = getattr(getattr(guard, "sloc", None), "framework_loc", None)
        if not isinstance(frame, traceback.FrameSummary) or not is_user_file(frame.filename):
            continue
        expr = _SYMBOL.sub(lambda m: names.get(m[0], m[0]), python_spelling(str(guard.expr)))
        a = Assumption(expr, SourceLoc(frame.filename, frame.lineno or 0, frame.name, (frame.line or "").strip()))
        if a not in out:
            out.append(a)
    return out


__all__ = ["assumptions_of", "capture_export", "graph_from_exported", "leaf_paths", "output_names"]
