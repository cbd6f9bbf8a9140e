"""Puts the HTML report's script bundle into the sdist and the wheel (metadata lives in
pyproject.toml).

Both `sdist` and `build_py` first make sure fxviz/render/static/ holds a bundle that matches the
web sources (scripts/build_web.py): a git checkout builds it with npm when it is missing or stale;
an sdist carries the bundle and the hash of its sources, so a wheel built from it never needs
Node. With neither a bundle nor web sources, the build stops and says what to do.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
BUILDER = ROOT / "scripts" / "build_web.py"


def ensure_bundle() -> None:
    if not BUILDER.is_file():
        if (ROOT / "fxviz" / "render" / "static" / "report.js").is_file():
            return  # a tree that carries the bundle but not how it was built: use it as it is
        raise SystemExit(
            "error: fxviz's HTML report bundle (fxviz/render/static/report.js) is missing and this "
            "tree has no scripts/build_web.py to build it: build from a git checkout of fxviz or "
            "from its sdist"
        )
    spec = importlib.util.spec_from_file_location("fxviz_build_web", BUILDER)
    assert spec is not None and spec.loader is not None
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    try:
        builder.ensure_bundle(ROOT)
    except builder.BundleError as e:
        raise SystemExit(f"error: {e}") from None


class BuildPyWithBundle(build_py):
    def run(self) -> None:
        ensure_bundle()  # an editable install reads it from the source tree: build it there too
        # the list of package data may have been taken before the bundle existed
        self.__dict__.pop("data_files", None)
        super().run()


class SdistWithBundle(sdist):
    def run(self) -> None:
        ensure_bundle()  # before the file list is made, so that the bundle is in it
        super().run()


setup(cmdclass={"build_py": BuildPyWithBundle, "sdist": SdistWithBundle})
