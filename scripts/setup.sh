#!/usr/bin/env bash
# One idempotent set-up for a fresh Debian machine with Python 3.11 and Node/npm:
#   1. system packages, only those missing: Graphviz and its headers (pygraphviz), Chromium (the
#      HTML report's browser tests; test tools cannot download their own browser here);
#   2. the HTML report's script bundle (npm ci + esbuild, scripts/build_web.sh);
#   3. a virtual environment in .venv with torch pinned to the 2.13.0 CPU wheel (constraints.txt,
#      so nothing can drag in a multi-GB CUDA build), and fxviz itself with its extras.
# `make demo` and `make test` call this through the .venv stamp; running it twice does nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

missing=()
command -v dot >/dev/null 2>&1 || missing+=(graphviz)
[ -f /usr/include/graphviz/cgraph.h ] || missing+=(libgraphviz-dev)
[ -x /usr/bin/chromium ] || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing system packages: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

./scripts/build_web.sh

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
echo "setup: installing fxviz and its dependencies into $VENV (pinned by constraints.txt)"
"$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[dot,dev]" 2> >(grep -v "^WARNING: Location" >&2)
# the Jupyter kernel the notebook tests run on
"$VENV/bin/python" -m ipykernel install --sys-prefix --name python3 >/dev/null
echo "setup: done"
