"""Hand-built IR graphs for the renderer tests: no torch, so they pin what a renderer does with
the IR rather than what a torch release captures."""

from __future__ import annotations

from fxviz.ir import Attempt, Graph, ModuleInfo, Node, Ref, SourceLoc, TensorMeta
from fxviz.passes import run_passes

HOSTILE = "</script><img src=x onerror=alert(1)>"


def _t(*shape: int) -> tuple[TensorMeta, ...]:
    return (TensorMeta(shape, "float32"),)


def partial_graph() -> Graph:
    """Two blocks; the second block's ``item`` raised, so the graph stops there."""
    src = SourceLoc("/home/u/model.py", 12, "forward", "if x.sum().item() > 0:")
    nodes = [
        Node("x", "input", target="x", outputs=_t(2, 8)),
        Node("enc.fc.weight", "parameter", target="enc.fc.weight", stack=(("enc.fc", 0),), outputs=_t(8, 8)),
        Node("linear", "op", target="aten.linear.default", inputs=(Ref("x"), Ref("enc.fc.weight")),
             stack=(("enc", 0), ("enc.fc", 0)), outputs=_t(2, 8)),
        Node("relu", "op", target="aten.relu.default", inputs=(Ref("linear"),), stack=(("enc", 0),),
             outputs=_t(2, 8)),
        Node("sum", "op", target="aten.sum.default", inputs=(Ref("relu"),), stack=(("gate", 0),),
             outputs=(TensorMeta((), "float32"),), source=src),
        Node("item", "op", target="aten.item.default", inputs=(Ref("sum"),), stack=(("gate", 0),),
             outputs=(TensorMeta((), "float", value="u0"),), source=src,
             error="RuntimeError: data-dependent branch on a tensor value"),
    ]
    g = Graph(
        name="Gated", nodes=nodes, method="eager",
        attempts=[
            Attempt("export", False, 0.4, "GuardOnDataDependentSymNode", "Could not guard on u0", src),
            Attempt("fx", False, 0.1, "TraceError", "symbolically traced variables cannot be used as inputs to control flow"),
            Attempt("eager", True, 0.2),
        ],
        modules={"": ModuleInfo("Gated"), "enc": ModuleInfo("Encoder"), "enc.fc": ModuleInfo("Linear"),
                 "gate": ModuleInfo("Gate")},
        error="RuntimeError: data-dependent branch on a tensor value",
    )
    return run_passes(g, ("module_paths", "shapes", "stats", "fold"))


def hostile_graph() -> Graph:
    """Module, class and op names that are HTML and script payloads."""
    path = f"blk.{HOSTILE}"
    nodes = [
        Node(HOSTILE, "input", target=HOSTILE, outputs=_t(1, 4)),
        Node("op<b>1</b>", "op", target=f"custom.{HOSTILE}", inputs=(Ref(HOSTILE),),
             stack=(("blk", 0), (path, 0)), outputs=_t(1, 4), attrs={"note": HOSTILE},
             source=SourceLoc("/x/<script>.py", 3, "forward", HOSTILE)),
        Node("output", "output", inputs=(Ref("op<b>1</b>"),)),
    ]
    g = Graph(name=f"Evil{HOSTILE}", nodes=nodes, method="export", attempts=[Attempt("export", True, 0.1)],
              modules={"": ModuleInfo("Evil"), "blk": ModuleInfo("Block\"'&"), path: ModuleInfo(HOSTILE)})
    return run_passes(g, ("module_paths", "shapes", "stats", "fold"))
