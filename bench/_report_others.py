"""torchview and torchvista next to fxviz's report (bench/report.py): each runs in bench/.venv
(``bash bench/setup.sh``), where they are installed, through bench/_other_tools_report.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH_PY = ROOT / "bench" / ".venv" / "bin" / "python"
TIMEOUT_S = 600


def other_tools(name: str, out_dir: Path) -> dict[str, Any]:
    """torchview and torchvista on model ``name``; ``{tool: {"seconds", "bytes"} | {"error"}}``."""
    if not BENCH_PY.exists():
        reason = "not installed here (bench/.venv missing: bash bench/setup.sh)"
        return {"torchview": {"error": reason}, "torchvista": {"error": reason}}
    cmd = [str(BENCH_PY), str(ROOT / "bench" / "_other_tools_report.py"), name, "--out-dir", str(out_dir / name)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    except subprocess.TimeoutExpired:
        reason = f"timed out after {TIMEOUT_S} s"
        return {"torchview": {"error": reason}, "torchvista": {"error": reason}}
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        reason = f"driver failed (exit {r.returncode}): {r.stderr.strip().splitlines()[-1:] or ''}"
        return {"torchview": {"error": reason}, "torchvista": {"error": reason}}
    return json.loads(lines[-1])  # type: ignore[no-any-return]
