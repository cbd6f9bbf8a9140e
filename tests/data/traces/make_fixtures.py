"""Make the small trace fixtures of tests/test_tracefile*.py from a real ``TORCH_TRACE`` file.

``python tests/data/traces/make_fixtures.py SOURCE.log`` writes ``train.log``: the source trace less
the events the tests do not read and that make it big (FX graph cache keys, the runnable graph,
functorch's config, instant cache events whose args repeat whole graphs). Every kept event is
byte-for-byte torch's, so each payload still matches its header's md5, except the ``inductor_compile``
chromium end events: their ``components`` (the FX graph cache key's parts, whole graphs again) are
emptied, and their payload and md5 rewritten the way torch writes them (``json.dumps(indent=0)``).

The source was made by /work/wt/samples/gen.py (a Linear-LayerNorm-GELU-Linear model compiled with
Inductor twice: compile 0/0, then 0/1 with a backward) under torch 2.13 with
``TORCH_TRACE=DIR`` and ``torch._inductor.config.trace.provenance_tracking_level = 1``.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

DROP_ARTIFACTS = {"fx_graph_cache_miss", "fx_graph_runnable", "torch._functorch.config",
                  "aot_forward_graph_fw_metadata"}
PREFIX = re.compile(r"(?:\[rank(\d+)\]:)?[VIWEC]\d{4} [\d:.]+ +\d+ [^\]]*\] ")


def keep(header: dict, payload: str | None) -> bool:
    key = next(iter(header))
    if key == "artifact" and header[key].get("name") in DROP_ARTIFACTS:
        return False
    instant = key == "chromium_event" and payload is not None and json.loads(payload)["ph"] == "i"
    return not instant


def main(source: str, out: str) -> None:
    lines = Path(source).read_text().split("\n")
    kept: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line:
            continue
        block = [line]
        while i < len(lines) and lines[i].startswith("\t"):
            block.append(lines[i])
            i += 1
        m = PREFIX.match(line)
        assert m is not None, line
        header = json.loads(line[m.end():])
        payload = "\n".join(b[1:] for b in block[1:]) if len(block) > 1 else None
        if not keep(header, payload):
            continue
        if payload is not None and "chromium_event" in header:
            event = json.loads(payload)
            if event.get("args", {}).get("components"):
                event["args"]["components"] = []
                payload = json.dumps(event, indent=0)
                header["has_payload"] = hashlib.md5(payload.encode()).hexdigest()
                block = [line[:m.end()] + json.dumps(header)]
                block += ["\t" + p for p in payload.split("\n")]
        kept.extend(block)
    Path(out).write_text("\n".join(kept) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else str(Path(__file__).with_name("train.log")))
