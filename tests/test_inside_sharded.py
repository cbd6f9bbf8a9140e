"""``fxviz compile TARGET --world-size 2 --inside`` (issue 22 point 4 with issue 20): a
tensor-parallel MLP compiled by Inductor in torch's fake process group shows its collectives as
calls of kind ``collective`` on the post-grad nodes torch's ``cppCodeToPost`` gives them, each named
by the eager collective DTensor ran and the module that issued it, and every stage (Dynamo's graph
of DTensor values included) is read. One compile, shared by the tests."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # an Inductor compile

import fxviz  # noqa: E402
from fxviz.analyze.inside.comms import comm_name  # noqa: E402
from fxviz.torchbridge.distributed import fake_world  # noqa: E402
from fxviz.torchbridge.tracelog import structured_trace  # noqa: E402
from tests import test_distributed as td  # noqa: E402


def compiled(factory: Any = td.mlp_factory) -> tuple[Any, dict[str, Any], str, list[str]]:
    """The factory's model compiled in a fake group of 2, torch's provenance mapping, Dynamo's graph
    and the post-grad graphs of the same compile (tests/test_cuda_sharded.py runs these checks on
    the GPU)."""
    import torch._inductor.config as inductor_config

    with fake_world(2), structured_trace() as events, inductor_config.patch({"force_disable_caches": True}):
        model, args = factory()
        cm = fxviz.compile_map(model, args, backend="inductor", inside=True)
    maps = [json.loads(p) for meta, p in events
            if meta.get("artifact", {}).get("name") == "inductor_provenance_tracking_node_mappings"]
    dynamo = next(p for meta, p in events if "dynamo_output_graph" in meta)
    post = [p for meta, p in events if meta.get("artifact", {}).get("name") == "inductor_post_grad_graph"]
    return cm, maps[0], dynamo, post


@pytest.fixture(scope="module")
def run() -> tuple[Any, dict[str, Any], str, list[str]]:
    return compiled()


def test_collectives_of_a_compiled_tensor_parallel_mlp(run) -> None:
    cm, mapping, *_ = run
    torch_map: dict[str, Any] = mapping["cppCodeToPost"]
    inside = cm.inside
    assert inside is not None and len(inside.graphs) == 1
    g = inside.graphs[0]
    assert [s.name for s in g.pipeline.stages][:2] == ["Dynamo graph", "pre-grad passes"]
    assert not [n for n in inside.notes if "not read" in n], inside.notes
    collective = [k for k in g.kernels if k.kind == "collective"]
    assert collective and {k.id for k in collective} == {h for h in torch_map if "_c10d_functional" in h}
    for k in collective:
        assert sorted(k.ops) == sorted(torch_map[k.id])
    # timed like any compiled graph (the trace of a process-group run has rank 0: the live run's
    # calls are matched to it all the same), collectives included
    assert inside.timed and all(k.time_us is not None and k.time_us > 0 for k in g.kernels), \
        [(k.id, k.time_us) for k in g.kernels]
    assert sum(k.share or 0 for k in g.kernels) == pytest.approx(1.0)
    # the compile map counts the all_reduce as compiled (one graph, no break)
    assert cm.share == 1.0


def test_the_summary_counts_the_collectives_torch_ran_and_their_waits_apart(run) -> None:
    """The headline counted each collective's wait as a collective: ``2 collective`` for the one
    all_reduce CommDebugMode counts. torch's records: the calls in ``cppCodeToPost`` (the output
    code's), and CommDebugMode's count of the same model's eager forward."""
    cm, mapping, *_ = run
    calls = [h for h in mapping["cppCodeToPost"] if "_c10d_functional" in h]
    waits = [h for h in calls if comm_name(h) == "wait_tensor"]
    ran = sum(td.oracle(td.mlp_factory, 2)[""].values())
    assert ran == len(calls) - len(waits) == 1 and len(waits) == 1
    assert f" extern, {ran} collective, {len(waits)} wait)" in cm.inside.summary(), cm.inside.summary()


def test_the_matmul_torch_records_as_the_wait_runs_its_own_addmm(run) -> None:
    """torch's ``cppCodeToPost`` gives the down projection's ``extern_kernels.addmm`` the node
    ``wait_tensor`` (the all_reduce reduces its output in place) and no call the node ``addmm_1``:
    the row takes the addmm node no call covers, marked inferred; then every post-grad op is
    mapped, and the collectives run where the post-grad graph has them (nothing moved)."""
    cm, mapping, *_ = run
    g = cm.inside.graphs[0]
    post = next(s for s in g.pipeline.stages if s.name.startswith("post-grad"))
    addmms = [n.name for n in post.graph.nodes if n.kind == "op" and n.target.endswith("addmm.default")]
    odd = [h for h, ns in mapping["cppCodeToPost"].items() if h.startswith("extern_kernels.addmm")
           and not set(ns) & set(addmms)]
    assert odd, "torch now records each addmm's own node: this test has nothing left to check"
    for k in g.kernels:
        if k.kind == "extern":
            assert len(k.ops) == 1 and k.ops[0] in addmms and k.inferred == (k.id in odd), (k.id, k.ops)
    assert sorted(o for k in g.kernels if k.kind == "extern" for o in k.ops) == sorted(addmms)
    assert g.mapped == g.ops
    assert next(s for s in g.pipeline.stages if s.name.startswith("kernels")).moved == []


def test_a_collective_row_names_the_eager_collective_and_the_module_that_issued_it(run) -> None:
    """torch's ``postToPre`` ties the all_reduce to a Dynamo op (DTensor's ``redistribute`` in
    RowwiseParallel's output hook), which is no eager op: the row names the eager all_reduce the
    tracer recorded under it and its module, the one CommDebugMode counts it for."""
    cm, mapping, dynamo, _ = run
    g = cm.inside.graphs[0]
    collective = [k for k in g.kernels if k.kind == "collective"]
    for k in collective:
        pre = {d for n in k.ops for d in mapping["postToPre"][n]}
        assert pre and all(re.search(rf"^\s+{d}(: \"[^\"]*\")? = .*\.redistribute\(", dynamo, re.M)
                           for d in pre), pre  # torch: a Dynamo redistribute, not an op the eager tracer saw
        assert not pre & set(k.eager), k.eager
        want = [n.name for n in cm.graph.nodes if n.kind == "op" and "c10d_functional" in n.target
                and comm_name(n.target) == comm_name(k.name)]
        if not want and comm_name(k.name) == "wait_tensor":
            # the eager run recorded no wait (under autograd funcol wraps the result with
            # _wrap_tensor_autograd and waits outside the forward): the wait is its collective's
            want = [n.name for n in cm.graph.nodes if n.kind == "op" and comm_name(n.target) == "all_reduce"]
        assert want and k.eager == want, (k.id, k.eager, want)
    counted = td.oracle(td.mlp_factory, 2)  # torch's CommDebugMode: the module that issued the all_reduce
    issuer = max((m for m, c in counted.items() if c.get("all_reduce")), key=len)
    assert issuer == "down"
    assert all(k.modules == [issuer] for k in collective), [(k.id, k.modules) for k in collective]
    # the post-grad stage's nodes say so too (their details, and the tree's module)
    post = next(s for s in g.pipeline.stages if s.name.startswith("post-grad"))
    reduce = next(n for n in post.graph.nodes if n.kind == "op" and comm_name(n.target) == "all_reduce")
    assert reduce.attrs.get("eager") == next(k for k in collective if comm_name(k.name) == "all_reduce").eager[0]
    assert reduce.stack and reduce.stack[-1][0] == issuer


def test_each_compiled_collective_names_the_group_torch_compiled_it_for(run) -> None:
    """A compiled collective's row says where it runs: the process group that torch's post-grad
    graph passes the ``_c10d_functional`` op (its last argument, the group's name), with the
    group's size; its wait, the same. In the tree's kernel table, the report's panel and the JSON."""
    from rich.console import Console

    from fxviz.cli.inside import kernel_table

    cm, _, _, post = run
    named = {m.group(1) for text in post
             for m in re.finditer(r"_c10d_functional\.(?!wait_tensor)\w+\.default\(.*, '([^']+)'\)", text)}
    assert len(named) == 1, post
    (group,) = named
    rows = [k for k in cm.inside.kernels if k.kind == "collective"]
    assert len(rows) == 2 and all(k.group == group for k in rows), [(k.id, k.group) for k in rows]
    assert all(k.to_dict()["group"] == group for k in rows)
    console = Console(record=True, width=300)
    console.print(kernel_table(cm.inside.graphs[0]))
    assert console.export_text().count(f"collective on group {group}") == 2
    panel = cm.graph.annotations["panels"]["kernels"]
    kinds = [r["cells"][1] for r in panel["rows"] if r["cells"][1].startswith("collective")]
    assert kinds == [f"collective on group {group}"] * 2
    with fake_world(2):  # the eager graph's collective names the same group
        model, args = td.mlp_factory()
        eager = fxviz.capture(model, args, method="eager")
    assert {r["group"] for r in eager.annotations["collectives"]} == {group}
