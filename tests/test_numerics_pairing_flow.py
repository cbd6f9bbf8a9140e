"""Pairs of eager and compiled (or exported) ops that the data flow contradicts are not compared.

A Gemma2 builds its full and sliding-window masks through ``and_masks(causal, padding)`` under
Dynamo and export but with a shortcut eagerly, so the line ``result & mask(...)`` runs more often on
the other side and order paired the full mask's ``&`` with eager's sliding one: ``compile:aot_eager``
named the sliding mask (10 of 64 booleans) the first divergence and ``export`` its ``.to(device)``
(28 of 64), where torch's own runs of the model give the same logits as eager. The key's and the
value's ``repeat_kv`` (one line) were swapped too. Checked against torch's record of the same
model: the logits of ``torch.compile(backend="aot_eager")`` and of the ExportedProgram against eager.
"""

from __future__ import annotations

import torch

from fxviz.analyze.numerics import numerics
from fxviz.analyze.numerics.pairing import Reads, consistent
from tests import numerics_models as nm


def _torch_agrees(side: str) -> None:
    """torch's own run of the model the other way gives eager's logits (so nothing diverges)."""
    model, args, kwargs = nm.gemma2()
    with torch.no_grad():
        eager = model(*args, **kwargs).logits
        if side == "export":
            other = torch.export.export(model, args, kwargs).module()(*args, **kwargs).logits
        else:
            torch._dynamo.reset()
            other = torch.compile(model, backend="aot_eager")(*args, **kwargs).logits
            torch._dynamo.reset()
    torch.testing.assert_close(other, eager, rtol=1.3e-6, atol=1e-5)


def test_gemma2_masks_are_no_divergence_against_export() -> None:
    _torch_agrees("export")
    model, args, kwargs = nm.gemma2()
    firsts = set()
    for _ in range(2):  # the same answer each time
        r = numerics(model, args, kwargs, against="export")
        beyond = [n for n, e in r.nodes.items() if e.comparable and e.exceeds]
        assert beyond == [], [(n, r.nodes[n].text()) for n in beyond]
        firsts.add(r.first)
    assert firsts == {None}


def test_gemma2_masks_are_no_divergence_against_aot_eager() -> None:
    _torch_agrees("aot_eager")
    model, args, kwargs = nm.gemma2()
    r = numerics(model, args, kwargs, against="compile:aot_eager")
    beyond = [n for n, e in r.nodes.items() if e.comparable and e.exceeds]
    assert beyond == [], [(n, r.nodes[n].text()) for n in beyond]
    assert r.first is None
    # the layers' ops are still compared op by op: the check drops only what it contradicts
    compared = {n for n, e in r.nodes.items() if e.comparable}
    assert len(compared) > 215, len(compared)
    # both masks' expand and where too: compiled-only ``&`` between the causal ``le`` and the full
    # mask's expand does not make the pair a contradiction (they are ops eager never ran)
    assert {"expand", "where", "expand_1", "where_1"} <= compared, sorted(compared)


def test_a_pair_reading_a_value_paired_with_what_its_eager_op_does_not_read_is_dropped() -> None:
    # eager: 0 ones, 1 to(gt), 2 and=&(0,1), 3 to(le), 4 and_1=&(2,3)
    eager = Reads([[], [], [0, 1], [], [2, 3]], [frozenset()] * 5)
    # other: 0 ones (paired with eager 0), 1 to(le) (with 3), 2 &(0,1) (order: with and_1)
    other = Reads([[], [], [0, 1]], [frozenset()] * 3)
    kept = consistent({0: 0, 1: 3, 2: 4}, eager, other, ambiguous={2, 4})
    assert kept == {0: 0, 1: 3}  # and_1 reads ``and``, not ``ones``: not its pair
    # the same reads through a view on either side agree
    viewed = Reads([[], [], [0, 1], [], [2, 3]], [frozenset()] * 5)
    through = Reads([[], [], [1, 0], []], [frozenset()] * 4, [False, False, False, False])
    assert consistent({0: 2, 1: 3, 2: 4}, viewed, through, ambiguous={4}) == {0: 2, 1: 3, 2: 4}


def test_ops_only_the_other_side_ran_do_not_contradict_a_pair() -> None:
    # eager: 0 le, 1 expand(le); compiled: 0 le, 1 ones, 2 &(ones, le), 3 expand(&) (and_masks)
    eager = Reads([[], [0]], [frozenset()] * 2)
    other = Reads([[], [], [1, 0], [2]], [frozenset()] * 4)
    assert consistent({0: 0, 3: 1}, eager, other, ambiguous={1}) == {0: 0, 3: 1}
