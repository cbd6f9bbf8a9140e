"""``fxviz numerics --against compile:inductor --per-kernel``: every Inductor kernel's output buffers
against eager, checked against torch's own record of the same run (the kernel handles of
``cppCodeToPost``), on a clean model and on one where a post-grad pass perturbs one add."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from torch import nn
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass

from fxviz.analyze.numerics import Numerics, numerics
from fxviz.cli import cli
from fxviz.errors import TargetError
from fxviz.torchbridge.tracelog import structured_trace

LINE = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if text.endswith("# LINE:residual"))


class Mixer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(torch.nn.functional.gelu(self.norm(x)))  # LINE:residual


class Net(nn.Module):
    """Two compiled graphs (a ``print`` breaks the forward); the second fuses a layer norm with a
    GELU, and adds a residual in ``mix``."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 32)
        self.mix = Mixer()
        self.out = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        print("h", tuple(h.shape))
        return self.out(self.mix(h)).tanh()


def build() -> tuple[nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    return Net().eval(), (torch.randn(4, 8),)


class Perturb(CustomGraphPass):
    """Multiplies the output of the first add of two same-shaped tensors (the residual) by 1.01,
    keeping the add's provenance on the new node; records the node's name."""

    def __init__(self) -> None:
        self.perturbed: list[str] = []

    def __call__(self, graph: torch.fx.Graph) -> None:
        for n in graph.nodes:
            if n.target is torch.ops.aten.add.Tensor and len(n.args) == 2 and \
                    all(isinstance(a, torch.fx.Node) and a.meta["val"].shape == n.meta["val"].shape for a in n.args):
                with graph.inserting_after(n):
                    wrong = graph.call_function(torch.ops.aten.mul.Tensor, (n, 1.01))
                n.replace_all_uses_with(wrong, delete_user_cb=lambda u, w=wrong: u is not w)
                wrong.meta = dict(n.meta)
                self.perturbed.append(wrong.name)
                return

    def uuid(self) -> Any:
        return "fxviz-test-perturb-residual-1.01"


def _run(perturb: Perturb | None = None) -> tuple[Numerics, list[dict[str, list[str]]]]:
    """The per-kernel result, and torch's own ``cppCodeToPost`` of each compiled graph."""
    model, args = build()
    patch = inductor_config.patch(post_grad_custom_post_pass=perturb) if perturb is not None else \
        inductor_config.patch({})
    with structured_trace() as events, patch:
        r = numerics(model, args, against="compile:inductor", per_kernel=True)
    mappings = [json.loads(p)["cppCodeToPost"] for meta, p in events if p is not None and
                meta.get("artifact", {}).get("name") == "inductor_provenance_tracking_node_mappings"]
    return r, mappings


@pytest.fixture(scope="module")
def clean() -> tuple[Numerics, list[dict[str, list[str]]]]:
    return _run()


@pytest.fixture(scope="module")
def bug() -> tuple[Numerics, list[dict[str, list[str]]], str]:
    perturb = Perturb()
    r, mappings = _run(perturb)
    assert len(perturb.perturbed) == 1
    return r, mappings, perturb.perturbed[0]


def _torch_handles(mappings: list[dict[str, list[str]]]) -> list[tuple[int, str]]:
    return [(g, h) for g, m in enumerate(mappings) for h in m]


@pytest.mark.slow
def test_a_clean_model_has_every_kernel_within_tolerance(clean: tuple[Numerics, Any]) -> None:
    r, mappings = clean
    assert r.kernels is not None and len(mappings) == 2  # the print breaks the forward in two graphs
    # every kernel torch names, in the order call() ran them, and nothing else
    assert [(k.graph, k.handle) for k in r.kernels] == _torch_handles(mappings)
    assert all(k.observed for k in r.kernels)
    assert r.first_kernel is None and not any(k.exceeds for k in r.kernels)
    compared = [b for k in r.kernels for b in k.buffers if b.error.comparable]
    assert compared and all(b.error.max_abs < 1e-4 for b in compared)
    # each extern addmm is compared with its eager linear
    addmm = [k for k in r.kernels if k.handle.startswith("extern_kernels.addmm")]
    assert len(addmm) == 3 and all(k.op.endswith("(linear)") and k.error is not None for k in addmm)
    assert [k.module for k in addmm] == ["inp", "mix.fc", "out"]
    # the layer norm's statistics are written but are no eager op's value: named, not compared
    fused = next(k for k in r.kernels if "native_layer_norm" in k.handle)
    assert fused.module in ("mix", "mix.norm") and any(
        not b.error.comparable and "eager computes no such value" in b.error.note for b in fused.buffers)
    assert any(b.error.comparable and b.eager for b in fused.buffers)  # the GELU it ends with is
    assert any(n.startswith("per kernel: 6 of 6 kernel calls watched") for n in r.notes), r.notes
    # each kernel also ran on eager's inputs, and on them is within tolerance too
    assert all(k.own_error is not None and not k.own_error.exceeds and k.origin == "" for k in r.kernels)
    back = Numerics.from_json(r.to_json())
    assert back.kernels is not None and [k.to_dict() for k in back.kernels] == [k.to_dict() for k in r.kernels]


@pytest.mark.slow
def test_a_perturbed_node_is_found_at_its_kernel(bug: tuple[Numerics, Any, str]) -> None:
    r, mappings, node = bug
    assert r.kernels is not None
    assert [(k.graph, k.handle) for k in r.kernels] == _torch_handles(mappings)
    # torch's own record of which kernel holds the perturbed node
    holder = [h for h, nodes in mappings[1].items() if node in nodes]
    assert len(holder) == 1
    first = r.first_kernel
    assert first is not None and (first.graph, first.handle) == (1, holder[0])
    assert first.module == "mix" and first.source == f"{Path(__file__).name}:{LINE}"
    assert first.error is not None and 0.005 < first.error.max_rel < 0.02  # 1.01: one percent
    before = r.kernels[: r.kernels.index(first)]
    assert before and all(k.observed and not k.exceeds for k in before)
    assert any(b.error.comparable for k in before for b in k.buffers)
    assert json.loads(r.to_json())["first_kernel"] == holder[0]
    # the report's divergence panel names it, pointing at the module call
    rows = r.graph.annotations["panels"]["divergence"]["rows"]
    kernel_row = next(row for row in rows if row["cells"][0] == "first kernel (own error)")
    assert kernel_row["cells"][1] == f"mix · {holder[0]}" and kernel_row["module"]


def _eager() -> dict[str, torch.Tensor]:
    """The eager model's own values (forward hooks): ``mix``'s input and output, ``mix.fc``'s and
    ``out``'s outputs, the model's output."""
    model, args = build()
    seen: dict[str, torch.Tensor] = {}
    model.mix.register_forward_hook(lambda m, i, o: seen.update(x=i[0].detach().clone(), add=o.detach().clone()))
    model.mix.fc.register_forward_hook(lambda m, i, o: seen.update(fc=o.detach().clone()))
    model.out.register_forward_hook(lambda m, i, o: seen.update(out=o.detach().clone()))
    with torch.no_grad():
        seen["tanh"] = model(*args)
    return seen


def _torch_error(eager: torch.Tensor, other: torch.Tensor) -> tuple[float, float]:
    """max abs and relative RMS of ``other`` against ``eager``, computed with torch directly."""
    diff = (other - eager).double()
    return diff.abs().max().item(), (diff.norm() / eager.double().norm()).item()


@pytest.mark.slow
def test_each_kernel_on_eager_inputs_separates_its_own_error_from_what_it_inherits(
        bug: tuple[Numerics, Any, str]) -> None:
    r, mappings, node = bug
    assert r.kernels is not None
    holder = next(h for h, nodes in mappings[1].items() if node in nodes)
    by = {(k.graph, k.handle): k for k in r.kernels}
    cause = by[(1, holder)]
    # exactly the perturbed kernel has an own error beyond tolerance, and it is the one named
    assert [(k.graph, k.handle) for k in r.kernels if k.origin == "own"] == [(1, holder)]
    assert r.first_kernel is cause and json.loads(r.to_json())["first_kernel"] == holder
    after = r.kernels[r.kernels.index(cause) + 1:]
    assert [k.handle.split(":")[0] for k in after] == ["extern_kernels.addmm", "cpp_fused_tanh_2"]
    for k in after:  # beyond tolerance in the compiled run, within on eager's inputs
        assert k.exceeds and k.origin == "inherited", k.text()
        assert k.own_error is not None and not k.own_error.exceeds and k.own_error.max_abs < 1e-6
    # every kernel was run on eager's inputs (the layer norm's statistics are filled by that kernel itself)
    assert all(k.own_error is not None and not k.own_note for k in r.kernels), [k.own_note for k in r.kernels]
    assert all(not k.own_error.exceeds for k in r.kernels if k is not cause)
    # the errors are what torch gives on the same tensors: the residual add of eager's values times
    # 1.01 (what the perturbed kernel computes) against eager's add, and the out linear (addmm) of
    # eager's add against eager's out linear
    eager = _eager()
    own = cause.own_error
    assert own is not None
    assert (own.max_abs, own.rel_rms) == pytest.approx(_torch_error(eager["add"], (eager["x"] + eager["fc"]) * 1.01),
                                                       rel=1e-6)
    assert 0.005 < own.max_rel < 0.02
    model, _ = build()
    linear = torch.addmm(model.out.bias, eager["add"], model.out.weight.t()).detach()
    out_own = after[0].own_error
    assert out_own is not None
    assert (out_own.max_abs, out_own.rel_rms) == pytest.approx(_torch_error(eager["out"], linear), abs=1e-12)
    # the accumulated error of the out linear is the compiled run's: far beyond its own
    assert after[0].error is not None and after[0].error.max_abs > 100 * out_own.max_abs + 1e-4
    # JSON and the report's kernels panel say which is which
    d = json.loads(r.to_json())
    assert [k["origin"] for k in d["kernels"]][-3:] == ["own", "inherited", "inherited"]
    assert all(k["own_within"] is True for k in d["kernels"][-2:]) and d["kernels"][-3]["own_within"] is False
    back = Numerics.from_json(r.to_json())
    assert back.kernels is not None and [k.origin for k in back.kernels] == [k.origin for k in r.kernels]
    panel = r.graph.annotations["panels"]["kernels"]
    assert [row["cells"][0] for row in panel["rows"]] == [k.handle for k in r.kernels]
    assert [row["cells"][4] for row in panel["rows"]][-3:] == ["own", "inherited", "inherited"]
    assert [row.get("level") for row in panel["rows"]][-3:] == ["error", "warn", "warn"]
    rows = r.graph.annotations["panels"]["divergence"]["rows"]
    assert any(row["cells"][0] == "first kernel (own error)" for row in rows)


def test_per_kernel_needs_the_inductor_side() -> None:
    model, args = build()
    with pytest.raises(TargetError, match="compile:inductor"):
        numerics(model, args, against="compile:aot_eager", per_kernel=True)
    res = CliRunner().invoke(cli, ["numerics", f"{__file__}:build", "--against", "export", "--per-kernel"])
    assert res.exit_code != 0
    lines = [t for t in res.output.splitlines() if t.strip()]
    assert len(lines) == 1 and "--against compile:inductor" in lines[0] and "Traceback" not in res.output


@pytest.mark.slow
def test_cli_lists_the_kernels() -> None:
    res = CliRunner().invoke(cli, ["numerics", f"{__file__}:build", "--against", "compile:inductor", "--per-kernel"])
    assert res.exit_code == 0, res.output
    assert "note: per kernel: 6 of 6 kernel calls watched" in res.output
    assert "every compared buffer within tolerance" in res.output
    table = res.output[res.output.index("kernels (--per-kernel)"):].splitlines()
    assert any("extern_kernels.addmm:1" in t and "within" in t for t in table)
    assert sum("│ within " in t for t in table) == 6



@pytest.mark.slow
def test_under_freezing_the_perturbed_kernel_is_still_the_cause() -> None:
    """Under ``freezing`` each linear is an MKL call on a packed weight (a tensor with no storage to
    copy) and its bias is added by the C++ kernel after it: the MKL call's buffer is no eager op's
    value (Inductor names no node for it), the bias kernel runs on what the MKL call wrote on eager's
    inputs, and the perturbed residual is still the only kernel with an own error beyond tolerance."""
    perturb = Perturb()
    with inductor_config.patch(freezing=True):
        r, mappings = _run(perturb)
    assert r.kernels is not None and [(k.graph, k.handle) for k in r.kernels] == _torch_handles(mappings)
    assert not any("not watched" in n for n in r.notes), r.notes
    holder = next(h for h, nodes in mappings[1].items() if perturb.perturbed[0] in nodes)
    mkl = [k for k in r.kernels if "_mkl_linear" in k.handle]
    assert len(mkl) == 3 and all(k.error is None and not k.buffers[0].error.comparable for k in mkl)
    assert [k.handle for k in r.kernels if k.origin == "own"] == [holder] and r.first_kernel is not None
    assert r.first_kernel.handle == holder and r.first_kernel.module == "mix"
    after = [k for k in r.kernels[r.kernels.index(r.first_kernel) + 1:] if k.error is not None]
    assert after and all(k.origin == "inherited" for k in after)
    assert any("_mkl_linear" in k.own_note and "wrote it on eager's inputs" in k.own_note for k in r.kernels)


class Counter(nn.Module):
    """A buffer updated in place, read again after: Inductor hands the buffer to one C++ kernel both
    to read and to write."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(4))
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(x.sum(0))
        return self.fc(self.count * 2).relu()


@pytest.mark.slow
def test_a_kernel_that_reads_what_it_writes_is_run_again_on_one_copy() -> None:
    torch.manual_seed(0)
    r = numerics(Counter().eval(), (torch.randn(3, 4),), against="compile:inductor", per_kernel=True)
    assert r.kernels and all(k.observed for k in r.kernels)
    assert all(k.own_error is not None and not k.own_error.exceeds for k in r.kernels), [k.text() for k in r.kernels]
    assert r.first_kernel is None


def gpt2() -> tuple[nn.Module, tuple[Any, ...]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config).eval(), (torch.randint(0, 100, (1, 8)),)


@pytest.mark.slow
def test_a_perturbed_gpt2_names_the_kernels_that_compute_the_perturbed_node() -> None:
    """GPT-2 (two blocks): the perturbed node is the token and position embeddings' sum, which
    Inductor recomputes inside each kernel that reads it (torch's ``cppCodeToPost`` lists it there).
    Exactly those kernels have an own error beyond tolerance, the first of them is the cause, and
    every other kernel beyond tolerance is inherited."""
    model, args = gpt2()
    perturb = Perturb()
    with inductor_config.patch(post_grad_custom_post_pass=perturb), structured_trace() as events:
        r = numerics(model, args, against="compile:inductor", per_kernel=True)
    (mapping,) = [json.loads(p)["cppCodeToPost"] for meta, p in events if p is not None and
                  meta.get("artifact", {}).get("name") == "inductor_provenance_tracking_node_mappings"]
    assert r.kernels is not None and [k.handle for k in r.kernels] == list(mapping)
    computing = [h for h, nodes in mapping.items() if perturb.perturbed[0] in nodes and h.startswith("cpp_")]
    assert computing and [k.handle for k in r.kernels if k.origin == "own"] == computing
    assert r.first_kernel is not None and r.first_kernel.handle == computing[0]
    assert all(k.own_error is not None for k in r.kernels if k.exceeds)  # every one measured
    assert {k.origin for k in r.kernels if k.exceeds and k.handle not in computing} == {"inherited"}
    assert r.first is not None and r.first in r.nodes  # the divergence named at the boundary is a compared op
