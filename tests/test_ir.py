"""The IR on its own: hand-built graphs and hypothesis properties. No torch here."""

from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fxviz.ir import (
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
from tests.irbuild import graphs

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


@pytest.mark.parametrize("schema", [0, SCHEMA_VERSION + 1, None, "1", True, float(SCHEMA_VERSION)])
def test_from_json_rejects_another_schema_version(schema: Any) -> None:
    d = tiny().to_dict()
    if schema is None:
        del d["schema"]
    else:
        d["schema"] = schema
    with pytest.raises(ValueError, match=f"schema {schema!r}, this fxviz reads schemas 1, {SCHEMA_VERSION}") as e:
        Graph.from_json(json.dumps(d))
    assert "re-capture" in str(e.value)


def test_a_schema_1_graph_still_reads() -> None:
    """Schema 2 changed how stacks are written (one table); a graph saved by the fxviz before it,
    each node's stack a list of [path, call] pairs, reads to the same graph."""
    g = tiny()
    g.nodes.insert(3, Node("gelu", "op", target="aten.gelu.default", inputs=(Ref("linear"),),
                           stack=(("fc", 0), ("fc.act", 0)), outputs=(meta("s0", 3),)))
    d = g.to_dict()
    assert d["schema"] == SCHEMA_VERSION == 2
    assert any(path.startswith(".") for _, path, _ in d["stacks"])  # a level written below its parent
    old = {**d, "schema": 1}
    table = old.pop("stacks", [])
    paths = []
    for parent, path, _call in table:
        full = paths[parent] + path if path.startswith(".") else path
        paths.append(full)
    def stack_of(k: int) -> list[list[Any]]:
        out = []
        while k >= 0:
            out.append([paths[k], table[k][2]])
            k = table[k][0]
        return out[::-1]
    old["nodes"] = [{**n, "stack": stack_of(n["stack"] - 1) if n.get("stack") else []} for n in d["nodes"]]
    assert Graph.from_json(json.dumps(old)) == g


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
        "stack": 1, "outputs": [{"shape": ["s0", 3], "dtype": "float32"}],
        "source": {"file": "/src/model.py", "line": 12, "func": "forward", "code": "return self.fc(x)"},
    }
    assert d["stacks"] == [[-1, "fc", 0]]  # each call level once; a node's stack is 1 + its index
    back = Graph.from_json(g.to_json(indent=2))
    assert back.to_dict() == g.to_dict()
    assert back.node("linear").source == g.node("linear").source
    old = {**d, "nodes": [{**n, "stack": [["fc", 0]]} if n.get("stack") else n for n in d["nodes"]]}
    del old["stacks"]  # a graph saved with a list of levels per node reads the same
    assert Graph.from_dict(old).to_dict() == g.to_dict()


def nested(depth: int) -> Graph:
    """One op in each module of a chain ``depth`` deep (``m``, ``m.m``, ...), as a model of nested
    blocks captures: paths grow with the depth, and so do the stacks."""
    nodes = [Node("x", "input", "x", outputs=(TensorMeta((2,)),))]
    stack: tuple[tuple[str, int], ...] = ()
    for k in range(depth):
        stack = (*stack, (stack[-1][0] + ".m" if stack else "m", 0))
        nodes.append(Node(f"op{k}", "op", "aten.relu.default", (Ref(nodes[-1].name),), stack, (TensorMeta((2,)),)))
    nodes.append(Node("out", "output", "out", (Ref(nodes[-1].name),)))
    return Graph(name="Nested", nodes=nodes)


def test_json_grows_with_the_nodes_not_with_the_depth_cubed() -> None:
    """Each node wrote its whole stack of full paths: O(depth^2) characters per node, 1 GB at a
    depth of 1,000. The table of call levels writes each level once, its path relative to its parent's."""
    small, large = (len(nested(d).to_json()) for d in (100, 400))
    assert large / small < 4.5, (small, large)  # 4x the nodes and levels; it was 57x
    g = nested(300)
    back = Graph.from_json(g.to_json())
    assert [n.stack for n in back.nodes] == [n.stack for n in g.nodes]
    assert back.node("op299").stack[-1] == (".".join(["m"] * 300), 0)


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


# ---- hypothesis: random valid graphs (tests.irbuild.graphs) --------------------------------------


PROPS = settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def copy(g: Graph) -> Graph:
    return Graph.from_dict(json.loads(g.to_json()))


@PROPS
@given(graphs())
def test_random_graphs_hold_the_ir_invariants(g: Graph) -> None:
    """What fxviz promises of any valid graph: it validates, its JSON reads back as itself, the
    call tree holds every op exactly once, a diff with itself is empty, and every renderer draws it."""
    import fxviz  # registers the renderers

    g.validate()
    assert Graph.from_json(g.to_json()).to_dict() == g.to_dict()
    tree = g.calls
    ops = [n.name for n in g.ops]
    owned = [name for c in tree.walk() for name in c.ops]
    assert sorted(owned) == sorted(ops) and len(set(owned)) == len(owned)
    assert tree.root.nodes == ops  # in execution order
    for c in tree.walk():
        assert c.nodes == [name for name in ops if tree.of(name).stack[: c.depth] == c.stack]
        assert c.parent is None or c.stack[:-1] == c.parent.stack
    assert len({c.id for c in tree.walk()}) == len(tree.by_stack)
    found = fxviz.diff(g, g).differences
    if g.ops or any(a.ok for a in g.attempts):
        assert found == []
    else:  # nothing captured: the diff says why, on both sides, and nothing else
        assert {d.kind for d in found} <= {"capture_failed"}
    from rich.console import Console

    console = Console(width=80, color_system=None, file=io.StringIO())
    console.print(g.tree(depth=1))
    text = str(g)
    assert "captured by" in text.splitlines()[0]
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", text)  # names are cleaned
    assert '<script type="application/json"' in g.to_html()


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


# ---- hypothesis: lookups by name follow every change of the node list -----------------------------

CHANGES = ("append", "insert", "extend", "iadd", "remove", "pop", "del", "del-slice", "set", "set-slice",
           "set-step", "rename", "assign", "sort", "reverse", "clear", "imul")


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_node_lookups_follow_every_change_of_the_node_list(data: st.DataObject) -> None:
    """``g.node(name)`` and ``name in g`` agree with a scan of ``g.nodes`` after any list operation,
    a node renamed in place, or a new list assigned (names stay unique, as in a valid graph)."""
    count = iter(range(10_000))
    every: list[Node] = []  # every node ever made: removed ones must not be found
    names = ["absent"]  # every name ever given, old names of renamed nodes first

    def new() -> Node:
        n = Node(f"n{next(count)}", "op")
        every.append(n)
        names.append(n.name)
        return n

    def some(k: int) -> list[Node]:
        """``k`` nodes: new ones, or removed ones whose names are free again."""
        out = []
        for _ in range(k):
            free = [n for n in every if all(m.name != n.name for m in g.nodes) and n not in out]
            out.append(data.draw(st.sampled_from(free)) if free and data.draw(st.booleans()) else new())
        return out

    g = Graph(nodes=[new() for _ in range(data.draw(st.integers(0, 5)))])
    for _ in range(data.draw(st.integers(1, 30))):
        nodes, size = g.nodes, len(g.nodes)
        change = data.draw(st.sampled_from(CHANGES))
        i = data.draw(st.integers(0, max(size - 1, 0)))
        j = data.draw(st.integers(i, size))
        if change == "append":
            nodes.append(some(1)[0])
        elif change == "insert":
            nodes.insert(i, some(1)[0])
        elif change == "extend":
            nodes.extend(iter(some(2)))
        elif change == "iadd":
            g.nodes += some(2)
        elif change == "remove" and size:
            nodes.remove(nodes[i])
        elif change == "pop" and size:
            nodes.pop(i)
        elif change == "del" and size:
            del nodes[i]
        elif change == "del-slice":
            del nodes[i:j]
        elif change == "set" and size:
            nodes[i] = some(1)[0]
        elif change == "set-slice":
            nodes[i:j] = some(data.draw(st.integers(0, 3)))
        elif change == "set-step" and size:
            nodes[::2] = some(len(nodes[::2]))
        elif change == "rename" and every:
            n = data.draw(st.sampled_from(every))
            names.insert(0, n.name)
            n.name = f"n{next(count)}"
            names.append(n.name)
        elif change == "assign":
            keep = data.draw(st.permutations(list(nodes)))[: data.draw(st.integers(0, size))]
            g.nodes = [*keep, *some(data.draw(st.integers(0, 2)))]
        elif change == "sort":
            nodes.sort(key=lambda n: n.name, reverse=data.draw(st.booleans()))
        elif change == "reverse":
            nodes.reverse()
        elif change == "clear":
            nodes.clear()
        elif change == "imul":
            g.nodes *= 2  # the same nodes twice: a lookup gives the first
        for name in dict.fromkeys(names):
            want = next((n for n in g.nodes if n.name == name), None)
            assert (name in g) == (want is not None), (change, name)
            if want is None:
                with pytest.raises(KeyError):
                    g.node(name)
            else:
                assert g.node(name) is want, (change, name)
