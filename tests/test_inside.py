"""Inside torch.compile (issue 20): Inductor's stages, the kernel map and compile costs, checked
against torch's own records of the same run (its structured trace's payloads, read here with
plain regular expressions, not fxviz's reader).

Inductor's first compile costs seconds: two module-scoped runs (a training step; a graph break
with a custom post-grad pass) serve every test."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # Inductor compiles (and a subprocess that compiles again)

import fxviz  # noqa: E402
from fxviz.analyze.compilemap.result import CompileMap  # noqa: E402
from fxviz.torchbridge.tracelog import structured_trace  # noqa: E402
from tests import inside_models  # noqa: E402
from tests.test_layers import _NO_TORCH  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _payloads(events: list[tuple[dict[str, Any], str | None]], key: str) -> list[tuple[str, Any]]:
    """(compile id, payload) of each event ``key`` (an artifact's name or an event key), in order."""
    out = []
    for meta, payload in events:
        name = meta["artifact"]["name"] if "artifact" in meta else next(iter(k for k in meta if k not in (
            "frame_id", "frame_compile_id", "attempt", "has_payload", "rank")), "")
        if name == key:
            cid = f"{meta.get('frame_id')}/{meta.get('frame_compile_id')}"
            cid += f"_{meta['attempt']}" if meta.get("attempt") else ""
            out.append((cid, payload if payload is not None else meta[name]))
    return out


def _run(build: Any, **kw: Any) -> tuple[CompileMap, list[tuple[dict[str, Any], str | None]]]:
    import torch._inductor.config as inductor_config

    model, args = build()
    with structured_trace() as events, inductor_config.patch({"force_disable_caches": True}):
        cm = fxviz.compile_map(model, args, backend="inductor", inside=True, **kw)
    return cm, list(events)


@pytest.fixture(scope="module")
def training() -> tuple[CompileMap, list[tuple[dict[str, Any], str | None]]]:
    return _run(inside_models.block, grad=True)


@pytest.fixture(scope="module")
def broken() -> tuple[CompileMap, list[tuple[dict[str, Any], str | None]]]:
    import torch._inductor.config as inductor_config

    with inductor_config.patch({"post_grad_custom_post_pass": inside_models.ReluToMax()}):
        return _run(inside_models.broken)


def test_kernels_are_those_of_the_output_code(training: Any) -> None:
    cm, events = training
    inside = cm.inside
    assert inside is not None and [g.compile_id for g in inside.graphs] == ["0/0"]
    codes = [p for _, p in _payloads(events, "inductor_output_code")]
    assert len(codes) == 2  # forward and backward
    for code, part in zip(codes, ("forward", "backward"), strict=True):
        defined = set(re.findall(r"^(\w+) = async_compile\.\w+\(", code, re.M))
        handles = set(re.findall(r"# \[Provenance debug handles\] (\S+)", code))
        mine = [k for k in inside.kernels if k.part == part]
        assert {k.name for k in mine if k.kind != "extern"} == defined
        assert {k.id for k in mine} == handles
        assert any(k.kind == "extern" and k.name == "extern_kernels.addmm" for k in mine) or part == "backward"
    # every kernel is timed by the profiler and the forward's shares add up
    fwd = [k for k in inside.kernels if k.part == "forward"]
    assert all(k.time_us is not None and k.time_us > 0 for k in fwd)
    assert sum(k.share or 0 for k in fwd) == pytest.approx(1.0)


def test_every_post_grad_op_has_one_kernel_or_a_reason(training: Any) -> None:
    cm, events = training
    inside = cm.inside
    g = inside.graphs[0]
    posts = [p for _, p in _payloads(events, "inductor_post_grad_graph")]
    mapping = [p for _, p in _payloads(events, "inductor_provenance_tracking_node_mappings")]
    for text, part in zip(posts, ("forward", "backward"), strict=True):
        ops = re.findall(r"^\s+(\w+)(?:: \"[^\"]*\")? = torch\.ops\.", text, re.M)
        ops += re.findall(r"^\s+(\w+)(?:: \"[^\"]*\")? = \w+\[\d+\]", text, re.M)  # getitems
        assert ops
        for name in ops:
            owners = [k.id for k in g.kernels if k.part == part and name in k.ops]
            reason = g.unmapped.get(f"{part}:{name}")
            assert len(owners) + (reason is not None) == 1, (part, name, owners, reason)
    assert g.share_mapped == 1.0
    # the forward's nodes are exactly torch's own kernel -> node record
    torch_map = json.loads(mapping[0])["cppCodeToPost"]
    assert {k.id: sorted(k.ops) for k in g.kernels if k.part == "forward"} == {h: sorted(v) for h, v in torch_map.items()}
    # and reach the eager ops and modules: the fused LayerNorm + GELU kernel crosses from ln to the root
    fused = next(k for k in g.kernels if k.part == "forward" and k.kind == "cpp")
    assert set(fused.eager) == {"layer_norm", "gelu"} and set(fused.modules) == {"ln", ""} and fused.crosses_modules
    assert next(k for k in g.kernels if k.id == "extern_kernels.addmm:1").modules == ["a"]
    assert all(k.inferred for k in g.kernels if k.part == "backward")
    assert all(k.ops for k in g.kernels if k.calls)  # no kernel left without the nodes it runs


def test_stages_of_a_training_step(training: Any) -> None:
    cm, _ = training
    p = cm.inside.graphs[0].pipeline
    names = [s.name for s in p.stages]
    assert names == ["Dynamo graph", "pre-grad passes", "AOT joint graph", "AOT forward", "post-grad passes (forward)",
                     "kernels (forward)", "AOT backward", "post-grad passes (backward)", "kernels (backward)"]
    backward = p.stages[names.index("AOT backward")]
    assert p.before(backward.index) == names.index("AOT joint graph")  # a branch from the joint graph
    kernels = p.stages[names.index("kernels (forward)")]
    assert sorted(kernels.graph.node(n).attrs["kernel"] for n in kernels.replaced) == sorted(
        k.id for k in cm.inside.graphs[0].kernels if k.part == "forward" and k.ops)


def test_compile_costs_are_torchs_metrics(training: Any) -> None:
    cm, events = training
    cost = cm.inside.graphs[0].cost
    (_, fwd), = _payloads(events, "compilation_metrics")
    (_, bwd), = _payloads(events, "bwd_compilation_metrics")
    for key in ("entire_frame_compile_time_s", "backend_compile_time_s", "inductor_compile_time_s", "code_gen_time_s"):
        assert cost.metrics[key] == fwd[key]
    assert cost.bwd_metrics["inductor_compile_time_s"] == bwd["inductor_compile_time_s"]
    assert cost.cache == {"aotautograd_cache": ["bypass"], "fx_graph_cache": ["bypass", "bypass"]} or all(
        v for v in cost.cache.values())
    assert {"Dynamo trace", "lowering", "codegen", "C++/Triton compile"} <= set(cost.phases)


def test_a_custom_post_grad_pass_is_its_stages_only_change_and_a_break_makes_two_graphs(broken: Any) -> None:
    cm, events = broken
    inside = cm.inside
    assert [g.compile_id for g in inside.graphs] == [cid for cid, _ in _payloads(events, "dynamo_output_graph")]
    assert len(inside.graphs) == 2 and cm.break_count == 1
    g0 = inside.graphs[0].pipeline
    post = next(s for s in g0.stages if s.name.startswith("post-grad passes"))
    assert post.removed == ["relu"]
    assert len(post.replaced) == 1 and post.graph.node(post.replaced[0]).target.endswith("clamp_min.default")
    assert post.added == []
    g1 = inside.graphs[1].pipeline
    assert not next(s for s in g1.stages if s.name.startswith("post-grad passes")).changed
    for g in inside.graphs:
        assert g.kernels and g.share_mapped == 1.0


def test_json_round_trips_without_torch(training: Any, tmp_path: Path) -> None:
    cm, _ = training
    path = tmp_path / "cm.json"
    path.write_text(cm.to_json())
    d = json.loads(path.read_text())
    assert {"stages", "kernels", "costs"} <= set(d)
    assert {"name", "kind", "ops", "modules", "source", "time_us", "share"} <= set(d["kernels"][0])
    assert {"name", "graph", "added", "removed", "seconds"} <= set(d["stages"][0]["stages"][0])
    code = _NO_TORCH + textwrap.dedent(f"""
        import json, sys
        from fxviz.analyze.compilemap.result import CompileMap
        cm = CompileMap.from_json(open({str(path)!r}).read())
        print(json.dumps({{"kernels": [k.id for k in cm.inside.kernels], "summary": cm.inside.summary(),
                          "stages": [s.name for s in cm.inside.graphs[0].pipeline.stages],
                          "torch": "torch" in sys.modules}}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    back = json.loads(proc.stdout.strip().splitlines()[-1])
    assert back == {"kernels": [k.id for k in cm.inside.kernels], "summary": cm.inside.summary(),
                    "stages": [s.name for s in cm.inside.graphs[0].pipeline.stages], "torch": False}


def test_the_cli_says_nothing_on_stderr_that_the_user_did_not_cause(tmp_path: Path) -> None:
    """torch.profiler (kineto) writes "USDT: ... profiler_start" to stderr around each profile: the
    kernel times of --inside must not put torch's log lines on the user's terminal; a level the
    user set is theirs."""
    run = [sys.executable, "-m", "fxviz", "compile", "tests/inside_models.py:block", "--inside"]
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    proc = subprocess.run(run, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "kernels:" in proc.stdout and proc.stderr == ""
    proc = subprocess.run([sys.executable, "-c", "import os, fxviz.cli.base as b, sys; sys.argv = ['fxviz', '--help']\n"
                           "try: b.main()\nexcept SystemExit: print(os.environ['KINETO_LOG_LEVEL'])"],
                          capture_output=True, text=True, timeout=120, cwd=REPO, env={**env, "KINETO_LOG_LEVEL": "2"})
    assert proc.stdout.splitlines()[-1] == "2", proc.stdout + proc.stderr


def test_a_saved_trace_shows_what_the_live_run_does(training: Any, tmp_path: Path) -> None:
    """TORCH_TRACE=DIR of the same training step in another process, read with --from-trace."""
    cm, _ = training
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_TRACE": str(tmp_path / "trace")}
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "inside_models.py")], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    from fxviz.analyze.inside.saved import from_trace

    saved, _ = from_trace(tmp_path / "trace")
    live = cm.inside
    assert [s.name for s in saved.graphs[0].pipeline.stages] == [s.name for s in live.graphs[0].pipeline.stages]
    # the same kernels on the same nodes; the numbers of the backward's provenance handles are not
    # compared: torch's handle counter is reset for each forward compile only, so the backward's
    # continue from whatever this process compiled before (another test's model)
    def kernels(inside: Any) -> list[tuple[str, str, list[str]]]:
        return [(k.part, k.id if k.part != "backward" else k.name, sorted(k.ops)) for k in inside.kernels]

    assert kernels(saved) == kernels(live)
    # the CLI: the stage table, the kernels and the costs; one stage's tree
    from click.testing import CliRunner

    from fxviz.cli import cli

    out = CliRunner().invoke(cli, ["compile", "--from-trace", str(tmp_path / "trace")])
    assert out.exit_code == 0, out.output
    assert "kernels (backward)" in out.output and "cpp_fused" in out.output and "frame compile" in out.output
    out = CliRunner().invoke(cli, ["compile", "--from-trace", str(tmp_path / "trace"), "--stage", "4"])
    assert out.exit_code == 0, out.output
    assert "change in stage 4" in out.output
    # with TARGET too: drawn on its module tree, each module coloured by its kernel
    out = CliRunner().invoke(cli, ["compile", "tests/inside_models.py:block", "--from-trace", str(tmp_path / "trace")])
    assert out.exit_code == 0, out.output
    assert re.search(r"a \(Linear\).*extern addmm \(g0\)", out.output), out.output
    assert re.search(r"ln \(LayerNorm\).*cpp_fused_gelu_native_layer_norm_0 \(g0\)", out.output), out.output
    # not a trace: one line, exit 2
    (tmp_path / "empty").mkdir()
    out = CliRunner().invoke(cli, ["compile", "--from-trace", str(tmp_path / "empty")])
    assert out.exit_code == 2 and "Traceback" not in out.output and len(out.output.strip().splitlines()) == 1, out.output
    # a truncated file: its problem is a note, the rest is shown
    f = next((tmp_path / "trace").iterdir())
    text = f.read_text()
    f.write_text(text[: len(text) * 2 // 3] + "\nV1125 not a torch trace line {")
    out = CliRunner().invoke(cli, ["compile", "--from-trace", str(tmp_path / "trace")])
    assert out.exit_code in (0, 2), out.output
    assert f.name in out.output


def test_the_cli_shows_stages_kernels_and_costs(tmp_path: Path) -> None:
    """``fxviz compile TARGET --inside --grad``: the map, then the tables; ``--stage``: one stage's tree."""
    from click.testing import CliRunner

    from fxviz.cli import cli

    out = CliRunner().invoke(cli, ["compile", "tests/inside_models.py:block", "--inside", "--grad",
                                   "--json", str(tmp_path / "m.json"), "--html", str(tmp_path / "m.html")])
    assert out.exit_code == 0, out.output
    for line in ("inside torch.compile: 1 compiled graph", "kernels (backward)", "cpp_fused",
                 "frame compile (Dynamo + backend)"):
        assert line in out.output, out.output
    d = json.loads((tmp_path / "m.json").read_text())
    assert {"stages", "kernels", "costs"} <= set(d) and "kernel" in d["graph"]["annotations"]["overlays"]
    assert "cpp_fused_gelu_native_layer_norm_0" in {k["name"] for k in d["kernels"]}
    out = CliRunner().invoke(cli, ["compile", "tests/inside_models.py:block", "--inside", "--stage", "4"])
    assert out.exit_code == 0, out.output
    assert "change in stage 4 (kernels (inference))" in out.output
    out = CliRunner().invoke(cli, ["compile", "tests/inside_models.py:block", "--inside", "--backend", "eager"])
    assert out.exit_code == 2 and "--backend inductor" in out.output

