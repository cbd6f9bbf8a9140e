#!/usr/bin/env bash
# Build the HTML report's script bundle (web/ -> fxviz/render/static/) when it is missing or older
# than its sources; FORCE=1 rebuilds anyway. The work is done by build_web.py (standard-library
# Python), which setup.py also runs, so a checkout and a package build decide "stale" the same way.
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "${BASH_SOURCE[0]}")/build_web.py" "$@"
