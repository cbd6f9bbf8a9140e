"""Build IR graphs by hand, without torch, for renderer and pass tests; :func:`graphs` draws random
valid ones for property tests."""

from __future__ import annotations

import string
from typing import Any

from hypothesis import strategies as st

from fxviz.ir import NODE_KINDS, Attempt, Graph, ModuleInfo, Node, Ref, SourceLoc, TensorMeta
from fxviz.passes import DEFAULT, run_passes


class GraphBuilder:
    def __init__(self, name: str, modules: dict[str, str] | None = None) -> None:
        self.g = Graph(name=name, method="export")
        self.g.modules = {"": ModuleInfo(name), **{p: ModuleInfo(c) for p, c in (modules or {}).items()}}

    def _add(self, node: Node) -> str:
        self.g.nodes.append(node)
        return node.name

    def input(self, name: str, shape: tuple[Any, ...], dtype: str = "float32") -> str:
        return self._add(Node(name, "input", target=name, outputs=(TensorMeta(shape, dtype),)))

    def param(self, name: str, shape: tuple[int, ...]) -> str:
        owner = name.rpartition(".")[0]
        return self._add(Node(name, "parameter", target=name, stack=((owner, 0),) if owner else (),
                              outputs=(TensorMeta(shape, "float32"),)))

    def op(self, name: str, target: str, inputs: list[str], shape: tuple[Any, ...],
           stack: tuple[tuple[str, int], ...] = (), dtype: str = "float32", **attrs: Any) -> str:
        return self._add(Node(name, "op", target=target, inputs=tuple(Ref(i) for i in inputs),
                              stack=stack, outputs=(TensorMeta(shape, dtype),), attrs=attrs))

    def output(self, name: str, src: str) -> str:
        return self._add(Node(name, "output", target=name, inputs=(Ref(src),)))

    def build(self) -> Graph:
        self.g.validate()
        return run_passes(self.g, DEFAULT)


def cnn_graph() -> Graph:
    """The two-branch CNN of fxviz.examples, as export captures it, built by hand."""
    b = GraphBuilder("CoolCNN", {
        "initial_conv": "Conv2d", "parallel_conv": "Conv2d", "secondary_conv": "Conv2d",
        "max_pool": "MaxPool2d", "fully_connected1": "Linear", "output_layer": "Linear",
    })
    for conv, cin, cout in (("initial_conv", 3, 16), ("parallel_conv", 3, 16), ("secondary_conv", 16, 32)):
        b.param(f"{conv}.weight", (cout, cin, 3, 3))
        b.param(f"{conv}.bias", (cout,))
    b.param("fully_connected1.weight", (128, 2048))
    b.param("fully_connected1.bias", (128,))
    b.param("output_layer.weight", (10, 128))
    b.param("output_layer.bias", (10,))
    x = b.input("x", (1, 3, 32, 32))
    c1 = b.op("conv2d", "aten.conv2d.default", [x, "initial_conv.weight", "initial_conv.bias"],
              (1, 16, 32, 32), (("initial_conv", 0),))
    r1 = b.op("relu", "aten.relu.default", [c1], (1, 16, 32, 32))
    p1 = b.op("max_pool2d", "aten.max_pool2d.default", [r1], (1, 16, 16, 16), (("max_pool", 0),))
    c2 = b.op("conv2d_1", "aten.conv2d.default", [x, "parallel_conv.weight", "parallel_conv.bias"],
              (1, 16, 32, 32), (("parallel_conv", 0),))
    r2 = b.op("relu_1", "aten.relu.default", [c2], (1, 16, 32, 32))
    p2 = b.op("max_pool2d_1", "aten.max_pool2d.default", [r2], (1, 16, 16, 16), (("max_pool", 1),))
    add = b.op("add", "aten.add.Tensor", [p1, p2], (1, 16, 16, 16))
    div = b.op("div", "aten.div.Tensor", [add], (1, 16, 16, 16))
    c3 = b.op("conv2d_2", "aten.conv2d.default", [div, "secondary_conv.weight", "secondary_conv.bias"],
              (1, 32, 16, 16), (("secondary_conv", 0),))
    r3 = b.op("relu_2", "aten.relu.default", [c3], (1, 32, 16, 16))
    p3 = b.op("max_pool2d_2", "aten.max_pool2d.default", [r3], (1, 32, 8, 8), (("max_pool", 2),))
    v = b.op("view", "aten.view.default", [p3], (1, 2048))
    l1 = b.op("linear", "aten.linear.default", [v, "fully_connected1.weight", "fully_connected1.bias"],
              (1, 128), (("fully_connected1", 0),))
    r4 = b.op("relu_3", "aten.relu.default", [l1], (1, 128))
    l2 = b.op("linear_1", "aten.linear.default", [r4, "output_layer.weight", "output_layer.bias"],
              (1, 10), (("output_layer", 0),))
    b.output("output", l2)
    return b.build()


def stack_graph(layers: int = 3, width: int = 8) -> Graph:
    """``layers`` identical residual blocks in a ModuleList ``h``, each block: ln -> fc -> add."""
    mods = {"h": "ModuleList"}
    for i in range(layers):
        mods.update({f"h.{i}": "Block", f"h.{i}.ln": "LayerNorm", f"h.{i}.fc": "Linear"})
    b = GraphBuilder("Stack", mods)
    for i in range(layers):
        b.param(f"h.{i}.fc.weight", (width, width))
    x = b.input("x", (2, "s0", width))
    for i in range(layers):
        blk = (f"h.{i}", 0)
        ln = b.op(f"ln_{i}", "aten.layer_norm.default", [x], (2, "s0", width), (blk, (f"h.{i}.ln", 0)))
        fc = b.op(f"fc_{i}", "aten.linear.default", [ln, f"h.{i}.fc.weight"], (2, "s0", width),
                  (blk, (f"h.{i}.fc", 0)))
        x = b.op(f"add_{i}", "aten.add.Tensor", [x, fc], (2, "s0", width), (blk,))
    b.output("output", x)
    return b.build()


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
        elif kind == "call":  # a module call that ran no op: a stack, nothing in or out
            stack = draw(stacks().filter(bool))
            target = draw(st.sampled_from(("Dropout", "Identity")))
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
