"""Dynamo records Python operators as the ``operator`` module's functions (``operator.invert`` for
``~mask``, ``operator.ixor`` for ``x ^= y``), the eager tracer as the tensor's dunders
(``Tensor.__invert__``): :func:`fxviz.ops.op_name` must give both one name, or the compile map and
``fxviz numerics`` never pair them (``~mask`` was ``invert`` against ``bitwise_not``: each side's op
unpaired). Checked against Python's own table (``operator.__X__ is operator.X``) and against
Dynamo's graph of the same run."""

from __future__ import annotations

import operator

import pytest

torch = pytest.importorskip("torch")

import fxviz  # noqa: E402
from fxviz.ops import op_name  # noqa: E402


def _spellings() -> list[tuple[str, str]]:
    """(operator module name, a dunder of it) for every operator Python's ``operator`` module also
    names as a dunder that ``torch.Tensor`` implements: ``operator.and_`` is ``operator.__and__``,
    ``operator.__inv__`` is ``operator.inv``."""
    dunders = [d for d in dir(operator) if d.startswith("__") and d.endswith("__") and hasattr(torch.Tensor, d)]
    return [(name, d) for name in dir(operator) if not name.startswith("_")
            for d in dunders if getattr(operator, d) is getattr(operator, name)]


def test_every_operator_the_tensor_implements_has_one_name_in_both_spellings() -> None:
    pairs = _spellings()
    assert {"invert", "ixor", "imod", "ipow", "lshift", "and_", "iadd", "matmul"} <= {n for n, _ in pairs}
    wrong = [(n, op_name(f"operator.{n}"), op_name(f"Tensor.{d}")) for n, d in pairs
             if op_name(f"operator.{n}") != op_name(f"Tensor.{d}")]
    assert wrong == []
    # operator.inv is another builtin computing ~x (no dunder of the tensor's names it)
    t = torch.tensor([True, False])
    assert torch.equal(operator.inv(t), operator.invert(t)) and op_name("operator.inv") == op_name("operator.invert")
    # the ATen op each dispatches to has the same name (the export path's and the ATen tracer's)
    assert op_name("aten.bitwise_not.default") == op_name("operator.invert") == "bitwise_not"
    assert op_name("aten.remainder.Scalar") == op_name("operator.mod") == "remainder"
    assert op_name("aten.__lshift__.Scalar") == op_name("torch.bitwise_left_shift") == op_name("operator.lshift")


class Masks(torch.nn.Module):
    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        keep = ~(x > 0)
        ids = ids % 3
        ids ^= 1
        ids = ids << 1
        return torch.where(keep, x, 0.0) * ids


def test_the_compile_map_pairs_dynamos_operator_nodes_with_the_eager_dunders() -> None:
    gms: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        gms.append(gm)
        return gm.forward

    torch.manual_seed(0)
    cm = fxviz.compile_map(Masks(), (torch.randn(4, 5), torch.arange(20).reshape(4, 5)), backend=keep)
    (g,), (gm,) = cm.graphs, gms
    theirs = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert {operator.invert, operator.mod, operator.ixor, operator.lshift} <= set(theirs)
    assert g.torch_op_count == len(theirs)
    # every Dynamo op is an eager op, and every eager op ran inside the graph
    assert g.no_eager_op == [] and g.eager_ops == len(theirs) == cm.compiled_ops
    assert all(cm.assigned[n.name] == g.id for n in cm.graph.ops)
