"""Capture an 80-layer LLaMA-70B-shaped model built on ``meta``, both through export and the fake
eager tracer; prints one JSON line of timings and peak memory. Run in its own process by
tests/test_fallback.py so the peak resident size is this capture's alone."""

from __future__ import annotations

import json
import resource
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import fxviz


def peak_rss_mb() -> float:
    """This process's own peak resident memory: ``VmHWM`` of its address space. (``ru_maxrss``
    also keeps the peak of the address space it replaced at ``exec``: a child that pytest starts
    reports at least pytest's own peak, whatever the child itself used.)"""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    config = LlamaConfig(
        hidden_size=8192, intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8,
        num_hidden_layers=80, vocab_size=32000,
    )
    t0 = time.perf_counter()
    with torch.device("meta"):
        model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 32000, (1, 16), device="meta")
    build = time.perf_counter() - t0
    result: dict[str, object] = {"build_s": build}
    for method in ("export", "eager"):
        t0 = time.perf_counter()
        g = fxviz.capture(model, (ids,), method=method)
        result[method] = {
            "seconds": time.perf_counter() - t0, "method": g.method, "ops": len(g.ops),
            "layers": sum(1 for p in g.modules if p.startswith("model.layers.") and p.count(".") == 2),
            "calls": sorted({p for n in g.ops for p, _ in n.stack if p.startswith("model.layers.")
                             and p.count(".") == 2}, key=lambda p: int(p.rsplit(".", 1)[1]))[-1],
            "logits": list(next(n for n in g.outputs if n.target == "logits").outputs[0].shape),
            "params": g.annotations["stats"]["total_params"],
        }
    result["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
