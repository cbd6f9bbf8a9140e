"""``--per-kernel``'s own errors without Inductor: :class:`Shadows` rebuilding what a kernel reads on
eager's values (views, reused buffers, ``in_out_ptr``, buffers eager has no value for), and what
:class:`KernelCheck` s say from their two errors (own, inherited, not measured), checked against the
tensors and errors computed here with torch."""

from __future__ import annotations

import json

import torch

from fxviz.analyze.numerics.error import Error
from fxviz.analyze.numerics.isolate import Shadows, isolate
from fxviz.analyze.numerics.kernelcode import Written
from fxviz.analyze.numerics.kernelresult import (
    BufferCheck,
    KernelCheck,
    first_beyond,
    kernel_note,
    kernel_panel,
)
from fxviz.ir import Graph


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_a_read_view_of_a_written_buffer_holds_eagers_value_in_a_copy() -> None:
    x = torch.randn(8)
    shadows = Shadows([x])
    buf = torch.empty(16)
    compiled = buf[4:12]
    compiled.copy_(x * 2 + 1e-3)  # what the compiled kernel wrote
    eager = x * 2
    shadows.wrote(compiled, eager, "buf0 holds no eager value")
    view = buf.as_strided((2, 4), (4, 1), 4)  # reinterpret_tensor(buf0, (2, 4), (4, 1), 4)
    got = isolate(shadows, "cpp_fused_mul_1", "cpp", ["buf0", "arg0_1", "buf1"], (view, x, torch.empty(8)), {},
                  Written((2,), ()), draws=False)
    assert got.why == ""
    a, b, out = got.args
    assert torch.equal(a, eager.reshape(2, 4)) and _storage(a) != _storage(buf)
    assert (a.stride(), a.storage_offset()) == ((4, 1), 4)
    assert b is x  # an input of the call no kernel wrote is eager's value already: read in place
    assert _storage(out) != _storage(got.args[0]) and out.shape == (8,)
    assert torch.equal(compiled, x * 2 + 1e-3)  # the compiled run's buffer is untouched


def test_an_in_out_pointer_reads_eagers_value_of_the_buffer_it_reuses() -> None:
    shadows = Shadows([])
    buf = torch.full((4,), 7.0)  # the extern mm's out=, reused by the pointwise kernel in place
    shadows.wrote(buf, torch.arange(4.0), "buf5 holds no eager value")
    fresh = torch.empty(4)  # an in_out_ptr that nothing wrote: the kernel fills it before it reads it
    got = isolate(shadows, "cpp_fused_add_1", "cpp", ["buf6", "buf9"], (buf, fresh), {}, Written((0, 1), (0, 1)),
                  draws=False)
    assert got.why == "" and torch.equal(got.args[0], torch.arange(4.0)) and _storage(got.args[0]) != _storage(buf)


def test_a_buffer_handed_to_read_and_to_write_stays_one_buffer() -> None:
    """A mutated input (``self.count.add_(...)``) is passed as ``in_ptr0`` and ``out_ptr3`` of one C++
    kernel: the second run must see its own write where it reads, as the compiled run does."""
    count = torch.zeros(4)
    shadows = Shadows([count])
    got = isolate(shadows, "cpp_fused_add_copy__0", "cpp", ["arg0_1", "buf1", "arg0_1"],
                  (count, torch.empty(4), count), {}, Written((1, 2), ()), draws=False)
    read, _, write = got.args
    assert got.why == "" and _storage(read) == _storage(write) != _storage(count)
    write.add_(1)
    assert torch.equal(read, torch.ones(4)) and torch.equal(count, torch.zeros(4))


def test_a_cat_written_through_aliases_and_read_whole_is_the_kernels_own() -> None:
    """``buf2 = reinterpret_tensor(buf5, ...)`` written as ``out_ptr0`` and ``buf5`` read as
    ``in_ptr0`` by the same kernel: nothing wrote it before, the kernel fills it itself."""
    shadows = Shadows([])
    buf5 = torch.empty(4, 24)
    buf2 = buf5[:, :8]
    got = isolate(shadows, "cpp_fused_cat_softmax_0", "cpp", ["buf5", "buf2"], (buf5, buf2), {}, Written((1,), ()),
                  draws=False)
    assert got.why == "" and _storage(got.args[0]) == _storage(got.args[1]) != _storage(buf5)


def test_a_buffer_eager_has_no_value_for_is_named_not_guessed() -> None:
    x = torch.randn(4)
    shadows = Shadows([x])
    stats = torch.empty(4)
    shadows.wrote(stats, None, "buf1 holds no eager value (an intermediate of layer_norm)")
    got = isolate(shadows, "cpp_fused_1", "cpp", ["buf1", "arg0_1", "buf2"], (stats, x, torch.empty(4)), {},
                  Written((2,), ()), draws=False)
    assert got.why == "buf1 holds no eager value (an intermediate of layer_norm)"
    stray = torch.ones(4)  # neither an input of the call nor written by a watched kernel
    got = isolate(shadows, "extern_kernels.mm", "extern", ["buf7"], (stray,), {"out": torch.empty(4)}, None, draws=False)
    assert got.why == "buf7 was written by no kernel fxviz watched"
    # a later write over the whole buffer replaces the one eager had no value for
    shadows.wrote(stats, torch.zeros(4), "")
    got = isolate(shadows, "cpp_fused_1", "cpp", ["buf1"], (stats,), {}, Written((), ()), draws=False)
    assert got.why == "" and torch.equal(got.args[0], torch.zeros(4))
    assert "random" in isolate(shadows, "cpp_fused_rand_0", "cpp", [], (), {}, None, draws=True).why
    assert "collective" in isolate(shadows, "torch.ops._c10d_functional.all_reduce_.default", "other", [], (x,), {},
                                   None, draws=False).why


def test_a_partial_result_is_taken_from_its_kernels_run_on_eager_inputs_and_named() -> None:
    x = torch.randn(4)
    shadows = Shadows([x])
    stats = torch.full((4,), 9.0)  # a layer norm's statistics one kernel writes and the next reads
    on_eager = torch.arange(4.0)  # what that kernel wrote there when it ran on eager's inputs
    shadows.wrote(stats, None, "buf2 holds no eager value (a partial)", derived=on_eager, by="cpp_fused_0:1")
    got = isolate(shadows, "cpp_fused_1", "cpp", ["buf2", "arg0_1", "buf3"], (stats, x, torch.empty(4)), {},
                  Written((2,), ()), draws=False)
    assert got.why == "" and torch.equal(got.args[0], on_eager)
    assert got.borrowed == ["buf2 as cpp_fused_0:1 wrote it on eager's inputs"]
    k = _kernel("cpp_fused_1:2", (0.3, True), (1e-7, False), "; ".join(got.borrowed))
    assert k.origin == "inherited" and "reads buf2 as cpp_fused_0:1 wrote it on eager's inputs" in k.text()


def test_a_fallback_op_gets_copies_of_the_calls_inputs_too() -> None:
    x = torch.randn(4)
    shadows = Shadows([x])
    got = isolate(shadows, "torch.ops.aten.index_put_.default", "other", ["arg0_1"], (x,), {}, None, draws=False)
    assert got.why == "" and torch.equal(got.args[0], x) and _storage(got.args[0]) != _storage(x)
    # so does a generated kernel whose written arguments could not be read (it may write the input)
    got = isolate(shadows, "cpp_fused_0", "cpp", ["arg0_1"], (x,), {}, None, draws=False)
    assert got.why == "" and torch.equal(got.args[0], x) and _storage(got.args[0]) != _storage(x)


def _err(max_rel: float, exceeds: bool) -> Error:
    return Error(max_abs=max_rel, max_rel=max_rel, rel_rms=max_rel, snr_db=-20.0, exceeds=exceeds)


def _kernel(handle: str, error: tuple[float, bool], own: tuple[float, bool] | None, note: str = "") -> KernelCheck:
    return KernelCheck(handle, 0, "cpp", module="m", observed=True, own_note=note,
                       buffers=[BufferCheck("buf0", "n", "n", _err(*error), None if own is None else _err(*own))])


def test_the_cause_is_the_first_kernel_whose_own_error_is_beyond_tolerance() -> None:
    ks = [_kernel("a:1", (1e-7, False), (1e-7, False)),
          _kernel("b:2", (0.2, True), None, "buf3 holds no eager value (a partial)"),
          _kernel("c:3", (0.3, True), (0.1, True)),
          _kernel("d:4", (0.3, True), (1e-7, False))]
    assert [k.origin for k in ks] == ["", "unmeasured", "own", "inherited"]
    assert first_beyond(ks) is ks[2]  # not b: its own error is not known
    assert first_beyond(ks[:2] + ks[3:]) is ks[1]  # no kernel's own error beyond: the first unmeasured one
    assert first_beyond([ks[0], ks[3]]) is None
    assert "none by its own error" in kernel_note([ks[0], ks[3]])
    note = kernel_note(ks)
    assert "the first kernel with its own error beyond tolerance is c:3" in note and "1 kernel(s) beyond tolerance only by" in note
    assert "inherited" in ks[3].text() and "buf3 holds no eager value" in ks[1].text()
    assert "2 kernel(s) in all with their own error" in kernel_note([*ks, _kernel("e:5", (0.3, True), (0.2, True))])
    assert "in all" not in note
    back = [KernelCheck.from_dict(json.loads(json.dumps(k.to_dict()))) for k in ks]
    assert [k.origin for k in back] == [k.origin for k in ks] and back[1].own_note == ks[1].own_note
    assert [k.to_dict()["own_within"] for k in ks] == [True, None, False, True]
    g = Graph(name="m")
    kernel_panel(g, ks)
    panel = g.annotations["panels"]["kernels"]
    assert [r["cells"][4] for r in panel["rows"]] == [
        "within", "beyond tolerance, own error not measured: buf3 holds no eager value (a partial)", "own", "inherited"]
    assert [r.get("level") for r in panel["rows"]] == [None, "warn", "error", "warn"]
    assert panel["page"] == 3 + 5
    assert panel["note"].startswith("3 kernel(s) beyond tolerance in the compiled run, 1 of them only by what they inherit")
