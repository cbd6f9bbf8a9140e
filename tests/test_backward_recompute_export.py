"""Recomputation on the export path: a checkpointed model's joint graph (strict export, AOT
Autograd's ``recompute`` / ``ac_graph_id`` tags) shows the same recompute nodes and saved bytes as the
eager path. Oracles: torch's own records of real steps of the same model (the ATen ops a
TorchDispatchMode sees run again in the backward, ``saved_tensors_hooks`` totals with and without
checkpoint, the outputs a selective policy told torch to cache) and the tags torch put in the joint
graph."""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import fxviz
from fxviz.errors import CaptureError
from fxviz.passes.overlays import overlays
from tests.backward_models import torch_step
from tests.statecheck import kept
from tests.test_backward_recompute import Net, Selective, _backward_aten, policy_cache_bytes


class Attention(nn.Module):
    """A pre-norm transformer block's attention and MLP, on [batch, seq, dim]."""

    def __init__(self, dim: int = 8, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm(x)).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        h = x + self.proj(a)
        return h + self.down(F.gelu(self.up(h)))


class Decoder(nn.Module):
    def __init__(self, ckpt: bool) -> None:
        super().__init__()
        self.ckpt = ckpt
        self.embed = nn.Linear(4, 8)
        self.block = Attention()
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.embed(x))
        h = checkpoint(self.block, h, use_reentrant=False) if self.ckpt else self.block(h)
        return self.head(h)


def _models(name: str) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    if name == "mlp":
        model, plain, x = Net(True), Net(False), torch.randn(4, 8)
    else:
        model, plain, x = Decoder(True), Decoder(False), torch.randn(2, 5, 4)
    plain.load_state_dict(model.state_dict())
    return model, plain, x


def _again(model: nn.Module, plain: nn.Module, x: torch.Tensor, early_stop: bool = False) -> Counter[str]:
    """torch's record: the ATen ops the checkpointed model's backward runs beyond the plain one's
    (checkpoint's own detaches aside); the whole region by default, as the export path shows it."""
    with torch.utils.checkpoint.set_checkpoint_early_stop(early_stop):
        again = Counter(_backward_aten(model, x)) - Counter(_backward_aten(plain, x))
    del again["aten.detach"]
    return again


def _recomputed(g: fxviz.Graph) -> dict[str, Counter[str]]:
    """module -> the ATen ops its recompute nodes ran."""
    out: dict[str, Counter[str]] = {}
    for n in g.nodes:
        if n.phase == "recompute":
            out.setdefault(n.module, Counter()).update(a for a in n.attrs["aten"] if a != "aten.detach")
    return out


def _joint_tags(model: nn.Module, x: torch.Tensor) -> Counter[tuple[str, str, str]]:
    """The tags torch puts on the joint graph of a strictly exported step: (module, op, policy)."""
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    from fxviz.symbolic.checkpoint import plain_checkpoints_as_selective
    from fxviz.symbolic.joint import LossModel
    from fxviz.torchbridge.normalize import flatten_inputs

    flat = flatten_inputs(model, (x,), {})
    with plain_checkpoints_as_selective():
        ep = torch.export.export(LossModel(model, flat, None), flat.tensors, strict=True)
    out: Counter[tuple[str, str, str]] = Counter()
    with contextlib.ExitStack() as stack:
        gm = aot_export_joint_with_descriptors(stack, ep.module(), flat.tensors, _record_nn_module_stack=True).graph_module
        for n in gm.graph.nodes:
            if n.meta.get("recompute") is not None and n.meta.get("partitioner_tag") == "is_forward" and \
                    isinstance(n.target, torch._ops.OpOverload):
                path = list(n.meta["nn_module_stack"].values())[-1][0].split("model.", 1)[-1]
                out[(path, str(n.target.overloadpacket), n.meta["recompute"].name.lower())] += 1
    return out


def _check_order(g: fxviz.Graph) -> None:
    order = {n.name: i for i, n in enumerate(g.nodes)}
    for n in g.nodes:
        for r in n.inputs:
            assert order[r.node] < order[n.name], (n.name, r.node)


@pytest.mark.parametrize("name", ["mlp", "decoder"])
def test_export_shows_the_recomputation_eager_shows(name: str) -> None:
    model, plain, x = _models(name)
    with kept(model, (x,)):
        gx = fxviz.capture(model, (x,), backward=True, method="export")
    ge = fxviz.capture(model, (x,), backward=True, method="eager")
    with torch.utils.checkpoint.set_checkpoint_early_stop(False):
        whole = fxviz.capture(model, (x,), backward=True, method="eager")
    assert gx.method == "export (joint)" and any("torch.utils.checkpoint: 1 region" in n for n in gx.notes)
    # the ops that run again, per module: torch's real backward with the region recomputed whole, the
    # eager path run so and the export path agree; the eager path's default step stops early, as torch's
    again = _again(model, plain, x)
    ops = _recomputed(gx)
    assert sum(ops.values(), Counter()) == again
    assert ops == _recomputed(whole)
    assert sum(_recomputed(ge).values(), Counter()) == _again(model, plain, x, early_stop=True) != again
    # each recompute node is a forward op torch tagged PREFER_RECOMPUTE, in that op's module
    tags = _joint_tags(model, x)
    assert {p for _, _, p in tags} == {"prefer_recompute"}
    by_name = {n.name: n for n in gx.nodes}
    rec = [n for n in gx.nodes if n.phase == "recompute"]
    assert Counter((n.module, n.attrs["aten"][0], "prefer_recompute") for n in rec) == tags
    for n in rec:
        fwd = by_name[n.attrs["recomputes"]]
        assert fwd.phase == "forward" and fwd.target == n.target and fwd.stack == n.stack
        assert fwd.attrs["policy"] == "prefer_recompute" and fwd.attrs["checkpoint"] == n.attrs["checkpoint"] == 0
    # the backward reads the recomputation, never a recomputed forward value
    recomputed = {n.attrs["recomputes"] for n in rec}
    assert not [(n.name, r.node) for n in gx.nodes if n.phase == "backward" for r in n.inputs if r.node in recomputed]
    assert any(r.node in {n.name for n in rec} for b in gx.nodes if b.phase == "backward" for r in b.inputs)
    _check_order(gx)
    # bytes: what autograd keeps with checkpoint (saved_tensors_hooks), both paths; checkpointing spared
    # what the plain step keeps more, per module as the eager path says
    with_ckpt, without = torch_step(model, (x,))[0], torch_step(plain, (x,))[0]
    assert sum(s.bytes for s in gx.saved) == sum(s.bytes for s in ge.saved) == with_ckpt
    assert sum(by_name[n.attrs["recomputes"]].attrs["would_save"] for n in rec) == without - with_ckpt > 0
    assert sum(n.attrs.get("would_save", 0) for n in ge.nodes if n.phase == "forward") == without - with_ckpt
    assert overlays(gx)["checkpoint_saved"]["modules"] == overlays(ge)["checkpoint_saved"]["modules"]
    # and the plain step's records are torch's too (split's q, k, v share one storage)
    gp = fxviz.capture(plain, (x,), backward=True, method="export")
    assert sum(s.bytes for s in gp.saved) == without
    # the JSON keeps it, saved records and all
    back = fxviz.Graph.from_json(gx.to_json())
    assert [(n.name, n.inputs, n.attrs) for n in back.nodes if n.phase == "recompute"] == \
        [(n.name, n.inputs, n.attrs) for n in rec]
    assert sum(s.bytes for s in back.saved) == with_ckpt


def test_no_checkpoint_is_the_plain_export() -> None:
    model, plain, x = _models("mlp")
    g = fxviz.capture(plain, (x,), backward=True, method="export")
    assert not [n for n in g.nodes if n.phase == "recompute" or "checkpoint" in n.attrs] and not g.notes
    assert sum(s.bytes for s in g.saved) == torch_step(plain, (x,))[0]


def test_a_selective_policy_saves_its_ops_on_the_export_path() -> None:
    torch.manual_seed(0)
    model, x = Selective(True), torch.randn(4, 8)
    plain = Net(False)
    plain.load_state_dict(model.state_dict())
    with kept(model, (x,)):
        gx = fxviz.capture(model, (x,), backward=True, method="export")
    ge = fxviz.capture(model, (x,), backward=True, method="eager")
    # what runs again is what torch's backward runs again: no addmm, the policy saved both
    again = _again(model, plain, x)
    assert again == Counter({"aten.t": 2, "aten.gelu": 1})
    assert sum(_recomputed(gx).values(), Counter()) == again == sum(_recomputed(ge).values(), Counter())
    tags = _joint_tags(model, x)
    assert tags[("blk.up", "aten.addmm", "must_save")] == tags[("blk.down", "aten.addmm", "must_save")] == 1
    addmms = [n for n in gx.nodes if n.target == "aten.addmm.default" and n.module.startswith("blk")]
    assert [(n.phase, n.attrs["policy"]) for n in addmms] == [("forward", "must_save")] * 2
    assert not [n for n in gx.nodes if n.phase == "recompute" and n.target == "aten.addmm.default"]
    gelu = next(n for n in gx.nodes if n.name == "gelu (recompute)")
    assert [r.node for r in gelu.inputs] == ["addmm"]  # the saved addmm, not a recomputation
    # the policy's outputs are saved records of their ops; the bytes are what autograd saves plus
    # what torch's selective checkpoint cached (its policy's own calls, in a real step)
    saved = {(s.node, s.value): s.bytes for s in gx.saved}
    assert saved[("addmm", "addmm")] == 4 * 32 * 4 and saved[("addmm_1", "addmm_1")] == 4 * 8 * 4
    hooks, cached = torch_step(model, (x,))[0], policy_cache_bytes(model, x)
    assert cached == 640
    assert sum(s.bytes for s in gx.saved) == sum(s.bytes for s in ge.saved) == hooks + cached
    # the eager path's records of the policy's cache: the forward ops whose addmm it kept
    assert [(s.node, s.module, s.bytes) for s in ge.saved if s.value == s.node and s.module.startswith("blk")] == [
        ("linear", "blk.up", 512), ("linear_1", "blk.down", 128)]
    _check_order(gx)


class _Opaque(Net):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(checkpoint(_untraceable, self.blk, x, use_reentrant=False)))


@torch._dynamo.disable  # type: ignore[misc]
def _not_for_dynamo(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _untraceable(blk: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return blk(_not_for_dynamo(x))


def test_a_checkpoint_strict_export_cannot_trace_is_one_line_and_auto_goes_eager() -> None:
    torch.manual_seed(0)
    model, x = _Opaque(True), torch.randn(4, 8)
    with pytest.raises(CaptureError) as err:
        fxviz.capture(model, (x,), backward=True, method="export")
    msg = str(err.value)
    assert "\n" not in msg and "torch.utils.checkpoint" in msg and "method='eager'" in msg
    g = fxviz.capture(model, (x,), backward=True)
    assert g.method.startswith("eager") and [n.module for n in g.nodes if n.phase == "recompute"] == \
        ["", "blk.up", "blk.act", "blk.down"]  # the x * 2 too


class _Reentrant(Net):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(checkpoint(self.blk, x, use_reentrant=True)))


def test_a_reentrant_checkpoint_is_not_traced_as_another() -> None:
    """Dynamo traces use_reentrant=True as False: with an input that does not require grad the eager
    region gives its parameters no gradient, the traced one would. Export says so; auto runs it eagerly."""
    torch.manual_seed(0)
    model, x = _Reentrant(True), torch.randn(4, 8)
    with pytest.raises(CaptureError, match="use_reentrant=True") as err:
        fxviz.capture(model, (x,), backward=True, method="export")
    assert "\n" not in str(err.value)
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad"):
        g = fxviz.capture(model, (x,), backward=True)
        model(x).sum().backward()  # torch's record: which parameters get a gradient
    assert g.method.startswith("eager")
    assert {n.attrs["grad_of"] for n in g.outputs if n.phase == "backward"} == \
        {name for name, p in model.named_parameters() if p.grad is not None} == {"head.weight", "head.bias"}


class _TwoRegions(nn.Module):
    def __init__(self, ckpt: bool) -> None:
        super().__init__()
        from tests.backward_models import Block

        self.ckpt, self.a, self.b = ckpt, Block(), Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.ckpt:
            return self.b(self.a(x))
        return checkpoint(self.b, checkpoint(self.a, x, use_reentrant=False), use_reentrant=False)


def test_a_region_keeps_its_input_made_by_another_region() -> None:
    """The second checkpoint saves its input, the first's output, as it is: not a recomputation."""
    torch.manual_seed(0)
    model, x = _TwoRegions(True), torch.randn(4, 8)
    plain = _TwoRegions(False)
    plain.load_state_dict(model.state_dict())
    gx = fxviz.capture(model, (x,), backward=True, method="export")
    ge = fxviz.capture(model, (x,), backward=True, method="eager")
    with_ckpt, without = torch_step(model, (x,))[0], torch_step(plain, (x,))[0]
    assert sum(s.bytes for s in gx.saved) == sum(s.bytes for s in ge.saved) == with_ckpt == 128
    assert sum(_recomputed(gx).values(), Counter()) == _again(model, plain, x)
    rec = {n.name: n for n in gx.nodes if n.phase == "recompute"}
    assert {n.attrs["checkpoint"] for n in rec.values()} == {0, 1}
    second = [n for n in rec.values() if n.module == "b.lin" and n.attrs["aten"] == ["aten.addmm"]]
    assert [r.node for r in second[0].inputs if r.node in rec] == ["t_1 (recompute)"]  # not a's recomputed tanh
    assert sum(n.attrs.get("would_save", 0) for n in gx.nodes if n.phase == "forward") == without - with_ckpt
    _check_order(gx)


class _Frozen(Net):
    def __init__(self) -> None:
        super().__init__(True)
        self.blk.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            h = checkpoint(self.blk, x, use_reentrant=False)
        return self.head(torch.tanh(h))


def test_a_checkpoint_with_nothing_to_recompute_says_so() -> None:
    """Under no_grad a checkpoint keeps nothing (torch still tags its ops): no recompute node, and the graph says why."""
    torch.manual_seed(0)
    model, x = _Frozen(), torch.randn(4, 8)
    g = fxviz.capture(model, (x,), backward=True, method="export")
    assert not [n for n in g.nodes if n.phase == "recompute"]
    assert any(n.startswith("torch.utils.checkpoint ran 1 time(s), but the backward differentiates no op") for n in g.notes)
    assert sum(s.bytes for s in g.saved) == torch_step(model, (x,))[0]


def test_strict_export_of_a_plain_checkpoint_is_its_regions() -> None:
    """torch 2.13's strict export fails on a checkpoint given no context_fn (KeyError
    '_checkpoint_context_fn'); fxviz gives it the policy torch runs it with, forward-only too."""
    from tests import capture_models as cm

    model, args, _ = cm.checkpoint_plain()
    with pytest.raises(RuntimeError, match="_checkpoint_context_fn"):
        torch.export.export(model, args, strict=True)
    g = fxviz.capture(model, args, method="export-strict")
    assert g.method == "export-strict"
    for path in ("blocks.0.0", "blocks.0.1", "blocks.1.0", "blocks.1.1"):
        ops = [n for n in g.ops if n.module == path]
        assert ops and all("checkpoint" in [r[2] for r in n.attrs.get("region", [])] for n in ops)


def test_strict_export_needs_no_private_name_torch_2_11_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.11 has no ``_always_prefer_recompute`` (2.13 names the policy it runs a plain
    checkpoint with): every strict export failed there with ImportError (the GPU machine's torch, 65
    tests). Without the name, a plain model and a checkpointed one export strictly, the same regions."""
    import torch._higher_order_ops.wrap as wrap

    from tests import capture_models as cm

    model, args, _ = cm.checkpoint_plain()
    want = fxviz.capture(model, args, method="export-strict")
    monkeypatch.delattr(wrap, "_always_prefer_recompute")
    got = fxviz.capture(model, args, method="export-strict")
    assert got.method == "export-strict"
    assert [(n.module, n.attrs.get("region")) for n in got.ops] == [(n.module, n.attrs.get("region")) for n in want.ops]
    plain = fxviz.capture(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),), method="export-strict")
    assert [n.target for n in plain.ops] == ["aten.linear.default", "aten.relu.default"]


class TwoCalls(nn.Module):
    """Two checkpoint calls from two lines; ``c`` runs on the line of the second call, outside it."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = checkpoint(lambda t: torch.tanh(self.a(t)), x, use_reentrant=False)
        return self.c(checkpoint(lambda t: torch.tanh(self.b(t)), h, use_reentrant=False))


def _boxes(text: str) -> list[list[str]]:
    """Each ``◇ checkpoint`` box of a rendered tree: its line and the lines drawn under it."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if "◇ checkpoint" in line:
            col = line.index("◇")
            indent = line[:col - 4] + ("│   " if line[col - 4] == "├" else "    ")
            body = []
            for x in lines[i + 1:]:
                if not x.startswith(indent):
                    break
                body.append(x)
            out.append([line, *body])
    return out


def test_the_tree_draws_one_box_per_checkpoint_call_with_its_recompute_and_backward_inside() -> None:
    """One ``◇ checkpoint`` box per call torch's joint graph tags (``ac_graph_id``), holding that call's
    forward ops, their recomputation and their backward ops; never the forward of the call and its
    backward as two boxes, and never a module that only shares the calling line (``c``)."""
    from fxviz.render.tree import tree_text
    from fxviz.symbolic.joint import export_joint
    from fxviz.torchbridge.normalize import flatten_inputs

    torch.manual_seed(0)
    model, x = TwoCalls(), torch.randn(4, 8)
    with contextlib.ExitStack() as stack:
        gm = export_joint(model, flatten_inputs(model, (x,), {}), None, stack)
        calls = {n.meta["ac_graph_id"] for n in gm.graph.nodes if "ac_graph_id" in n.meta}
    g = fxviz.capture(model, (x,), backward=True, method="export")
    boxes = _boxes(tree_text(g, width=200, unfold=True))
    assert len(calls) == 2 and len(boxes) == len(calls), tree_text(g, width=200)
    for box, (mine, other) in zip(boxes, [("a (Linear)", "b (Linear)"), ("b (Linear)", "a (Linear)")], strict=True):
        text = "\n".join(box)
        assert mine in text and other not in text and "c (Linear)" not in text, text
        ops = [line.split("── ")[-1].split()[0] for line in box[1:] if "── " in line]
        # tanh, its recomputation and tanh_backward; the Linear's addmm, recomputed, and its backward mm
        assert ops.count("tanh") == 2 and "tanh_backward" in ops, text
    assert sum(line.count("◇ checkpoint") for line in tree_text(g, width=200).splitlines()) == 2
