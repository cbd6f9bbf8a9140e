"""A capture is complete or it is not a success: TorchScript, graphs without ops, custom ops named
``namespace::name``, wrapped models, runtime assertions and inputs the model rejects, the auto chain
skipping what cannot succeed, and constants placed with their layer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import capture_models as cm
import pytest
import torch
from torch import nn
from transformers_zoo import gpt2

import fxviz
from fxviz.api import AUTO_CHAIN, CAPTURERS, METHODS
from fxviz.ir import Graph
from fxviz.ops import short_name

REPO = Path(__file__).resolve().parents[1]


# ---- TorchScript and graphs without ops ------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_a_torchscript_module_is_refused_with_what_to_do(method: str) -> None:
    scripted = torch.jit.script(cm.Teacher().eval())
    with pytest.raises(fxviz.TargetError) as info:
        fxviz.capture(scripted, (torch.randn(2, 8),), method=method)
    message = str(info.value)
    assert "TorchScript" in message and "pass the original nn.Module" in message and "\n" not in message


def test_a_graph_without_ops_while_the_model_ran_ops_is_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    model, args, kwargs = cm.small()
    monkeypatch.setitem(CAPTURERS, "export", lambda *a: Graph(name="Small", method="export"))
    g = fxviz.capture(model, args, kwargs)
    assert g.method == "export-strict" and g.ops
    failed = g.attempts[0]
    assert failed.method == "export" and not failed.ok
    assert "captured no op while the model ran" in failed.message
    with pytest.raises(fxviz.CaptureError, match="captured no op"):
        fxviz.capture(model, args, kwargs, method="export")


def test_a_model_that_runs_no_op_may_have_a_graph_without_ops() -> None:
    class Identity(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    g = fxviz.capture(Identity(), (torch.randn(2),))
    assert g.method == "export" and not g.ops


# ---- custom ops ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["export", "export-strict", "fx", "eager", "eager-aten"])
def test_a_custom_op_is_named_by_its_namespace(method: str) -> None:
    model, args, kwargs = cm.custom_op()
    g = fxviz.capture(model, args, kwargs, method=method)
    (op,) = [n for n in g.ops if "scaled_swish" in n.target]
    assert op.target == "fxviz_tests::scaled_swish.default"
    assert short_name(op.target) == "fxviz_tests::scaled_swish"
    assert "fxviz_tests::scaled_swish" in str(g) and "default" not in str(g)


def test_a_custom_op_aligns_in_the_diff() -> None:
    model, args, kwargs = cm.custom_op()
    d = fxviz.compare(model, args, kwargs)
    assert not [x for x in d.differences if x.kind in ("only_in_a", "only_in_b")], [x.message for x in d.differences]


# ---- wrapped models -------------------------------------------------------------------------------


def _assert_like_the_model(g: Graph, wrapper: str) -> None:
    assert g.name == "Small"
    assert [n.target for n in g.inputs][0] == "features"  # fx adds the keyword input with its default
    assert {n.module for n in g.ops} == {"encoder.0", "encoder.1", "head", ""}
    assert not any("_orig_mod" in p or p.startswith("module") for p in g.modules)
    assert any(note.startswith(f"unwrapped {wrapper}") for note in g.notes), g.notes
    assert Graph.from_json(g.to_json()).notes == g.notes
    assert "ℹ unwrapped" in str(g)


def test_a_compiled_model_is_captured_as_the_model_it_holds() -> None:
    model, args, kwargs = cm.small()
    g = fxviz.capture(torch.compile(model), args, {"scale": 2.0})
    _assert_like_the_model(g, "OptimizedModule")


@pytest.mark.parametrize("method", ["auto", "fx", "eager"])
def test_a_data_parallel_model_is_captured_as_the_model_it_holds(method: str) -> None:
    model, args, _ = cm.small()
    _assert_like_the_model(fxviz.capture(nn.DataParallel(model), args, method=method), "DataParallel")


def test_a_distributed_data_parallel_model_is_captured_as_the_model_it_holds(tmp_path: Path) -> None:
    import torch.distributed as dist

    model, args, _ = cm.small()
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        wrapped = nn.parallel.DistributedDataParallel(model)
        _assert_like_the_model(fxviz.capture(wrapped, args), "DistributedDataParallel")
    finally:
        dist.destroy_process_group()


# ---- runtime assertions and inputs the model rejects -----------------------------------------------


def test_a_deferred_check_is_an_assumption_that_holds_for_the_inputs() -> None:
    model, args, kwargs = cm.image_tokens(2)
    g = fxviz.capture(model, args, kwargs)
    assert g.method == "export"
    checks = [a for a in g.assumptions if a.kind == "assertion"]
    assert checks and all(a.holds is True for a in checks)
    assert any(a.expr == "u0 == 2" for a in checks), [a.expr for a in checks]
    assert all(a.source is not None and a.source.file.endswith("capture_models.py") for a in checks)
    back = Graph.from_json(g.to_json())
    assert back.assumptions == g.assumptions


@pytest.mark.parametrize("method", ["auto", "export", "export-strict"])
def test_inputs_the_model_rejects_are_a_model_error_with_the_partial_graph(method: str) -> None:
    model, args, kwargs = cm.image_tokens(1)
    with pytest.raises(fxviz.ModelError, match="image tokens do not match image features") as info:
        fxviz.capture(model, args, kwargs, method=method)
    g = info.value.graph
    assert g is not None and g.partial and g.method == "eager" and g.ops
    first = g.attempts[0]
    assert first.method == (method if method != "auto" else "export") and first.error_type == "RejectedInputs"
    if first.method == "export":  # non-strict export keeps the check as an assertion of its graph
        assert "asserts u0" in first.message and "false for these inputs" in first.message
    else:  # Dynamo drops it while it traces: the model itself, run once, rejects the inputs
        assert first.message.startswith("the model does not run on these inputs: RuntimeError: image tokens")
    assert g.attempts[-1].method == "eager" and not g.attempts[-1].ok


def test_without_validation_the_assertion_is_listed_unchecked() -> None:
    model, args, kwargs = cm.image_tokens(1)
    g = fxviz.capture(model, args, kwargs, method="export", validate=False)
    checks = [a for a in g.assumptions if a.kind == "assertion"]
    assert checks and all(a.holds is None for a in checks)


def test_llava_with_the_wrong_image_token_count_is_a_model_error() -> None:
    model, args, kwargs = cm.llava(4)
    g = fxviz.capture(model, args, kwargs)
    assert g.method == "export" and [a for a in g.assumptions if a.kind == "assertion" and a.holds]
    model, args, kwargs = cm.llava(3)
    with pytest.raises(fxviz.ModelError, match="Image features and image tokens do not match"):
        fxviz.capture(model, args, kwargs)


def test_the_cli_does_not_call_a_rejected_capture_a_success(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text(
        "import torch\nfrom torch import nn\n\n\ndef model():\n    return nn.Sequential(nn.Linear(3, 4), nn.ReLU())\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "fxviz", "tree", "good.py:model", "-i", "2,3", "--dtype", "int64"]
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr
    assert "captured by torch.export" not in run.stdout and "mat1 and mat2 must have the same dtype" in run.stderr
    run = subprocess.run([*cmd, "--no-validate"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "captured by torch.export" in run.stdout


def test_a_model_on_meta_given_real_inputs_is_an_error_not_a_fake_graph() -> None:
    model, args, _ = cm.small()
    model = model.to("meta")
    with pytest.raises(fxviz.ModelError) as info:
        fxviz.capture(model, args)
    assert info.value.graph is not None and "(fake)" not in info.value.graph.method
    g = fxviz.capture(model, (args[0].to("meta"),))  # meta inputs: nothing runs, nothing to check
    assert g.method == "export" and g.ops
    assert fxviz.capture(model, (args[0].to("meta"),), method="eager").method == "eager (fake)"


def test_checking_the_inputs_leaves_model_inputs_and_generators_as_found() -> None:
    class Writes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn = nn.BatchNorm1d(4)
            self.drop = nn.Dropout(0.5)
            self.register_buffer("steps", torch.zeros(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.steps.add_(1)
            x.mul_(2)
            return self.drop(self.bn(x))

    torch.manual_seed(0)
    model = Writes().train()
    x = torch.randn(3, 4)
    before = ({k: v.clone() for k, v in model.state_dict().items()}, x.clone(), torch.get_rng_state())
    for method in ("export", "auto"):  # (fx's own tracing is issue 9's state harness)
        fxviz.capture(model, (x,), method=method)
        assert all(torch.equal(v, before[0][k]) for k, v in model.state_dict().items()), method
        assert torch.equal(x, before[1]) and torch.equal(torch.get_rng_state(), before[2]), method


# ---- what the confirming run runs -------------------------------------------------------------------

_RUNS: list[int] = []


@torch.library.custom_op("fxviz_confirm::tick", mutates_args=())
def _tick(x: torch.Tensor) -> torch.Tensor:
    """Counts the real executions of a model's ops (export traces the fake kernel below)."""
    _RUNS.append(1)
    return x.clone()


@_tick.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class _Counted(nn.Module):
    """A GPT-2-like plain model (embedding, projection, every size static), or with ``check`` a
    LLaVA-like one whose export defers a check on tensor data to run time; ``tick`` counts runs."""

    def __init__(self, check: bool) -> None:
        super().__init__()
        self.check = check
        self.embed = nn.Embedding(16, 8)
        self.proj = nn.Linear(8, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.check:
            n = (ids == 3).sum().item()
            torch._check(n == 2, lambda: "wants two 3s")
        return self.proj(torch.ops.fxviz_confirm.tick(self.embed(ids)))


@pytest.mark.parametrize("method", ["export", "auto"])
def test_a_program_export_proved_is_not_run_again(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import fxviz.symbolic.export as exporting

    runs: list[bool] = []
    real = exporting.run_program

    def spy(*args: object) -> object:
        run = real(*args)  # type: ignore[arg-type]
        runs.append(run.ran)
        return run

    monkeypatch.setattr(exporting, "run_program", spy)
    model, ids = _Counted(check=False).eval(), torch.tensor([[1, 3, 3, 5]])
    del _RUNS[:]
    g = fxviz.capture(model, (ids,), method=method, isolate=False)
    assert g.method == "export" and any(n.target.startswith("fxviz_confirm::tick") for n in g.ops)
    assert _RUNS == [] and runs == [False]  # confirmed by export itself: never run for real
    model, args, kwargs = gpt2(n_layer=1)
    g = fxviz.capture(model, args, kwargs, method=method, isolate=False)
    assert g.method == "export" and runs == [False, False]


def test_a_deferred_check_is_confirmed_by_running_only_what_it_reads() -> None:
    from torch.export import export

    from fxviz.symbolic.check import check_slice, needs_running

    model, ids = _Counted(check=True).eval(), torch.tensor([[1, 3, 3, 5]])
    ep = export(model, (ids,))
    asserts = [n for n in ep.graph.nodes if n.target is torch.ops.aten._assert_scalar.default]
    assert asserts and needs_running(ep) is not None  # torch's record: checks deferred to run time
    only = check_slice(ep)
    assert only is not None and set(asserts) <= only
    assert {n.name for n in only if n.op == "placeholder"} == {"ids"}  # no weight is read
    assert not any(w in str(n.target) for n in only for w in ("embedding", "tick", "linear"))
    del _RUNS[:]
    g = fxviz.capture(model, (ids,), method="export")
    assert _RUNS == []  # the count the check reads ran; the model behind it did not
    checks = {a.expr: a.holds for a in g.assumptions if a.kind == "assertion"}
    assert checks.get("u0 == 2") is True and set(checks.values()) == {True}, checks
    with pytest.raises(fxviz.ModelError, match="wants two 3s") as info:
        fxviz.capture(model, (torch.tensor([[1, 3, 5, 5]]),), method="export")
    first = info.value.graph.attempts[0]  # type: ignore[union-attr]
    # the full-speed run failed, then the node-by-node run named the assertion that failed
    assert first.error_type == "RejectedInputs" and "asserts u0 >= 2 (test_capture_checks.py:" in first.message
    assert "false for these inputs" in first.message


class _Sized(nn.Module):
    """A size bound to data (a boolean mask's ``nonzero``) that a later op reads."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.ops.fxviz_confirm.tick(ids[ids > 2].float())


def test_a_size_bound_to_data_runs_the_whole_program_once_at_full_speed() -> None:
    from torch.export import export

    from fxviz.symbolic.check import check_slice

    ids = torch.tensor([1, 3, 5, 7])
    ep = export(_Sized(), (ids,))
    assert any(n.meta.get("unbacked_bindings") for n in ep.graph.nodes)  # torch's record: u0 from data
    assert check_slice(ep) is None  # what reads the sized tensor must run too
    del _RUNS[:]
    g = fxviz.capture(_Sized(), (ids,), method="export")
    assert _RUNS == [1] and g.method == "export"  # once, at full speed: not stepped after it


def test_ids_beyond_the_embedding_table_are_confirmed_and_the_node_named() -> None:
    """Export never sees values: an id past the table is a program export proved that does not run."""
    model, ids = _Counted(check=False).eval(), torch.tensor([[1, 3, 99]])
    with pytest.raises(IndexError):  # torch's own verdict on these inputs
        model(ids)
    with pytest.raises(fxviz.ModelError) as info:
        fxviz.capture(model, (ids,), method="export")
    first = info.value.graph.attempts[0]  # type: ignore[union-attr]
    assert first.error_type == "RejectedInputs"
    assert first.message.startswith("the exported graph does not run on these inputs at embedding:"), first.message


def test_operands_only_the_real_kernel_checks_are_confirmed_and_the_node_named() -> None:
    """Fake kernels let ``linear`` take an int64 input and a float weight; the CPU kernel refuses."""
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    x = torch.randint(0, 4, (2, 3))
    with pytest.raises(RuntimeError, match="same dtype"):  # torch's own verdict on these inputs
        model(x)
    with pytest.raises(fxviz.ModelError) as info:
        fxviz.capture(model, (x,), method="export")
    first = info.value.graph.attempts[0]  # type: ignore[union-attr]
    assert first.error_type == "RejectedInputs"
    assert first.message.startswith("the exported graph does not run on these inputs at linear:"), first.message


# ---- the auto chain ----------------------------------------------------------------------------------


def test_after_a_data_dependent_failure_auto_skips_what_cannot_succeed() -> None:
    model, args, kwargs = cm.detector()
    truth, _ = cm.aten_modules(model, args, kwargs)
    g = fxviz.capture(model, args, kwargs)
    assert g.method == "eager"
    assert [(a.method, a.ok, a.skipped) for a in g.attempts] == [
        ("export", False, False), ("export-strict", False, True), ("fx", False, True), ("eager", True, False)]
    assert g.attempts[0].error_type == "GuardOnDataDependentSymNode"
    for a in g.attempts[1:3]:
        assert a.reason().startswith("skipped: export stopped on a decision on tensor data")
        assert "capture_models.py:" in a.message
    assert truth <= cm.graph_modules(g)
    text = str(g)
    assert "⤼ export-strict skipped: export stopped" in text and "⤼ fx skipped" in text
    back = Graph.from_json(g.to_json())
    assert [a.skipped for a in back.attempts] == [a.skipped for a in g.attempts]


def test_a_skipped_method_still_runs_when_asked_for() -> None:
    model, args, kwargs = cm.detector()
    with pytest.raises(fxviz.CaptureError) as info:
        fxviz.capture(model, args, kwargs, method="fx")
    assert [(a.method, a.skipped) for a in info.value.attempts] == [("fx", False)]
    assert AUTO_CHAIN == ("export", "export-strict", "fx", "eager")


# ---- constants ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["export", "eager", "eager-aten"])
def test_constants_sit_with_the_module_that_reads_them(method: str) -> None:
    model, args, kwargs = gpt2(n_layer=3)
    g = fxviz.capture(model, args, kwargs, method=method)
    users = g.users()
    calls = g.calls
    for n in g.nodes:
        if n.kind != "constant":
            continue
        readers = [g.node(u) for u in users[n.name] if g.node(u).kind == "op"]
        if readers and readers[0].stack:
            assert n.module == readers[0].module, (n.name, n.stack, readers[0].stack)
            assert calls.of(n.name) is calls.of(readers[0].name)
    assert not [s for s in calls.root.state if g.node(s).kind == "constant"]
    assert [r["label"] for r in g.annotations["fold"]] == ["transformer.h.0-2"]
