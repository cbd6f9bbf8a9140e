"""Memory a capture borrowed, given back when it ends."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Any

_LIBC: Any = None


def _malloc_trim() -> None:
    """Ask glibc to return freed heap memory to the system (it keeps freed arenas otherwise)."""
    global _LIBC
    if not sys.platform.startswith("linux"):
        return
    if _LIBC is None:
        try:
            _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _LIBC = False
    if _LIBC:
        _LIBC.malloc_trim(0)


def give_back_memory() -> None:
    """Return what a capture's attempts left allocated but unused."""
    _malloc_trim()


__all__ = ["give_back_memory"]
