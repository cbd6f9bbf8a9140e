"""Series/parallel structure derived from data-flow edges."""

from __future__ import annotations

from fxviz.passes.structure import Block, Op, Parallel, Step, step_nodes, structure
from tests.irbuild import GraphBuilder, cnn_graph, stack_graph


def kinds(steps: list[Step]) -> list[str]:
    out = []
    for s in steps:
        if isinstance(s, Op):
            out.append(s.node)
        elif isinstance(s, Block):
            out.append(f"call:{s.path}")
        else:
            out.append("residual" if s.residual else f"parallel{len(s.branches)}")
    return out


def test_every_op_appears_once_in_execution_order() -> None:
    for g in (cnn_graph(), stack_graph(4)):
        root = structure(g)
        assert step_nodes(Parallel([root.steps])) == [n.name for n in g.ops]


def test_cnn_has_two_branches_joining_at_add() -> None:
    root = structure(cnn_graph())
    assert kinds(root.steps)[:3] == ["parallel2", "add", "div"]
    par = root.steps[0]
    assert isinstance(par, Parallel)
    assert [kinds(b) for b in par.branches] == [
        ["call:initial_conv", "relu", "call:max_pool"],
        ["call:parallel_conv", "relu_1", "call:max_pool"],
    ]
    assert [c.index for c in (par.branches[0][2], par.branches[1][2])] == [0, 1]  # type: ignore[union-attr]


def test_residual_blocks_are_a_chain_with_a_residual_branch_each() -> None:
    root = structure(stack_graph(3))
    assert kinds(root.steps) == ["call:h.0", "call:h.1", "call:h.2"]
    block = root.steps[1]
    assert isinstance(block, Block)
    assert kinds(block.steps) == ["residual", "add_1"]


def test_a_mask_read_inside_every_block_does_not_hide_the_chain() -> None:
    b = GraphBuilder("Masked", {"h.0": "Block", "h.1": "Block"})
    x = b.input("x", (1, 4))
    mask = b.op("mask", "aten.ones.default", [], (4, 4), dtype="bool")
    for i in range(2):
        blk = (f"h.{i}", 0)
        y = b.op(f"lin_{i}", "aten.linear.default", [x], (1, 4), (blk,))
        x = b.op(f"attn_{i}", "aten.masked_fill.Scalar", [y, mask], (1, 4), (blk,))
    b.output("out", x)
    root = structure(b.build())
    # the mask is made in parallel with nothing it depends on; the blocks stay a chain of cut points
    assert kinds(root.steps)[-2:] == ["call:h.0", "call:h.1"]


def test_q_k_v_fork_from_one_input() -> None:
    b = GraphBuilder("Attn", {"q": "Linear", "k": "Linear", "v": "Linear"})
    x = b.input("x", (1, 4))
    q, k, v = (b.op(n, "aten.linear.default", [x], (1, 4), ((n, 0),)) for n in "qkv")
    s = b.op("sdpa", "aten.scaled_dot_product_attention.default", [q, k, v], (1, 4))
    b.output("out", s)
    root = structure(b.build())
    assert kinds(root.steps) == ["parallel3", "sdpa"]


def test_siblings_in_execution_order_and_no_fold_across_another_sibling() -> None:
    """LLaMA's decoder layer declares self_attn before its norms, and export lists parameters
    first: the two RMSNorms must neither look consecutive nor fold into one run."""
    b = GraphBuilder("Layer", {"attn": "Attention", "norm1": "Norm", "norm2": "Norm"})
    for name in ("attn.w", "norm1.w", "norm2.w"):  # __init__ order, as export lists them
        b.param(name, (4,))
    x = b.input("x", (1, 4))
    n1 = b.op("n1", "aten.mul.Tensor", [x, "norm1.w"], (1, 4), (("norm1", 0),))
    a = b.op("a", "aten.mul.Tensor", [n1, "attn.w"], (1, 4), (("attn", 0),))
    n2 = b.op("n2", "aten.mul.Tensor", [a, "norm2.w"], (1, 4), (("norm2", 0),))
    b.output("out", n2)
    g = b.build()
    assert list(g.scopes.children) == ["norm1", "attn", "norm2"]
    assert g.annotations["fold"] == []
