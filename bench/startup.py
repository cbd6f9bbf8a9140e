"""Start-up: how long a user waits for ``fxviz`` when nothing needs torch.

    .venv/bin/python bench/startup.py [--reps 5] [--graph PATH] [--out results.json]

Builds a saved graph once: GPT-2 from ``GPT2Config(n_layer=12)`` (random weights, nothing
downloaded), ``input_ids`` of length 16, captured with ``fxviz.capture`` and written as ``fxviz json``
writes it (``--graph PATH`` reuses or creates that file). Then runs each command in a fresh process,
``--reps`` times, in interleaved rounds (the order alternates), output to ``/dev/null``:

- ``fxviz --help`` and ``fxviz tree g.json``: the console script next to this interpreter
  (``python -m fxviz`` if there is none), with this checkout first on ``PYTHONPATH``;
- ``python -c "import fxviz"``, ``python -c "import torch"``, and ``python -c pass`` (the
  interpreter's own start-up, which every other row includes).

Per command: the median wall time, the median CPU time of the child (user + system, from
``wait4``: blind to waiting for a core on a shared machine), and whether the command imported
torch (one more run under ``-X importtime``). Targets: ``--help`` and ``tree g.json`` under 0.5 s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import environment, fmt_s, gpt2, med, pin_threads, quiet_transformers, table, write_json  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 0.5


def build_graph(path: Path) -> dict[str, Any]:
    """Capture GPT-2 (12 layers, seq 16) and save it as ``fxviz json`` does."""
    import fxviz

    model, args = gpt2(n_layer=12, seq=16)
    g = fxviz.capture(model, args)
    path.write_text(g.to_json(indent=1), encoding="utf-8")
    return {"nodes": len(g.nodes), "ops": len(g.ops), "method": g.method, "bytes": path.stat().st_size}


def describe(path: Path) -> dict[str, Any]:
    from fxviz import Graph

    g = Graph.from_json(path.read_text(encoding="utf-8"))
    return {"nodes": len(g.nodes), "ops": len(g.ops), "method": g.method, "bytes": path.stat().st_size}


def fxviz_command() -> list[str]:
    script = Path(sys.executable).with_name("fxviz")
    return [str(script)] if script.exists() else [sys.executable, "-m", "fxviz"]


def commands(graph: Path) -> dict[str, list[str]]:
    fx = fxviz_command()
    return {
        "fxviz --help": [*fx, "--help"],
        "fxviz tree g.json": [*fx, "tree", str(graph)],
        'python -c "import fxviz"': [sys.executable, "-c", "import fxviz"],
        'python -c "import torch"': [sys.executable, "-c", "import torch"],
        'python -c "pass"': [sys.executable, "-c", "pass"],
    }


def child_env(**extra: str) -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO), **extra}


def run_once(cmd: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one fresh process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env())
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: {err.strip()}")
    return wall, usage.ru_utime + usage.ru_stime


def imports_torch(cmd: list[str]) -> bool:
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env=child_env(PYTHONPROFILEIMPORTTIME="1"), check=True)
    return any(line.rstrip().endswith("| torch") for line in proc.stderr.splitlines())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--graph", default=None, help="the saved GPT-2 graph (built here when missing)")
    p.add_argument("--out", default=None)
    opts = p.parse_args()
    pin_threads(1)
    quiet_transformers()

    graph = Path(opts.graph) if opts.graph else Path(tempfile.mkdtemp(prefix="fxviz-startup-")) / "gpt2-12.json"
    built = build_graph(graph) if not graph.exists() else describe(graph)
    cmds = commands(graph)
    for cmd in cmds.values():  # warm the page cache: the first run of each reads its files from disk
        run_once(cmd)
    wall: dict[str, list[float]] = {k: [] for k in cmds}
    cpu: dict[str, list[float]] = {k: [] for k in cmds}
    order = list(cmds)
    for i in range(opts.reps):
        for k in order if i % 2 == 0 else reversed(order):
            w, c = run_once(cmds[k])
            wall[k].append(w)
            cpu[k].append(c)
    torch_in = {k: imports_torch(cmd) for k, cmd in cmds.items()}

    rows = []
    for k in cmds:
        target = f"< {fmt_s(TARGET_S)}" if k.startswith("fxviz") else ""
        met = ("met" if med(wall[k]) < TARGET_S else "MISSED") if target else ""
        rows.append([k, fmt_s(med(wall[k])), fmt_s(min(wall[k])), fmt_s(med(cpu[k])),
                     "yes" if torch_in[k] else "no", f"{target} {met}".strip()])
    print(table(["command", "wall (median)", "wall (min)", "cpu (median)", "imports torch", "target"], rows))
    print(f"\nmedians of {opts.reps} fresh processes per command, interleaved; graph: {graph} "
          f"({built['ops']} ops, {built['bytes'] / 1e6:.2f} MB); fxviz: {' '.join(fxviz_command())}")
    print(environment())
    write_json(opts.out, {"environment": environment(), "graph": built, "wall": wall, "cpu": cpu,
                          "imports_torch": torch_in})


if __name__ == "__main__":
    main()
