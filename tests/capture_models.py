"""Models for complete capture (issue 9): ops inside higher-order ops, wrapped and scripted models,
custom ops, inputs the model rejects, a detection-style model with data-dependent steps.

Each factory returns ``(model, args, kwargs)`` in eval mode, built under a fixed seed. Also the
ground truth the tests compare a graph with: :func:`aten_modules`, every module in which an ATen op
ran in a plain forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

Built = tuple[nn.Module, tuple[Any, ...], dict[str, Any]]


def _seeded(fn: Callable[[], Built]) -> Callable[[], Built]:
    def build() -> Built:
        torch.manual_seed(0)
        return fn()

    build.__name__ = fn.__name__
    return build


# ---- ground truth ------------------------------------------------------------------------------


class _Modules(TorchDispatchMode):
    """Records the module call running when each ATen op runs."""

    def __init__(self, stack: list[str]) -> None:
        super().__init__()
        self.stack = stack
        self.seen: set[str] = set()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        if self.stack:
            self.seen.add(self.stack[-1])
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _module_stack(model: nn.Module) -> Iterator[list[str]]:
    paths = {id(m): p for p, m in model.named_modules() if p}
    stack: list[str] = []

    def pre(m: nn.Module, _a: Any) -> None:
        if id(m) in paths:
            stack.append(paths[id(m)])

    def post(m: nn.Module, _a: Any, _o: Any) -> None:
        if id(m) in paths and stack and stack[-1] == paths[id(m)]:
            stack.pop()

    handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
    try:
        yield stack
    finally:
        for h in handles:
            h.remove()


def aten_modules(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[set[str], int]:
    """Every module (path) in which an ATen op ran in a plain forward, and how many ATen ops ran:
    the ground truth of module coverage. The model's buffers are put back afterwards."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        with _module_stack(model) as stack, torch.no_grad():
            mode = _Modules(stack)
            with mode:
                model(*args, **kwargs)
    finally:
        with torch.no_grad():
            for b, s in saved:
                b.copy_(s)
    return mode.seen, mode.ops


def graph_modules(graph: Any) -> set[str]:
    """Every module path on some op node's stack."""
    return {p for n in graph.ops for p, _ in n.stack}


# ---- higher-order ops ----------------------------------------------------------------------------


class Teacher(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class Distill(nn.Module):
    """A student trained against a teacher that runs under ``no_grad``."""

    def __init__(self) -> None:
        super().__init__()
        self.teacher = Teacher()
        self.student = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            target = self.teacher(x).softmax(-1)
        return (self.student(x).log_softmax(-1) * target).sum(-1)


@_seeded
def no_grad_teacher() -> Built:
    return Distill().eval(), (torch.randn(2, 8),), {}


class Checkpointed(nn.Module):
    """Two blocks run through ``torch.utils.checkpoint``."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.reentrant = reentrant
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(2))
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant)
        return self.head(x)


@_seeded
def checkpoint_reentrant() -> Built:
    return Checkpointed(True).eval(), (torch.randn(2, 8),), {}


@_seeded
def checkpoint_plain() -> Built:
    return Checkpointed(False).eval(), (torch.randn(2, 8),), {}


class Autocast(nn.Module):
    """A block under ``torch.autocast(bfloat16)``, then a float head."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = self.block(x)
        return self.head(y.float())


@_seeded
def autocast_block() -> Built:
    return Autocast().eval(), (torch.randn(2, 8),), {}


class Branches(nn.Module):
    """``torch.cond`` with a module call in each branch."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Linear(8, 8)
        self.neg = nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cond(x.sum() > 0, lambda t: self.pos(t).relu(), lambda t: self.neg(t) * 2, (x,))
        return self.out(y)


def cond_branches(sign: float = 1.0) -> Built:
    torch.manual_seed(0)
    return Branches().eval(), (sign * torch.rand(2, 8),), {}


def reformer() -> Built:
    """Reformer's attention and feed-forward run under ``no_grad`` (its reversible layers)."""
    from transformers import ReformerConfig, ReformerModel

    torch.manual_seed(0)
    cfg = ReformerConfig(
        vocab_size=96, hidden_size=32, num_attention_heads=2, attention_head_size=16, attn_layers=["local", "lsh"],
        axial_pos_embds=False, feed_forward_size=64, max_position_embeddings=64, local_attn_chunk_length=4,
        lsh_attn_chunk_length=4, num_buckets=2, num_hashes=1, is_decoder=False,
    )
    return ReformerModel(cfg).eval(), (torch.randint(0, 96, (1, 16)),), {}


# ---- custom ops, wrappers, TorchScript -------------------------------------------------------------


def _scaled_swish_op() -> Any:
    """``fxviz_tests::scaled_swish``, registered once per process."""
    name = "fxviz_tests::scaled_swish"
    existing = getattr(torch.ops.fxviz_tests, "scaled_swish", None) if hasattr(torch.ops, "fxviz_tests") else None
    if existing is not None:
        return existing.default

    @torch.library.custom_op(name, mutates_args=())
    def scaled_swish(x: torch.Tensor, scale: float) -> torch.Tensor:
        return x * torch.sigmoid(x) * scale

    @scaled_swish.register_fake
    def _(x: torch.Tensor, scale: float) -> torch.Tensor:
        return torch.empty_like(x)

    return torch.ops.fxviz_tests.scaled_swish.default


class CustomOp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.op = _scaled_swish_op()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(self.fc(x), 2.0)


@_seeded
def custom_op() -> Built:
    return CustomOp().eval(), (torch.randn(2, 8),), {}


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 16), nn.ReLU())
        self.head = nn.Linear(16, 4)

    def forward(self, features: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        return self.head(self.encoder(features)) * scale


@_seeded
def small() -> Built:
    return Small().eval(), (torch.randn(2, 8),), {}


# ---- inputs a model rejects -----------------------------------------------------------------------

IMAGE_TOKEN = 7


class ImageTokens(nn.Module):
    """LLaVA's check: as many image tokens in ``input_ids`` as the image has features, written with
    ``torch._check`` (which export defers to a runtime assertion)."""

    def __init__(self, features: int = 2) -> None:
        super().__init__()
        self.features = features
        self.embed = nn.Embedding(16, 8)
        self.vision = nn.Linear(4, 8)

    def forward(self, input_ids: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        n = (input_ids == IMAGE_TOKEN).sum().item()
        torch._check(n == self.features, lambda: "image tokens do not match image features")
        return self.embed(input_ids).sum(1) + self.vision(pixels).sum(1)


def image_tokens(tokens: int = 2) -> Built:
    torch.manual_seed(0)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    ids[0, 1 : 1 + tokens] = IMAGE_TOKEN
    return ImageTokens().eval(), (ids, torch.randn(1, 2, 4)), {}


def llava(tokens: int = 4) -> Built:
    """A tiny LLaVA (CLIP vision tower, LLaMA text model) from configs; an image of 4 patches wants
    4 image tokens in ``input_ids``."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    torch.manual_seed(0)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                              image_size=16, patch_size=8, projection_dim=32)
    text = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=64)
    cfg = LlavaConfig(vision_config=vision, text_config=text, image_token_index=95, image_seq_length=4,
                      vision_feature_layer=-1, vision_feature_select_strategy="default")
    ids = torch.randint(0, 90, (1, 10))
    ids[0, 1 : 1 + tokens] = 95
    return LlavaForConditionalGeneration(cfg).eval(), (), {"input_ids": ids, "pixel_values": torch.randn(1, 3, 16, 16)}


# ---- a detection-style model -----------------------------------------------------------------------


def _box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area = lambda t: (t[:, 2:] - t[:, :2]).clamp(min=0).prod(-1)  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None, :] - inter + 1e-6)


class ConvBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class TinyDetector(nn.Module):
    """A Faster R-CNN-shaped model: a conv backbone, a region proposal head, score filtering with a
    boolean mask, a top-k sized by the number of survivors, a greedy NMS loop, RoI pooling by
    integer crops and a box head. Every step after the proposal head depends on tensor data."""

    def __init__(self, classes: int = 5, anchors: int = 3, width: int = 32) -> None:
        super().__init__()
        self.anchors = anchors
        chans = [3, width // 2, width, width, width, width, width]
        self.backbone = nn.Sequential(*(ConvBlock(a, b, 2 if i < 3 else 1)
                                        for i, (a, b) in enumerate(zip(chans, chans[1:], strict=False))))
        self.rpn_conv = ConvBlock(width, width, 1)
        self.objectness = nn.Conv2d(width, anchors, 1)
        self.deltas = nn.Conv2d(width, anchors * 4, 1)
        self.box_head = nn.Sequential(nn.Flatten(), nn.Linear(width * 4, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.classifier = nn.Linear(64, classes)
        self.regressor = nn.Linear(64, classes * 4)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        feats = self.backbone(images)
        h = self.rpn_conv(feats)
        scores = self.objectness(h).sigmoid().flatten()
        n, _, fh, fw = feats.shape
        ys, xs = torch.meshgrid(torch.arange(fh, dtype=torch.float32), torch.arange(fw, dtype=torch.float32),
                                indexing="ij")
        centers = torch.stack([xs, ys], -1).reshape(1, fh, fw, 2).expand(self.anchors, fh, fw, 2).reshape(-1, 2)
        deltas = self.deltas(h).reshape(self.anchors * 4, -1).t().reshape(-1, 4)
        boxes = torch.cat([centers - 1 + deltas[:, :2].tanh(), centers + 1 + deltas[:, 2:].tanh()], -1)
        boxes = boxes.clamp(0, max(fh, fw) - 1)
        keep = scores > 0.3  # survivors depend on the image
        boxes, scores = boxes[keep], scores[keep]
        k = min(32, int(scores.numel()))
        scores, order = scores.topk(k)
        boxes = boxes[order]
        kept: list[int] = []
        remaining = torch.arange(k)
        while remaining.numel() > 0 and len(kept) < 8:  # greedy NMS
            i = int(remaining[0])
            kept.append(i)
            ious = _box_iou(boxes[i : i + 1], boxes[remaining[1:]])[0]
            remaining = remaining[1:][ious <= 0.5]
        rois = []
        for x0, y0, x1, y1 in boxes[kept].round().long().tolist():  # RoI pooling by integer crops
            crop = feats[:, :, y0 : max(y1, y0 + 1) + 1, x0 : max(x1, x0 + 1) + 1]
            rois.append(nn.functional.adaptive_avg_pool2d(crop, 2))
        pooled = torch.cat(rois) if rois else feats.new_zeros(0, feats.shape[1], 2, 2)
        hidden = self.box_head(pooled)
        logits = self.classifier(hidden)
        return {"boxes": boxes[kept], "scores": logits.softmax(-1).amax(-1), "labels": logits.argmax(-1),
                "deltas": self.regressor(hidden)}


def detector(size: int = 128) -> Built:
    torch.manual_seed(0)
    return TinyDetector().eval(), (torch.randn(1, 3, size, size),), {}


__all__ = [
    "Branches", "Checkpointed", "CustomOp", "Distill", "ImageTokens", "Small", "TinyDetector", "aten_modules",
    "autocast_block", "checkpoint_plain", "checkpoint_reentrant", "cond_branches", "custom_op", "detector",
    "graph_modules", "image_tokens", "llava", "no_grad_teacher", "reformer", "small",
]
