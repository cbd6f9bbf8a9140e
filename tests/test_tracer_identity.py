"""What the eager tracer keys its per-op caches by: each fact must stay the fact of the object it was
worked out for, however the caches are keyed for speed (issue 18, point 9)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch
from torch import nn

from fxviz.fallback import trace_eager
from fxviz.torchbridge.guard import named_modules
from fxviz.torchbridge.values import mark_tied

TWIN = '''import torch
from torch import nn


class Block(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2
'''


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)
    return mod


def test_twin_forwards_in_two_files_each_get_their_own_source_lines(tmp_path: Path) -> None:
    # the same text in two files compiles to code objects that compare equal (a code object's
    # equality ignores its file name): the tracer's line cache once gave the second file's ops
    # the first file's location
    for p in (tmp_path / "twin_a.py", tmp_path / "twin_b.py"):
        p.write_text(TWIN)
    a, b = (_load(tmp_path / f"twin_{k}.py") for k in "ab")
    try:
        assert a.Block.forward.__code__ == b.Block.forward.__code__  # what made them collide
        g = trace_eager(nn.Sequential(a.Block(), b.Block()), (torch.randn(2),))
        files = {n.name: (n.module, n.source.file if n.source else None, n.source.line if n.source else None)
                 for n in g.ops}
        # Python's own record of where each forward is: its code object
        ca, cb = a.Block.forward.__code__, b.Block.forward.__code__
        line = ca.co_firstlineno + 1
        assert files == {
            "relu": ("0", ca.co_filename, line), "mul": ("0", ca.co_filename, line),
            "relu_1": ("1", cb.co_filename, line), "mul_1": ("1", cb.co_filename, line),
        }
        assert ca.co_filename != cb.co_filename
    finally:
        sys.modules.pop("twin_a", None)
        sys.modules.pop("twin_b", None)


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.shared = nn.Linear(4, 4)
        self.again = self.shared  # one module under two paths
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.norm = nn.BatchNorm1d(4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.again(self.shared(self.emb(ids)))))


def test_tied_tensors_are_named_as_torch_lists_them() -> None:
    """``mark_tied`` reads one walk of the modules; the names and their order are torch's own
    (``named_parameters`` / ``named_buffers`` with ``remove_duplicate=False``)."""
    torch.manual_seed(0)
    model = _Tied().eval()
    g = trace_eager(model, (torch.tensor([1, 2, 3]),))
    names: dict[int, list[str]] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        names.setdefault(id(t), []).append(name)
    tied = {ns[0]: ns[1:] for ns in names.values() if len(ns) > 1}
    assert tied == {"emb.weight": ["head.weight"], "shared.weight": ["again.weight"],
                    "shared.bias": ["again.bias"]}
    state = {n.target: n for n in g.nodes if n.kind in ("parameter", "buffer")}
    assert {t: n.attrs["shared_with"] for t, n in state.items() if "shared_with" in n.attrs} == tied
    # the walk given by the caller and the one mark_tied makes itself agree
    for n in g.nodes:
        n.attrs.pop("shared_with", None)
    mark_tied(g.nodes, model, named_modules(model, remove_duplicate=False))
    assert {n.target: n.attrs["shared_with"] for n in g.nodes if "shared_with" in n.attrs} == tied
