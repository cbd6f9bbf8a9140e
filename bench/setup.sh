#!/usr/bin/env bash
# Create bench/.venv: fxviz (editable) + the tools it is compared with (torchlens, torchview,
# torchvista) + transformers. Kept apart from the project's venv so those tools never leak into it.
# Idempotent: re-running only installs what is missing. torch is pinned by ../constraints.txt (the
# CPU wheel), so none of the tools can drag in a CUDA build; the script checks that afterwards.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
venv="$here/.venv"
py="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

# The torch pin lives in the project's constraints file; transformers follows the project venv
# when there is one, so both environments build the same models.
constraints=(-c "$root/constraints.txt")
tf_spec="transformers"
if [ -x "$root/.venv/bin/python" ]; then
    v="$("$root/.venv/bin/python" -c 'import importlib.metadata as m; print(m.version("transformers"))' 2>/dev/null || true)"
    [ -n "$v" ] && tf_spec="transformers==$v"
fi

if ! "$venv/bin/python" -c 'import fxviz, torchlens, torchview, torchvista, transformers' 2>/dev/null; then
    "${pip[@]}" install "${constraints[@]}" -e "$root" torchlens torchview torchvista "$tf_spec"
fi

# Guard: the CPU torch pinned by constraints.txt, and no nvidia-* wheels.
"$venv/bin/python" - "$root/constraints.txt" <<'PY'
import importlib.metadata as md, sys
pin = next((l.split("==", 1)[1].strip() for l in open(sys.argv[1]) if l.startswith("torch==")), None)
have = md.version("torch")
nvidia = sorted(d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].lower().startswith("nvidia"))
if pin and have.split("+")[0] != pin:
    sys.exit(f"bench/.venv has torch {have}, constraints.txt pins {pin}")
if nvidia:
    sys.exit(f"bench/.venv pulled CUDA packages: {', '.join(nvidia)}")
tools = {n: md.version(n) for n in ("torch", "transformers", "torchlens", "torchview", "torchvista")}
print("bench/.venv ready: " + ", ".join(f"{k} {v}" for k, v in tools.items()))
PY
