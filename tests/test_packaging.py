"""How fxviz is built, installed and tested.

* scripts/build_web.py decides when the report's script bundle must be (re)built, and says what to
  do when it cannot be (fast, on hand-made trees).
* ``python -m build`` on a clean checkout makes an sdist and a wheel that both carry the bundle;
  each installs into a fresh virtual environment whose PATH has no Node, and renders a report
  there (slow: two builds and two installs, about a minute).
* Under ``CI=true`` a skipped test fails the run (tests/conftest.py), checked in a child pytest.

The fresh environments reuse this one's packages (torch among them) through a ``.pth`` file and
install fxviz with ``--no-deps``: what is tested is fxviz's own files, not a second download of
torch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import venv
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from fxviz.render.html import to_html
from tests.conftest import REPO, build_web, missing
from tests.render_graphs import partial_graph

#: The one version, as pyproject.toml writes it (tomllib is Python 3.11+; fxviz supports 3.10)
VERSION = re.search(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(encoding="utf-8"), re.M)[1]  # type: ignore[index]
BUNDLE = ("report.js", "report.css")


# ---- when the bundle is built, and what a build without it says -------------------------------


def fake_tree(root: Path, *, sources: bool = True, bundle: bool = True) -> Path:
    """A tree shaped like fxviz's: web/ sources, and a bundle built from them (stamp included)."""
    bw = build_web()
    if sources:
        (root / "web" / "src").mkdir(parents=True)
        (root / "web" / "package.json").write_text('{"name": "x", "private": true}\n')
        (root / "web" / "package-lock.json").write_text("{}\n")
        (root / "web" / "src" / "main.js").write_text("console.log(1);\n")
    if bundle:
        static = bw.static_dir(root)
        static.mkdir(parents=True)
        for name in BUNDLE:
            (static / name).write_text("/* built */\n")
        if sources:
            (static / bw.STAMP).write_text(f"{bw.sources_hash(root)}  web/\n")
    return root


def no_npm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(empty))


def test_a_bundle_that_matches_its_sources_needs_no_npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bw = build_web()
    root = fake_tree(tmp_path)
    no_npm(monkeypatch, tmp_path)
    assert bw.stale_reason(root) is None
    said: list[str] = []
    bw.ensure_bundle(root, log=said.append)
    assert said == ["fxviz/render/static is up to date"]


def test_changed_sources_make_the_bundle_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bw = build_web()
    root = fake_tree(tmp_path)
    (root / "web" / "src" / "main.js").write_text("console.log(2);\n")
    assert "sources changed" in bw.stale_reason(root)
    (root / "web" / "src" / "main.js").write_text("console.log(1);\n")
    assert bw.stale_reason(root) is None  # content decides, not file times
    (root / "web" / "src" / ".main.js.swp").write_text("editor state")
    assert bw.stale_reason(root) is None  # hidden files are not sources
    (root / "web" / "src" / "new.js").write_text("export {};\n")
    assert bw.stale_reason(root) is not None
    no_npm(monkeypatch, tmp_path)
    with pytest.raises(bw.BundleError, match=r"needs Node\.js \(>= 18\) and npm.*install fxviz from its sdist or wheel"):
        bw.ensure_bundle(root, log=lambda _: None)


def test_a_missing_stamp_or_bundle_means_a_build(tmp_path: Path) -> None:
    bw = build_web()
    root = fake_tree(tmp_path)
    (bw.static_dir(root) / bw.STAMP).unlink()
    assert "no SOURCES.sha256" in bw.stale_reason(root)
    (bw.static_dir(root) / "report.css").unlink()
    assert "not built" in bw.stale_reason(root)


def test_a_bundle_without_sources_is_used_as_shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bw = build_web()
    root = fake_tree(tmp_path, sources=False)
    no_npm(monkeypatch, tmp_path)
    said: list[str] = []
    bw.ensure_bundle(root, log=said.append)
    assert said == ["fxviz/render/static: using the bundle as shipped (no web/ sources here)"]


def test_neither_bundle_nor_sources_says_what_to_do(tmp_path: Path) -> None:
    bw = build_web()
    root = fake_tree(tmp_path, sources=False, bundle=False)
    with pytest.raises(bw.BundleError) as e:
        bw.ensure_bundle(root, log=lambda _: None)
    msg = str(e.value)
    assert "fxviz/render/static/report.js) is missing" in msg and "no web sources" in msg
    assert "git checkout" in msg and "sdist" in msg and "\n" not in msg


def test_the_checkout_has_one_version() -> None:
    """pyproject.toml holds the version; the private npm package that builds the bundle has none."""
    assert "version" not in json.loads((REPO / "web" / "package.json").read_text(encoding="utf-8"))
    lock = json.loads((REPO / "web" / "package-lock.json").read_text(encoding="utf-8"))
    assert "version" not in lock and "version" not in lock["packages"][""]


# ---- python -m build, then installs without Node ----------------------------------------------


def checkout_copy(dest: Path) -> Path:
    """The files git tracks (or would, untracked but not ignored), as a clean clone has them: no
    bundle, no virtual environment. ``web/node_modules`` is linked in when present, so that npm
    does not download again what it installed for this checkout."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    assert not (dest / "fxviz" / "render" / "static").exists()  # git-ignored: a clean clone lacks it
    if (REPO / "web" / "node_modules").is_dir():
        (dest / "web" / "node_modules").symlink_to(REPO / "web" / "node_modules")
    return dest


def run(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path, timeout: int = 300) -> str:
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{out[-4000:]}"
    return out


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory, build_frontend: ModuleType) -> dict[str, Path]:
    """``python -m build`` on a clean copy of the checkout (npm on PATH builds the bundle for
    the sdist; the wheel is built from that sdist)."""
    if shutil.which("npm") is None:
        missing("npm (a clean checkout builds the report bundle with it)", "install Node.js >= 18 and npm")
    tmp = tmp_path_factory.mktemp("build")
    src = checkout_copy(tmp / "src")
    log = run([sys.executable, "-m", "build", "--outdir", str(tmp / "dist"), str(src)], cwd=tmp)
    # the sdist step built the bundle; the wheel step, from the sdist, found it up to date
    assert "building the report bundle: the HTML report's script bundle (fxviz/render/static/) is not built" in log
    assert "fxviz/render/static is up to date" in log
    out = {"sdist": tmp / "dist" / f"fxviz-{VERSION}.tar.gz",
           "wheel": tmp / "dist" / f"fxviz-{VERSION}-py3-none-any.whl", "log": tmp / "build.log"}
    out["log"].write_text(log)
    return out


@pytest.mark.slow
def test_sdist_carries_the_bundle_and_the_sources_it_was_built_from(dists: dict[str, Path]) -> None:
    with tarfile.open(dists["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        stamp = tar.extractfile(f"fxviz-{VERSION}/fxviz/render/static/SOURCES.sha256")
        assert stamp is not None
        recorded = stamp.read().decode().split()[0]
    assert {f"fxviz/render/static/{f}" for f in (*BUNDLE, "SOURCES.sha256")} <= names
    assert {"scripts/build_web.py", "web/package.json", "web/package-lock.json", "web/src/model.js",
            "fxviz/render/templates/report.html.j2", "setup.py", "MANIFEST.in"} <= names
    assert not any("node_modules" in n for n in names)
    assert recorded == build_web().sources_hash(REPO)  # built from the sources of this checkout


@pytest.mark.slow
def test_wheel_carries_the_bundle(dists: dict[str, Path], bundle: Path) -> None:
    with zipfile.ZipFile(dists["wheel"]) as whl:
        names = set(whl.namelist())
        assert {f"fxviz/render/static/{f}" for f in BUNDLE} <= names
        assert "fxviz/render/templates/report.html.j2" in names
        # esbuild is deterministic: the same sources give this checkout's bundle, byte for byte
        assert whl.read("fxviz/render/static/report.js") == (bundle / "report.js").read_bytes()
        meta = whl.read(f"fxviz-{VERSION}.dist-info/METADATA").decode()
    assert f"\nVersion: {VERSION}\n" in meta


def fresh_env(root: Path) -> tuple[Path, dict[str, str]]:
    """A virtual environment that sees this one's packages (torch, jinja2, ...) after its own,
    and an environment for its processes: its bin/ alone on PATH (no node, no npm), no
    PYTHONPATH, so that nothing reaches this checkout's sources."""
    venv.create(root, with_pip=False, symlinks=True)
    site = Path(subprocess.run([str(root / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    parents = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "_fxviz_test_parent.pth").write_text("".join(f"{p}\n" for p in parents))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PATH=str(root / "bin"), PIP_DISABLE_PIP_VERSION_CHECK="1")
    assert shutil.which("npm", path=env["PATH"]) is None and shutil.which("node", path=env["PATH"]) is None
    return root, env


RENDER = textwrap.dedent("""
    import sys, fxviz
    g = fxviz.Graph.from_json(open(sys.argv[1], encoding="utf-8").read())
    g.to_html(sys.argv[2])
    print(fxviz.__version__)
    print(fxviz.__file__)
""")


def render_in(root: Path, env: dict[str, str], work: Path) -> None:
    """Render a saved graph with the installed fxviz; the report must be the one this checkout makes."""
    g = partial_graph()
    (work / "graph.json").write_text(g.to_json(), encoding="utf-8")
    out = run([str(root / "bin" / "python"), "-c", RENDER, "graph.json", "r.html"], env=env, cwd=work).split()
    assert out[-2] == VERSION
    assert Path(out[-1]).is_relative_to(root)  # the installed copy, not the checkout
    assert (work / "r.html").read_text(encoding="utf-8") == to_html(g)


@pytest.mark.slow
def test_the_wheel_installs_and_renders_without_node(dists: dict[str, Path], bundle: Path, tmp_path: Path) -> None:
    root, env = fresh_env(tmp_path / "venv")
    run([sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install", "-q", "--no-deps",
         "--ignore-installed", "--no-index", str(dists["wheel"])], env=env, cwd=tmp_path)
    render_in(root, env, tmp_path)
    # the console script, end to end: capture the example CNN and write its report
    run([str(root / "bin" / "fxviz"), "html", "fxviz.examples:cnn", "-o", "cnn.html"], env=env, cwd=tmp_path)
    assert "CoolCNN" in (tmp_path / "cnn.html").read_text(encoding="utf-8")


@pytest.mark.slow
def test_the_sdist_builds_installs_and_renders_without_node(dists: dict[str, Path], bundle: Path, tmp_path: Path) -> None:
    root, env = fresh_env(tmp_path / "venv")
    # pip builds a wheel from the sdist in an isolated environment (setuptools from the package
    # index), with no npm anywhere on PATH
    log = run([sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install", "-v", "--no-deps",
               "--ignore-installed", str(dists["sdist"])], env=env, cwd=tmp_path)
    assert "fxviz/render/static is up to date" in log
    render_in(root, env, tmp_path)


@pytest.mark.slow
def test_a_build_without_bundle_or_web_sources_stops_and_says_why(tmp_path: Path, build_frontend: ModuleType) -> None:
    src = tmp_path / "src"
    for rel in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "scripts/build_web.py"):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, src / rel)
    shutil.copytree(REPO / "fxviz", src / "fxviz", ignore=shutil.ignore_patterns("static", "__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--skip-dependency-check",
                           "--outdir", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "error: the HTML report's script bundle (fxviz/render/static/report.js) is missing and there are no web sources" \
        in proc.stdout + proc.stderr
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").glob("*.whl"))


# ---- under CI=true, a skip fails the run -------------------------------------------------------

CHILD_TESTS = textwrap.dedent("""
    import pytest

    @pytest.fixture
    def chromium_elsewhere():
        pytest.skip("Chromium (/nowhere/chromium) is missing: apt-get install -y chromium")

    def test_needs_a_browser(chromium_elsewhere):
        pass

    def test_skips_itself():
        pytest.skip("no GPU here")

    @pytest.mark.xfail(strict=True, reason="a known bug stays a known bug")
    def test_known_bug():
        assert False

    def test_runs():
        pass
""")

CHILD_MODULE = textwrap.dedent("""
    import pytest

    pytest.importorskip("fxviz_no_such_prerequisite")

    def test_never_collected():
        pass
""")


def child_pytest(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    """pytest in a child process on two tiny test files, with this suite's conftest as a plugin."""
    (tmp_path / "test_fixture_skip.py").write_text(CHILD_TESTS)
    (tmp_path / "test_module_skip.py").write_text(CHILD_MODULE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-rA",
         "--continue-on-collection-errors",
         "--rootdir", str(tmp_path), str(tmp_path / "test_fixture_skip.py"), str(tmp_path / "test_module_skip.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )


@pytest.mark.slow
def test_ci_turns_a_missing_prerequisite_into_a_failure(tmp_path: Path) -> None:
    local = child_pytest(tmp_path, None)
    assert local.returncode == 0, local.stdout[-3000:]
    assert "1 passed, 3 skipped, 1 xfailed" in local.stdout.splitlines()[-1], local.stdout[-3000:]

    ci = child_pytest(tmp_path, "true")
    assert ci.returncode != 0, ci.stdout[-3000:]
    assert "1 failed, 1 passed, 1 xfailed, 2 errors" in ci.stdout.splitlines()[-1], ci.stdout[-3000:]
    # a fixture's skip is an error at set-up, a skip in the test a failure, a module's an error
    assert ("ERROR test_fixture_skip.py::test_needs_a_browser - CI=true: this test would have been "
            "skipped: Chromium (/nowhere/chromium) is missing") in ci.stdout
    assert "FAILED test_fixture_skip.py::test_skips_itself - CI=true: this test would have been skipped: no GPU here" \
        in ci.stdout
    assert ("ERROR test_module_skip.py - CI=true: test_module_skip.py would have been skipped: could not "
            "import 'fxviz_no_such_prerequisite'") in ci.stdout
