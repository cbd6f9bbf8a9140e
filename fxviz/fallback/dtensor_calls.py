"""DTensor's own calls in the model's code as calls the tracer records: ``x.redistribute(mesh,
[Replicate()])``, ``DTensor.from_local(t, mesh, [Partial()])``, ``x.to_local()``, ``x.full_tensor()``.

They are plain Python methods of ``DTensor``, not torch functions: no torch-function mode sees them,
so the tracer recorded what they run on the local shards (``chunk``, ``cat``, the functional
collective and its wait) as ops of the user's line, and the DTensors they return, whose placement
(``S(1)``, ``R``) is the point of the call, were no op's output. While a sharded run is recorded
(:func:`user_calls_seen`), each goes through torch's ``handle_torch_function`` when the model's own
code (a user file) calls it: one node per call, reading the DTensor or shard it is given and giving
the DTensor it returns (its global shape and placement, on the edges), holding the collectives it
ran (``attrs["collectives"]``, their bytes in the ``comm`` overlay). The same calls made by torch's
own code (the parallel styles' hooks of ``parallelize_module``) stay the ops they run.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import handle_torch_function

from fxviz.torchbridge.source import is_user_file

#: the ``DTensor`` methods wrapped, and its static ones
METHODS = ("redistribute", "to_local", "full_tensor")
STATIC = ("from_local",)


#: a call the model's code made is on its way through the torch-function modes: each mode that
#: handles it calls it again (with that mode off), and it goes on to the next, until none is left
_PASSING: list[None] = []


#: file name -> whether it is a user's (:func:`~fxviz.torchbridge.source.is_user_file`), per caller:
#: the parallel styles' hooks call these methods about three times per sharded linear
_USER_FILES: dict[str, bool] = {}


def _seen(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` as a torch-function call where the model's code calls it under a torch-function mode."""
    enabled, getframe, users = torch._C._is_torch_function_mode_enabled, sys._getframe, _USER_FILES

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not enabled():
            return func(*args, **kwargs)
        if not _PASSING:
            name = getframe(1).f_code.co_filename
            user = users.get(name)
            if user is None:
                user = users[name] = is_user_file(name)
            if not user:
                return func(*args, **kwargs)
        _PASSING.append(None)
        try:
            return handle_torch_function(call, [a for a in args if isinstance(a, torch.Tensor)], *args, **kwargs)
        finally:
            _PASSING.pop()

    call.__module__ = "torch.distributed.tensor"  # its public name: torch.distributed.tensor.DTensor.redistribute
    return call


@contextlib.contextmanager
def user_calls_seen() -> Iterator[None]:
    """DTensor's redistribution calls recorded as calls for the block (see the module's docstring);
    nothing where DTensor was never imported."""
    dtensor: Any = sys.modules.get("torch.distributed.tensor")
    if dtensor is None:
        yield
        return
    cls = dtensor.DTensor
    own = {name: cls.__dict__[name] for name in (*METHODS, *STATIC) if name in cls.__dict__}
    try:
        for name, f in own.items():
            setattr(cls, name, staticmethod(_seen(f.__func__)) if isinstance(f, staticmethod) else _seen(f))
        yield
    finally:
        for name, f in own.items():
            setattr(cls, name, f)


__all__ = ["METHODS", "STATIC", "user_calls_seen"]
