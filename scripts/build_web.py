#!/usr/bin/env python3
"""Build the HTML report's script bundle: web/src -> fxviz/render/static/ (report.js, report.css).

`npm ci` installs the exact versions of web/package-lock.json, then web/package.json's `build`
script runs esbuild. Next to the bundle goes `SOURCES.sha256`, a hash of what it was built from
(web/package.json, web/package-lock.json, every file under web/src). When the sources hash the
same, nothing runs and Node is not needed.

That hash is what lets a wheel build without Node: the sdist carries the web sources, the bundle
and its hash, so a wheel built from the sdist finds the bundle up to date. A git checkout builds
the bundle with npm when it is missing or stale. A tree with a bundle and no web sources uses the
bundle as it is; a tree with neither cannot make a working package and says so.

    python3 scripts/build_web.py            # build if missing or stale (scripts/build_web.sh too)
    python3 scripts/build_web.py --force    # rebuild anyway (also FORCE=1)
    python3 scripts/build_web.py --check    # exit 1, saying why, if a build is needed

setup.py imports this file and calls :func:`ensure_bundle`. Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ("report.js", "report.css")
STAMP = "SOURCES.sha256"


class BundleError(Exception):
    """The bundle is missing or stale and cannot be built here; the message says what to do."""


def static_dir(root: Path) -> Path:
    return root / "fxviz" / "render" / "static"


def source_files(root: Path) -> list[Path]:
    """What the bundle is built from: the npm manifest, its lockfile and the sources, sorted.
    Hidden files (an editor's swap file) are not sources."""
    web = root / "web"
    files = [web / "package.json", web / "package-lock.json"]
    files += sorted(
        p for p in (web / "src").rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(web).parts)
    )
    return [p for p in files if p.is_file()]


def sources_hash(root: Path) -> str:
    """sha256 over each source's path (relative to web/, '/'-separated) and bytes."""
    h = hashlib.sha256()
    web = root / "web"
    for p in source_files(root):
        rel = p.relative_to(web).as_posix().encode()
        data = p.read_bytes()
        h.update(b"%d:%s%d:" % (len(rel), rel, len(data)))
        h.update(data)
    return h.hexdigest()


def has_sources(root: Path) -> bool:
    return (root / "web" / "package.json").is_file() and (root / "web" / "src").is_dir()


def has_bundle(root: Path) -> bool:
    return all((static_dir(root) / f).is_file() for f in BUNDLE)


def stale_reason(root: Path) -> str | None:
    """Why the bundle must be (re)built, or None when it matches the web sources (or when there
    are no sources to build from, in which case the bundle is used as it is)."""
    if not has_sources(root):
        if has_bundle(root):
            return None
        return (
            "the HTML report's script bundle (fxviz/render/static/report.js) is missing and there "
            "are no web sources (web/) to build it from: install from a git checkout of fxviz "
            "(with Node.js >= 18 and npm) or from fxviz's sdist, which carries the built bundle"
        )
    if not has_bundle(root):
        return "the HTML report's script bundle (fxviz/render/static/) is not built"
    stamp = static_dir(root) / STAMP
    if not stamp.is_file():
        return f"the HTML report's script bundle has no {STAMP} (built by an older build script)"
    recorded = stamp.read_text(encoding="utf-8").split()[:1]
    if recorded != [sources_hash(root)]:
        return "the HTML report's script bundle is older than web/ (the sources changed)"
    return None


def build(root: Path) -> None:
    """npm ci (when node_modules is older than the lockfile) and esbuild, then write the stamp."""
    npm = shutil.which("npm")
    if npm is None:
        raise BundleError(
            "building the HTML report's script bundle needs Node.js (>= 18) and npm, which are not "
            "on PATH: install them (https://nodejs.org, or apt-get install nodejs npm) and run "
            "scripts/build_web.sh, or install fxviz from its sdist or wheel, which carry the bundle"
        )
    web = root / "web"
    installed = web / "node_modules" / ".package-lock.json"
    if not installed.is_file() or installed.stat().st_mtime < (web / "package-lock.json").stat().st_mtime:
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=web, check=True)
    static_dir(root).mkdir(parents=True, exist_ok=True)
    # drop the old stamp first: if the build fails half-way, it must not vouch for the result
    (static_dir(root) / STAMP).unlink(missing_ok=True)
    subprocess.run([npm, "run", "--silent", "build"], cwd=web, check=True)
    if not has_bundle(root):
        raise BundleError(f"npm run build finished but {static_dir(root)} lacks {' or '.join(BUNDLE)}")
    (static_dir(root) / STAMP).write_text(f"{sources_hash(root)}  web/\n", encoding="utf-8")


def _say(line: str) -> None:
    print(line, flush=True)  # before npm's own output, which goes straight to the terminal


def ensure_bundle(root: Path = ROOT, *, force: bool = False, log: Callable[[str], object] = _say) -> None:
    """Make sure ``root`` has a bundle that matches its web sources: build it if needed and
    possible, else raise :class:`BundleError`."""
    reason = "a rebuild was asked for" if force and has_sources(root) else stale_reason(root)
    if reason is None:
        log("fxviz/render/static is up to date" if has_sources(root) else
            "fxviz/render/static: using the bundle as shipped (no web/ sources here)")
        return
    if not has_sources(root):
        raise BundleError(reason)
    log(f"building the report bundle: {reason}")
    try:
        build(root)
    except subprocess.CalledProcessError as e:
        raise BundleError(f"building the HTML report's script bundle failed: {' '.join(map(str, e.cmd))} "
                          f"exited with {e.returncode} (see its output above)") from e
    size = (static_dir(root) / BUNDLE[0]).stat().st_size
    log(f"built fxviz/render/static/{BUNDLE[0]} ({size / 1024:.0f} kB)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--force", action="store_true", help="rebuild even when up to date (also FORCE=1)")
    ap.add_argument("--check", action="store_true", help="only say whether a build is needed (exit 1 if so)")
    opts = ap.parse_args()
    if opts.check:
        reason = stale_reason(ROOT)
        print(reason or "fxviz/render/static is up to date", file=sys.stderr if reason else sys.stdout)
        return 1 if reason else 0
    try:
        ensure_bundle(ROOT, force=opts.force or os.environ.get("FORCE") == "1")
    except BundleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
