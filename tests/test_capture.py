"""Symbolic capture against the real forward: modules, outputs, parameters, calls, methods, passes.

Each model of the zoo is built, run eagerly (with forward hooks that record every module call) and
captured once per session; the tests compare the captured graph with what eager PyTorch did.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import models
import pytest
import torch
from torch import nn
from transformers_zoo import TRANSFORMERS_ZOO

import fxviz
from fxviz.api import AUTO_CHAIN, CAPTURERS
from fxviz.ir import Graph
from fxviz.torchbridge.normalize import flatten_outputs

ZOO = {**models.ZOO, **TRANSFORMERS_ZOO}
EXPLICIT = ("export", "export-strict", "fx")

# (model, method) pairs to check structurally: the small zoo under every method that applies, the
# transformers models under "auto" (fx's keyword inputs: test_fx_kwargs.py).
CASES = [
    (name, method)
    for name in models.ZOO
    for method in ("auto", *EXPLICIT)
] + [(name, "auto") for name in TRANSFORMERS_ZOO]
CASE_IDS = [f"{n}-{m}" for n, m in CASES]


@dataclass
class Eager:
    """What the real forward did."""

    model: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outputs: list[tuple[str, Any]]  # flatten_outputs of the real result
    calls: Counter[str] = field(default_factory=Counter)  # module path -> number of forward calls
    passthrough: set[str] = field(default_factory=set)  # modules that returned an input untouched


def run_eager(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Eager:
    calls: Counter[str] = Counter()
    passthrough: set[str] = set()

    def hook(path: str):
        def fn(mod: nn.Module, a: tuple[Any, ...], kw: dict[str, Any], out: Any) -> None:
            calls[path] += 1
            ins = [*a, *kw.values()]
            if isinstance(out, torch.Tensor) and any(out is x for x in ins):
                passthrough.add(path)

        return fn

    handles = [
        m.register_forward_hook(hook(p), with_kwargs=True) for p, m in model.named_modules() if p
    ]
    try:
        with torch.no_grad():
            out = model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return Eager(model, args, kwargs, flatten_outputs(out), calls, passthrough)


@functools.cache
def eager(name: str) -> Eager:
    return run_eager(*ZOO[name]())


@functools.cache
def captured(name: str, method: str) -> Graph:
    e = eager(name)
    return fxviz.capture(e.model, e.args, e.kwargs, method=method)


def tensor_outputs(e: Eager) -> list[tuple[str, torch.Tensor]]:
    return [(p, v) for p, v in e.outputs if isinstance(v, torch.Tensor)]


def user_outputs(g: Graph) -> list[fxviz.Node]:
    """Output nodes for what the model returned (not export's buffer mutations)."""
    return [o for o in g.outputs if ":" not in o.target]


def owners(model: nn.Module) -> dict[str, nn.Parameter]:
    """State-dict name -> parameter, first name only for tied weights (``named_parameters``)."""
    return dict(model.named_parameters())


# ---- every method, every model -------------------------------------------------------------------


@pytest.mark.parametrize(("name", "method"), CASES, ids=CASE_IDS)
def test_capture_records_method(name: str, method: str) -> None:
    g = captured(name, method)
    g.validate()
    assert g.name == type(eager(name).model).__name__
    assert g.attempts, "capture recorded no attempt"
    last = g.attempts[-1]
    assert last.ok and last.method == g.method
    if method == "auto":
        assert g.method in AUTO_CHAIN
        tried = [a.method for a in g.attempts]
        assert tried == list(AUTO_CHAIN[: len(tried)])
        assert all(not a.ok and a.error_type for a in g.attempts[:-1])
    else:
        assert g.method == method
        assert [a.method for a in g.attempts] == [method]


@pytest.mark.parametrize(("name", "method"), CASES, ids=CASE_IDS)
def test_every_called_module_is_in_the_scope_tree(name: str, method: str) -> None:
    e, g = eager(name), captured(name, method)
    scopes = {s.path: s for s in g.scopes.walk()}
    assert e.calls, "the eager forward called no submodule"
    for path, n in e.calls.items():
        if path in e.passthrough:
            # returns its input as is (nn.Identity): no op to place in a scope, but it is known
            assert path in g.modules
            continue
        assert path in scopes, f"{path} ran in eager but is not in the scope tree"
        assert scopes[path].calls == n, f"{path}: {scopes[path].calls} calls in graph, {n} in eager"
        assert scopes[path].cls == type(e.model.get_submodule(path)).__name__
    # and nothing the model never called shows up as called
    for path, s in scopes.items():
        if path and s.calls:
            assert path in e.calls, f"{path} is called in the graph but never ran in eager"


@pytest.mark.parametrize(("name", "method"), CASES, ids=CASE_IDS)
def test_output_shapes_equal_the_real_outputs(name: str, method: str) -> None:
    e, g = eager(name), captured(name, method)
    real = tensor_outputs(e)
    outs = [o for o in user_outputs(g) if o.inputs]
    assert all(o.outputs for o in outs), "an output node has no tensor metadata"
    got = [(o.target, o.outputs[0].shape, o.outputs[0].dtype) for o in outs]
    want = [(p, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for p, v in real]
    # strict export too names outputs by their paths (Dynamo does not run the wrapper's Python,
    # the paths come from the keys of the dict it returns)
    assert got == want


@pytest.mark.parametrize(("name", "method"), CASES, ids=CASE_IDS)
def test_parameters_appear_under_state_dict_names(name: str, method: str) -> None:
    e, g = eager(name), captured(name, method)
    params = {n.target: n for n in g.nodes if n.kind == "parameter"}
    assert len(params) == sum(1 for n in g.nodes if n.kind == "parameter"), "a parameter appears twice"
    for pname, p in owners(e.model).items():
        assert pname in params, f"parameter {pname} missing"
        node = params[pname]
        assert node.meta is not None and node.meta.shape == tuple(p.shape)
        assert node.module == pname.rpartition(".")[0]
        assert "tied_to" not in node.attrs
    tied = {n: n2 for n, n2 in ((k, v.attrs.get("tied_to")) for k, v in params.items()) if n2}
    for alias, owner in tied.items():
        assert e.model.get_parameter(alias) is e.model.get_parameter(owner)


@pytest.mark.parametrize(("name", "method"), CASES, ids=CASE_IDS)
def test_stats_count_each_parameter_once(name: str, method: str) -> None:
    e, g = eager(name), captured(name, method)
    stats = g.annotations["stats"]
    assert stats["total_params"] == sum(p.numel() for p in e.model.parameters())
    assert stats["total_ops"] == len(g.ops)
    assert sum(stats["op_counts"].values()) == len(g.ops)
    for path, entry in stats["modules"].items():
        want = sum(p.numel() for n, p in owners(e.model).items() if not path or n.startswith(path + "."))
        assert entry["params"] == want, f"params of {path!r}"


@pytest.mark.parametrize(("name", "method"), CASES, ids=CASE_IDS)
def test_every_op_has_shapes_and_json_round_trips(name: str, method: str) -> None:
    g = captured(name, method)
    assert g.annotations["shapes"]["missing"] == []
    assert all(n.outputs for n in g.ops)
    assert fxviz.Graph.from_json(g.to_json()).to_dict() == g.to_dict()


# ---- repeated calls ------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ("auto", *EXPLICIT))
def test_module_called_twice_has_two_distinct_calls(method: str) -> None:
    g = captured("called_twice", method)
    shared = next(s for s in g.scopes.walk() if s.path == "shared")
    assert shared.calls == 2
    ops = [n for n in g.ops if n.module == "shared"]
    assert {n.stack[-1][1] for n in ops} == {0, 1}
    first = [n for n in ops if n.stack[-1][1] == 0]
    second = [n for n in ops if n.stack[-1][1] == 1]
    assert [n.target for n in first] == [n.target for n in second]
    # the second call reads what `mid` made of the first: data flows 0 -> mid -> 1
    mid = {n.name for n in g.ops if n.module == "mid"}
    assert mid and any(r.node in mid for n in second for r in n.inputs)
    # one weight, read by both calls
    weight = [n for n in g.nodes if n.target == "shared.weight"]
    assert len(weight) == 1
    readers = [n for n in ops if any(r.node == weight[0].name for r in n.inputs)]
    assert {n.stack[-1][1] for n in readers} == {0, 1}


# ---- methods -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TRANSFORMERS_ZOO))
def test_fx_on_transformers_fails_with_a_reason_or_names_what_it_could_not_see(name: str) -> None:
    """torch.fx cannot trace transformers' data-dependent masks: either every attempt fails with
    its reason recorded, or the modules it could not trace through are kept as single ops and the
    graph says which and why, never a silently smaller graph."""
    e = eager(name)
    try:
        g = fxviz.capture(e.model, e.args, e.kwargs, method="fx")
    except fxviz.CaptureError as err:
        (attempt,) = err.attempts
        assert attempt.method == "fx" and not attempt.ok
        assert attempt.error_type and attempt.reason()
        assert f"fx: {attempt.reason()}" in str(err)
        assert "co_varnames" not in attempt.reason()  # torch.fx's own limit, worked around
        return
    # a module with children called as one op (its class is the op's target), not the ops inside it
    named = {p: type(m).__name__ for p, m in e.model.named_modules() if p and next(m.children(), None) is not None}
    opaque = [n for n in g.nodes if n.kind == "op" and named.get(n.module) == n.target]
    assert opaque, "fx traced a transformers model through: the test's premise changed"
    for n in opaque:
        assert any(f"fx kept {n.module} (" in note and "could not be traced through" in note for note in g.notes)


def test_every_method_failing_raises_capture_error_listing_each(monkeypatch: pytest.MonkeyPatch) -> None:
    # every symbolic method fails on data-dependent control flow; the eager tracer (last in the
    # chain, when present) is made to fail too, so that nothing is left
    def no_tracer(*_: Any) -> Graph:
        raise RuntimeError("tracer unavailable")

    for method in AUTO_CHAIN:
        if method not in EXPLICIT:
            monkeypatch.setitem(CAPTURERS, method, no_tracer)
    model, args, kwargs = models.data_dependent()
    with pytest.raises(fxviz.CaptureError) as info:
        fxviz.capture(model, args, kwargs)
    err = info.value
    assert [a.method for a in err.attempts] == list(AUTO_CHAIN)
    assert all(not a.ok and (a.error_type or a.skipped) for a in err.attempts)
    # after export stopped on a decision on tensor data, strict export and fx cannot make it either
    assert [a.method for a in err.attempts if a.skipped] == ["export-strict", "fx"]
    assert all(a.reason().startswith("skipped: export stopped on a decision on tensor data") and "models.py:" in a.reason()
               for a in err.attempts if a.skipped)
    # one line, every attempt's reason in it; details() lists them one per line
    assert "\n" not in str(err)
    assert str(err).startswith("could not capture DataDependent: every method failed (export: ")
    assert err.details() == [f"{a.method}: {a.reason()}" for a in err.attempts]
    for a in err.attempts:
        assert f"{a.method}: {a.reason()}" in str(err) and "\n" not in a.reason()
    # non-strict export points at the line of the model that branches on data
    export = err.attempts[0]
    assert export.source is not None and export.source.file.endswith("models.py")
    assert "item()" in export.source.code


def test_auto_falls_back_and_records_why(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any) -> Graph:
        raise RuntimeError("export is off today\nsecond line")

    monkeypatch.setitem(CAPTURERS, "export", refuse)
    model, args, kwargs = models.cnn()
    g = fxviz.capture(model, args, kwargs)
    assert g.method == "export-strict"
    first, second = g.attempts
    assert (first.method, first.ok, first.error_type) == ("export", False, "RuntimeError")
    assert first.message == "export is off today\nsecond line"
    assert first.source is not None and first.source.short() == f"test_capture.py:{first.source.line}"
    assert first.reason() == f"RuntimeError: export is off today ({first.source.short()})"
    assert (second.method, second.ok) == ("export-strict", True)


def test_unknown_method_is_refused() -> None:
    model, args, _ = models.cnn()
    with pytest.raises(ValueError, match="not one of"):
        fxviz.capture(model, args, method="dynamo")


@pytest.mark.parametrize("method", ("auto", *EXPLICIT))
def test_capture_leaves_the_model_as_it_found_it(method: str) -> None:
    model, args, kwargs = models.attention()
    model.train()
    model.ln.weight.requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fxviz.capture(model, args, kwargs, method=method)
    assert model.training and all(m.training for m in model.modules())
    assert [p.requires_grad for p in model.parameters()] == [False] + [True] * (
        len(list(model.parameters())) - 1
    )
    assert all(
        not m._forward_hooks and not m._forward_pre_hooks for m in model.modules()
    ), "a hook was left behind"
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_kwargs_inputs_are_named_by_argument() -> None:
    g = captured("kwargs", "auto")
    assert [n.target for n in g.inputs] == ["x", "mask", "extra['bias']"]
    assert [n.meta.shape for n in g.inputs if n.meta] == [(3, 8)] * 3


def test_constant_outputs_keep_their_value() -> None:
    g = captured("dataclass_out", "auto")
    (n_classes,) = [o for o in g.outputs if o.target == "n_classes"]
    assert not n_classes.inputs and n_classes.attrs == {"value": "6"}


# ---- passes on real graphs -----------------------------------------------------------------------


@functools.cache
def gpt2_4_layers() -> tuple[nn.Module, Graph]:
    from transformers_zoo import gpt2

    model, args, kwargs = gpt2(n_layer=4)
    return model, fxviz.capture(model, args, kwargs)


def test_fold_gpt2_blocks_into_one_run() -> None:
    _, g = gpt2_4_layers()
    assert g.annotations["fold"] == [{
        "parent": "transformer.h",
        "paths": [f"transformer.h.{i}" for i in range(4)],
        "cls": "GPT2Block",
        "label": "transformer.h.0-3",
        "count": 4,
    }]


def test_fold_stats_on_gpt2() -> None:
    model, g = gpt2_4_layers()
    stats = g.annotations["stats"]
    assert stats["total_params"] == sum(p.numel() for p in model.parameters())
    per_block = sum(p.numel() for p in model.transformer.h[0].parameters())
    assert [stats["modules"][f"transformer.h.{i}"]["params"] for i in range(4)] == [per_block] * 4
    assert len({stats["modules"][f"transformer.h.{i}"]["ops"] for i in range(4)}) == 1
    assert stats["modules"]["lm_head"]["params"] == 0, "tied to transformer.wte.weight, counted there"


@pytest.mark.parametrize(
    ("name", "parent"),
    [
        ("gpt2", "transformer.h"),
        ("llama", "model.layers"),
        ("qwen2", "model.layers"),
        ("bert", "encoder.layer"),
        ("distilbert", "distilbert.transformer.layer"),
        ("vit", "vit.layers"),
        ("bart", "model.encoder.layers"),
    ],
)
def test_fold_finds_the_stacked_layers(name: str, parent: str) -> None:
    g = captured(name, "auto")
    runs = {r["parent"]: r for r in g.annotations["fold"]}
    assert parent in runs, f"no fold under {parent}: {g.annotations['fold']}"
    assert runs[parent]["paths"] == [f"{parent}.0", f"{parent}.1"]
    assert runs[parent]["count"] == 2


@pytest.mark.parametrize("name", ["cnn", "attention"])
def test_fold_leaves_parallel_siblings_alone(name: str) -> None:
    # initial_conv / parallel_conv (cnn) and q / k / v (attention) are identical siblings that run
    # side by side on one input: parallel work, not a stack of repeated blocks
    for method in ("auto", *EXPLICIT):
        assert captured(name, method).annotations["fold"] == [], method


def test_passes_are_idempotent_on_real_graphs() -> None:
    for name in ("cnn", "called_twice", "gpt2", "t5"):
        g = captured(name, "auto")
        before = g.to_dict()
        again = fxviz.run_passes(Graph.from_dict(before), fxviz.DEFAULT_PASSES)
        assert again.to_dict() == before, name
