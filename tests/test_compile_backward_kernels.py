"""``fxviz compile --backward`` under Inductor (issue 21 point 4): the backward's kernels mapped to
modules, checked against the module torch itself gives each backward node (``fwd_nn_module_stack``,
which AOT Autograd copies from the forward op of the same ``seq_nr``) in the post-grad graph
Inductor compiled, read by a custom post-grad pass in the same run. A 2-layer MLP and a 2-layer
GPT-2 (whose blocks run the same source lines, so a line says nothing about the block)."""

from __future__ import annotations

import re
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # Inductor compiles a forward and a backward

from torch._inductor.custom_graph_pass import CustomGraphPass  # noqa: E402

import fxviz  # noqa: E402
from fxviz.analyze.compilemap.result import CompileMap  # noqa: E402
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


def _run(build: Any) -> tuple[CompileMap, dict[str, str | None]]:
    import torch._inductor.config as inductor_config

    record = _Modules()
    model, args = build()
    with inductor_config.patch({"force_disable_caches": True, "post_grad_custom_post_pass": record}):
        cm = fxviz.compile_map(model, args, backend="inductor", grad=True, inside=True)
    return cm, record.seen


def _cnn() -> tuple[Any, tuple[Any, ...]]:
    """The example CNN training: lines that run a conv, the model's relu and a max pool at once."""
    from fxviz.examples import cnn

    model, args = cnn()
    return model.train(), args


#: per model: (matmul calls, kernels whose modules equal torch's exactly, kernels with stack traces)
_LEAST = {"mlp": (3, 3, 3), "gpt2": (12, 16, 25), "cnn": (3, 8, 10)}


@pytest.mark.parametrize("build", [models.mlp, models.gpt2, _cnn], ids=["mlp", "gpt2", "cnn"])
def test_backward_extern_calls_belong_to_their_module(build: Any) -> None:
    least = _LEAST[{models.mlp: "mlp", models.gpt2: "gpt2"}.get(build, "cnn")]
    cm, truth = _run(build)
    assert cm.inside is not None
    g = cm.inside.graphs[0]
    back = [k for k in g.kernels if k.part == "backward"]
    post = next(s.graph for s in g.pipeline.stages if s.name == "post-grad passes (backward)")
    targets = {n.name: n.target for n in post.nodes}
    # every matmul call of the backward (by the call's name, not by what fxviz mapped it to) runs
    # exactly one post-grad node, a matmul, of the one module torch says that node belongs to
    mms = [k for k in back if k.kind == "extern" and k.id.split(":")[0].rsplit(".", 1)[-1] in ("mm", "addmm", "bmm")]
    assert len(mms) >= least[0] and truth
    for k in mms:
        assert len(k.ops) == 1 and targets[k.ops[0]].split(".")[-2] == k.id.split(":")[0].rsplit(".", 1)[-1], (k.id, k.ops)
        want = {truth[o] for o in k.ops if truth.get(o) is not None}
        assert len(want) == 1 and k.modules == list(want), (k.id, k.ops, k.modules, want)
    # every backward kernel claims exactly the modules torch's record gives its nodes (a layer's
    # GELU backward is that layer's, not every GELU's that shares the source line)
    exact = 0
    for k in back:
        said = [truth.get(o) for o in k.ops]
        want = {m for m in said if m is not None}
        if want and set(k.modules) == want:
            exact += 1
        elif want:  # torch gives a node no module, or its line also runs the model's own op (relu
            # around a pool): fxviz keeps the module and its parent, nothing else
            assert set(k.modules) >= want, (k.id, k.modules, want)
            extra = set(k.modules) - want
            assert None in said or all(any(not e or w.startswith(e + ".") for w in want) for e in extra), (
                k.id, k.modules, want)
    assert exact >= least[1], exact
    # torch records no kernel -> node mapping for the backward but does record each kernel's stack
    # traces: every node fxviz puts in a backward kernel runs on a line torch names for that kernel
    where = {n.name: f"{n.source.file.rsplit('/', 1)[-1]}:{n.source.line}" for n in post.nodes if n.source}
    traced = [k for k in back if k.lines and k.ops]
    assert len(traced) >= least[2], len(traced)
    for k in traced:
        assert {where[o] for o in k.ops if o in where} <= set(k.lines), (k.id, k.ops, k.lines)
    # and the partition is read under Inductor too: the min-cut partitioner's choice
    assert g.partition is not None and g.partition.partitioner == "min-cut" and g.partition.saved_bytes > 0
