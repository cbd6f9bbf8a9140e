"""The eager float32 run that numerics compare against: the eager tracer's own recorder
(:class:`~fxviz.fallback.recorder.Recorder`, function level), so the results land on the nodes of
the graph ``fxviz.capture(method="eager")`` draws, with a :class:`Watcher` told about each op
before it runs and after its node is recorded, while its values are alive.

This is :func:`fxviz.fallback.trace.trace_eager`'s loop with the recorder subclassed, built on the
tracer's public pieces (its modes and hooks), not a change to the tracer.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from fxviz.analyze.flops import CAPTURE_PASSES
from fxviz.errors import ModelError
from fxviz.fallback.classify import Action, kind_of
from fxviz.fallback.context import MODEL_CALLERS
from fxviz.fallback.modes import module_hooks, recording
from fxviz.fallback.recorder import Recorder, TracerFault
from fxviz.fallback.trace import collectives_seen
from fxviz.ir import Graph, Node
from fxviz.ops import op_name
from fxviz.passes import run_passes
from fxviz.torchbridge.normalize import _describe, flatten_inputs, flatten_outputs
from fxviz.torchbridge.run import gc_paused
from fxviz.torchbridge.values import mark_tied, module_infos, output_node

#: Ops whose value is memory the model has not written yet (``torch.empty_like`` before the
#: ``index_add_`` or slice assignment that fills it): what is in it means nothing on either side.
UNINITIALISED = frozenset({"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted"})


def zero_unwritten(name: str, value: Any) -> None:
    """Fill what an op of :data:`UNINITIALISED` (``name``) returned with zeros, on every side (the
    eager runs, a shadow, a program's node): a write that fills it in parts (``out[idx] = ...`` per
    expert) otherwise leaves each side its own garbage where it has not written yet, compared as if
    it meant something (an error of inf one run, a noise floor of inf the next). Zeros are one of
    the values the memory may hold, so the model computes what it computes. Through ``.data``: the
    tensor's version is not bumped (the tracer tells writes by version)."""
    if name in UNINITIALISED:
        for t in pytree.tree_leaves(value):
            if isinstance(t, torch.Tensor):
                t.data.zero_()


class Watcher:
    """What a numerics side does around each torch-function call of the eager run. ``before``
    returns what ``after`` needs (a side that shadows the call resolves its arguments there, before
    an in-place call changes them); ``node`` is the op's node, ``None`` when the tracer recorded
    nothing for the call (a metadata query). ``out`` is what the call returned, or for a call that
    returns nothing but writes its arguments (``x[i] = v``) the tensors it wrote."""

    def before(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return None

    def after(self, node: Node | None, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              out: Any, state: Any) -> None:
        return None


class Watchers(Watcher):
    """Several watchers on one run, told in order."""

    def __init__(self, *watchers: Watcher) -> None:
        self.watchers = watchers

    def before(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return [w.before(func, args, kwargs) for w in self.watchers]

    def after(self, node: Node | None, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              out: Any, state: Any) -> None:
        for w, s in zip(self.watchers, state, strict=True):
            w.after(node, func, args, kwargs, out, s)


class _Recorder(Recorder):
    def __init__(self, model: nn.Module, watcher: Watcher, named: list[tuple[str, nn.Module]]) -> None:
        super().__init__(model, "function", snapshot_buffers=True, named=named)
        self.watcher = watcher

    def observe(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if kind_of(func, "function").action is Action.SKIP:  # a metadata query: nothing to compare
            return super().observe(func, args, kwargs)
        try:
            state = self.watcher.before(func, args, kwargs)
        except Exception as e:  # numerics' own failure: never reported as the model's
            raise TracerFault(f"numerics failed before {func}") from e
        n = len(self.nodes)
        out = super().observe(func, args, kwargs)
        node = self.nodes[-1] if len(self.nodes) > n and self.nodes[-1].kind == "op" else None
        if node is not None:
            zero_unwritten(op_name(node.target), out)
        if out is None and node is not None and node.outputs:
            out = self._written(node, args, kwargs)
        try:
            self.watcher.after(node, func, args, kwargs, out, state)
        except Exception as e:
            raise TracerFault(f"numerics failed after {func}") from e
        return out

    def _written(self, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The tensors a call that returns nothing wrote (``x[i] = v``): the node's outputs, as the
        tracer numbers them, so a side compares the value the write left."""
        found: dict[int, torch.Tensor] = {}
        for t in pytree.tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                entry = self._values.get(t)
                if entry is not None and entry[0].node == node.name:
                    found.setdefault(entry[0].index, t)
        if not found:
            return None
        items = [found.get(k) for k in range(max(found) + 1)]
        return items[0] if len(items) == 1 else tuple(items)


class SameRng:
    """Calling it puts torch's RNG where the first call found it (``seed``: seeds it instead), so
    each run of the model draws the same numbers."""

    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self.rng = torch.random.get_rng_state() if seed is None else None
        self.cuda = torch.cuda.get_rng_state_all() if seed is None and torch.cuda.is_initialized() else None

    def __call__(self) -> None:
        if self.seed is not None:
            torch.manual_seed(self.seed)
        elif self.rng is not None:
            torch.random.set_rng_state(self.rng)
            if self.cuda is not None:
                torch.cuda.set_rng_state_all(self.cuda)


def run_eager(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], watcher: Watcher,
              *, seed: int | None) -> tuple[Graph, Any]:
    """Run ``model`` once under ``torch.no_grad()`` with ``watcher`` on every call; the eager
    graph (capture passes run) and the model's output. The model is left as found (buffers a
    forward updates are restored). A model that raises is a :class:`ModelError`."""
    named = list(model.named_modules(remove_duplicate=False))
    rec = _Recorder(model, watcher, named)
    flat = flatten_inputs(model, args, kwargs)
    for name, t in zip(flat.names, flat.tensors, strict=True):
        rec.add_input(name, t)
    graph = Graph(name=type(model).__name__, method="eager", modules=module_infos(model, named))
    if seed is not None:
        torch.manual_seed(seed)
    try:
        with module_hooks(rec), gc_paused(), torch.no_grad(), collectives_seen(), recording(rec):
            out = model(*args, **kwargs)
        rec.finish()
        for path, v in flatten_outputs(out):
            if isinstance(v, torch.Tensor):
                rec.nodes.append(output_node(rec.names.unique(path), path, rec.read(v), None))
            else:
                rec.nodes.append(output_node(rec.names.unique(path), path, None, _describe(v)))
    except TracerFault as e:
        raise (e.__cause__ or e) from None
    except (ModelError, KeyboardInterrupt):
        raise
    except Exception as e:
        raise ModelError(f"the model raised during the numerics run: {type(e).__name__}: {e}") from e
    finally:
        rec.state.restore()
    mark_tied(rec.nodes, model)
    graph.nodes = rec.nodes
    return run_passes(graph, CAPTURE_PASSES), out


MODEL_CALLERS.add(run_eager.__code__)  # an op's line is one inside the model's call, as in trace_eager

__all__ = ["SameRng", "Watcher", "Watchers", "run_eager"]
