"""Two FX passes of your own, for ``fxviz passes`` (the README's example, run from the repository
root):

    fxviz passes fxviz.examples:cnn --pass examples.my_passes:fuse_linear_relu \
        --pass examples.my_passes:swap_add_for_sub

``fuse_linear_relu`` fuses each ``relu(linear(x))`` into one custom op (the numbers stay the same);
``swap_add_for_sub`` is a deliberately wrong rewrite (``add`` becomes ``sub``), so that the table
shows where the numbers first diverge. A pass is a function on a ``GraphModule`` (changed in
place, or returned, or in a ``PassResult``); fxviz runs each on a copy of the exported program.
"""

from __future__ import annotations

import torch
import torch.fx
from torch.fx.passes.infra.pass_base import PassResult

aten = torch.ops.aten


@torch.library.custom_op("my_passes::linear_relu", mutates_args=())
def linear_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The fused op: ``relu(linear(x, weight, bias))`` in one call."""
    return torch.relu(torch.nn.functional.linear(x, weight, bias))


@linear_relu.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def fuse_linear_relu(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Replace every ``relu(linear(x, w, b))`` whose linear has no other user by
    ``my_passes::linear_relu``; the fused node keeps the relu's meta (its module path and line)."""
    graph = gm.graph
    for relu in list(graph.nodes):
        if relu.op != "call_function" or relu.target is not aten.relu.default:
            continue
        linear = relu.args[0]
        if not isinstance(linear, torch.fx.Node) or linear.target is not aten.linear.default or len(linear.users) != 1:
            continue
        with graph.inserting_after(relu):
            fused = graph.call_function(torch.ops.my_passes.linear_relu.default, tuple(linear.args))
        fused.meta = dict(relu.meta)
        relu.replace_all_uses_with(fused)
        graph.erase_node(relu)
        graph.erase_node(linear)
    graph.lint()
    gm.recompile()
    return gm


def swap_add_for_sub(gm: torch.fx.GraphModule) -> PassResult:
    """A wrong rewrite: every ``aten.add.Tensor`` becomes ``aten.sub.Tensor``."""
    modified = False
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is aten.add.Tensor:
            node.target = aten.sub.Tensor
            modified = True
    gm.recompile()
    return PassResult(gm, modified)
