"""The eager tracer (fxviz/fallback): complete graphs for models that run, partial graphs for models
that raise, replay as the fidelity oracle, and nothing left behind in torch or the model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.modules import module as nn_module

import fxviz
from fxviz.errors import ModelError
from fxviz.fallback import ReplayError, replay, trace_eager
from fxviz.ir import Graph
from fxviz.torchbridge.normalize import _describe, flatten_outputs
from tests.fallback_models import ZOO, Built, InPlace, TrainingBatchNorm, WithHooks
from tests.transformers_zoo import TRANSFORMERS_ZOO

REPO = Path(__file__).resolve().parents[1]


# ---- what "untouched" means -------------------------------------------------------------------


@dataclass
class ModelState:
    state: dict[str, torch.Tensor]
    training: dict[str, bool]
    hooks: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]
    requires_grad: dict[str, bool]


def snapshot(model: nn.Module) -> ModelState:
    return ModelState(
        state={k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()},
        training={p: m.training for p, m in model.named_modules()},
        hooks={p: (tuple(m._forward_hooks), tuple(m._forward_pre_hooks)) for p, m in model.named_modules()},
        requires_grad={k: p.requires_grad for k, p in model.named_parameters()},
    )


def assert_untouched(model: nn.Module, before: ModelState) -> None:
    after = snapshot(model)
    assert after.training == before.training
    assert after.hooks == before.hooks
    assert after.requires_grad == before.requires_grad
    assert after.state.keys() == before.state.keys()
    for k, v in before.state.items():
        assert torch.equal(after.state[k], v), f"capture changed {k}"


def assert_no_leak() -> None:
    assert torch._C._len_torch_function_stack() == 0
    assert torch._C._len_torch_dispatch_stack() == 0
    for name in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
                 "_global_backward_pre_hooks", "_global_forward_hooks_always_called",
                 "_global_forward_hooks_with_kwargs"):
        assert not getattr(nn_module, name), name
    assert torch.is_grad_enabled()


@pytest.fixture(autouse=True)
def _clean_torch() -> Iterator[None]:
    assert_no_leak()
    yield
    assert_no_leak()


# ---- what a correct graph means ---------------------------------------------------------------


def modules_that_run(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[set[str], Any]:
    """Paths of the submodules whose forward runs in a plain eager call, and its output."""
    ran: set[str] = set()
    handles = [
        m.register_forward_pre_hook(lambda mod, a, p=path: ran.add(p))
        for path, m in model.named_modules() if path
    ]
    out: Any = None
    try:
        with torch.no_grad():
            out = model(*args, **kwargs)
    except Exception:
        pass  # a model that raises: the modules up to the failure ran
    finally:
        for h in handles:
            h.remove()
    return ran, out


def called_scopes(g: Graph) -> set[str]:
    return {s.path for s in g.scopes.walk() if s.calls > 0 and s.path}


def assert_outputs_match(g: Graph, out: Any) -> None:
    nodes = {n.target: n for n in g.outputs}
    leaves = flatten_outputs(out)
    assert set(nodes) == {p for p, _ in leaves}
    for path, v in leaves:
        node = nodes[path]
        if isinstance(v, torch.Tensor):
            assert node.inputs, path
            assert g.meta_of(node.inputs[0]).shape == tuple(v.shape), path
            assert g.meta_of(node.inputs[0]).dtype == str(v.dtype).removeprefix("torch.")
        else:
            assert not node.inputs and node.attrs["value"] == _describe(v), path


def assert_replays(g: Graph, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
    replayed = replay(g, model, args, kwargs)
    for path, v in flatten_outputs(out):
        if isinstance(v, torch.Tensor):
            torch.testing.assert_close(replayed[path], v, msg=lambda m, p=path: f"{p}: {m}")
        else:
            assert replayed[path] == _describe(v)


# ---- the zoo through auto and through the forced tracer --------------------------------------


#: The zoo as test parameters; the deepest model is for `make test`, not the quick loop.
ZOO_PARAMS = [pytest.param(n, marks=pytest.mark.slow) if n == "deep_residual" else n for n in ZOO]


@pytest.mark.parametrize("name", ZOO_PARAMS)
def test_zoo_auto(name: str) -> None:
    entry = ZOO[name]
    model, args, kwargs = entry.build()
    ran, out = modules_that_run(model, args, kwargs)
    before = snapshot(model)
    if entry.raises:
        with pytest.raises(ModelError) as info:
            fxviz.capture(model, args, kwargs)
        g = info.value.graph
        assert g is not None and g.partial and g.attempts[-1].method == "eager"
        assert [a.ok for a in g.attempts] == [False] * len(g.attempts)
        assert "stats" in g.annotations  # passes ran on the partial graph
    else:
        g = fxviz.capture(model, args, kwargs)
        assert g.attempts[-1].ok and g.attempts[-1].method == g.method.split(" ")[0]
        assert_outputs_match(g, out)
    g.validate()
    assert ran <= called_scopes(g) | set(g.annotations.get("failure", {}).get("module", "").split())
    assert_untouched(model, before)


@pytest.mark.parametrize("level", ["function", "aten"])
@pytest.mark.parametrize("name", ZOO_PARAMS)
def test_zoo_eager(name: str, level: str) -> None:
    entry = ZOO[name]
    model, args, kwargs = entry.build()
    ran, out = modules_that_run(model, args, kwargs)
    before = snapshot(model)
    if entry.tracer_limit is not None:  # torch's own error reaches the caller, not a ModelError
        error, message = entry.tracer_limit[level]
        with pytest.raises(error, match=message or None):
            trace_eager(model, args, kwargs, level=level)
        assert_untouched(model, before)
        # KNOWN ISSUE (closing note, issue 9): after the tracer fails inside torch.cond's own
        # compile, a later non-strict export of another cond model in the same pytest process
        # can fail with Dynamo's "Observed exception"; not reproduced outside pytest yet. Until it
        # is found, the test leaves Dynamo fresh so test_hops sees the state a user starts with.
        torch._dynamo.reset()
        return
    if entry.raises:
        with pytest.raises(ModelError) as info:
            trace_eager(model, args, kwargs, level=level)
        g = info.value.graph
        assert g is not None
    else:
        g = trace_eager(model, args, kwargs, level=level)
        assert g.method == ("eager" if level == "function" else "eager-aten")
        assert_outputs_match(g, out)
        if entry.replay and level == "function":
            assert g.annotations["replay"] == {"ok": True}
            assert_replays(g, model, args, kwargs, out)
        elif level == "function":
            assert g.annotations["replay"]["ok"] is False
    g.validate()
    assert Graph.from_json(g.to_json()).to_dict() == json.loads(g.to_json())
    scopes = called_scopes(g)
    if entry.raises:
        assert scopes <= ran
    else:
        assert scopes == ran
    assert all(n.source is not None for n in g.ops), [n.name for n in g.ops if n.source is None]
    assert_untouched(model, before)


# ---- what each zoo model is there to show ------------------------------------------------------


def _eager(name: str, level: str = "function") -> tuple[Graph, Built]:
    built = ZOO[name].build()
    model, args, kwargs = built
    return trace_eager(model, args, kwargs, level=level), built


def test_data_dependent_exits_are_marked_with_their_line() -> None:
    g, _ = _eager("data_dependent_if")
    exits = [n for n in g.ops if n.attrs.get("data_dependent")]
    assert [n.target for n in exits] == ["Tensor.__bool__"]
    assert exits[0].source is not None and exits[0].source.code == "if y.sum() > 0:"
    assert exits[0].source.file.endswith("fallback_models.py")
    assert g.node(exits[0].inputs[0].node).target == "Tensor.gt"

    g, _ = _eager("data_dependent_loop")
    (item,) = [n for n in g.ops if n.attrs.get("data_dependent")]
    assert item.target == "Tensor.item" and item.outputs[0].value == "3"
    assert g.node(item.inputs[0].node).kind == "input"
    linears = [n for n in g.ops if n.target == "torch.nn.functional.linear"]
    assert [n.stack for n in linears] == [(("block", i),) for i in range(3)]
    assert g.scopes.children["block"].calls == 3

    g, _ = _eager("data_dependent_loop", level="aten")
    assert [n.target for n in g.ops if n.attrs.get("data_dependent")] == ["aten._local_scalar_dense.default"]


def test_auto_falls_back_to_eager_for_data_dependent_routing() -> None:
    model, args, kwargs = ZOO["mixture_of_experts"].build()
    g = fxviz.capture(model, args, kwargs)
    assert g.method == "eager"
    assert [a.method for a in g.attempts] == ["export", "export-strict", "fx", "eager"]
    assert all(a.reason() for a in g.attempts[:-1]) and not any(a.ok for a in g.attempts[:-1])
    routed = {p for n in g.ops for p, _ in n.stack if p.startswith("experts.") and p.count(".") == 1}
    assert routed and routed <= {f"experts.{i}" for i in range(4)}
    assert any(n.target == "Tensor.nonzero" for n in g.ops)


def test_in_place_and_view_writes_are_seen_by_readers() -> None:
    model = InPlace().eval()
    x = torch.randn(4, 6)
    g = trace_eager(model, (x,))
    by_target = {n.target: n for n in g.ops}
    mul_, relu, setitem, add_, mul = (by_target[t] for t in (
        "Tensor.mul_", "torch.nn.functional.relu", "Tensor.__setitem__", "Tensor.add_", "Tensor.mul"))
    assert mul_.inputs[0].node == by_target["torch.nn.functional.linear"].name
    assert relu.inputs[0].node == mul_.name and relu.attrs["inplace"] is True
    assert setitem.inputs[0].node == relu.name  # relu(inplace=True) wrote y
    assert setitem.attrs["aliases"] == [[0, relu.name]]
    getitem = g.node(add_.inputs[0].node)
    assert getitem.target == "Tensor.__getitem__" and getitem.inputs[0].node == setitem.name
    # y * 3 reads y after the write through its view `row`: an extra output of add_
    assert mul.inputs[0].node == add_.name and mul.inputs[0].index == 1
    assert add_.outputs[1].shape == (4, 6)
    torch.testing.assert_close(replay(g, model, (x,))["output"], model(x))


def test_shared_module_calls_are_counted() -> None:
    g, _ = _eager("shared_thrice")
    shared = g.scopes.children["shared"]
    assert shared.calls == 3
    assert [n.kind for n in g.nodes if n.target == "shared.weight"] == ["parameter"]
    weight = next(n for n in g.nodes if n.target == "shared.weight")
    assert weight.stack == (("shared", 0),)
    users = g.users()[weight.name]
    assert [g.node(u).stack for u in users] == [(("shared", i),) for i in range(3)]


def test_user_hooks_fire_once_and_their_ops_belong_to_the_module() -> None:
    model = WithHooks().eval()
    x = torch.randn(4, 8)
    g = trace_eager(model, (x,))
    assert model.calls == {"pre": 1, "post": 1}
    scaled = next(n for n in g.ops if n.target == "Tensor.mul")
    assert scaled.stack == (("lin", 0),)
    out = g.node(next(n for n in g.ops if n.stack == (("out", 0),)).name)
    assert out.inputs[0].node == scaled.name
    # a capture puts back what the forward changed, the hooks' own count included; a hook whose
    # count lives outside the model shows they fire once per capture, and stay registered
    fired: list[str] = []
    model.lin.register_forward_hook(lambda *_: fired.append("post"))
    fxviz.capture(model, (x,), method="eager")
    assert fired == ["post"] and model.calls == {"pre": 1, "post": 1}
    model(x)
    assert fired == ["post", "post"] and model.calls == {"pre": 2, "post": 2}


def test_training_batchnorm_stats_survive_and_replay_says_why_not() -> None:
    model = TrainingBatchNorm().train()
    x = torch.randn(6, 8)
    before = snapshot(model)
    g = trace_eager(model, (x,))
    assert_untouched(model, before)
    bn = next(n for n in g.ops if n.target == "torch.nn.functional.batch_norm")
    assert [g.node(r.node).target for r in bn.inputs[1:3]] == ["bn.running_mean", "bn.running_var"]
    # BatchNorm writes its running statistics without a version bump or a schema annotation, so
    # the graph cannot show the write; the capture still restores them, at both levels
    trace_eager(model, (x,), level="aten")
    assert_untouched(model, before)
    assert g.annotations["replay"]["ok"] is False
    assert "dropout" in g.annotations["replay"]["reason"]
    with pytest.raises(ReplayError, match="dropout"):
        replay(g, model, (x,))
    assert model.training and all(m.training for m in model.modules())


def test_model_error_keeps_the_partial_graph() -> None:
    model, args, kwargs = ZOO["broken"].build()
    before = snapshot(model)
    with pytest.raises(ModelError) as info:
        fxviz.capture(model, args, kwargs, method="eager")
    err = info.value
    assert isinstance(err.__cause__, RuntimeError)
    assert "head" in str(err) and "fallback_models.py" in str(err) and "RuntimeError" in str(err)
    g = err.graph
    assert g is not None and g.error and g.partial
    failed = [n for n in g.nodes if n.error]
    assert len(failed) == 1 and failed[0].target == "torch.nn.functional.linear"
    assert failed[0].stack == (("head", 0),) and "RuntimeError" in failed[0].error
    assert g.annotations["failure"]["module"] == "head"
    assert [n.stack for n in g.ops if not n.error] == [(("body", 0), ("body.0", 0)), (("body", 0), ("body.1", 0))]
    assert g.attempts[-1].method == "eager" and g.attempts[-1].error_type == "RuntimeError"
    assert not g.outputs
    assert_untouched(model, before)


class _Interrupting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.bn(x)
        raise KeyboardInterrupt


@pytest.mark.parametrize("level", ["function", "aten"])
def test_keyboard_interrupt_leaves_nothing_behind(level: str) -> None:
    model = _Interrupting().train()
    before = snapshot(model)
    with pytest.raises(KeyboardInterrupt):
        trace_eager(model, (torch.randn(8, 4),), level=level)
    assert_no_leak()
    assert_untouched(model, before)


def test_non_tensor_outputs_and_kwargs_inputs() -> None:
    g, (model, args, kwargs) = _eager("non_tensor_outputs")
    assert [n.target for n in g.inputs] == ["x", "mask"]
    assert {n.target: n.attrs.get("value") for n in g.outputs} == {
        "summary.scores": None, "summary.count": "4", "summary.label": "'ok'", "summary.extra": "None",
        "pair[0]": None, "pair[1]": "None", "name": "'nto'",
    }
    fill = next(n for n in g.ops if n.target == "Tensor.masked_fill")
    assert g.node(fill.inputs[1].node).target == "mask"


def test_complex_dtypes() -> None:
    g, _ = _eager("complex_fft")
    rfft = next(n for n in g.ops if n.target == "torch.fft.rfft")
    assert rfft.outputs[0].dtype == "complex64" and rfft.outputs[0].shape == (2, 9)
    assert g.node("filt").kind == "parameter"


def test_a_negative_index_into_a_size_is_an_output_index_a_saved_graph_reads_back() -> None:
    """fx reads ``x.shape[-1]`` as ``getitem(getattr(x, "shape"), -1)``: the reference is to the
    size's last element (index 1 of a 2-d input), which ``from_json`` accepts; -1 it refused."""
    model, args, kwargs = ZOO["complex_fft"].build()
    g = fxviz.capture(model, args, kwargs, method="fx")
    irfft = next(n for n in g.ops if n.target.endswith("irfft"))
    size = next(r for r in irfft.inputs if g.node(r.node).target == "getattr")  # x.shape
    assert size.index == len(g.node(size.node).outputs) - 1 == args[0].dim() - 1
    again = fxviz.Graph.from_json(g.to_json())
    assert again.to_json() == g.to_json()


def test_deep_stack_is_complete_and_folds() -> None:
    model, args, kwargs = ZOO["deep_residual"].build()
    g = fxviz.capture(model, args, kwargs, method="eager")
    assert len(g.ops) == 4 * 300
    assert sum(1 for n in g.nodes if n.kind == "parameter") == 4 * 300
    (run,) = g.annotations["fold"]
    assert run["count"] == 300 and run["label"] == "layers.0-299"


def test_custom_function_and_cond_run_their_ops() -> None:
    g, _ = _eager("custom_function")
    assert [n.target for n in g.ops] == [
        "torch.nn.functional.linear", "Tensor.clamp", "Tensor.mul", "Tensor.add"]
    model, args, kwargs = ZOO["cond"].build()
    g = fxviz.capture(model, args, kwargs)  # export follows torch.cond; the tracer cannot
    assert g.method == "export" and any("cond" in n.target for n in g.ops)


# ---- real architectures -------------------------------------------------------------------------


def mixtral() -> Built:
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    cfg = MixtralConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
    )
    return MixtralForCausalLM(cfg).eval(), (torch.randint(0, 96, (1, 7)),), {}


# every architecture of the foundation zoo, plus a mixture-of-experts LM
ARCHS = {**TRANSFORMERS_ZOO, "mixtral": mixtral}


def test_mixture_of_experts_lm_is_complete_under_auto() -> None:
    model, args, kwargs = mixtral()
    ran, out = modules_that_run(model, args, kwargs)
    g = fxviz.capture(model, args, kwargs)
    g.validate()
    silent = {p for p, m in model.named_modules() if isinstance(m, (nn.Dropout, nn.Identity))}
    assert ran - silent <= called_scopes(g)
    assert_outputs_match(g, out)


@pytest.mark.parametrize("level", ["function", "aten"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_transformers_through_the_tracer(arch: str, level: str) -> None:
    model, args, kwargs = ARCHS[arch]()
    ran, out = modules_that_run(model, args, kwargs)
    before = snapshot(model)
    g = fxviz.capture(model, args, kwargs, method="eager" if level == "function" else "eager-aten")
    g.validate()
    # every module that ran is in the graph, also one that computed nothing (an eval-mode Dropout
    # dispatches no ATen op: it is a call of its own, a "call" node)
    assert called_scopes(g) == ran
    assert_outputs_match(g, out)
    if level == "function":
        assert g.annotations["replay"] == {"ok": True}
        with torch.no_grad():
            assert_replays(g, model, args, kwargs, out)
    assert_untouched(model, before)


# ---- models too big for the machine --------------------------------------------------------------


def test_meta_model_through_export_and_fake_tracer() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 96, (1, 7), device="meta")
    exported = fxviz.capture(model, (ids,), method="export")
    traced = fxviz.capture(model, (ids,), method="eager")
    assert (exported.method, traced.method) == ("export", "eager (fake)")
    for g in (exported, traced):
        assert next(n for n in g.outputs if n.target == "logits").outputs[0].shape == (1, 7, 96)
    assert called_scopes(traced) >= {f"model.layers.{i}.self_attn" for i in range(2)}
    assert all(p.is_meta for p in model.parameters())


@pytest.mark.slow  # a subprocess capturing an 80-layer model twice (~40 s)
def test_llama_70b_shape_on_meta_both_ways() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, str(REPO / "tests" / "_meta_llama.py")], capture_output=True, text=True,
        timeout=120, env=env, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for method, label in (("export", "export"), ("eager", "eager (fake)")):
        r = result[method]
        assert r["method"] == label
        assert r["layers"] == 80 and r["calls"] == "model.layers.79"
        assert r["logits"] == [1, 16, 32000]
        assert r["params"] > 68_000_000_000
    # time is the benchmark's business (README "Performance"); memory is what decides whether
    # a too-big model can be looked at on this machine at all
    assert result["peak_rss_mb"] < 4096
