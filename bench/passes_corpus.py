"""A before/after check for a change to the passes: capture a corpus of models with every method
that takes them and write, per capture, what the passes' results reach: ``graph.to_json()`` (with
attempt times zeroed), the terminal tree (folded and unfolded, with the ``flops`` overlay) and the
HTML view model. ``--check DIR`` compares a new run with a saved one byte for byte.

    PYTHONPATH=$PWD .venv/bin/python bench/passes_corpus.py --save /tmp/before    # on the old code
    PYTHONPATH=$PWD .venv/bin/python bench/passes_corpus.py --check /tmp/before   # on the new: exit 1 on a difference

Models: tests/models.py, tests/capture_models.py (the light ones), tests/fallback_models.py,
tests/numerics_models.py, fxviz.examples, tests/transformers_zoo.py (tiny HF configs: GPT-2,
LLaMA, Qwen2, BERT, DistilBERT, T5, BART, ViT, ResNet) and bench's residual stack. Methods:
eager, eager-aten, export, fx; a capture that fails is recorded as its error's type (the same
failure must come back). A few minutes on a shared machine. Run it with the project's environment:
bench's has a site-packages ``tests`` package that hides tests/.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("eager", "eager-aten", "export", "fx")


def models() -> Iterator[tuple[str, Callable[[], Any]]]:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT / "bench"))
    import capture_models
    import fallback_models
    import models as test_models
    import numerics_models
    import transformers_zoo
    from tracer import build_models

    from fxviz import examples

    for name, make in test_models.ZOO.items():
        yield f"models.{name}", make
    for name in ("no_grad_teacher", "checkpoint_plain", "autocast_block", "small", "custom_op"):
        yield f"capture.{name}", getattr(capture_models, name)
    for name, entry in fallback_models.ZOO.items():
        if name not in ("broken", "cond"):
            yield f"fallback.{name}", entry.build
    for name in ("deterministic", "gelu_net", "dropped", "tiny_moe", "qwen2_moe", "modernbert", "set_order"):
        yield f"numerics.{name}", getattr(numerics_models, name)
    for name, make in examples.EXAMPLES.items():
        yield f"examples.{name}", make
    for name, make in transformers_zoo.TRANSFORMERS_ZOO.items():
        yield f"hf.{name}", make
    stack = build_models(12)["stack"]
    yield "bench.stack", lambda: stack()[:2]


def untimed(data: Any) -> Any:
    """``data`` with every capture attempt's ``seconds`` set to 0 (the one thing that changes
    between two runs of the same code)."""
    if isinstance(data, dict):
        return {k: 0 if k == "seconds" else untimed(v) for k, v in data.items()}
    if isinstance(data, list):
        return [untimed(v) for v in data]
    return data


def outputs(graph: Any) -> dict[str, str]:
    """What the passes' results reach, as text."""
    from fxviz.render.tree import tree_text
    from fxviz.render.viewmodel import view_model

    out = {"json": json.dumps(untimed(graph.to_dict()), indent=0, default=str)}
    parts: dict[str, Callable[[], str]] = {
        "tree": lambda: tree_text(graph, width=140),
        "tree-unfold": lambda: tree_text(graph, width=140, unfold=True),
        "tree-flops": lambda: tree_text(graph, width=140, overlay="flops"),  # a RenderError without one
        "view": lambda: json.dumps(untimed(view_model(graph)), default=str),
    }
    for part, fn in parts.items():
        try:
            out[part] = fn()
        except Exception as e:
            out[part] = f"error {type(e).__name__}: {e}"
    # the checkout's place (source lines name files): a copy of the old code elsewhere compares too
    return {part: text.replace(str(ROOT), "<root>") for part, text in out.items()}


def run(into: Path | None, against: Path | None) -> int:
    import torch

    import fxviz

    torch.manual_seed(0)
    torch.set_num_threads(1)
    differ: list[str] = []
    n = 0
    for name, make in models():
        for method in METHODS:
            built = make()
            model, args = built[0], built[1]
            kwargs = built[2] if len(built) > 2 else {}
            torch.manual_seed(0)
            try:
                graph = fxviz.capture(model, args, kwargs, method=method)
            except Exception as e:
                texts = {"error": type(e).__name__}
            else:
                texts = outputs(graph)
            n += 1
            for part, text in texts.items():
                fname = f"{name}.{method}.{part}.txt"
                if into is not None:
                    (into / fname).write_text(text)
                if against is not None:
                    old = against / fname
                    if not old.exists() or old.read_text() != text:
                        differ.append(fname)
                        print(f"DIFFERS: {fname}", flush=True)
            if against is not None:
                old_parts = {p.name for p in against.glob(f"{name}.{method}.*.txt")}
                missing = old_parts - {f"{name}.{method}.{part}.txt" for part in texts}
                for fname in sorted(missing):
                    differ.append(fname)
                    print(f"MISSING: {fname}", flush=True)
    print(f"{n} captures; {len(differ)} outputs differ", flush=True)
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--save", type=Path, help="write the outputs here")
    ap.add_argument("--check", type=Path, help="compare with the outputs saved here")
    a = ap.parse_args()
    if a.save is None and a.check is None:
        ap.error("give --save DIR or --check DIR")
    if a.save is not None:
        a.save.mkdir(parents=True, exist_ok=True)
    return run(a.save, a.check)


if __name__ == "__main__":
    sys.exit(main())
