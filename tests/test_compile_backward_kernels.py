"""``fxviz compile --backward`` under Inductor (issue 21 point 4): the backward's kernels mapped to
modules, checked against the module torch itself gives each backward node (``fwd_nn_module_stack``,
which AOT Autograd copies from the forward op of the same ``seq_nr``) in the post-grad graph
Inductor compiled, read by a custom post-grad pass in the same run. A 2-layer MLP and a 2-layer
GPT-2 (whose blocks run the same source lines, so a line says nothing about the block), a CNN and
blocks whose one line runs three modules, in a loop. A live run gives the kernels torch's own record
(fxviz's post-grad pass writes it into the structured trace); a plain ``TORCH_TRACE`` has none, and
the kernels' modules are inferred there, as the notes say."""

from __future__ import annotations

import re
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # Inductor compiles a forward and a backward

from torch._inductor.custom_graph_pass import CustomGraphPass  # noqa: E402

import fxviz  # noqa: E402
from tests import compile_backward_models as models  # noqa: E402


class _Modules(CustomGraphPass):
    """Records each backward post-grad node's module as torch gives it (changes nothing)."""

    def __init__(self) -> None:
        self.seen: dict[str, str | None] = {}

    def __call__(self, graph: torch.fx.Graph) -> None:
        if not any(n.op == "placeholder" and n.name.startswith("tangents") for n in graph.nodes):
            return
        for n in graph.nodes:
            stack = n.meta.get("fwd_nn_module_stack") or n.meta.get("nn_module_stack")
            path = list(stack.values())[-1][0] if stack else None
            if path is not None:
                path = re.sub(r"\[(\d+)\]", r".\1", re.sub(r"^L\['self'\]\.?", "", path))
                path = re.sub(r"\._modules\['(\w+)'\]", r".\1", path).lstrip(".")
            self.seen[n.name] = path

    def uuid(self) -> bytes:
        return b"fxviz-test-backward-modules"


@pytest.fixture(scope="module", params=["mlp", "gpt2", "cnn", "shared"])
def run(request: Any, tmp_path_factory: Any) -> dict[str, Any]:
    """One live ``compile_map(inside=True)`` training step under Inductor, caches off, with the
    oracle's pass set as a user's own post-grad pass, and torch's structured trace of it written as
    ``TORCH_TRACE`` writes it (``TorchLogsFormatter(trace=True)`` on its ``trace_log``)."""
    import logging

    import torch._inductor.config as inductor_config
    from torch._logging._internal import TorchLogsFormatter, trace_log

    build = {"mlp": models.mlp, "gpt2": models.gpt2, "cnn": _cnn, "shared": models.shared}[request.param]
    record = _Modules()
    model, args = build()
    path = tmp_path_factory.mktemp("trace")
    handler = logging.FileHandler(path / "dedicated_log_torch_trace_test.log")
    handler.setFormatter(TorchLogsFormatter(trace=True))
    with inductor_config.patch({"force_disable_caches": True, "post_grad_custom_post_pass": record}):
        trace_log.addHandler(handler)
        try:
            cm = fxviz.compile_map(model, args, backend="inductor", grad=True, inside=True)
        finally:
            trace_log.removeHandler(handler)
            handler.close()
        after = inductor_config.post_grad_custom_post_pass
    return {"name": request.param, "cm": cm, "truth": record.seen, "path": path, "record": record, "after": after}


def _cnn() -> tuple[Any, tuple[Any, ...]]:
    """The example CNN training: lines that run a conv, the model's relu and a max pool at once."""
    from fxviz.examples import cnn

    model, args = cnn()
    return model.train(), args


#: per model: (matmul calls, kernels whose modules equal torch's exactly, kernels with stack traces)
_LEAST = {"mlp": (3, 3, 3), "gpt2": (12, 16, 25), "cnn": (3, 8, 10), "shared": (5, 10, 7)}


def test_backward_extern_calls_belong_to_their_module(run: dict[str, Any]) -> None:
    least = _LEAST[run["name"]]
    cm, truth = run["cm"], run["truth"]
    assert cm.inside is not None
    g = cm.inside.graphs[0]
    back = [k for k in g.kernels if k.part == "backward"]
    post = next(s.graph for s in g.pipeline.stages if s.name == "post-grad passes (backward)")
    targets = {n.name: n.target for n in post.nodes}
    # every matmul call of the backward (by the call's name, not by what fxviz mapped it to) runs
    # exactly one post-grad node, a matmul, of the one module torch says that node belongs to (a
    # recomputed forward matmul that a post-grad pattern rewrote, ``addmm_default_1``, has no stack:
    # torch says nothing of it)
    mms = [k for k in back if k.kind == "extern" and k.id.split(":")[0].rsplit(".", 1)[-1] in ("mm", "addmm", "bmm")]
    assert len(mms) >= least[0] and truth
    for k in mms:
        assert len(k.ops) == 1 and targets[k.ops[0]].split(".")[-2] == k.id.split(":")[0].rsplit(".", 1)[-1], (k.id, k.ops)
        want = {truth[o] for o in k.ops if truth.get(o) is not None}
        assert not want or k.modules == list(want), (k.id, k.ops, k.modules, want)
    assert sum(1 for k in mms if any(truth.get(o) for o in k.ops)) >= least[0]
    # every backward kernel claims exactly the modules torch's record gives its nodes (a layer's
    # GELU backward is that layer's, not every GELU's that shares the source line; a kernel that also
    # runs the backward of the model's own ops claims only the modules torch names)
    exact = 0
    for k in back:
        want = {m for o in k.ops if (m := truth.get(o)) is not None}
        if want:
            assert set(k.modules) == want, (k.id, k.ops, k.modules, want)
            exact += 1
    assert exact >= least[1], exact
    assert any("backward: kernels' modules from torch's fwd_nn_module_stack" in n for n in cm.inside.notes), (
        cm.inside.notes)
    # torch records no kernel -> node mapping for the backward but does record each kernel's stack
    # traces: every node fxviz puts in a backward kernel runs on a line torch names for that kernel
    where = {n.name: f"{n.source.file.rsplit('/', 1)[-1]}:{n.source.line}" for n in post.nodes if n.source}
    traced = [k for k in back if k.lines and k.ops]
    assert len(traced) >= least[2], len(traced)
    for k in traced:
        assert {where[o] for o in k.ops if o in where} <= set(k.lines), (k.id, k.ops, k.lines)
    # and the partition is read under Inductor too: the min-cut partitioner's choice
    assert g.partition is not None and g.partition.partitioner == "min-cut" and g.partition.saved_bytes > 0


def test_a_users_post_grad_pass_still_runs_and_is_put_back(run: dict[str, Any]) -> None:
    """fxviz's recording pass runs after the user's own (which saw both graphs, the backward with
    its tangents) and leaves the user's setting as it found it."""
    assert run["after"] is run["record"]
    assert any(name.startswith("tangents") for name in run["truth"]) and len(run["truth"]) > 10


def _modules(inside: Any) -> dict[str, set[str]]:
    return {k.id: set(k.modules) for g in inside.graphs for k in g.kernels if k.part == "backward"}


def test_a_saved_trace_reads_torchs_record_and_a_plain_one_falls_back_and_says_so(run: dict[str, Any],
                                                                                  tmp_path: Any) -> None:
    """``--from-trace`` of the trace the live run wrote gives its backward kernels torch's modules,
    as the live run did (where torch gives their nodes one); the same trace without fxviz's record
    (what a plain ``TORCH_TRACE`` run writes) still maps them, by the parameters their ops read,
    and its notes say which source did."""
    from fxviz.analyze.inside.saved import from_trace
    from fxviz.tracefile.records import NODE_MODULES

    truth = run["truth"]
    saved, _ = from_trace(run["path"])
    live = _modules(run["cm"].inside)
    ops = {k.id: k.ops for g in saved.graphs for k in g.kernels if k.part == "backward"}
    judged = {k: w for k in ops if (w := {m for o in ops[k] if (m := truth.get(o)) is not None})}
    assert judged and all(_modules(saved)[k] == live[k] == w for k, w in judged.items())
    assert any("from torch's fwd_nn_module_stack" in n for n in saved.notes)
    plain = tmp_path / "plain"
    plain.mkdir()
    lines = (run["path"] / "dedicated_log_torch_trace_test.log").read_text().splitlines(keepends=True)
    kept, skip = [], False
    for line in lines:  # drop fxviz's artifact: its header line and its payload lines (a tab first)
        if not line.startswith("\t"):
            skip = f'"{NODE_MODULES}"' in line
        if not skip:
            kept.append(line)
    assert len(kept) < len(lines)
    (plain / "dedicated_log_torch_trace_test.log").write_text("".join(kept))
    inferred, _ = from_trace(plain)
    assert any("backward: kernels' modules inferred" in n for n in inferred.notes), inferred.notes
    assert not any("from torch's fwd_nn_module_stack" in n for n in inferred.notes)
    heur = _modules(inferred)
    assert heur.keys() == live.keys() and any(heur.values())
    # how often the fallback differs from torch's record (printed for the record: -s)
    post = next(s.graph for g in saved.graphs for s in g.pipeline.stages if s.name == "post-grad passes (backward)")
    wrong = [k for k, w in judged.items() if heur[k] != w]
    print(f"{run['name']}: {len(post.nodes)} backward nodes; the fallback differs from torch's record on "
          f"{len(wrong)} of {len(judged)} backward kernels: {wrong}")
