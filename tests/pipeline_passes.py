"""Hand-written FX passes, of every kind ``fxviz.pipeline`` takes, for tests/test_pipeline.py.

Each is what a pass author writes: a function on a ``GraphModule`` (in place, or returning one), a
``PassBase``, a function returning ``PassResult``, a function on an ``ExportedProgram``, and a
``PassManager`` of three passes. None copies node meta on purpose where real passes do not, so
the pipeline has to infer those links.
"""

from __future__ import annotations

import torch
import torch.fx
from torch.export import ExportedProgram
from torch.fx.passes.infra.pass_base import PassBase, PassResult
from torch.fx.passes.infra.pass_manager import PassManager

aten = torch.ops.aten


@torch.library.custom_op("fxviz_test::linear_relu", mutates_args=())
def linear_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The fused op: ``relu(linear(x, weight, bias))`` in one call."""
    return torch.relu(torch.nn.functional.linear(x, weight, bias))


@linear_relu.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def fuse_linear_relu(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace every ``relu(linear(x, w, b))`` whose linear has no other user by the custom op
    ``fxviz_test::linear_relu``; returns the module (changed in place). The fused node gets the
    relu's meta (its value and module path), as a careful pass author does, but no ``from_node``."""
    graph = gm.graph
    for relu in list(graph.nodes):
        if relu.op != "call_function" or relu.target is not aten.relu.default:
            continue
        linear = relu.args[0]
        if not isinstance(linear, torch.fx.Node) or linear.target is not aten.linear.default or len(linear.users) != 1:
            continue
        with graph.inserting_after(relu):
            fused = graph.call_function(torch.ops.fxviz_test.linear_relu.default, tuple(linear.args))
        fused.meta = {k: v for k, v in relu.meta.items() if k != "from_node"}
        relu.replace_all_uses_with(fused)
        graph.erase_node(relu)
        graph.erase_node(linear)
    graph.lint()
    gm.recompile()
    return gm


def do_nothing(gm: torch.fx.GraphModule) -> None:
    """A pass that finds nothing to do (returns ``None``: the module is unchanged)."""
    for _ in gm.graph.nodes:
        pass


class Broken(Exception):
    """What :func:`raise_on_add` raises."""


def raise_on_add(gm: torch.fx.GraphModule) -> None:
    """A pass with a bug: it raises on the first ``add`` it sees."""
    for node in gm.graph.nodes:
        if node.target is aten.add.Tensor:
            raise Broken(f"cannot handle {node.name}")  # the frame a user must see


def swap_add_for_sub(gm: torch.fx.GraphModule) -> PassResult:
    """A wrong rewrite: every ``aten.add.Tensor`` becomes ``aten.sub.Tensor`` (the numbers change
    at that node). Keeps the node's meta, as a rewrite in place does."""
    modified = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is aten.add.Tensor:
            node.target = aten.sub.Tensor
            modified = True
    gm.recompile()
    return PassResult(gm, modified)


def divide_by_four(gm: torch.fx.GraphModule) -> None:
    """Edit a constant in place: ``x / 2`` becomes ``x / 4`` (same node, same op, other numbers)."""
    for node in gm.graph.nodes:
        if node.target is aten.div.Tensor and node.args[1] == 2:
            node.args = (node.args[0], 4)
    gm.recompile()


class DoubleRelu(PassBase):
    """A ``PassBase``: ``relu(x)`` -> ``relu(relu(x))``, which changes the graph, not the numbers."""

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        graph = graph_module.graph
        modified = False
        for node in list(graph.nodes):
            if node.op == "call_function" and node.target in (aten.relu.default, torch.ops.fxviz_test.linear_relu.default):
                with graph.inserting_after(node):
                    again = graph.call_function(aten.relu.default, (node,))
                node.replace_all_uses_with(again, delete_user_cb=lambda user, again=again: user is not again)
                modified = True
        graph_module.recompile()
        return PassResult(graph_module, modified)


def drop_double_relu(gm: torch.fx.GraphModule) -> PassResult:
    """Undo :class:`DoubleRelu`: ``relu(relu(x))`` -> ``relu(x)``."""
    modified = False
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is aten.relu.default:
            inner = node.args[0]
            if isinstance(inner, torch.fx.Node) and inner.target in (aten.relu.default, torch.ops.fxviz_test.linear_relu.default):
                node.replace_all_uses_with(inner)
                gm.graph.erase_node(node)
                modified = True
    gm.recompile()
    return PassResult(gm, modified)


def scale_by_one(gm: torch.fx.GraphModule) -> PassResult:
    """Multiply the first ``view`` by 1.0: a new node, the same numbers."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is aten.view.default:
            with gm.graph.inserting_after(node):
                one = gm.graph.call_function(aten.mul.Tensor, (node, 1.0))
            node.replace_all_uses_with(one, delete_user_cb=lambda user, one=one: user is not one)
            gm.recompile()
            return PassResult(gm, True)
    return PassResult(gm, False)


def three_passes() -> PassManager:
    """A ``PassManager`` of three passes; the pipeline shows each as a stage."""
    return PassManager([DoubleRelu(), drop_double_relu, scale_by_one])


def decompose_program(ep: ExportedProgram) -> ExportedProgram:
    """A pass on the whole program: core ATen through ``run_decompositions``."""
    return ep.run_decompositions()
