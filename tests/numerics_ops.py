"""The custom op of the numerics models (:mod:`tests.numerics_models`), in a module of its own.

``tests/test_numerics.py`` loads a copy of ``numerics_models.py`` as a CLI target (a file fxviz
imports under a name of its own). Had the op been defined there, each load would register
``fxviz_numerics_test::jitter`` again: torch replaces the registration, and once that copy is
collected its library is destroyed with it, leaving the op the suite imported without a schema
(a later call failed with ``std::bad_alloc``, an internal assert, or a segmentation fault). The copy
imports the op from here, which registers it once per process.
"""

from __future__ import annotations

import os

import torch


@torch.library.custom_op("fxviz_numerics_test::jitter", mutates_args=())
def jitter(x: torch.Tensor) -> torch.Tensor:
    """``x`` plus noise of 1e-3 drawn from the operating system's entropy, not torch's RNG: an op
    whose eager result no seed reproduces (as a kernel that adds in a racing order is)."""
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    return x + 1e-3 * torch.randn(x.shape, generator=g, dtype=x.dtype)


@jitter.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


__all__ = ["jitter"]
