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
    kernel_row = next(row for row in rows if row["cells"][0] == "first kernel")
    assert kernel_row["cells"][1] == f"mix · {holder[0]}" and kernel_row["module"]


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
    assert "kernel extern_kernels.addmm:1 (" in res.output and "within tolerance" in res.output
