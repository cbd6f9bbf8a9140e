"""Targets that need torch: a factory (``path/to/file.py:build``, ``package.module:build``) called
for a model and its inputs, a ``.pt2`` file loaded, and the capture or comparison the CLI runs on
them. Every way this can go wrong is one :class:`~fxviz.errors.FxvizError` that says what to do;
code of the user's that exits (``sys.exit``) or raises something that is not an ``Exception``
is reported the same way, never let through as an exit of its own.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fxviz.api import capture, compare
from fxviz.errors import ModelError, TargetError
from fxviz.graphdiff import Diff
from fxviz.ir import Graph
from fxviz.passes import DEFAULT, run_passes
from fxviz.symbolic.pt2 import graph_from_pt2
from fxviz.targets.parse import TargetSpec, parse_shape, read_graph, recognise
from fxviz.targets.shapes import shapes_fit, suggest
from fxviz.torchbridge.distributed import (
    exchange_graphs,
    fake_world,
    fake_world_hint,
    launched_world,
    launched_world_size,
    made_group_hint,
)

_INT_DTYPES = {torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8}


@dataclass
class Target:
    model: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    shapes: tuple[str, ...] = ()  # the --input-shape texts the inputs were made from

    def runs(self) -> contextlib.AbstractContextManager[None]:
        """Around a run of the model: inputs from ``--input-shape`` that do not fit its first layer
        are a :class:`TargetError` that says which shape it expects (:func:`shapes_fit`)."""
        return shapes_fit(self.model, self.shapes, self.args)


def parse_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise TargetError(f"--dtype {name!r} is not a torch dtype (try float32, float16, bfloat16, int64)")
    return dtype


def make_inputs(shapes: Sequence[str], dtype: str, device: torch.device | str | None = None) -> tuple[torch.Tensor, ...]:
    """Random example inputs of the given shapes (token-id-like small integers for int dtypes),
    drawn on the CPU (the same values everywhere) and moved to ``device``."""
    dt = parse_dtype(dtype)
    g = torch.Generator().manual_seed(0)
    out = []
    for text in shapes:
        shape = parse_shape(text)
        try:
            if dt in _INT_DTYPES:
                out.append(torch.randint(0, 10, shape, generator=g, dtype=dt))
            elif dt == torch.bool:
                out.append(torch.rand(shape, generator=g) > 0.5)
            else:
                out.append(torch.randn(shape, generator=g).to(dt))
        except (RuntimeError, MemoryError) as e:  # too large for this machine, or for the dtype
            raise TargetError(f"cannot make a random {dtype} input of shape {text}: {e}") from e
    if device is not None and torch.device(device).type != "cpu":
        out = [t.to(device) for t in out]
    return tuple(out)


def model_device(model: nn.Module) -> torch.device | None:
    """Where the model's weights are, for the inputs fxviz makes: a GPU or ``meta`` (a model too big
    to load), else ``None`` (the CPU)."""
    for t in (*model.parameters(), *model.buffers()):
        return t.device if t.device.type != "cpu" else None
    return None


def _failed(what: str, e: BaseException) -> str:
    """``what`` and how it failed: an exception, or an exit (the hint says why that is wrong)."""
    if isinstance(e, SystemExit):
        return f"{what} called sys.exit({e.code!r})"
    try:
        message = str(e)
    except Exception:  # noqa: BLE001 - the user's exception may not even print
        message = "(its message cannot be printed)"
    return f"{what} raised {type(e).__name__}: {message}"


def _needs_group(e: BaseException) -> str:
    """The hint for a factory that failed inside torch.distributed with no process group set up
    (``init_device_mesh`` or ``init_process_group`` outside a launcher): how to give it one; in a
    fake one, :func:`~fxviz.torchbridge.distributed.fake_world_hint`'s."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return fake_world_hint(e) if dist.get_backend() == "fake" else made_group_hint(e)
    if not dist.is_available():
        return ""
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__", "").startswith("torch.distributed"):
            if launched_world_size() is not None:  # this command does not join the launch's group
                return ("; it needs a process group, and this command does not join torchrun's (tree, json "
                        "and the other capturing commands do): run it without torchrun, with --world-size N")
            return ("; it needs a process group: pass --world-size N (world_size=N in Python) to run it "
                    "under a fake one in this process, or launch it with torchrun")
        tb = tb.tb_next
    return ""


def load_module(spec: TargetSpec) -> Any:
    """The module ``spec`` names: imported by name, or a ``.py`` file loaded as ``python file.py``
    would (imports next to it work); its failure is a one-line :class:`TargetError`. Every object a
    command line names (a target's factory, ``--inputs``, ``--pass``, ``--decompose-table``) is
    looked up in a module loaded here."""
    if spec.module:
        try:
            return importlib.import_module(spec.module)
        except ModuleNotFoundError as e:
            raise TargetError(f"cannot import module {spec.module!r}: {e}") from e
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - the import is the user's code: report, never exit
            raise TargetError(_failed(f"importing {spec.module!r}", e)) from e
    path = os.path.abspath(spec.path)
    name = f"fxviz_target_{os.path.splitext(os.path.basename(path))[0]}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise TargetError(f"cannot import {spec.path!r} as Python code: give a .py file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    # imports next to the file work, as they do when the user runs it
    sys.path.insert(0, os.path.dirname(path))
    try:
        module_spec.loader.exec_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - the import is the user's code: report, never exit
        sys.modules.pop(name, None)
        hint = " (put the file's script part under `if __name__ == \"__main__\":`)" if isinstance(e, SystemExit) else ""
        raise TargetError(_failed(f"importing {spec.path!r}", e) + hint) from e
    finally:
        sys.path.remove(os.path.dirname(path))
    return module


def load_factory(spec: TargetSpec, *, input_shapes: Sequence[str] = (), dtype: str = "float32") -> Target:
    """Import the factory ``spec`` names, call it, and return the model with its inputs.

    The factory returns a model, ``(model, args)`` or ``(model, args, kwargs)``; it may also be an
    ``nn.Module`` subclass that takes no arguments. ``input_shapes`` (with ``dtype``) replace the
    factory's inputs, or supply them when the factory returns only a model.
    """
    target, attr = spec.text, spec.attr
    where = spec.module or spec.path
    module = load_module(spec)
    factory = getattr(module, attr, None)
    if factory is None:
        names = sorted(  # what the file itself defines, not what it imported
            n for n, v in vars(module).items()
            if not n.startswith("_") and callable(v) and getattr(v, "__module__", None) == module.__name__
        )
        hint = f"; it defines: {', '.join(names[:12])}" if names else ""
        raise TargetError(f"{where!r} has no attribute {attr!r}{hint}")
    if not callable(factory):
        raise TargetError(f"{target!r} is a {type(factory).__name__}, not a factory function")
    try:
        result = factory()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - the factory is the user's code: report, never exit
        hint = ": a factory returns a model, it does not exit" if isinstance(e, SystemExit) else _needs_group(e)
        raise TargetError(_failed(f"factory {target!r}", e) + hint) from e

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    if isinstance(result, tuple):
        if not 1 <= len(result) <= 3:
            raise TargetError(
                f"factory {target!r} returned a tuple of {len(result)}; return a model, "
                "(model, args) or (model, args, kwargs)"
            )
        model = result[0]
        if len(result) > 1:
            args = result[1] if isinstance(result[1], tuple) else (result[1],)
        if len(result) > 2:
            if not isinstance(result[2], dict):
                raise TargetError(f"factory {target!r} returned kwargs of type {type(result[2]).__name__}, not a dict")
            kwargs = result[2]
    else:
        model = result
    if not isinstance(model, nn.Module):
        raise TargetError(
            f"factory {target!r} returned {type(model).__name__}, not a torch.nn.Module; return a model, "
            "(model, args) or (model, args, kwargs)"
        )
    if input_shapes:
        return Target(model, make_inputs(input_shapes, dtype, model_device(model)), {}, tuple(input_shapes))
    if not args and not kwargs:
        hint = suggest(model) or "--input-shape 1,3,224,224 (repeat it for several inputs)"
        raise TargetError(
            f"factory {target!r} returned a model without inputs: pass {hint} or return (model, args) from the factory"
        )
    return Target(model, args, kwargs)


@contextlib.contextmanager
def _model_runs() -> Iterator[None]:
    """Around a capture: a forward that calls ``sys.exit`` or raises a ``BaseException`` that is
    not an ``Exception`` (which capture lets through, like Ctrl-C) is a :class:`ModelError`."""
    try:
        yield
    except (KeyboardInterrupt, Exception):
        raise
    except SystemExit as e:
        raise ModelError(f"the model called sys.exit({e.code!r}) during capture: a forward must not exit") from e
    except BaseException as e:  # noqa: BLE001
        raise ModelError(_failed("the model", e) + " during capture (not an Exception subclass)") from e


def load_function(text: str, option: str) -> Callable[..., Any]:
    """The function ``text`` names (``file.py:name`` or ``package.module:name``), for ``option``."""

    try:
        spec = recognise(text)
    except TargetError:
        spec = None
    if spec is None or not spec.captures or not spec.attr:
        raise TargetError(f"{option} {text!r} is not a function: give file.py:name or package.module:name")
    fn = getattr(load_module(spec), spec.attr, None)
    if not callable(fn):
        raise TargetError(f"{option} {text!r}: {spec.module or spec.path} has no function {spec.attr!r}")
    return fn


def load_graph(
    spec: TargetSpec, *, input_shapes: Sequence[str] = (), dtype: str = "float32", method: str = "auto",
    validate: bool = True, backward: bool = False, world_size: int | None = None,
    loss: Callable[[Any], Any] | None = None,
) -> Graph:
    """The annotated graph of any target: a saved graph read, a ``.pt2`` file converted, or a
    factory's model captured with ``method`` (``validate``, ``backward``, ``loss``: see
    :func:`fxviz.capture`; a ``loss`` implies ``backward``)."""
    backward = backward or loss is not None
    if spec.kind == "graph":
        return read_graph(spec.path)
    if spec.kind == "pt2":
        return run_passes(graph_from_pt2(spec.path), DEFAULT)
    if world_size is not None:  # the factory shards the model: it runs inside the fake group
        with fake_world(world_size):
            t = load_factory(spec, input_shapes=input_shapes, dtype=dtype)
            with t.runs(), _model_runs():
                return capture(t.model, t.args, t.kwargs, method=method, validate=validate, backward=backward,
                               loss=loss, world_size=world_size)
    t = load_factory(spec, input_shapes=input_shapes, dtype=dtype)
    with t.runs(), _model_runs():
        return capture(t.model, t.args, t.kwargs, method=method, validate=validate, backward=backward, loss=loss)


def compare_target(
    spec: TargetSpec, *, input_shapes: Sequence[str] = (), dtype: str = "float32", decompose: bool = False,
    level: str | None = None,
) -> Diff:
    """:func:`fxviz.compare` on a factory's model: export against eager on the same inputs."""
    t = load_factory(spec, input_shapes=input_shapes, dtype=dtype)
    with t.runs(), _model_runs():
        return compare(t.model, t.args, t.kwargs, decompose=decompose, level=level)


__all__ = ["Target", "compare_target", "exchange_graphs", "launched_world", "launched_world_size", "load_factory",
           "load_function", "load_graph", "make_inputs", "parse_dtype"]
