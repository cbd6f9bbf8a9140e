"""Reading a large saved structured trace: fxviz.tracefile against tlparse (issue 20).

    .venv/bin/python bench/trace.py [--mb 500] [--reps 3] [--source tests/data/traces/train.log]
                                    [--dir /tmp/fxviz_bench_trace] [--out bench/results/trace.json]

Builds (once, then reused) a trace of about ``--mb`` MB by repeating a real ``TORCH_TRACE`` file
(forward and backward graphs, a recompile) with every copy's frame ids and compile ids renumbered
(headers, chromium events' ``compile_id`` and the payload md5s rewritten), so it holds thousands of
compile ids. Then, in interleaved rounds, each in a fresh process:

* ``fxviz``: ``read_trace(DIR)``, then ``parse_graph`` on every graph payload and
  ``parse_output_code`` on every ``inductor_output_code`` (no torch is imported);
* ``tlparse DIR -o OUT --overwrite --no-browser`` (the ``tlparse`` package, a Rust binary).

It reports process CPU time (the child's user + system time, its own children included) and wall
time, medians, the ratio fxviz / tlparse (target <= 0.5), and each one's peak RSS against the size
of the trace (target for fxviz: <= 2x). Both outputs are compared on what each shows: compile ids,
and per compile the artifacts (graphs, output code, provenance) each one lists.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PREFIX = re.compile(r"(?:\[rank\d+\]:)?[VIWEC]\d{4} [\d:.]+ +\d+ [^\]]*\] ")
GRAPHS = ("dynamo_output_graph", "before_pre_grad_graph", "after_pre_grad_graph", "aot_joint_graph",
          "aot_forward_graph", "aot_backward_graph", "before_post_grad_graph",
          "inductor_post_grad_graph")
TLPARSE = shutil.which("tlparse") or str(Path(sys.executable).with_name("tlparse"))


# ---- the trace ------------------------------------------------------------------------------------
def events_of(path: Path) -> list[tuple[str, dict, str | None]]:
    """(glog prefix, header, payload) of each event of one trace file."""
    lines = path.read_text().split("\n")
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line:
            continue
        m = PREFIX.match(line)
        assert m is not None, line[:80]
        body = []
        while i < len(lines) and lines[i].startswith("\t"):
            body.append(lines[i][1:])
            i += 1
        header = json.loads(line[m.end():])
        out.append((line[:m.end()], header, "\n".join(body) if "has_payload" in header else None))
    return out


def renumbered(events: list[tuple[str, dict, str | None]], frame: int) -> str:
    """One copy of the events with frame id ``frame`` (every compile id ``0/N`` -> ``frame/N``)."""
    parts = []
    for prefix, header, payload in events:
        h = dict(header)
        if "frame_id" in h:
            h["frame_id"] = frame
        if payload is not None and '"compile_id": "0/' in payload:
            payload = payload.replace('"compile_id": "0/', f'"compile_id": "{frame}/')
            h["has_payload"] = hashlib.md5(payload.encode()).hexdigest()
        parts.append(prefix + json.dumps(h))
        if payload is not None:
            parts.append("\t" + payload.replace("\n", "\n\t"))
    return "\n".join(parts) + "\n"


def build(source: Path, directory: Path, mb: int) -> Path:
    """A directory holding one trace file of about ``mb`` MB (reused when it is already there)."""
    path = directory / "dedicated_log_torch_trace_bench.log"
    stamp = directory / "made-from.json"
    key = {"source": source.name, "size": source.stat().st_size, "mb": mb}
    if path.exists() and stamp.exists() and json.loads(stamp.read_text()) == key:
        return path
    directory.mkdir(parents=True, exist_ok=True)
    events = events_of(source)
    total, frame = 0, 0
    with open(path, "w") as f:
        while total < mb << 20:
            text = renumbered(events, frame)
            f.write(text)
            total += len(text)
            frame += 1
    stamp.write_text(json.dumps(key))
    return path


# ---- the two readers ------------------------------------------------------------------------------
WORKER = """
import json, sys
from fxviz.tracefile import read_trace
from fxviz.tracefile.code import parse_output_code
from fxviz.tracefile.fxtext import parse_graph
GRAPHS = set(sys.argv[2].split(","))
trace = read_trace(sys.argv[1])
graphs = nodes = kernels = calls = 0
shown = {}
for c in trace.compiles:
    names = []
    for a in c.artifacts:
        names.append(a.name)
        if a.name in GRAPHS:
            graphs += 1
            nodes += len(parse_graph(a.payload, name=a.name).nodes)
        elif a.name == "inductor_output_code":
            code = parse_output_code(a.payload)
            kernels += len(code.kernels)
            calls += len(code.calls)
    shown[c.compile_id] = names
print(json.dumps({"compiles": len(trace.compiles), "graphs": graphs, "nodes": nodes,
                  "kernels": kernels, "calls": calls, "problems": len(trace.problems),
                  "torch": "torch" in sys.modules, "shown": shown}))
"""


def run_child(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, int, str]:
    """As :func:`run`, reaping the child with ``os.wait4`` to get its own resource usage."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {err.decode()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, out.decode()


def tlparse_shown(out: Path) -> dict[str, list[str]]:
    """What tlparse lists per compile: its directories ``-_F_C_A`` and the artifacts in each."""
    shown: dict[str, list[str]] = {}
    for d in sorted(out.iterdir()):
        m = re.fullmatch(r"(-|\d+)_(\d+)_(\d+)_(\d+)", d.name)
        if not d.is_dir() or m is None:
            continue
        ca, frame, fcid, attempt = m.groups()
        cid = f"{frame}/{fcid}" + (f"_{attempt}" if attempt != "0" else "")
        if ca != "-":
            cid = f"!{ca}/{cid}"
        names = []
        for f in d.iterdir():
            stem = re.sub(r"(_readable)?$", "", f.stem)
            stem = re.sub(r"_\d+$", "", stem)
            stem = re.sub(r"^inductor_output_code_\w+$", "inductor_output_code", stem)
            names.append(stem)
        shown[cid] = names
    return shown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mb", type=int, default=500)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--source", type=Path, default=ROOT / "tests/data/traces/train.log")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/fxviz_bench_trace"))
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    t0 = time.perf_counter()
    path = build(args.source, args.dir / "trace", args.mb)
    size = path.stat().st_size
    print(f"trace: {path} ({size / 1e6:.0f} MB, built or found in {time.perf_counter() - t0:.1f} s)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    tl_out = args.dir / "tl_out"
    cmds = {
        "fxviz": ([sys.executable, "-c", WORKER, str(path), ",".join(GRAPHS)], env),
        "tlparse": ([TLPARSE, str(path), "-o", str(tl_out), "--overwrite", "--no-browser"],
                    None),
    }
    times: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": [], "rss": []} for k in cmds}
    outputs: dict[str, str] = {}
    for i in range(args.reps):
        for k in list(cmds) if i % 2 == 0 else reversed(list(cmds)):
            cmd, e = cmds[k]
            wall, cpu, rss, out = run_child(cmd, e)
            times[k]["wall"].append(wall)
            times[k]["cpu"].append(cpu)
            times[k]["rss"].append(rss)
            outputs[k] = out
            print(f"  round {i + 1} {k:8s} cpu {cpu:7.2f} s  wall {wall:7.2f} s  "
                  f"peak RSS {rss / 1e6:7.0f} MB", flush=True)

    med = {k: {m: statistics.median(v) for m, v in t.items()} for k, t in times.items()}
    print()
    print("| reader | CPU s (median) | wall s | peak RSS MB | RSS / file |")
    print("|---|---|---|---|---|")
    for k, m in med.items():
        print(f"| {k} | {m['cpu']:.2f} | {m['wall']:.2f} | {m['rss'] / 1e6:.0f} | "
              f"{m['rss'] / size:.2f}x |")
    ratio_cpu = med["fxviz"]["cpu"] / med["tlparse"]["cpu"]
    ratio_wall = med["fxviz"]["wall"] / med["tlparse"]["wall"]
    print(f"\nfxviz / tlparse: CPU {ratio_cpu:.2f}x (target <= 0.5), wall {ratio_wall:.2f}x; "
          f"fxviz peak RSS {med['fxviz']['rss'] / size:.2f}x the file (target <= 2)")

    ours = json.loads(outputs["fxviz"])
    theirs = tlparse_shown(tl_out)
    print(f"fxviz: {ours['compiles']} compiles, {ours['graphs']} graphs ({ours['nodes']} nodes), "
          f"{ours['kernels']} kernels, {ours['calls']} kernel calls, {ours['problems']} problems, "
          f"torch imported: {ours['torch']}")
    print(f"tlparse: {len(theirs)} compile directories")
    same_ids = set(ours["shown"]) == set(theirs)
    keys = ("dynamo_output_graph", "aot_joint_graph", "aot_forward_graph", "aot_backward_graph",
            "inductor_post_grad_graph", "inductor_output_code",
            "inductor_provenance_tracking_node_mappings")
    differ = [cid for cid in ours["shown"] if cid in theirs and any(
        ours["shown"][cid].count(k) != theirs[cid].count(k) for k in keys)]
    print(f"same compile ids: {same_ids}; compiles whose graphs/code/provenance counts differ: "
          f"{len(differ)}{' e.g. ' + differ[0] if differ else ''}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"size": size, "times": times, "median": med,
                                        "ratio_cpu": ratio_cpu, "ratio_wall": ratio_wall,
                                        "same_compile_ids": same_ids, "differ": differ}, indent=1))


if __name__ == "__main__":
    main()
