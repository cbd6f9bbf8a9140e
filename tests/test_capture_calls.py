"""Module calls in every capture method: lazy modules captured as their first forward leaves them,
modules that run no op kept as calls, ``torch.nn`` containers traced through by fx (or named as
unseen), checked against what eager PyTorch did (forward hooks)."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch import nn

import fxviz

METHODS = ("export", "export-strict", "fx", "eager", "auto")


def eager_calls(model: nn.Module, args: tuple[Any, ...]) -> set[str]:
    """The paths of the modules one real forward called (forward hooks)."""
    seen: set[str] = set()
    hooks = [m.register_forward_hook(lambda *_, p=p: seen.add(p)) for p, m in model.named_modules() if p]
    with torch.no_grad():
        model(*args)
    for h in hooks:
        h.remove()
    return seen


def graph_calls(g: fxviz.Graph) -> set[str]:
    return {c.path for c in g.calls.root.walk() if c.path}


def _lazy() -> nn.Module:
    return nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.Unflatten(1, (2, 2, 2)), nn.LazyConv2d(3, 1))


@pytest.mark.parametrize("method", METHODS)
def test_lazy_modules_are_captured_initialised_on_a_copy(method: str) -> None:
    torch.manual_seed(0)
    model, x = _lazy(), torch.rand(5, 5)
    g = fxviz.capture(model, (x,), method=method)
    params = {n.target: n.meta.shape for n in g.nodes if n.kind == "parameter" and n.meta is not None}
    # the shapes torch itself gives on a first forward
    ref = _lazy()
    ref(x)
    assert params == {k: tuple(v.shape) for k, v in ref.named_parameters()}
    assert any("lazy modules 0 (LazyLinear), 3 (LazyConv2d)" in n for n in g.notes), g.notes
    # the model passed in is left as it was: uninitialised
    assert isinstance(model[0].weight, nn.parameter.UninitializedParameter)
    assert isinstance(model[3].weight, nn.parameter.UninitializedParameter)
    assert type(model[0]) is nn.LazyLinear


def test_the_analyzers_run_a_lazy_model_on_an_initialised_copy_and_leave_it_lazy() -> None:
    """compile_map and numerics, as capture: torch.compile turns a LazyLinear into a Linear on its
    first call, which no snapshot of attributes undoes (the model was left a Linear with a lazy
    hook: its next call raised)."""
    import torch._dynamo as dynamo

    torch.manual_seed(0)
    model, x = _lazy(), torch.rand(5, 5)
    ex = dynamo.explain(_lazy())(x)  # torch's record of the user's first compiled call
    dynamo.reset()
    cmap = fxviz.compile_map(model, (x,), backend="eager")
    assert (len(cmap.graphs), cmap.break_count) == (ex.graph_count, ex.graph_break_count) == (1, 0)
    assert cmap.share == 1.0 and all(g == "g0" for g in cmap.assigned.values())
    assert any("lazy modules 0 (LazyLinear), 3 (LazyConv2d)" in n for n in cmap.notes), cmap.notes
    r = fxviz.numerics(model, (x,), against="export")
    assert r.first is None and set(r.nodes) == set(cmap.assigned)
    for m in (model[0], model[3]):  # left as it was: lazy, and its first forward still works
        assert type(m) in (nn.LazyLinear, nn.LazyConv2d) and isinstance(m.weight, nn.parameter.UninitializedParameter)
    assert model(x).shape == (5, 3, 2, 2)


def test_a_lazy_model_whose_first_forward_raises_says_what_to_do() -> None:
    model = nn.Sequential(nn.LazyLinear(4), nn.Linear(3, 2))  # 4 features into a Linear of 3
    with pytest.raises(fxviz.ModelError, match=r"first forward, which initialises them, raised RuntimeError"):
        fxviz.capture(model, (torch.rand(2, 5),))
    assert isinstance(model[0].weight, nn.parameter.UninitializedParameter)


class PassThrough(nn.Module):
    """Returns its input: a module call with no op."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class Noop(nn.Module):
    """No child, no op: traced through by fx too."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Silent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.ident = nn.Identity()
        self.wrap = PassThrough()
        self.noop = Noop()
        self.out = nn.Linear(4, 2)
        self.unused = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.noop(self.wrap(self.ident(self.lin(self.noop(x))))))


@pytest.mark.parametrize("method", [*METHODS, "export-decomposed"])
def test_module_calls_without_ops_are_in_every_graph(method: str) -> None:
    model, args = Silent().eval(), (torch.randn(3, 4),)
    g = fxviz.capture(model, args, method=method)
    assert graph_calls(g) == eager_calls(model, args) == {"noop", "lin", "ident", "wrap", "wrap.inner", "out"}
    order = [c.id for c in g.calls.root.walk() if c.path]
    assert order == ["noop#0", "lin#0", "ident#0", "wrap#0", "wrap.inner#0", "noop#1", "out#0"], order
    calls = {(n.stack[-1], n.target) for n in g.nodes if n.kind == "call"}
    noops = {(("noop", 0), "Noop"), (("noop", 1), "Noop")}
    if method == "fx":  # fx keeps an Identity as one op; the others have a call node
        assert calls == noops
    else:
        assert calls == noops | {(("ident", 0), "Identity"), (("wrap.inner", 0), "Identity")}
        assert next(n for n in g.nodes if n.kind == "call" and n.module == "wrap.inner").stack == (
            ("wrap", 0), ("wrap.inner", 0))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.body = nn.Sequential(nn.Linear(16, 16), nn.Sequential(nn.ReLU(), nn.Linear(16, 3)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.enc(x))


def test_fx_traces_through_torch_nn_containers_or_says_which_stay_opaque() -> None:
    torch.manual_seed(0)
    model, args = Encoder().eval(), (torch.randn(2, 5, 16),)
    g = fxviz.capture(model, args, method="fx")
    eager = eager_calls(model, args)
    # nested Sequentials are traced through: their leaves are ops of their own
    assert {"body", "body.0", "body.1", "body.1.0", "body.1.1"} <= graph_calls(g)
    assert [n.target for n in g.ops if n.module.startswith("body")] == ["Linear", "ReLU", "Linear"]
    # what fx could not trace through is one op, marked, and named in the notes; every module the
    # eager run called is in the graph or inside such an op
    opaque = {n.module: n for n in g.ops if "opaque" in n.attrs}
    assert opaque, "TransformerEncoder's forward branches on its input's size: fx cannot trace it"
    for path, n in opaque.items():
        assert n.attrs["opaque"].startswith("TraceError")
        assert any(note.startswith(f"fx kept {path} ({n.target}) as one op") for note in g.notes), g.notes
        assert '"opaque": "TraceError' in g.to_json()
    inside = {p for p in eager if any(p.startswith(o + ".") for o in opaque)}
    assert graph_calls(g) | inside == eager
    assert "fx kept enc (TransformerEncoder) as one op" in str(g)  # the tree says it too


def test_fx_traces_through_a_container_it_can_trace() -> None:
    """A ``TransformerEncoderLayer`` alone can be traced up to its attention, whose fast-path checks
    branch on the input: the layer's linears and norms are ops, the attention is the opaque op."""
    torch.manual_seed(0)

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mlp = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.mlp(self.attn(x, x, x, need_weights=False)[0])

    model, args = Layer().eval(), (torch.randn(2, 3, 8),)
    g = fxviz.capture(model, args, method="fx")
    assert [n.module for n in g.ops if n.target in ("Linear", "GELU")] == ["mlp.0", "mlp.1", "mlp.2"]
    opaque = [n.module for n in g.ops if "opaque" in n.attrs]
    assert opaque in ([], ["attn"])
    if not opaque:
        assert "attn.out_proj" in graph_calls(g)


def _passes_through(f):
    @functools.wraps(f)
    def wrapper(self, *args, **kwargs):
        return f(self, *args, **kwargs)
    return wrapper


class _Decorated(nn.Module):
    """A forward behind a ``*args, **kwargs`` decorator, as transformers' models have: torch.fx
    unwraps it to find the inputs, sees ``**kwargs`` there and rewrites the wrapper's code object
    for that many inputs, which fails ("co_varnames is too small")."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)

    @_passes_through
    def forward(self, x, mask=None, **kwargs):
        return self.a(x).relu()


def test_fx_traces_a_forward_behind_an_args_kwargs_decorator_and_puts_the_class_back():
    model, x = _Decorated(), torch.randn(2, 4)
    g = fxviz.capture(model, (x,), method="fx")
    assert g.method == "fx"
    ops = [n for n in g.nodes if n.kind == "op"]
    assert [n.target for n in ops] == ["Linear", "Tensor.relu"]
    assert ops[0].module == "a" and ops[1].outputs[0].shape == (2, 3)
    assert type(model) is _Decorated and "forward" not in vars(model)
