"""``fxviz compile --backward`` (issue 21 points 3 and 4): what the compiled backward saves from the
forward and what it recomputes, per module, checked against the forward and backward graph
modules torch itself produced in the same run (handed to the test's own AOT Autograd compilers)
and their tensors' storages; ``activation_memory_budget`` moves them the way torch says.

AOT Autograd with torch's min-cut partitioner (what Inductor uses) and no Inductor: the partition
is the point here, not the kernels."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402
from torch._dynamo.backends.common import aot_autograd  # noqa: E402
from torch._functorch.partitioners import min_cut_rematerialization_partition  # noqa: E402
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402

import fxviz  # noqa: E402
from fxviz.analyze.compilemap.result import CompileMap  # noqa: E402
from fxviz.cli import cli  # noqa: E402
from tests import compile_backward_models as backward_models  # noqa: E402


def _run(build: Any, budget: float | None) -> tuple[CompileMap, dict[str, torch.fx.GraphModule]]:
    """The compile map of a training step and the graph modules torch compiled."""
    gms: dict[str, torch.fx.GraphModule] = {}

    def keep(part: str) -> Any:
        def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
            gms.setdefault(part, gm)  # the first run's (the profiler's warm runs compile nothing new)
            from functorch.compile import make_boxed_func

            return make_boxed_func(gm.forward)

        return compiler

    backend = aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw"),
                           partition_fn=min_cut_rematerialization_partition)
    model, args = build()
    cm = fxviz.compile_map(model, args, backend=backend, grad=True, inside=True, activation_memory_budget=budget)
    return cm, gms


@pytest.fixture(scope="module")
def runs() -> dict[Any, tuple[CompileMap, dict[str, torch.fx.GraphModule]]]:
    """The MLP at budgets 1.0 and 0.0, and a 2-layer GPT-2 (two blocks running the same lines)."""
    out: dict[Any, Any] = {b: _run(backward_models.mlp, b) for b in (1.0, 0.0)}
    out["gpt2"] = _run(backward_models.gpt2, None)
    return out


def _module(node: torch.fx.Node) -> str | None:
    """The module path torch's own ``nn_module_stack`` gives a node (``""``: an op of the model's
    own forward; ``None``: a node of the joint graph's backward part, which torch gives none)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "" if node.meta.get("partitioner_tag") == "is_forward" else None
    path = list(stack.values())[-1][0]
    path = re.sub(r"\[(\d+)\]", r".\1", re.sub(r"^L\['self'\]\.?", "", path))
    return re.sub(r"\._modules\['(\w+)'\]", r".\1", path).lstrip(".")


def _oracle(gms: dict[str, torch.fx.GraphModule]) -> tuple[dict[str, int], dict[str, str | None], set[str]]:
    """From torch's graph modules: saved value -> its extra bytes (each storage once, the forward's
    inputs free), node -> module, and the recomputed ops (call_function names in both graphs,
    getitems left out: torch's ``remat_nodes``)."""
    fw, bw = gms["fw"].graph, gms["bw"].graph
    saved = [n.name for n in bw.nodes if n.op == "placeholder" and not n.name.startswith("tangents")]
    fw_nodes = {n.name: n for n in fw.nodes}
    out = next(n for n in fw.nodes if n.op == "output").args[0]
    # the forward returns the user's outputs, then exactly what the backward reads
    assert [o.name for o in out[len(out) - len(saved):]] == saved
    seen = {StorageWeakRef(n.meta["val"].untyped_storage()) for n in fw.nodes if n.op == "placeholder"}
    nbytes: dict[str, int] = {}
    for name in saved:
        val = fw_nodes[name].meta["val"]
        ref = StorageWeakRef(val.untyped_storage())
        nbytes[name] = 0 if ref in seen else val.untyped_storage().nbytes()
        seen.add(ref)
    modules = {n.name: _module(n) for n in fw.nodes if n.op == "call_function"}
    fw_ops = {n.name for n in fw.nodes if n.op == "call_function" and "getitem" not in str(n.target)}
    recomputed = {n.name for n in bw.nodes if n.op == "call_function" and n.name in fw_ops}
    return nbytes, modules, recomputed


@pytest.mark.parametrize("budget", [1.0, 0.0, "gpt2"])
def test_saved_and_recomputed_are_torchs(runs: Any, budget: Any) -> None:
    cm, gms = runs[budget]
    assert cm.inside is not None and len(cm.inside.graphs) == 1
    part = cm.inside.graphs[0].partition
    assert part is not None
    nbytes, modules, recomputed = _oracle(gms)
    assert {s.node: s.bytes for s in part.saved} == nbytes
    assert part.saved_bytes == sum(nbytes.values())
    assert (part.saved_bytes > 0) == (budget != 0.0)  # at budget 0 the backward recomputes every activation
    assert {r.node for r in part.recomputed} == recomputed
    # each op's module is the one torch's nn_module_stack names; the inputs saved cost nothing
    for s in part.saved:
        if s.node in modules:
            assert s.module == modules[s.node] or modules[s.node] is None, s
        else:
            assert s.bytes == 0 and s.shares in ("input", "parameter")
    assert all(r.module == modules[r.node] for r in part.recomputed if modules[r.node] is not None)
    params = {s.module for s in part.saved if s.shares == "parameter"}
    assert params <= ({"fc1", "fc2"} if budget != "gpt2" else {m for m in cm.graph.modules if m})
    # per module the bytes add up to the total, and the report's overlay has the same per module call
    assert sum(r[1] for r in part.per_module()) == part.saved_bytes
    overlays = cm.graph.annotations.get("overlays") or {}
    assert ("backward saves" in overlays) == (part.saved_bytes > 0)
    overlay = overlays.get("backward saves") or {"nodes": {}, "modules": {}}
    assert sum(overlay["nodes"].values()) == part.saved_bytes
    mod = "fc1" if budget != "gpt2" else "h.1.attn"
    assert overlay["modules"].get(f"{mod}#0", 0) == sum(s.bytes or 0 for s in part.saved
                                                        if s.module is not None and s.module.startswith(mod))
    if budget == "gpt2":  # the second block's values are its own, not the first's (the same source lines)
        per = {m: b for m, b, _, _ in part.per_module()}
        assert per["h.1.attn"] == per["h.0.attn"] > 0 and per["h.1.mlp.c_fc"] == per["h.0.mlp.c_fc"] > 0


def test_a_lower_budget_saves_less_and_recomputes_more(runs: Any) -> None:
    full, low = (runs[b][0].inside.graphs[0].partition for b in (1.0, 0.0))
    assert low.saved_bytes < full.saved_bytes
    assert len(low.recomputed) > len(full.recomputed)
    # what torch's own graphs say, the same direction
    (b_full, _, r_full), (b_low, _, r_low) = (_oracle(runs[b][1]) for b in (1.0, 0.0))
    assert sum(b_low.values()) < sum(b_full.values()) and len(r_low) > len(r_full)


def test_partition_reads_back_from_json(runs: Any) -> None:
    cm, _ = runs[0.0]
    d = json.loads(cm.to_json())
    part = d["inside"]["graphs"][0]["partition"]
    assert {"node", "module", "bytes", "shape", "dtype"} <= set(part["saved"][0])
    assert {"node", "module", "op"} <= set(part["recomputed"][0])
    back = CompileMap.from_json(cm.to_json())
    assert back.inside is not None and back.inside.graphs[0].partition == cm.inside.graphs[0].partition


def test_cli_backward(tmp_path: Any) -> None:
    """``--backward`` (``--grad`` the same) on aot_eager: the partition table and the JSON key; a
    budget the partitioner does not read is one line."""
    out = tmp_path / "map.json"
    res = CliRunner().invoke(cli, ["compile", "tests/compile_backward_models.py:mlp", "--backward", "--backend", "aot_eager",
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert re.search(r"g0 \(0/0\) partition: the compiled backward saves [\d.]+ KB \(\d+ values\) and "
                     r"recomputes \d+ ops", res.output)
    assert "fc1" in res.output and "AOT backward" in res.output and "1 compiled graph, no Inductor kernels" in res.output
    d = json.loads(out.read_text())
    part = d["inside"]["graphs"][0]["partition"]
    assert part["saved_bytes"] == sum(s["bytes"] or 0 for s in part["saved"]) > 0
    bad = CliRunner().invoke(cli, ["compile", "tests/compile_backward_models.py:mlp", "--backward", "--backend", "aot_eager",
                                   "--activation-memory-budget", "0.5"])
    assert bad.exit_code != 0 and "min-cut partitioner" in bad.output and "Traceback" not in bad.output


def test_budget_needs_a_backward() -> None:
    """A budget with no backward to partition is one clear error, before anything compiles."""
    from fxviz.errors import TargetError

    model, args = backward_models.mlp()
    with pytest.raises(TargetError, match="add grad=True, inside=True"):
        fxviz.compile_map(model, args, backend="aot_eager", activation_memory_budget=0.5)
    with pytest.raises(TargetError, match="not 'eager'"):
        fxviz.compile_map(model, args, backend="eager", grad=True, inside=True)
