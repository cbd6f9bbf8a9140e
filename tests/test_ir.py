"""The IR on its own: hand-built graphs and hypothesis properties. No torch here."""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fxviz.ir import (
    NODE_KINDS,
    SCHEMA_VERSION,
    Attempt,
    Graph,
    ModuleInfo,
    Node,
    Ref,
    SourceLoc,
    TensorMeta,
)
from fxviz.ops import short_name
from fxviz.passes import DEFAULT, PASSES, run_passes

F32 = "float32"


def meta(*shape: int | str, dtype: str = F32) -> TensorMeta:
    return TensorMeta(tuple(shape), dtype)


def tiny() -> Graph:
    """x -> fc (linear, in module ``fc``) -> relu (root) -> output, with fc's weight."""
    return Graph(
        name="Tiny",
        nodes=[
            Node("x", "input", target="x", outputs=(meta("s0", 4),)),
            Node("fc.weight", "parameter", target="fc.weight", stack=(("fc", 0),), outputs=(meta(3, 4),)),
            Node("linear", "op", target="aten.linear.default", inputs=(Ref("x"), Ref("fc.weight")),
                 stack=(("fc", 0),), outputs=(meta("s0", 3),),
                 source=SourceLoc("/src/model.py", 12, "forward", "return self.fc(x)")),
            Node("relu", "op", target="aten.relu.default", inputs=(Ref("linear"),), outputs=(meta("s0", 3),)),
            Node("output", "output", target="output", inputs=(Ref("relu"),)),
        ],
        method="export",
        attempts=[Attempt("export", True, 0.5)],
        modules={"": ModuleInfo("Tiny"), "fc": ModuleInfo("Linear", "torch.nn.modules.linear.Linear")},
    )


# ---- hand-built graphs ---------------------------------------------------------------------------


def test_edges_users_and_lookups_are_derived_from_inputs() -> None:
    g = tiny()
    g.validate()
    assert [(e.src, e.dst, e.src_index) for e in g.edges] == [
        ("x", "linear", 0), ("fc.weight", "linear", 0), ("linear", "relu", 0), ("relu", "output", 0),
    ]
    assert g.edges[0].meta == meta("s0", 4)
    assert g.users() == {"x": ["linear"], "fc.weight": ["linear"], "linear": ["relu"], "relu": ["output"],
                         "output": []}
    assert [n.name for n in g.ops] == ["linear", "relu"]
    assert [n.name for n in g.inputs] == ["x"] and [n.name for n in g.outputs] == ["output"]
    assert g.node("linear").module == "fc" and g.node("relu").module == ""
    assert "relu" in g and "nope" not in g
    with pytest.raises(KeyError, match="'nope'"):
        g.node("nope")


def test_scope_tree_of_the_tiny_graph() -> None:
    root = tiny().scopes
    assert (root.path, root.cls, root.calls) == ("", "Tiny", 1)
    assert root.nodes == ["x", "relu", "output"]
    (fc,) = root.children.values()
    assert (fc.path, fc.name, fc.cls, fc.calls, fc.nodes) == ("fc", "fc", "Linear", 1, ["fc.weight", "linear"])


def test_scopes_count_calls_and_keep_uncalled_containers() -> None:
    # h.0 and h.1 are called once each, h.0.mlp twice; the container h is never called
    ops = []
    prev = Ref("x")
    for i, stack in enumerate([
        (("h.0", 0), ("h.0.mlp", 0)), (("h.0", 0), ("h.0.mlp", 1)), (("h.1", 0),),
    ]):
        ops.append(Node(f"op{i}", "op", target="aten.relu.default", inputs=(prev,), stack=stack,
                        outputs=(meta(2),)))
        prev = Ref(f"op{i}")
    g = Graph(name="M", nodes=[Node("x", "input", outputs=(meta(2),)), *ops,
                               Node("out", "output", inputs=(prev,))])
    scopes = {s.path: s for s in g.scopes.walk()}
    assert list(scopes) == ["", "h", "h.0", "h.0.mlp", "h.1"]
    assert {p: s.calls for p, s in scopes.items()} == {"": 1, "h": 0, "h.0": 1, "h.0.mlp": 2, "h.1": 1}
    assert scopes["h.0.mlp"].nodes == ["op0", "op1"] and scopes["h"].nodes == []


def test_tensor_meta_and_names() -> None:
    assert meta(2, 3).numel == 6 and meta("s0", 3).numel is None and meta().numel == 1
    assert meta("s0", "2*s1").shape_str() == "[s0, 2*s1]"
    sym = TensorMeta((), "int", value="s0")
    assert not sym.is_tensor and sym.shape_str() == "s0"
    assert TensorMeta((), "float").shape_str() == "float"
    assert short_name("aten.linear.default") == "linear"
    assert short_name("aten.add.Tensor") == "add"
    assert short_name("torch.nn.functional.relu") == "relu"
    assert short_name("Tensor.view") == "view"


def test_attempt_reason_is_one_line_with_its_location() -> None:
    a = Attempt("export", False, 1.0, "UserError", "Could not guard\n\nmore text",
                SourceLoc("/a/b/model.py", 7, "forward"))
    assert a.reason() == "UserError: Could not guard (model.py:7)"
    assert Attempt("fx", False, 0.1, "TraceError", "").reason() == "TraceError"
    assert Attempt("fx", True).reason() == "ok"


def test_validate_rejects_use_before_def() -> None:
    g = tiny()
    g.nodes[2], g.nodes[3] = g.nodes[3], g.nodes[2]  # relu now reads linear before it exists
    with pytest.raises(ValueError, match="node 'relu' reads 'linear' before it is defined"):
        g.validate()


def test_validate_rejects_a_dangling_reference() -> None:
    g = tiny()
    g.nodes[3].inputs = (Ref("ghost"),)
    with pytest.raises(ValueError, match="'ghost'"):
        g.validate()


def test_validate_rejects_duplicate_names() -> None:
    g = tiny()
    g.nodes.insert(3, Node("linear", "op", target="aten.relu.default", inputs=(Ref("x"),)))
    with pytest.raises(ValueError, match="duplicate node name 'linear'"):
        g.validate()


def test_validate_rejects_an_output_index_out_of_range() -> None:
    g = tiny()
    g.nodes[3].inputs = (Ref("linear", 1),)
    with pytest.raises(ValueError, match="reads output 1 of 'linear', which has 1"):
        g.validate()


@pytest.mark.parametrize("schema", [0, SCHEMA_VERSION + 1, None, "1"])
def test_from_json_rejects_another_schema_version(schema: Any) -> None:
    d = tiny().to_dict()
    if schema is None:
        del d["schema"]
    else:
        d["schema"] = schema
    with pytest.raises(ValueError, match=f"schema {schema!r}, this fxviz reads schema {SCHEMA_VERSION}") as e:
        Graph.from_json(json.dumps(d))
    assert "re-capture" in str(e.value)


def test_from_json_rejects_an_unknown_node_kind() -> None:
    d = tiny().to_dict()
    d["nodes"][0]["kind"] = "tensor"
    with pytest.raises(ValueError, match="node 'x' has unknown kind 'tensor'"):
        Graph.from_dict(d)


def test_json_of_the_tiny_graph() -> None:
    g = tiny()
    d = json.loads(g.to_json())
    assert d["schema"] == SCHEMA_VERSION
    assert d["nodes"][2] == {
        "name": "linear", "kind": "op", "target": "aten.linear.default", "inputs": ["x", "fc.weight"],
        "stack": [["fc", 0]], "outputs": [{"shape": ["s0", 3], "dtype": "float32"}],
        "source": {"file": "/src/model.py", "line": 12, "func": "forward", "code": "return self.fc(x)"},
    }
    back = Graph.from_json(g.to_json(indent=2))
    assert back.to_dict() == g.to_dict()
    assert back.node("linear").source == g.node("linear").source


# ---- passes on hand-built graphs -----------------------------------------------------------------


def blocks(parallel: bool, n: int = 3) -> Graph:
    """``n`` identical Linear blocks ``layers.i``: chained one after the other, or side by side on x
    and summed."""
    nodes = [Node("x", "input", target="x", outputs=(meta(2, 8),))]
    prev = "x"
    outs = []
    for i in range(n):
        nodes.append(Node(f"layers.{i}.weight", "parameter", target=f"layers.{i}.weight",
                          stack=((f"layers.{i}", 0),), outputs=(meta(8, 8),)))
        src = "x" if parallel else prev
        nodes.append(Node(f"linear{i}", "op", target="aten.linear.default",
                          inputs=(Ref(src), Ref(f"layers.{i}.weight")),
                          stack=((f"layers.{i}", 0),), outputs=(meta(2, 8),)))
        prev = f"linear{i}"
        outs.append(prev)
    if parallel:
        nodes.append(Node("sum", "op", target="aten.stack.default", inputs=tuple(Ref(o) for o in outs),
                          outputs=(meta(n, 2, 8),)))
        prev = "sum"
    nodes.append(Node("output", "output", target="output", inputs=(Ref(prev),)))
    modules = {"": ModuleInfo("Net"), "layers": ModuleInfo("ModuleList")}
    modules.update({f"layers.{i}": ModuleInfo("Linear") for i in range(n)})
    return Graph(name="Net", nodes=nodes, modules=modules)


def test_fold_folds_a_chain_of_identical_blocks() -> None:
    g = run_passes(blocks(parallel=False), DEFAULT)
    assert g.annotations["fold"] == [{
        "parent": "layers", "paths": ["layers.0", "layers.1", "layers.2"], "cls": "Linear",
        "label": "layers.0-2", "count": 3,
    }]


def test_fold_leaves_parallel_identical_blocks_alone() -> None:
    g = run_passes(blocks(parallel=True), DEFAULT)
    assert g.annotations["fold"] == []


def test_stats_on_hand_built_blocks() -> None:
    g = run_passes(blocks(parallel=False), DEFAULT)
    s = g.annotations["stats"]
    assert s["total_params"] == 3 * 64 and s["total_ops"] == 3 and s["op_counts"] == {"linear": 3}
    assert s["modules"]["layers"]["params"] == 192 and s["modules"]["layers.1"]["params"] == 64
    assert g.calls.count("layers.1") == 1 and g.calls.count("layers") == 0


def test_shapes_pass_gives_outputs_their_metadata_and_lists_unknowns() -> None:
    g = tiny()
    g.nodes[3].outputs = ()
    g.nodes.insert(4, Node("relu2", "op", target="aten.relu.default", inputs=(Ref("linear"),),
                           outputs=(meta("s0", 3),)))
    g.nodes[-1].inputs = (Ref("relu2"),)
    run_passes(g, ["shapes"])
    assert g.node("output").outputs == (meta("s0", 3),)
    assert g.annotations["shapes"] == {"missing": ["relu"]}


def test_run_passes_names_the_failing_pass_and_those_before() -> None:
    from fxviz.errors import PassError

    g = tiny()
    g.nodes[3].inputs = (Ref("ghost"),)  # the shapes pass looks its input up
    g.nodes[4].inputs = (Ref("ghost"),)
    with pytest.raises(PassError, match=r"pass 'shapes' failed after \['module_paths'\] on graph 'Tiny'"):
        run_passes(g, ["module_paths", "shapes"])
    with pytest.raises(PassError, match="unknown pass 'nope'"):
        run_passes(tiny(), ["nope"])


# ---- hypothesis: random valid graphs -------------------------------------------------------------

NAME_CHARS = string.ascii_letters + string.digits + "._-@[]'"
DTYPES = ("float32", "float16", "bfloat16", "int64", "bool")
SYMBOLS = ("s0", "s1", "2*s0", "s0 + 1", "u0")

dims = st.one_of(st.integers(0, 64), st.sampled_from(SYMBOLS))
tensor_metas = st.builds(
    TensorMeta, st.lists(dims, max_size=4).map(tuple), st.sampled_from(DTYPES),
    st.sampled_from(("", "cpu", "meta")),
)
scalar_metas = st.builds(
    TensorMeta, st.just(()), st.sampled_from(("int", "float", "bool")),
    value=st.one_of(st.sampled_from(SYMBOLS), st.integers(-5, 5).map(str)),
)
metas = st.one_of(tensor_metas, tensor_metas, scalar_metas)
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**31), 2**31),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=6,
)
attrs = st.dictionaries(st.text(string.ascii_lowercase + "_", min_size=1, max_size=8), json_values, max_size=3)
sources = st.one_of(
    st.none(),
    st.builds(SourceLoc, st.text(NAME_CHARS + "/", min_size=1, max_size=20), st.integers(1, 5000),
              st.text(max_size=10), st.text(max_size=20)),
)
# module paths drawn from a small tree so that scopes nest and siblings repeat
PARTS = ("h", "0", "1", "attn", "mlp", "fc")
paths = st.lists(st.sampled_from(PARTS), min_size=1, max_size=3).map(".".join)


@st.composite
def stacks(draw: st.DrawFn) -> tuple[tuple[str, int], ...]:
    """A module call stack: nested paths (each level a prefix of the next), each with a call index."""
    if draw(st.booleans()):
        return ()
    parts = draw(st.lists(st.sampled_from(PARTS), min_size=1, max_size=3))
    levels = sorted(set(draw(st.lists(st.integers(1, len(parts)), min_size=1, max_size=len(parts)))))
    return tuple((".".join(parts[:i]), draw(st.integers(0, 2))) for i in levels)


@st.composite
def graphs(draw: st.DrawFn) -> Graph:
    n = draw(st.integers(1, 25))
    names = draw(st.lists(st.text(NAME_CHARS, min_size=1, max_size=10), min_size=n, max_size=n, unique=True))
    nodes: list[Node] = []
    for i, name in enumerate(names):
        kind = "input" if i == 0 else draw(st.sampled_from(NODE_KINDS))
        outputs = tuple(draw(st.lists(metas, min_size=0 if kind == "op" else 1, max_size=3)))
        inputs: tuple[Ref, ...] = ()
        stack: tuple[tuple[str, int], ...] = ()
        target = ""
        if kind in ("op", "output") and nodes:
            srcs = draw(st.lists(st.sampled_from(nodes), max_size=4))
            inputs = tuple(
                Ref(s.name, draw(st.integers(0, max(len(s.outputs) - 1, 0)))) for s in srcs
            )
        if kind == "op":
            stack = draw(stacks())
            target = draw(st.sampled_from(("aten.linear.default", "aten.add.Tensor", "torch.relu", "Tensor.view")))
        elif kind in ("parameter", "buffer", "constant"):
            owner = draw(st.one_of(st.just(""), paths))
            target = f"{owner}.weight" if owner else "weight"
            stack = ((owner, 0),) if owner and draw(st.booleans()) else ()
        elif kind == "output":
            target = name
            outputs = ()
        nodes.append(Node(
            name, kind, target=target, inputs=inputs, stack=stack, outputs=outputs,
            source=draw(sources) if kind == "op" else None, attrs=draw(attrs),
            error=draw(st.one_of(st.none(), st.text(max_size=10))) if kind == "op" else None,
        ))
    attempts = draw(st.lists(st.builds(
        Attempt, st.sampled_from(("export", "export-strict", "fx", "eager")), st.booleans(),
        st.floats(0, 100), st.text(max_size=10), st.text(max_size=30), sources,
    ), max_size=3))
    modules = {p: ModuleInfo(draw(st.sampled_from(("Linear", "Block", "ModuleList")))) for p in
               draw(st.lists(paths, max_size=4))}
    return Graph(
        name=draw(st.text(max_size=10)), nodes=nodes, method=draw(st.sampled_from(("export", "fx", ""))),
        attempts=attempts, modules=modules, error=draw(st.one_of(st.none(), st.text(max_size=10))),
    )


PROPS = settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def copy(g: Graph) -> Graph:
    return Graph.from_dict(json.loads(g.to_json()))


@PROPS
@given(graphs())
def test_random_graphs_are_valid(g: Graph) -> None:
    g.validate()


@PROPS
@given(graphs())
def test_json_round_trip_is_identity(g: Graph) -> None:
    back = Graph.from_json(g.to_json())
    assert back.to_dict() == g.to_dict()
    assert [n.to_dict() for n in back.nodes] == [n.to_dict() for n in g.nodes]
    assert back.to_json() == g.to_json()


@PROPS
@given(graphs())
def test_scopes_partition_the_nodes(g: Graph) -> None:
    homes: dict[str, list[str]] = {}
    for s in g.scopes.walk():
        for name in s.nodes:
            homes.setdefault(name, []).append(s.path)
    assert {n.name: [n.module] for n in g.nodes} == homes
    # every path on any stack has a scope, nested under its parent path
    scopes = {s.path: s for s in g.scopes.walk()}
    for n in g.nodes:
        for path, _ in n.stack:
            assert path in scopes
    for s in scopes.values():
        for child in s.children.values():
            assert child.path.rpartition(".")[0] == s.path


@PROPS
@given(graphs())
def test_scope_calls_count_distinct_call_indices(g: Graph) -> None:
    want: dict[str, set[int]] = {}
    for n in g.nodes:
        if n.kind not in ("parameter", "buffer", "constant"):
            for path, call in n.stack:
                want.setdefault(path, set()).add(call)
    for s in g.scopes.walk():
        if s.path:
            assert s.calls == len(want.get(s.path, ())), s.path


@PROPS
@given(graphs())
def test_edges_are_derived_from_inputs(g: Graph) -> None:
    edges = g.edges
    assert len(edges) == sum(len(n.inputs) for n in g.nodes)
    assert [(e.src, e.dst, e.src_index) for e in edges] == [
        (r.node, n.name, r.index) for n in g.nodes for r in n.inputs
    ]
    users = g.users()
    for e in edges:
        assert e.dst in users[e.src]


@PROPS
@given(graphs(), st.sampled_from(sorted(PASSES)))
def test_each_pass_is_idempotent(g: Graph, name: str) -> None:
    once = PASSES[name](copy(g))
    first = once.to_dict()
    twice = PASSES[name](once)
    assert twice.to_dict() == first


@PROPS
@given(graphs())
def test_default_passes_are_idempotent_and_keep_the_graph_valid(g: Graph) -> None:
    once = run_passes(copy(g), DEFAULT)
    once.validate()
    first = once.to_dict()
    assert run_passes(once, DEFAULT).to_dict() == first
    assert Graph.from_json(once.to_json()).to_dict() == first
    stats = once.annotations["stats"]
    assert stats["total_ops"] == len(once.ops)
    assert stats["modules"][""]["ops"] == len(once.ops)
    for run in once.annotations["fold"]:
        assert run["count"] == len(run["paths"]) >= 2
