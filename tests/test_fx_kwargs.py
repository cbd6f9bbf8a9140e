"""Forced fx takes keyword inputs as torch.fx's ``concrete_args`` do: a tensor given (by keyword, or
in a container) is an input named as the user passed it, every other value (``use_cache=False``,
an int, ``None``) is a constant of the graph and a note says so. Checked against torch.fx's own
trace with the same ``concrete_args`` (placeholders, nodes) and against the model's eager result."""

from __future__ import annotations

import operator
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.fx
from click.testing import CliRunner
from torch import nn

import fxviz
from fxviz.cli import cli
from tests.models import kwargs_inputs
from tests.transformers_zoo import bert, gpt2


class Flags(nn.Module):
    """A forward steered by flags, as transformers' are."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.cache_proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None, *, use_cache: bool = True,
                return_dict: bool = True, output_attentions: bool = False, n_layers: int = 2,
                cache: torch.Tensor | None = None) -> Any:
        h = x
        for _ in range(n_layers):
            h = torch.relu(self.proj(h))
        if attention_mask is not None:
            h = h * attention_mask
        if cache is not None:
            h = h + cache
        cache_out = self.cache_proj(h) if use_cache else None
        attn = h.softmax(-1) if output_attentions else None
        if not return_dict:
            return tuple(v for v in (h, cache_out, attn) if v is not None)
        return {"hidden": h, "cache": cache_out, "attentions": attn}


def _fx_reference(model: nn.Module, concrete: dict[str, Any]) -> tuple[list[str], list[str]]:
    """torch.fx's own trace: its placeholders for tensors (a specialised value's placeholder only
    feeds the guard fx adds for it) and the names of its other nodes, guards left out."""
    graph = torch.fx.Tracer().trace(model, concrete_args=concrete)
    guards = {n for n in graph.nodes if n.op == "call_function"
              and n.target in (torch._assert, torch.fx._symbolic_trace._assert_is_none)}
    guards |= {a for n in guards for a in n.args if isinstance(a, torch.fx.Node) and a.target is operator.eq}
    inputs = [n.name for n in graph.nodes if n.op == "placeholder" and not set(n.users) <= guards]
    ops = [n.name for n in graph.nodes if n.op in ("call_function", "call_method", "call_module") and n not in guards]
    return inputs, ops


def _defaults(model: nn.Module, given: dict[str, Any]) -> dict[str, Any]:
    """The parameters not given, at their defaults, as the eager call runs them."""
    import inspect

    sig = inspect.signature(model.forward)
    return {k: p.default for k, p in sig.parameters.items() if k not in given and k != "x"}


FLAG_CASES = [
    {"attention_mask": torch.ones(2, 8), "use_cache": False, "return_dict": False},
    {"use_cache": True, "return_dict": True, "output_attentions": True, "n_layers": 1, "cache": None},
    {"attention_mask": torch.ones(2, 8), "n_layers": 3, "cache": torch.randn(2, 8), "output_attentions": True},
]


@pytest.mark.parametrize("kwargs", FLAG_CASES, ids=["no-cache-tuple", "dict-attn", "cache-tensor"])
def test_fx_specialises_flags_and_takes_tensor_kwargs_as_torch_fx_does(kwargs: dict[str, Any]) -> None:
    torch.manual_seed(0)
    model, x = Flags().eval(), torch.randn(2, 8)
    g = fxviz.capture(model, (x,), kwargs, method="fx")
    assert g.method == "fx"
    tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    concrete = {**_defaults(model, tensors), **{k: v for k, v in kwargs.items() if k not in tensors}}
    fx_inputs, fx_ops = _fx_reference(model, concrete)
    assert [n.name for n in g.nodes if n.kind == "input"] == fx_inputs == ["x", *tensors]
    assert [n.name for n in g.nodes if n.kind == "op"] == fx_ops
    # the graph says which values it holds for, in its notes (tree, report, JSON alike)
    given = {k: v for k, v in kwargs.items() if k not in tensors}
    (note,) = [s for s in g.notes if s.startswith("fx specialised")]
    assert all(f"{k}={v!r}" in note for k, v in given.items())
    assert note in fxviz.Graph.from_json(g.to_json()).notes
    # what each output is, against the eager result of the same call
    with torch.no_grad():
        want = model(x, **kwargs)
    items = want.items() if isinstance(want, dict) else [(f"output[{i}]", v) for i, v in enumerate(want)]
    shapes = {o.target: tuple(o.outputs[0].shape) for o in g.outputs if o.outputs}
    assert shapes == {k: tuple(v.shape) for k, v in items if v is not None}


def test_fx_takes_a_dict_of_tensors_by_keyword_named_as_passed(tmp_path: Path) -> None:
    model, args, kwargs = kwargs_inputs()
    g = fxviz.capture(model, args, kwargs, method="fx")
    g.to_html(tmp_path / "g.html")
    assert "scale=0.5" in (tmp_path / "g.html").read_text()  # the report shows the note too
    fx_inputs, fx_ops = _fx_reference(model, {"scale": 0.5, "extra": {"bias": torch.fx.PH}})
    inputs = [n.target for n in g.nodes if n.kind == "input"]
    assert inputs == ["x", "mask", "extra['bias']"] and len(fx_inputs) == len(inputs)
    assert [n.name for n in g.nodes if n.kind == "op"] == fx_ops
    assert any("scale=0.5" in s for s in g.notes)
    (out,) = g.outputs
    assert tuple(out.outputs[0].shape) == tuple(model(*args, **kwargs).shape)


class _Box:
    """A cache object pytree does not flatten."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


class _Cached(nn.Module):
    def forward(self, x: torch.Tensor, cache: _Box | None = None) -> torch.Tensor:
        return x + cache.t if cache is not None else x


def test_an_input_holding_tensors_pytree_cannot_reach_is_a_clear_error() -> None:
    with pytest.raises(fxviz.CaptureError) as info:
        fxviz.capture(_Cached(), (torch.randn(2),), {"cache": _Box(torch.randn(2))}, method="fx")
    (attempt,) = info.value.attempts
    assert attempt.message.startswith("fx cannot take cache (_Box) as an input") and "method='export'" in attempt.message
    assert "\n" not in attempt.message


def test_gpt2_without_cache_under_fx_against_torch_fx_and_eager() -> None:
    """torch.fx cannot trace transformers' GPT-2 itself (transformers has its own tracer for
    that); forced fx gets a graph, its unseen modules named, its flags specialised, its logits
    the shape eager gives."""
    model, args, _ = gpt2()
    kwargs = {"use_cache": False, "return_dict": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises((torch.fx.proxy.TraceError, ValueError, TypeError)):
            torch.fx.symbolic_trace(model, concrete_args=kwargs)
        g = fxviz.capture(model, args, kwargs, method="fx")
        with torch.no_grad():
            (logits,) = model(*args, **kwargs)
    assert [n.target for n in g.nodes if n.kind == "input"] == ["input_ids"]
    assert any("use_cache=False, return_dict=False" in s for s in g.notes)
    assert any(s.startswith("fx kept transformer (GPT2Model) as one op") for s in g.notes)
    first, *rest = g.outputs
    assert first.target == "output[0]" and tuple(first.outputs[0].shape) == tuple(logits.shape)
    # the fields the opaque GPT2Model leaves unset are None as it runs (eager's tuple drops them;
    # fx cannot see that they are None, so its graph returns them)
    assert rest and all(o.attrs.get("value") == "None" and not o.inputs for o in rest)


def test_bert_under_fx_fails_with_one_line_saying_what_to_do() -> None:
    model, args, kwargs = bert()
    with pytest.raises(fxviz.CaptureError) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fxviz.capture(model, args, {**kwargs, "return_dict": False}, method="fx")
    (attempt,) = info.value.attempts
    assert attempt.error_type == "TraceError" and "\n" not in attempt.message
    assert attempt.message.endswith("use method='export' or 'eager'")
    assert attempt.source is not None and attempt.source.file.endswith("masking_utils.py")


FACTORY = '''
import torch
from tests.test_fx_kwargs import Flags

def build():
    torch.manual_seed(0)
    return Flags().eval(), (torch.randn(2, 8),), {"attention_mask": torch.ones(2, 8), "use_cache": False}
'''


def test_cli_fx_passes_a_factorys_keyword_inputs(tmp_path: Path) -> None:
    target = tmp_path / "flags_factory.py"
    target.write_text(FACTORY)
    res = CliRunner().invoke(cli, ["json", f"{target}:build", "--method", "fx"])
    assert res.exit_code == 0, res.output
    g = fxviz.Graph.from_json(res.output[res.output.index("{"):])
    assert g.method == "fx" and [n.target for n in g.nodes if n.kind == "input"] == ["x", "attention_mask"]
    assert any("use_cache=False" in s for s in g.notes)
    tree = CliRunner().invoke(cli, ["tree", f"{target}:build", "--method", "fx"])
    assert tree.exit_code == 0 and "use_cache=False" in tree.output
