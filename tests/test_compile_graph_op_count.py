"""The map counts the eager forward's ops that ran inside each compiled graph; torch's
``graph_op_count`` (compilation metrics, what tlparse shows) counts every call node of the graph
Dynamo handed the backend. Checked against both of the same run (the backend is a callable that
keeps torch's graph):

- GPT-2: 99 eager ops, torch 105: the six ``getitem`` that unpack ``split``'s tuple
  (``query, key, value = c_attn(x).split(...)``, two layers);
- Qwen3: 175 against 176: ``torch._C._log_api_usage_once``, which ``nn.Module.__init__`` calls as the
  forward slices its ``ModuleList`` (``self.layers[: n]``), a call of no tensor;
- LLaMA: transformers builds the attention mask itself under torch.compile, where the eager forward
  lets SDPA apply causality: Dynamo's graph holds 28 tensor ops no eager op is (they ran compiled
  only: a note says where), and the eager forward's ``fast_all(padding_mask)`` (``sum``, ``eq``), in
  a function Dynamo never traced, was counted in the graph though it never ran compiled. Every op
  the map puts in a graph is now on a line Dynamo traced (its ``trace_source`` log).
"""

from __future__ import annotations

import logging
import operator
import re
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import fxviz  # noqa: E402
from fxviz.analyze.compilemap.kinds import UNRUN  # noqa: E402
from fxviz.analyze.compilemap.opcount import op_count_lines  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from transformers_zoo import gpt2, llama  # noqa: E402


def _qwen3() -> tuple[torch.nn.Module, tuple[torch.Tensor], dict[str, object]]:
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
    return transformers.Qwen3ForCausalLM(cfg).eval(), (torch.randint(0, 128, (1, 8)),), {}


def _same_run(model: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]):  # type: ignore[no-untyped-def]
    """The map, torch's compilation metrics (compile id -> graph_op_count) and the graphs Dynamo
    handed the backend, all of one run."""
    from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

    gms: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        gms.append(gm)
        return gm.forward

    clear_compilation_metrics()
    cm = fxviz.compile_map(model, args, kwargs, backend=keep)
    metrics = {str(m.compile_id): m.graph_op_count for m in get_compilation_metrics()}
    return cm, metrics, gms


def _calls(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if "call" in n.op]  # torch's count_calls


def _no_model_op(n: torch.fx.Node) -> bool:
    """A getitem of a tuple (one output of a call that returned several) or a call with no tensor value."""
    if n.target is operator.getitem and isinstance(n.args[0], torch.fx.Node):
        return isinstance(n.args[0].meta.get("example_value"), tuple)
    return not any(isinstance(v, torch.Tensor) for v in torch.utils._pytree.tree_leaves(n.meta.get("example_value")))


@pytest.mark.parametrize(("build", "eager", "theirs"), [(gpt2, 99, 105), (_qwen3, 175, 176)])
def test_op_counts_say_what_they_count_with_torchs_beside(build, eager, theirs) -> None:  # type: ignore[no-untyped-def]
    model, args, kwargs = build()
    cm, metrics, gms = _same_run(model, args, kwargs)
    (g,), (gm,) = cm.graphs, gms
    calls = _calls(gm)
    assert g.torch_op_count == metrics[g.compile_id] == len(calls) == g.ops == theirs
    assert g.eager_ops == cm.compiled_ops == eager
    # the difference is exactly the call nodes of torch's graph that are no model op
    extra = [n for n in calls if _no_model_op(n)]
    assert len(extra) == theirs - eager == len(g.no_eager_op)
    assert sorted(t.split(" ", 1)[0] for t in g.no_eager_op) == sorted(
        "getitem" if n.target is operator.getitem else n.target.__name__ for n in extra)  # type: ignore[union-attr]
    assert not any("no eager op)" in t for t in g.no_eager_op)  # none is a model op that ran compiled only
    d = cm.to_dict()["summary"]
    assert (d["compiled_ops"], d["torch_graph_op_count"], d["no_eager_op"]) == (eager, theirs, theirs - eager)
    panel = cm.graph.annotations["panels"]["graphs"]
    assert panel["columns"][3] == "eager ops in it" and panel["columns"][8] == "torch graph_op_count"
    assert panel["rows"][0]["cells"][3] == eager and panel["rows"][0]["cells"][8] == theirs
    assert f"torch's graph_op_count {theirs}" in panel["note"] and "every call node" in panel["note"]
    lines = op_count_lines(cm.graphs)
    assert lines[0].startswith(f"eager ops per graph: g0 {eager} (torch {theirs})")
    again = type(cm).from_json(cm.to_json())
    assert [(x.torch_op_count, x.eager_ops, x.no_eager_op) for x in again.graphs] == \
        [(x.torch_op_count, x.eager_ops, x.no_eager_op) for x in cm.graphs]


def _traced_lines(model: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> set[tuple[str, int]]:
    """(file name, line) of every line Dynamo traced in a plain torch.compile run on the same inputs
    (its ``trace_source`` log: ``TRACE starts_line file.py:12 in f``)."""
    traced: set[tuple[str, int]] = set()

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            m = re.match(r"TRACE starts_line (.*?):(\d+) in ", text)
            if m:
                traced.add((m.group(1).rsplit("/", 1)[-1], int(m.group(2))))

    log = logging.getLogger("torch._dynamo.symbolic_convert.__trace_source")
    handler = Lines()
    log.addHandler(handler)
    torch._dynamo.reset()
    torch._logging.set_logs(trace_source=True)
    try:
        with torch.no_grad():
            torch.compile(model, backend="eager")(*args, **kwargs)
    finally:
        torch._logging.set_logs()
        log.removeHandler(handler)
        torch._dynamo.reset()
    return traced


def test_ops_only_one_path_ran_are_said_on_their_side() -> None:
    model, args, kwargs = llama()
    traced = _traced_lines(model, args, kwargs)
    cm, metrics, gms = _same_run(model, args, kwargs)
    (g,), (gm,) = cm.graphs, gms
    assert g.torch_op_count == metrics[g.compile_id] == len(_calls(gm))
    # every op the map says ran inside a graph is on a line Dynamo traced
    inside = [n for n in cm.graph.ops if cm.assigned[n.name] == g.id]
    assert inside and all(n.source is not None and (n.source.file.rsplit("/", 1)[-1], n.source.line) in traced
                          for n in inside)
    # fast_all(padding_mask): the eager forward ran it; Dynamo never traced it, its graph holds no sum
    fast_all = [n for n in cm.graph.ops if n.source is not None and n.source.file.endswith("masking_utils.py")
                and n.source.func == "fast_all"]
    assert [op.name for op in fast_all] == ["sum", "eq"] and all(cm.assigned[n.name] == UNRUN for n in fast_all)
    assert all((n.source.file.rsplit("/", 1)[-1], n.source.line) not in traced for n in fast_all)  # type: ignore[union-attr]
    assert not any(n.target == torch.Tensor.sum for n in gm.graph.nodes)
    # the mask torch.compile builds: tensor ops of torch's graph, in no eager op, said in a note
    only = [t for t in g.no_eager_op if "(no eager op)" in t]
    masking = [n for n in _calls(gm) if not _no_model_op(n)
               and re.findall(r'File "([^"]+)"', n.meta["stack_trace"])[-1].endswith("masking_utils.py")]
    assert len(only) >= len(masking) > 0 and all("masking_utils.py" in t or "sdpa_attention.py" in t for t in only)
    assert any(f"{len(only)} ops of Dynamo's graphs match no op of the eager forward" in n for n in cm.notes)
