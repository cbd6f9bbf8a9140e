"""Where fxviz places what torch compiled, checked against torch's own record of the same run: a
frame Dynamo failed to compile (its compilation metrics' ``fail_type``) is listed as a function
skipped, and a saved value made inside a torch function called from the user's function is on the
module torch's AOT forward graph puts it on (``nn_module_stack``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fxviz.analyze.compilemap import compile_map


def _guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A decorator whose frame Dynamo cannot compile once the call inside it breaks (transformers'
    ``merge_with_config_defaults``/``capture_outputs`` wrappers do the same)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            pass

    return wrapper


class Wrapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    @_guarded
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        idx = torch.nonzero(y > 0)
        return y.sum() + idx.sum()


def _failed_frames(model: nn.Module, x: torch.Tensor) -> set[tuple[str, str, int, int]]:
    """torch's record: (file, function, first line, blamed line) of each frame whose compile failed."""
    from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

    torch._dynamo.reset()
    clear_compilation_metrics()
    torch.compile(model, backend="eager")(x)
    out = {(m.co_filename, m.co_name, m.co_firstlineno, m.fail_user_frame_lineno)
           for m in get_compilation_metrics() if m.fail_type}
    torch._dynamo.reset()
    return out


def test_a_frame_dynamo_failed_to_compile_is_a_function_skipped() -> None:
    from fxviz.analyze.compilemap.result import CompileMap

    model, x = Wrapped(), torch.randn(3, 4)
    failed = _failed_frames(model, x)
    line = Wrapped.forward.__code__.co_firstlineno  # the wrapper's (functools.wraps keeps its code)
    assert {(f, first) for _, f, first, _ in failed} == {("wrapper", line)}  # Unsupported
    cmap = compile_map(model, (x,), backend="eager")
    skipped = [b for b in cmap.breaks if b.category == "skip"]
    # before: no row; the nonzero break was listed, the wrapper that ran eagerly was not
    assert {(b.where.file, b.where.func, b.where.line, b.stack[-1].line) for b in skipped if b.where} == failed
    (b,) = skipped
    assert b.detail.startswith("Unsupported: Dynamic shape operator") and b.reason == "Dynamic shape operator"
    # the report's breaks panel and the terminal's tree say it too
    rows = cmap.graph.annotations["panels"]["breaks"]["rows"]
    assert [r for r in rows if "function skipped" in str(r) and f":{line}" in str(r)]
    from fxviz.analyze.compilemap.overlay import break_lines

    assert any(f":{line}" in text for text in break_lines(skipped))
    # the same facts in the JSON the CLI writes (and reads back)
    again = CompileMap.from_json(cmap.to_json())
    assert [(g.category, g.where.func, g.where.line) for g in again.breaks if g.category == "skip" and g.where] \
        == [("skip", "wrapper", line)]


def _scan(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Mamba's selective scan: a path only Dynamo takes (transformers' ``is_torchdynamo_compiling()``
    picks torch's ``associative_scan`` there, a Python loop eagerly), through a torch function
    (``F.pad``) whose result the backward keeps. AOT Autograd gives the pad the line inside
    torch/nn/functional.py; no eager op ran there, so no Dynamo op of that line has a module."""
    if torch.compiler.is_compiling():
        return nn.functional.pad(x, (1, 0)) * w
    return torch.cat([x.new_zeros(*x.shape[:-1], 1), x], -1) * w


class Mixer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.w = nn.Parameter(torch.randn(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _scan(self.proj(x), self.w)


class Scanned(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mixer = Mixer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mixer(x).tanh()


def _torch_modules(model: nn.Module, x: torch.Tensor) -> dict[str, str]:
    """torch's record: AOT forward node -> the innermost module of its ``nn_module_stack``, from an
    ``aot_eager`` of the same partitioner whose forward compiler reads them (as fxviz writes them)."""
    from torch._dynamo.backends.debugging import aot_eager, boxed_nop

    from fxviz.analyze.inside.backward import module_path

    out: dict[str, str] = {}

    def fw(gm: torch.fx.GraphModule, ex: Any) -> Any:
        if any(n.name.startswith("tangents") for n in gm.graph.nodes):
            return boxed_nop(gm, ex)
        for n in gm.graph.nodes:
            stack = n.meta.get("nn_module_stack")
            if stack:
                out[n.name] = module_path(str(list(stack.values())[-1][0]))
        return boxed_nop(gm, ex)

    torch._dynamo.reset()
    torch.compile(model, backend=lambda gm, ex: aot_eager(gm, ex, fw_compiler=fw))(x).sum().backward()
    torch._dynamo.reset()
    model.zero_grad()
    return out


def test_a_saved_value_made_inside_a_torch_function_is_on_torchs_module() -> None:
    torch.manual_seed(0)
    model, x = Scanned(), torch.randn(3, 4)
    truth = _torch_modules(model, x)
    assert truth["constant_pad_nd"] == "mixer"
    cmap = compile_map(model, (x,), backend="aot_eager", grad=True, inside=True)
    assert cmap.inside is not None
    (part,) = [g.partition for g in cmap.inside.graphs if g.partition is not None]
    mine = {s.node: s.module for s in part.saved if not s.shares}
    assert "constant_pad_nd" in mine  # the backward keeps the pad for the mul by w
    # before: None ('?'): the pad's line is torch/nn/functional.py's, which no Dynamo op has
    # torch's: the innermost entry of the node's nn_module_stack; none is the model itself ("": the
    # saved detach of tanh, which forward runs on the model)
    assert mine == {k: truth.get(k, "") for k in mine} == {"constant_pad_nd": "mixer", "detach_1": ""}
    assert {c.node: c.module for c in part.recomputed} == {c.node: truth.get(c.node, "") for c in part.recomputed}
