"""Resolve a CLI target (``path/to/file.py:factory`` or ``package.module:factory``) to a model and
example inputs. Every way this can go wrong is a :class:`TargetError` that says what to do.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fxviz.errors import TargetError

_INT_DTYPES = {torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8}


@dataclass
class Target:
    model: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1,3,32,32"`` -> ``(1, 3, 32, 32)``."""
    parts = [p.strip() for p in text.split(",")]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        raise TargetError(f"--input-shape {text!r} is not a list of positive integers like 1,3,32,32")
    return shape


def parse_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise TargetError(f"--dtype {name!r} is not a torch dtype (try float32, float16, bfloat16, int64)")
    return dtype


def make_inputs(shapes: Sequence[str], dtype: str) -> tuple[torch.Tensor, ...]:
    """Random example inputs of the given shapes (token-id-like small integers for int dtypes)."""
    dt = parse_dtype(dtype)
    g = torch.Generator().manual_seed(0)
    out = []
    for text in shapes:
        shape = parse_shape(text)
        if dt in _INT_DTYPES:
            out.append(torch.randint(0, 10, shape, generator=g, dtype=dt))
        elif dt == torch.bool:
            out.append(torch.rand(shape, generator=g) > 0.5)
        else:
            out.append(torch.randn(shape, generator=g).to(dt))
    return tuple(out)


def _load_module(spec: str) -> Any:
    if spec.endswith(".py") or os.sep in spec or "/" in spec:
        path = os.path.abspath(spec)
        if not os.path.isfile(path):
            raise TargetError(f"file {spec!r} does not exist")
        name = f"fxviz_target_{os.path.splitext(os.path.basename(path))[0]}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise TargetError(f"cannot import {spec!r} as Python code")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # dataclasses and pickling look modules up by name
        # imports next to the file work, as they do when the user runs it
        sys.path.insert(0, os.path.dirname(path))
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            raise TargetError(f"importing {spec!r} raised {type(e).__name__}: {e}") from e
        finally:
            sys.path.remove(os.path.dirname(path))
        return module
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as e:
        raise TargetError(f"cannot import module {spec!r}: {e}") from e
    except Exception as e:
        raise TargetError(f"importing {spec!r} raised {type(e).__name__}: {e}") from e


def load_target(target: str, *, input_shapes: Sequence[str] = (), dtype: str = "float32") -> Target:
    """Import ``target``, call its factory and return the model with its inputs.

    The factory returns a model, ``(model, args)`` or ``(model, args, kwargs)``; it may also be an
    ``nn.Module`` subclass that takes no arguments. ``input_shapes`` (with ``dtype``) replace the
    factory's inputs, or supply them when the factory returns only a model.
    """
    spec, sep, attr = target.rpartition(":")
    if not sep or not spec or not attr:
        raise TargetError(
            f"target {target!r} should be path/to/file.py:factory or package.module:factory"
        )
    module = _load_module(spec)
    factory = getattr(module, attr, None)
    if factory is None:
        names = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        hint = f"; it defines: {', '.join(names[:12])}" if names else ""
        raise TargetError(f"{spec!r} has no attribute {attr!r}{hint}")
    if not callable(factory):
        raise TargetError(f"{target!r} is a {type(factory).__name__}, not a factory function")
    try:
        result = factory()
    except Exception as e:
        raise TargetError(f"factory {target!r} raised {type(e).__name__}: {e}") from e

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
        args, kwargs = make_inputs(input_shapes, dtype), {}
    elif not args and not kwargs:
        raise TargetError(
            f"factory {target!r} returned a model without inputs: pass --input-shape 1,3,224,224 "
            "(repeat it for several inputs) or return (model, args) from the factory"
        )
    return Target(model, args, kwargs)
