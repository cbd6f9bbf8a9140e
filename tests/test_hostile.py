"""Hostile saved graphs. Whatever a JSON file holds, ``Graph.from_json`` either returns a graph that
every renderer draws (tree, report, DOT, a diff with itself), or raises ``GraphFormatError`` naming
what is wrong: no other exception, no recursion limit, no hang, and nothing from the file reaches a
terminal unescaped. No torch."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rich.console import Console

import fxviz
from fxviz.errors import GraphFormatError
from fxviz.ir import Attempt, Graph, ModuleInfo, Node, Ref, TensorMeta
from fxviz.passes import DEFAULT, run_passes
from fxviz.schema import MAX_NESTING, MAX_STACK
from tests.irbuild import graphs, stack_graph

try:
    import pygraphviz
except ImportError:  # the DOT checks need the optional extra
    pygraphviz = None

#: What must never reach a terminal raw: C0/C1 controls but newline, bidirectional controls,
#: lone surrogates.
UNSAFE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
ESCAPES = "\x1b]0;PWNED\x07\x1b[2J"
RTL = "\u202eexe.txt"


def render_all(g: Graph) -> str:
    """Draw ``g`` with every renderer; returns the plain-text tree. Fails on anything unsafe."""
    text = str(g)
    assert not UNSAFE.search(text), repr(UNSAFE.search(text))
    console = Console(width=100, color_system=None, record=True, file=io.StringIO())
    console.print(g.tree(depth=1))
    console.print(g)
    assert not UNSAFE.search(console.export_text())
    g.to_html().encode("utf-8")  # a report that can be written
    if pygraphviz is not None:
        pygraphviz.AGraph(string=g.to_dot())  # DOT that Graphviz reads back
    fxviz.diff(g, g)
    return text


def base() -> dict[str, Any]:
    """A valid saved graph with every annotation the renderers read (three folded blocks)."""
    return json.loads(stack_graph().to_json())


def node(d: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in d["nodes"] if n["name"] == name)


def deep(depth: int, leaf: Any = 1) -> Any:
    v = leaf
    for _ in range(depth):
        v = [v]
    return v


# ---- malformed documents: one GraphFormatError that says what and where ---------------------------

Edit = Callable[[dict[str, Any]], Any]

MALFORMED: list[tuple[str, Edit, str]] = [
    ("name-int", lambda d: d["nodes"][0].update(name=5), r"nodes\[0\] 'name': expected a string, got 5"),
    ("name-list", lambda d: d["nodes"][0].update(name=["a"]), r"expected a string, got a list of 1 items"),
    ("name-null", lambda d: d["nodes"][0].update(name=None), r"nodes\[0\] 'name': expected a string, got None"),
    ("name-empty", lambda d: d["nodes"][0].update(name=""), r"expected a non-empty string"),
    ("dangling", lambda d: node(d, "output").update(inputs=["ghost"]), r"node 'output' .* reads 'ghost', which no node defines"),
    ("forward", lambda d: node(d, "ln_0").update(inputs=["add_2"]), r"node 'ln_0' reads 'add_2' before it is defined"),
    ("self", lambda d: node(d, "ln_0").update(inputs=["ln_0"]), r"node 'ln_0' reads 'ln_0' before it is defined"),
    ("duplicate", lambda d: d["nodes"].append(dict(d["nodes"][-2])), r"duplicate node name 'add_2'"),
    ("kind", lambda d: node(d, "x").update(kind="tensor"), r"node 'x' has unknown kind 'tensor': expected one of input"),
    ("kind-list", lambda d: node(d, "x").update(kind=["op"]), r"node 'x' has unknown kind a list of 1 items"),
    ("ref-shape", lambda d: node(d, "output").update(inputs=[[None, 2]]), r"'inputs'\[0\]: expected a node name or \[node name, output index\]"),
    ("ref-node-index-later", lambda d: node(d, "output").update(inputs=[len(d["nodes"])]),
     r"'inputs'\[0\]: expected the index of an earlier node"),
    ("ref-node-index-bool", lambda d: node(d, "output").update(inputs=[True]), r"'inputs'\[0\]: expected a node name"),
    ("name-prefix-index", lambda d: d["nodes"][1].update(name=[1, 0, "x"]), r"nodes\[1\] 'name' \[index, length, suffix\]: expected an earlier index"),
    ("name-prefix-length", lambda d: d["nodes"][1].update(name=[0, 99, "x"]), r"nodes\[1\] 'name' shared length: expected 0 to"),
    ("target-prefix-suffix", lambda d: d["nodes"][1].update(target=[1, 5]), r"'target' suffix: expected a string, got 5"),
    ("module-entry", lambda d: d.update(modules=[["h", "Block", ""]]), r"'modules'\[0\]: expected \[module path, value\]"),
    ("module-prefix", lambda d: d["modules"].append([[0, 1, "x"], {"cls": "A"}]), r"'modules'\[\d+\] path shared length: expected 0 to 0"),
    ("stats-entry", lambda d: d["annotations"]["stats"]["modules"].append([5, {}]), r"annotation 'stats' 'modules'\[\d+\] path: expected a string"),
    ("stack-path-prefix", lambda d: d.update(stacks=[[-1, [0, 0, "x"], 0]]), r"'stacks'\[0\] module path \[index, length, suffix\]"),
    ("ref-index-bool", lambda d: node(d, "output").update(inputs=[["add_2", True]]), r"output index: expected a non-negative integer"),
    ("ref-index-range", lambda d: node(d, "output").update(inputs=[["add_2", 3]]), r"node 'output' reads output 3 of 'add_2', which has 1"),
    ("graph-error", lambda d: d.update(error=5), r"graph 'error': expected a string, got 5"),
    ("node-error", lambda d: node(d, "ln_0").update(error=[1]), r"node 'ln_0' \(nodes\[4\]\) 'error': expected a string"),
    ("target", lambda d: node(d, "ln_0").update(target={}), r"'target': expected a string, got an object"),
    ("stack-pair", lambda d: node(d, "ln_0").update(stack=[["h.0"]]), r"'stack'\[0\]: expected \[module path, call index\]"),
    ("stack-call", lambda d: node(d, "ln_0").update(stack=[["h.0", -1]]), r"'stack'\[0\] call index: expected a non-negative"),
    ("stack-path", lambda d: node(d, "ln_0").update(stack=[["", 0]]), r"'stack'\[0\] module path: expected a non-empty string"),
    ("stack-deep", lambda d: node(d, "ln_0").update(stack=[["m", 0]] * (MAX_STACK + 1)), rf"at most {MAX_STACK} module calls"),
    ("stack-cells", lambda d: [n.update(stack=[[f"m{i}", 0]] * MAX_STACK) for i, n in enumerate(d["nodes"])],
     r"distinct module stacks, up to 5000 levels deep, are more than fxviz draws"),
    ("shape-float", lambda d: node(d, "x")["outputs"][0].update(shape=[1.5]), r"'shape'\[0\] \(a size or a symbol such as 's0'\)"),
    ("shape-huge", lambda d: node(d, "x")["outputs"][0].update(shape=[2**62, 2**62]), r"'shape': expected at most 2\*\*63 elements"),
    ("shape-symbol", lambda d: node(d, "x")["outputs"][0].update(shape=[""]), r"'shape'\[0\]: expected a non-empty string"),
    ("dtype", lambda d: node(d, "x")["outputs"][0].pop("dtype"), r"'dtype': expected a string, got None"),
    ("outputs", lambda d: node(d, "x").update(outputs="[2, 3]"), r"node 'x' .* 'outputs': expected a list"),
    ("source-line", lambda d: node(d, "ln_0").update(source={"file": "m.py", "line": 1.0}), r"'source' 'line': expected a non-negative"),
    ("attrs", lambda d: node(d, "ln_0").update(attrs=[1]), r"'attrs': expected an object, got a list"),
    ("attrs-deep", lambda d: node(d, "ln_0").update(attrs={"a": deep(MAX_NESTING + 1)}), rf"nested more than {MAX_NESTING} levels"),
    ("surrogate", lambda d: node(d, "x").update(target="a\ud800b"), r"'target': holds a lone surrogate \('a\\ud800b'\)"),
    ("surrogate-key", lambda d: node(d, "x").update(attrs={"\udc00": 1}), r"'attrs' \(a key\): holds a lone surrogate"),
    ("attempt-ok", lambda d: d.update(attempts=[{"method": "export", "ok": 1}]), r"attempts\[0\] 'ok': expected true or false, got 1"),
    ("attempt-seconds", lambda d: d.update(attempts=[{"method": "export", "ok": True, "seconds": "1s"}]), r"'seconds': expected a finite number"),
    ("assumption", lambda d: d.update(assumptions=[{"expr": 3}]), r"assumptions\[0\] 'expr': expected a string"),
    ("module-cls", lambda d: d["modules"].append(["h", {"cls": 5}]), r"modules\['h'\] 'cls': expected a string, got 5"),
    ("modules", lambda d: d.update(modules=5), r"'modules': expected an object, got 5"),
    ("nodes", lambda d: d.update(nodes={}), r"'nodes': expected a list, got an object"),
    ("annotations", lambda d: d.update(annotations=[]), r"'annotations': expected an object"),
    ("stats", lambda d: d["annotations"].update(stats=5), r"annotation 'stats': expected an object, got 5"),
    ("stats-params", lambda d: next(e for e in d["annotations"]["stats"]["modules"] if e[0] == "h")[1].update(params="many"),
     r"annotation 'stats' 'modules'\['h'\] 'params': expected a non-negative integer"),
    ("stats-total", lambda d: d["annotations"]["stats"].update(total_params=2**70), r"'total_params': expected a non-negative integer below 2\*\*63"),
    ("fold-list", lambda d: d["annotations"].update(fold={"paths": []}), r"annotation 'fold': expected a list"),
    ("fold-paths", lambda d: d["annotations"]["fold"][0].pop("paths"), r"annotation 'fold'\[0\]: expected a run with 'paths'"),
    ("fold-empty", lambda d: d["annotations"]["fold"][0].update(paths=[]), r"'paths': expected a non-empty list of module paths"),
    ("fold-label", lambda d: d["annotations"]["fold"][0].update(label=None), r"annotation 'fold'\[0\] 'label': expected a string"),
    ("shapes", lambda d: d["annotations"].update(shapes={"missing": [1]}), r"annotation 'shapes' 'missing'\[0\]: expected a string"),
    ("failure", lambda d: d["annotations"].update(failure={"call": -1}), r"annotation 'failure' 'call': expected a non-negative"),
    ("replay", lambda d: d["annotations"].update(replay={"ok": "yes"}), r"annotation 'replay' 'ok': expected true or false"),
    ("unknown-annotation", lambda d: d["annotations"].update(overlay={"x": deep(MAX_NESTING + 1)}),
     r"annotation 'overlay': nested more than"),
    ("schema-true", lambda d: d.update(schema=True), r"graph JSON has schema True, this fxviz reads schemas 1, 2"),
    ("schema-float", lambda d: d.update(schema=1.0), r"graph JSON has schema 1.0, this fxviz reads schemas 1, 2"),
    ("schema-missing", lambda d: d.pop("schema"), r"graph JSON has schema None"),
]


@pytest.mark.parametrize(("edit", "message"), [(e, m) for _, e, m in MALFORMED], ids=[i for i, _, _ in MALFORMED])
def test_malformed_json_names_what_is_wrong(edit: Edit, message: str) -> None:
    d = base()
    edit(d)
    with pytest.raises(GraphFormatError, match=message) as e:
        Graph.from_json(json.dumps(d))
    assert "\n" not in str(e.value) and len(str(e.value)) < 400  # one readable line
    with pytest.raises(GraphFormatError, match=message):
        Graph.from_dict(d)


TEXTS: list[tuple[str, Any, str]] = [
    ("deep-arrays", "[" * 100_000 + "]" * 100_000, r"nested too deeply to parse"),
    ("deep-objects", '{"a":' * 100_000 + "1" + "}" * 100_000, r"nested too deeply to parse"),
    ("truncated", '{"schema": 1, "nodes": [', r"not valid JSON: Expecting value at line 1 column 25"),
    ("empty", "", r"not valid JSON"),
    ("nan", '{"schema": 1, "annotations": {"a": NaN}}', r"holds NaN, which JSON does not allow"),
    ("infinity", '{"schema": 1, "annotations": {"a": -Infinity}}', r"holds -Infinity"),
    ("overflow", '{"schema": 1, "annotations": {"a": 1e400}}', r"holds the number 1e400, which is too large"),
    ("digits", '{"schema": 1, "annotations": {"a": ' + "9" * 5000 + "}}", r"cannot be read"),
    ("bytes", b'{"schema": 1, "name": "\xff"}', r"cannot be read"),
    ("bom", "\ufeff{}", r"not valid JSON"),
    ("list", "[]", r"the document: expected an object with 'schema' and 'nodes', got a list of 0 items"),
    ("null", "null", r"got None"),
    ("number", "3", r"got 3"),
    ("not-text", None, r"graph JSON must be text, got None"),
]


@pytest.mark.parametrize(("text", "message"), [(t, m) for _, t, m in TEXTS], ids=[i for i, _, _ in TEXTS])
def test_malformed_text_is_a_graph_format_error(text: Any, message: str) -> None:
    with pytest.raises(GraphFormatError, match=message):
        Graph.from_json(text)


def test_an_in_memory_graph_is_held_to_the_same_rules() -> None:
    g = stack_graph()
    g.nodes[0].attrs["eps"] = float("nan")
    with pytest.raises(GraphFormatError, match=r"node 'h.0.fc.weight' .* 'attrs': expected a finite number, got nan"):
        g.validate()
    with pytest.raises(GraphFormatError, match="cannot be written as JSON: Out of range float"):
        g.to_json()
    g = stack_graph()
    g.nodes[0].stack = (("h.0.fc", "0"),)  # type: ignore[assignment]
    with pytest.raises(GraphFormatError, match=r"'stack'\[0\] call index"):
        g.validate()


# ---- documents that load: every renderer draws them -------------------------------------------------


def hostile_names() -> Graph:
    """Every string the tree prints, from a model that names things with escape sequences."""
    path = f"blk{ESCAPES}"
    nodes = [
        Node(f"x{ESCAPES}", "input", target=f"x{RTL}", outputs=(TensorMeta((1, f"s{ESCAPES}"), f"f{ESCAPES}"),)),
        Node("w", "parameter", target=f"{path}.w", stack=((path, 0),), outputs=(TensorMeta((4,), "float32"),)),
        Node("op", "op", target=f"custom.{ESCAPES}", inputs=(Ref(f"x{ESCAPES}"), Ref("w")), stack=((path, 0),),
             outputs=(TensorMeta((1, 4), "float32"),), attrs={"data_dependent": True},
             error=f"RuntimeError: {ESCAPES}\nsecond line {RTL}"),
        Node("k", "input", target="k", attrs={"value": ESCAPES}),
        Node(f"out{RTL}", "output", target=f"out{ESCAPES}", inputs=(Ref("op"),)),
    ]
    g = Graph(name=f"Evil{ESCAPES}", nodes=nodes, method=f"export{ESCAPES}",
              attempts=[Attempt(f"fx{ESCAPES}", False, 0.1, f"Trace{ESCAPES}", f"bad {RTL}")],
              modules={"": ModuleInfo("Evil"), path: ModuleInfo(f"Block{ESCAPES}{RTL}")}, error=f"boom{ESCAPES}")
    return Graph.from_json(run_passes(g, DEFAULT).to_json())


def flat(text: str) -> str:
    """``text`` without line breaks, tree guides and spaces: rich wraps long labels anywhere."""
    return re.sub(r"[\s│├└─]", "", text)


def test_escape_sequences_reach_the_terminal_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    g = hostile_names()
    print(g)
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
    pwned = "\\x1b]0;PWNED\\x07\\x1b[2J"
    for shown in (f"Evil{pwned} captured by export{pwned} (partial)",  # graph name, method
                  f"✗ fx{pwned} failed: Trace{pwned}: bad ⟨U+202E⟩exe.txt",  # attempt
                  f"▶ x⟨U+202E⟩exe.txt [1, s{pwned}] f{pwned}",  # input target, symbolic size, dtype
                  f"▶ k = {pwned}",  # attribute value
                  f"blk{pwned} (Block{pwned}⟨U+202E⟩exe.txt)",  # module path and class
                  f"· {pwned} ⚠ data-dependent ✗ RuntimeError: {pwned} ⏎ second line ⟨U+202E⟩exe.txt",  # op, error
                  f"◀ out{pwned} [1, 4] float32",  # output path
                  f"✗ the model raised: boom{pwned}"):
        assert flat(shown) in flat(out), shown
    render_all(g)


def test_an_empty_graph_renders() -> None:
    g = Graph.from_json('{"schema": 1}')
    assert render_all(g).startswith("model  captured by an unknown method")


def test_unknown_annotations_are_kept_as_plain_json() -> None:
    d = base()
    d["annotations"]["overlay"] = {"flops": {"ln_0": [1, 2.5, None, "x"]}, "unit": "FLOP"}
    g = Graph.from_json(json.dumps(d))
    assert g.annotations["overlay"] == d["annotations"]["overlay"]
    assert json.loads(g.to_json()) == d
    render_all(g)


def test_a_module_path_5000_levels_deep_renders() -> None:
    d = base()
    path = ".".join(f"m{i}" for i in range(5000))
    node(d, "ln_0")["stack"] = [[path, 0]]
    d["modules"].append([path, {"cls": "Deep", "qualname": ""}])
    g = Graph.from_json(json.dumps(d))
    assert len(list(g.scopes.walk())) > 5000 and "Scope(" in repr(g.scopes)
    text = render_all(g)
    # the tree cuts the label like every renderer (issue 10); the saved graph keeps the path
    assert flat(path[:150]) in flat(text) and path not in flat(text) and path in g.to_json()


@pytest.mark.slow
def test_a_stack_5000_calls_deep_renders() -> None:
    d = base()
    node(d, "ln_0")["stack"] = [[f"m{i}", 0] for i in range(4999)]
    node(d, "fc_0")["stack"] = [[f"m{i}", 0] for i in range(4999)] + [["m", 1]]
    g = Graph.from_json(json.dumps(d))
    text = render_all(g)
    assert re.search(r"⋯2opsin4,9\d\dmorelevelsofmodulesnotdrawn:thetreestopsat22levels", flat(text))
    assert max(len(line) for line in text.splitlines()) <= 120
    tree = g.calls
    assert len({c.id for c in tree.walk()}) == len(tree.by_stack) > 5000


@pytest.mark.skipif(pygraphviz is None, reason="needs the dot extra (pygraphviz)")
def test_a_huge_class_name_gives_dot_graphviz_reads() -> None:
    g = stack_graph()
    g.modules["h.0.ln"] = ModuleInfo("C" * 100_000)
    long = "n" * 100_000
    for n in g.nodes:  # the input x gets a name Graphviz could not read as an id
        n.inputs = tuple(Ref(long) if r.node == "x" else r for r in n.inputs)
    g.node("x").name = long
    g.validate()
    dot = g.to_dot()
    back = pygraphviz.AGraph(string=dot)
    assert len(back.nodes()) == len(pygraphviz.AGraph(string=stack_graph().to_dot()).nodes())
    assert len(dot) < 20_000 and back.has_node("L3")  # x, by its position
    assert re.search(r'label="ln \(C{195}…"', dot)  # cut to MAX_LABEL characters
    assert "C" * 100_000 in g.to_html()  # the report keeps the full text


def test_a_lone_surrogate_in_memory_is_refused_by_validate_and_escaped_by_the_tree() -> None:
    g = stack_graph()
    g.modules["h.0"] = ModuleInfo("Bad\ud800")
    with pytest.raises(GraphFormatError, match="lone surrogate"):
        g.validate()
    assert "Bad\\ud800" in str(g)
    if pygraphviz is not None:
        assert "Bad\\\\ud800" in g.to_dot()


# ---- hypothesis: random damage to valid documents -------------------------------------------------

EVIL = [ESCAPES, RTL, "\ud800", "\udfff\ud800", "x" * 100_000, "", ".", "..", "a..b", "</script>", "\\", '"',
        "\n\n", "\x00", "\u2028", "h.0", "h.0.fc", "x", "add_0", "output", "s0", "-1", "-.", "-", "1.5", "node",
        "graph", "strict", "subgraph", "edge", "digraph", "<b>", "\t", "\r\n", "\x7f", "\x9b"]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.integers(0, 5), st.floats(),
    st.text(max_size=12), st.sampled_from(EVIL),
)
values = st.one_of(
    scalars,
    st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                  st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                 max_leaves=8),
    st.integers(1, MAX_NESTING + 2).map(deep),  # deep, but not too deep for json.dumps in this test
    st.lists(st.sampled_from(["h", "h.0", "a", "x", "add_0"]), min_size=1, max_size=3).map(lambda p: [p, 0]),
)


def like(draw: st.DrawFn, old: Any) -> Any:
    """A hostile value of the same JSON type as ``old``: a document that still loads, but holds
    names, paths, numbers and pass results no capture makes."""
    if isinstance(old, bool):
        return draw(st.booleans())
    if isinstance(old, int):
        return draw(st.one_of(st.integers(0, 3), st.integers(0, 2**63 - 1)))
    if isinstance(old, float):
        return draw(st.floats(0, 1e300))
    if isinstance(old, str):
        return draw(st.one_of(st.sampled_from(EVIL), st.text(max_size=12)))
    if isinstance(old, list):
        return draw(st.lists(st.sampled_from(old), max_size=4)) if old else []
    return draw(values)


def locations(doc: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) in ``doc`` but the schema version (its own tests break that), the
    deepest first: hypothesis favours the first, and a leaf is where damage still loads."""
    out: list[tuple[Any, Any]] = []
    todo = [doc]
    while todo and len(out) < 5000:
        v = todo.pop()
        keys = list(v) if isinstance(v, dict) else range(len(v)) if isinstance(v, list) else []
        for k in keys:
            if v is not doc or k != "schema":
                out.append((v, k))
                todo.append(v[k])
    return out[::-1]


@st.composite
def damaged(draw: st.DrawFn) -> str | bytes:
    """A valid saved graph (with pass results, sometimes) damaged one to three ways, as text."""
    g = draw(graphs())
    if draw(st.booleans()):
        g = run_passes(g, DEFAULT)
    doc = json.loads(g.to_json())
    for _ in range(draw(st.integers(1, 3))):
        nodes = doc.get("nodes") if isinstance(doc.get("nodes"), list) else []
        how = draw(st.sampled_from(["like", "like", "like", "like", "set", "drop", "swap", "copy", "read", "stack",
                                    "path"]))
        if how in ("swap", "copy", "read", "stack", "path") and not nodes:
            how = "set"
        if how == "like":
            container, key = draw(st.sampled_from(locations(doc) or [(doc, "nodes")]))
            container[key] = like(draw, container.get(key) if isinstance(container, dict) else container[key])
        elif how == "set":
            container, key = draw(st.sampled_from(locations(doc) or [(doc, "nodes")]))
            container[key] = draw(values)
        elif how == "drop":
            dicts = [(c, k) for c, k in locations(doc) if isinstance(c, dict)] or [(doc, "name")]
            container, key = draw(st.sampled_from(dicts))
            del container[key]
        elif how == "swap":  # a node before what it reads, or a cycle
            i, j = draw(st.integers(0, len(nodes) - 1)), draw(st.integers(0, len(nodes) - 1))
            nodes[i], nodes[j] = nodes[j], nodes[i]
        elif how == "copy":  # a duplicate name
            nodes.insert(draw(st.integers(0, len(nodes))), json.loads(json.dumps(draw(st.sampled_from(nodes)))))
        elif how == "read":  # a reference to a later node, itself, an unknown name, an output index
            n = draw(st.sampled_from(nodes))
            other = draw(st.sampled_from(nodes))
            if isinstance(n, dict) and isinstance(other, dict):
                n["inputs"] = [[other.get("name"), draw(st.integers(0, 3))], *(n.get("inputs") or [])][:3]
        elif how == "stack":  # deep module nesting
            n = draw(st.sampled_from(nodes))
            if isinstance(n, dict):
                n["stack"] = [[draw(st.sampled_from(["m", "h", "h.0", "a.b"])), i % 3] for i in range(draw(st.integers(1, 400)))]
        else:  # a long dotted path
            n = draw(st.sampled_from(nodes))
            if isinstance(n, dict):
                n["stack"] = [[".".join(["m"] * draw(st.integers(1, 2000))), 0]]
    text = json.dumps(doc)
    cut = draw(st.sampled_from(["", "", "", "", "", "", "", "", "truncate", "nest", "bytes"]))
    if cut == "truncate":
        return text[: draw(st.integers(0, len(text)))]
    if cut == "nest":
        n = draw(st.integers(500, 50_000))
        return '{"schema": 1, "annotations": {"a": ' + "[" * n + "]" * n + "}}"
    if cut == "bytes":
        data = text.encode("utf-8")
        i = draw(st.integers(0, len(data)))
        return data[:i] + draw(st.binary(min_size=1, max_size=4)) + data[i:]
    return text


def loads_and_renders_or_refuses(text: str | bytes) -> bool:
    try:
        g = Graph.from_json(text)
    except GraphFormatError as e:
        assert str(e) and "\n" not in str(e)
        event("refused")
        return False
    event("loaded")
    render_all(g)
    assert Graph.from_json(g.to_json()).to_dict() == g.to_dict()  # and it saves what it loaded
    return True


HOSTILE = settings(max_examples=60, deadline=timedelta(seconds=5), suppress_health_check=list(HealthCheck))


@HOSTILE
@given(damaged())
def test_damaged_json_loads_and_renders_or_is_a_graph_format_error(text: str | bytes) -> None:
    loads_and_renders_or_refuses(text)


@pytest.mark.slow
@settings(HOSTILE, max_examples=600)
@given(damaged())
def test_damaged_json_at_length(text: str | bytes) -> None:
    loads_and_renders_or_refuses(text)


@pytest.mark.parametrize("text", [s for s in EVIL if not re.search(r"[\ud800-\udfff]", s) and len(s) < 1000],
                         ids=lambda s: ascii(s)[1:-1] or "empty")
def test_odd_strings_in_every_field_render(text: str) -> None:
    d = base()
    d.update(name=text, method=text, error=text)
    next(m for m in d["modules"] if m[0] == "h.0")[1]["cls"] = text
    d["attempts"] = [{"method": text, "ok": False, "error_type": text, "message": text}]
    node(d, "ln_0").update(target=text, error=text, attrs={text: text, "value": text})
    node(d, "x")["outputs"][0].update(dtype=text or "f", shape=[text or "s", 2])
    if text and text not in {n["name"] for n in d["nodes"]}:  # every reference follows the new name
        for n in d["nodes"]:
            n["inputs"] = [text if r == "add_0" else r for r in n.get("inputs", [])]
        node(d, "add_0")["name"] = text
    render_all(Graph.from_json(json.dumps(d)))
