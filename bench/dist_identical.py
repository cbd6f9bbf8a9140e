"""The sharded captures the distributed tests build, as JSON: a check that a speed change to the
sharded capture path changes no output (issue 22 benchmark).

    PYTHONPATH=$PWD python bench/dist_identical.py save DIR    # before a change
    PYTHONPATH=$PWD python bench/dist_identical.py check DIR   # after: byte-identical, or the names that differ

Models (tests/test_distributed*.py's factories): the TP MLP, the attention block, TP+SP LLaMA-shaped
on dp x tp, FSDP2 GPT-2 (plain, tied, on meta, FSDP over TP), pipeline stages (forward, loss), and
two layers of the 70B shape on meta; each captured forward and with ``backward=True``.
"""

from __future__ import annotations

import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import fxviz  # noqa: E402
from tests import test_distributed as td  # noqa: E402
from tests import test_distributed_fsdp as tf  # noqa: E402
from tests import test_distributed_pipeline as tp  # noqa: E402


def cases() -> dict[str, tuple[Callable[[], Any], int]]:
    """name -> (factory, world size)."""
    return {
        "tp_mlp": (td.mlp_factory, 8), "attention_block": (td.block_factory, 4), "tp_sp_llama": (td.sp_factory, 8),
        "fsdp_mlp": (td.fsdp_factory, 4), "fsdp_gpt2": (tf.gpt_factory, 8), "fsdp_gpt2_tied": (tf.tied_factory, 2),
        "fsdp_gpt2_meta": (tf.meta_factory, 8), "fsdp_tp": (tf.fsdp_tp_factory, 8),
        "pipeline_forward": (tp.forward_factory, 2), "pipeline_loss": (tp.loss_factory, 1),
        "llama70b_2_layers_meta": (lambda: td._bench().llama70b(2), 8),
    }


def _timeless(text: str) -> str:
    """``text`` without what differs between two runs of the same capture: each attempt's seconds."""
    return re.sub(r'"seconds": [0-9.e-]+', '"seconds": 0', text)


def graphs() -> dict[str, str]:
    out = {}
    for name, (factory, world) in cases().items():
        for backward in (False, True):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    text = _timeless(fxviz.capture(factory, world_size=world, backward=backward).to_json())
                except Exception as e:  # a capture that fails must fail the same way
                    text = f"error: {type(e).__name__}: {e}"
            out[f"{name}{'_backward' if backward else ''}"] = text
    return out


def main() -> None:
    what, where = sys.argv[1], Path(sys.argv[2])
    got = graphs()
    if what == "save":
        where.mkdir(parents=True, exist_ok=True)
        for name, text in got.items():
            (where / f"{name}.json").write_text(text)
        print(f"saved {len(got)} captures to {where}")
        return
    differ = [name for name, text in got.items() if (where / f"{name}.json").read_text() != text]
    print(f"{len(got) - len(differ)}/{len(got)} byte-identical" + (f"; differ: {', '.join(differ)}" if differ else ""))
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
