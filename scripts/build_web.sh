#!/usr/bin/env bash
# Build the HTML report's script bundle: web/src/*.js + style.css -> fxviz/render/static/.
# Runs `npm ci` (exact versions from web/package-lock.json) and esbuild. Does nothing when the
# bundle is newer than every source, the package files and this script; FORCE=1 rebuilds anyway.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
web="$root/web"
out="$root/fxviz/render/static"
bundle=("$out/report.js" "$out/report.css")

up_to_date() {
  local f
  for f in "${bundle[@]}"; do [[ -f "$f" ]] || return 1; done
  # any source newer than the oldest bundle file means a rebuild
  local newer
  newer="$(find "$web/src" "$web/package.json" "$web/package-lock.json" "${BASH_SOURCE[0]}" \
    -newer "${bundle[0]}" -print -quit 2>/dev/null)"
  [[ -z "$newer" ]] || return 1
  newer="$(find "$web/src" "$web/package.json" "$web/package-lock.json" -newer "${bundle[1]}" -print -quit)"
  [[ -z "$newer" ]]
}

if [[ "${FORCE:-0}" != "1" ]] && up_to_date; then
  echo "fxviz/render/static is up to date"
  exit 0
fi

command -v npm >/dev/null || { echo "build_web.sh needs Node.js (>= 18) and npm" >&2; exit 1; }
cd "$web"
if [[ ! -d node_modules || package-lock.json -nt node_modules/.package-lock.json ]]; then
  npm ci --no-audit --no-fund
fi
mkdir -p "$out"
npm run --silent build
echo "built $(du -h "${bundle[0]}" | cut -f1) fxviz/render/static/report.js"
