"""Builds the HTML report's script bundle into the wheel (metadata lives in pyproject.toml)."""

import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithWebBundle(build_py):
    """Run scripts/build_web.sh (npm ci + esbuild; a no-op when up to date) before packaging."""

    def run(self) -> None:
        script = Path(__file__).parent / "scripts" / "build_web.sh"
        if script.exists():  # an sdist without the web sources ships the built bundle instead
            subprocess.run(["bash", str(script)], check=True)
        super().run()


setup(cmdclass={"build_py": BuildWithWebBundle})
