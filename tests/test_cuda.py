"""On a CUDA device: Triton kernels in the kernel map, their device time, per-kernel numerics on
Triton, max-autotune's template kernels, and the saved-activation accounting against the CUDA
caching allocator. Each fact is checked against torch's own record of the same run.

These need a GPU: ``pytest -m cuda`` on a machine with one. Where there is none they are
deselected (tests/conftest.py says how many), never skipped: CI has no GPU.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import torch
from torch import nn

import fxviz
from fxviz.analyze.compilemap.result import CompileMap
from fxviz.passes.training import saved_timeline
from fxviz.torchbridge.tracelog import structured_trace
from tests import inside_models

pytestmark = [pytest.mark.cuda, pytest.mark.slow]

Events = list[tuple[dict[str, Any], Any]]


def _on_cuda(model: nn.Module, args: tuple[Any, ...]) -> tuple[nn.Module, tuple[Any, ...]]:
    return model.cuda(), tuple(a.cuda() for a in args)


def block_cuda() -> tuple[nn.Module, tuple[Any, ...]]:
    """The inside tests' Block on the GPU (a CLI target too)."""
    return _on_cuda(*inside_models.block())


def block_model_cuda() -> nn.Module:
    """Only the model, on the GPU: ``--input-shape`` makes its inputs there."""
    return inside_models.Block().cuda()


def _artifacts(events: Events, name: str) -> list[Any]:
    return [p for meta, p in events if meta.get("artifact", {}).get("name") == name or
            (name in meta and "artifact" not in meta)]


def _compile_map(build: Any, **kw: Any) -> tuple[CompileMap, Events]:
    import torch._inductor.config as inductor_config

    model, args = build()
    with structured_trace() as events, inductor_config.patch({"force_disable_caches": True}):
        cm = fxviz.compile_map(model, args, backend="inductor", inside=True, **kw)
    return cm, list(events)


@pytest.fixture(scope="module")
def training() -> tuple[CompileMap, Events]:
    return _compile_map(block_cuda, grad=True)


def _torch_device_times(build: Any, iterations: int = 5) -> dict[str, float]:
    """Per kernel name, device microseconds per iteration, from torch.profiler over a fresh
    compile of the same model (Inductor names kernels the same way each time)."""
    from torch.profiler import ProfilerActivity, profile

    model, args = build()
    fn = torch.compile(model)
    for _ in range(2):
        fn(*args)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iterations):
            fn(*args)
        torch.cuda.synchronize()
    return {e.key: e.device_time_total / iterations for e in prof.key_averages() if e.device_time_total > 0}


def test_triton_kernels_are_those_of_the_output_code(training: tuple[CompileMap, Events]) -> None:
    cm, events = training
    inside = cm.inside
    assert inside is not None
    codes = _artifacts(events, "inductor_output_code")
    assert len(codes) == 2  # forward and backward
    for code, part in zip(codes, ("forward", "backward"), strict=True):
        defined = dict(re.findall(r"^(\w+) = async_compile\.(\w+)\(", code, re.M))
        assert defined and set(defined.values()) == {"triton"}, defined
        handles = set(re.findall(r"# \[Provenance debug handles\] (\S+)", code))
        mine = [k for k in inside.kernels if k.part == part]
        assert {k.name for k in mine if k.kind != "extern"} == set(defined)
        assert {k.kind for k in mine if k.kind != "extern"} == {"triton"}
        assert {k.id for k in mine} == handles
        # every Triton kernel's source is its @triton.jit function
        assert all("@triton.jit" in k.source and f"def {k.name}(" in k.source for k in mine if k.kind == "triton")
    g = inside.graphs[0]
    assert g.share_mapped == 1.0
    torch_map = json.loads(_artifacts(events, "inductor_provenance_tracking_node_mappings")[0])["cppCodeToPost"]
    assert {k.id: sorted(k.ops) for k in g.kernels if k.part == "forward"} == {
        h: sorted(v) for h, v in torch_map.items()}


def test_kernel_times_are_device_times(training: tuple[CompileMap, Events]) -> None:
    cm, _ = training
    fwd = [k for k in cm.inside.kernels if k.part == "forward"]
    assert all(k.time_us is not None and k.time_us > 0 for k in fwd), [(k.id, k.time_us) for k in fwd]
    assert sum(k.share or 0 for k in fwd) == pytest.approx(1.0)
    # torch's own profile of the same compiled model: each Triton kernel's device time per forward
    theirs = _torch_device_times(block_cuda)
    for k in fwd:
        if k.kind == "triton":
            assert k.name in theirs, (k.name, sorted(theirs))
            assert theirs[k.name] / 3 < k.time_us < theirs[k.name] * 3, (k.name, k.time_us, theirs[k.name])
        else:  # an extern call: its ATen op's device time, not the microseconds its launch took on the CPU
            op = f"aten::{k.name.rsplit('.', 1)[-1]}"
            assert op in theirs and theirs[op] / 3 < k.time_us < theirs[op] * 3, (k.id, k.time_us, theirs.get(op))


def test_cli_prints_the_triton_kernels() -> None:
    from click.testing import CliRunner

    from fxviz.cli import cli

    res = CliRunner().invoke(cli, ["compile", f"{__file__}:block_cuda", "--backend", "inductor", "--inside"])
    assert res.exit_code == 0, res.output
    assert "triton_" in res.output and "extern_kernels.addmm" in res.output
    # a factory that returns only a model on the GPU: --input-shape makes the inputs there
    res = CliRunner().invoke(cli, ["tree", f"{__file__}:block_model_cuda", "--input-shape", "8,16"])
    assert res.exit_code == 0, res.output
    assert "▶ x  [8, 16] float32" in res.output and "b (Linear)  [8, 32] → [8, 8]" in res.output


def test_max_autotune_templates_are_mapped() -> None:
    import torch._inductor.config as inductor_config

    def wide() -> tuple[nn.Module, tuple[Any, ...]]:
        torch.manual_seed(0)
        return _on_cuda(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)),
                        (torch.randn(64, 256),))

    with inductor_config.patch({"max_autotune_gemm_backends": "TRITON,ATEN"}):
        cm, events = _compile_map(wide, mode="max-autotune-no-cudagraphs")
    code = _artifacts(events, "inductor_output_code")[0]
    defined = set(re.findall(r"^(\w+) = async_compile\.\w+\(", code, re.M))
    g = cm.inside.graphs[0]
    assert {k.name for k in g.kernels if k.kind != "extern"} == defined
    assert g.share_mapped == 1.0
    # whatever the autotuner picked for each mm (a Triton template or ATen), it covers the linear's ops
    mms = [k for k in g.kernels if any("mm" in op for op in k.ops)]
    assert len(mms) == 2 and all(k.modules for k in mms), [(k.id, k.modules) for k in mms]


# ---- per-kernel numerics on Triton -----------------------------------------------------------


def _numerics(perturb: Any = None) -> tuple[Any, list[dict[str, list[str]]]]:
    from torch._inductor import config as inductor_config

    from tests import test_numerics_kernels as nk

    model, args = _on_cuda(*nk.build())
    patch = inductor_config.patch(post_grad_custom_post_pass=perturb) if perturb is not None else \
        inductor_config.patch({})
    with structured_trace() as events, patch:
        r = fxviz.numerics(model, args, against="compile:inductor", per_kernel=True)
    maps = [json.loads(p)["cppCodeToPost"] for p in _artifacts(list(events), "inductor_provenance_tracking_node_mappings")]
    return r, maps


def test_per_kernel_numerics_watch_every_triton_kernel_and_find_the_perturbed_one() -> None:
    from tests import test_numerics_kernels as nk

    clean, maps = _numerics()
    assert clean.kernels is not None
    assert [(k.graph, k.handle) for k in clean.kernels] == [(g, h) for g, m in enumerate(maps) for h in m]
    assert all(k.observed for k in clean.kernels) and clean.first_kernel is None
    assert any(k.handle.startswith("triton_") for k in clean.kernels)
    perturb = nk.Perturb()
    bug, maps = _numerics(perturb)
    holder = [h for h, nodes in maps[1].items() if perturb.perturbed[0] in nodes]
    assert len(holder) == 1 and bug.first_kernel is not None
    assert (bug.first_kernel.graph, bug.first_kernel.handle) == (1, holder[0])
    assert bug.first_kernel.module == "mix"
    # each kernel also ran on eager's inputs: only the perturbed one has an own error beyond
    # tolerance, the kernels after it are beyond only by what they inherit. On CUDA a linear's matmul
    # is an extern mm whose bias add is fused into the next Triton kernel: eager has no value of the
    # bare mm to compare with, so that kernel's own error is not measured, and the Triton kernel that
    # reads its buffer is run on what the mm wrote on eager's inputs (and says so)
    measured = [k for k in clean.kernels if any(b.error.comparable for b in k.buffers)]
    bare = [k for k in clean.kernels if k not in measured]
    assert measured and all(k.own_error is not None and not k.own_error.exceeds for k in measured), \
        [(k.handle, k.own_note) for k in clean.kernels]
    assert all(k.handle.startswith("extern_kernels.mm") and k.own_error is None and
               all("eager computes no such value" in b.error.note for b in k.buffers) for k in bare), \
        [(k.handle, [b.error.note for b in k.buffers]) for k in bare]
    borrowers = [k for k in measured if "wrote it on eager's inputs" in k.own_note]
    assert {k.own_note.split(" as ")[1].split(" wrote")[0] for k in borrowers} == {k.handle for k in bare}
    assert [k.handle for k in bug.kernels if k.origin == "own"] == [holder[0]]
    after = bug.kernels[bug.kernels.index(bug.first_kernel) + 1:]
    assert after and all(k.origin == "inherited" for k in after if k.exceeds)


# ---- saved activations against the CUDA caching allocator ------------------------------------


class Wide(nn.Module):
    """Activations in megabytes, so that the allocator's 512-byte rounding is noise."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(512, 2048)
        self.down = nn.Linear(2048, 512)
        self.norm = nn.LayerNorm(512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


@pytest.mark.parametrize("method", ["export", "eager"])
def test_saved_bytes_and_peak_agree_with_the_cuda_allocator(method: str) -> None:
    torch.manual_seed(0)
    model = Wide().cuda()
    x = torch.randn(256, 512, device="cuda")
    g = fxviz.capture(model, (x,), backward=True, method=method)
    saved = sum(s.bytes for s in g.saved)
    line = saved_timeline(g)
    peak = max(b for _, b in line)
    assert saved > 4 << 20 and peak == saved  # everything saved is alive when the forward ends

    # torch's own count: what the autograd graph holds once the forward has run
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = model(x)
    held = torch.cuda.memory_allocated() - base - out.untyped_storage().nbytes()
    out.sum().backward()
    torch.cuda.synchronize()
    top = torch.cuda.max_memory_allocated() - base
    model.zero_grad(set_to_none=True)
    assert abs(held - saved) <= 512 * len(g.saved), (method, held, saved)
    assert peak <= top, (peak, top)


# ---- the compiled backward's partition on the GPU --------------------------------------------


def test_the_compiled_backward_saves_and_recomputes_what_torch_says_on_cuda() -> None:
    """``--backward`` on a GPU model: the saved values and their bytes and the recomputed ops are
    those of the forward and backward graph modules torch compiled in the same run."""
    from tests import compile_backward_models
    from tests.test_compile_backward import _oracle, _run

    cm, gms = _run(lambda: _on_cuda(*compile_backward_models.mlp()), 1.0)
    part = cm.inside.graphs[0].partition
    nbytes, _, recomputed = _oracle(gms)
    assert part is not None and {s.node: s.bytes for s in part.saved} == nbytes
    assert part.saved_bytes == sum(nbytes.values()) > 0
    assert {r.node for r in part.recomputed} == recomputed


# ---- fusions Inductor refused, on Triton -----------------------------------------------------


def test_refusals_on_triton_are_the_ones_torch_logged() -> None:
    """``max_fusion_size=1`` makes Inductor refuse fusions of Triton kernels: fxviz's list is what
    torch's fusion logger said in the same run, each side on the Triton kernels torch's
    ``cppCodeToPost`` gives its nodes."""
    from tests.test_inside_fusion import _stood, compile_with_torchs_fusion_log

    cm, events, log = compile_with_torchs_fusion_log(*_on_cuda(*inside_models.unfused()))
    got = {(n.part, n.first, n.second, n.reason) for n in cm.inside.not_fused}
    assert got and got == _stood(log)
    forward = json.loads(_artifacts(events, "inductor_provenance_tracking_node_mappings")[0])["cppCodeToPost"]
    for n in cm.inside.not_fused:
        if n.part == "forward":
            for ops, kernels in ((n.first_ops, n.first_kernels), (n.second_ops, n.second_kernels)):
                assert kernels and all(k.startswith("triton_") or k.startswith("extern_") for k in kernels)
                assert set(kernels) == {h for h, nodes in forward.items() if set(nodes) & set(ops)}
