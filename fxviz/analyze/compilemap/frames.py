"""Whose code a stack frame is: the user's own, or a library's (the standard library, anything
installed, torch itself), by the root its file lies under. No torch."""

from __future__ import annotations

import functools
import importlib.util
import sysconfig
from collections.abc import Sequence
from pathlib import Path


@functools.cache
def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(k)}
    spec = importlib.util.find_spec("torch")
    for root in (spec.submodule_search_locations or ()) if spec is not None else ():
        roots.add(str(Path(root).parent))
    # the longest first: site-packages before the stdlib that holds it
    return tuple(sorted((str(Path(r).resolve()) + "/" for r in roots), key=len, reverse=True))


def library_of(file: str) -> str:
    """``file`` relative to the library root it lies under (``json/encoder.py``,
    ``transformers/utils/generic.py``), or ``""`` for the user's own code. Code torch.fx generated
    (``<eval_with_key>.3``: the graph compiled autograd captured, whose line calls a backward hook) is
    torch's, not the user's: a hook that is itself library code (``print``) breaks where torch names it,
    not at the generated graph's call of it."""
    if file.startswith("<"):
        return file if file.startswith(("<frozen", "<eval_with_key>")) else ""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in file:
            return file.rsplit(marker, 1)[1]
    resolved = str(Path(file).resolve()) if file.startswith("/") else file
    for root in _library_roots():
        if resolved.startswith(root):
            return resolved[len(root):]
    return ""


def own_frames(files: Sequence[str]) -> list[int]:
    """Which frames of a stack (outermost first) are the model's own code: the user's (files under
    no library root); where the stack holds none, a model installed as a package (transformers'
    ``modeling_resnet.py``), its frames outside torch and the standard library: the model's line
    that called ``nn.BatchNorm2d``, not ``torch/nn/modules/batchnorm.py``."""
    user = [i for i, f in enumerate(files) if not library_of(f)]
    if user:
        return user
    return [i for i, f in enumerate(files) if any(m in f for m in ("/site-packages/", "/dist-packages/"))
            and not library_of(f).startswith("torch/")]


__all__ = ["library_of", "own_frames"]
