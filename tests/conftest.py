"""What the whole suite shares: its prerequisites, and the rule that CI never skips.

Tiers (markers registered in pyproject.toml): ``slow`` (subprocesses, big models, package builds,
and property tests, which the hook below marks), ``browser`` (headless Chromium), ``notebook`` (a
Jupyter kernel). ``make test`` runs everything, ``make test-fast`` leaves those three out.
``cuda`` tests need a GPU: deselected where torch sees none (see :func:`_deselect_cuda`).

Prerequisites a developer may lack (the report bundle, Chromium, Playwright, a notebook kernel,
the ``build`` package) are fixtures here: where one is missing the test is skipped with the
command that fixes it. Under ``CI=true`` a skip is a failure, whatever raised it (these fixtures,
``pytest.importorskip`` at module level, ``pytest.skip``): CI installs every extra, so a skip
there means the suite did not run what it claims to, and a green run would hide it.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Generator
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest

REPO = Path(__file__).resolve().parent.parent

# Inductor's caches (its FX graph and AOT Autograd caches, and fxviz's records kept beside them) are
# the suite's own, new each run: a run must not read entries that an earlier run, another checkout or
# a process writing at the same time left in the machine's shared /tmp/torchinductor_<user>. (A test
# that needs a cache hit makes it in its own run: tests/test_modulerecord.py.) Set before torch is
# imported; subprocesses (torchrun, notebooks) inherit it.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _INDUCTOR_CACHE = tempfile.mkdtemp(prefix="fxviz-tests-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _INDUCTOR_CACHE
    atexit.register(shutil.rmtree, _INDUCTOR_CACHE, ignore_errors=True)
CHROMIUM = Path("/usr/bin/chromium")


def on_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing(what: str, fix: str) -> NoReturn:
    """Skip the test because ``what`` is missing (a failure under CI=true, see the hooks below)."""
    pytest.skip(f"{what} is missing: {fix}")


def import_or_missing(module: str, fix: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError:
        missing(f"the Python module {module}", fix)


def build_web() -> ModuleType:
    """scripts/build_web.py as a module: it decides whether the bundle matches web/."""
    spec = importlib.util.spec_from_file_location("fxviz_build_web", REPO / "scripts" / "build_web.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- prerequisites ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def bundle() -> Path:
    """The report's script bundle, built from the web sources as they are now: a stale one would
    test yesterday's script."""
    reason = build_web().stale_reason(REPO)
    if reason is not None:
        missing("an up-to-date report bundle", f"{reason}; run scripts/build_web.sh (or make web)")
    from fxviz.render.html import BUNDLE_DIR

    return BUNDLE_DIR


@pytest.fixture(scope="session")
def chromium() -> Path:
    if not CHROMIUM.is_file():
        missing(f"Chromium ({CHROMIUM})", "apt-get install -y chromium (scripts/setup.sh does it)")
    return CHROMIUM


@pytest.fixture(scope="session")
def playwright() -> ModuleType:
    """``playwright.sync_api`` (the driver; the browser is Debian's Chromium)."""
    return import_or_missing("playwright.sync_api", "pip install -e '.[dev]' (make setup)")


@pytest.fixture(scope="module")
def browser(chromium: Path, playwright: ModuleType) -> Generator[Any, None, None]:
    """A headless Chromium for one test module's pages."""
    from tests.report_browser import ARGS

    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(chromium), args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def notebook_kernel() -> str:
    """The name of the Jupyter kernel the notebooks run on, once nbclient can start it."""
    for module in ("nbformat", "nbclient", "ipykernel", "jupyter_client.kernelspec"):
        import_or_missing(module, "pip install -e '.[dev]' (make setup)")
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        missing("the Jupyter kernel python3", f"{sys.executable} -m ipykernel install --sys-prefix --name python3")
    return "python3"


@pytest.fixture(scope="session")
def build_frontend() -> ModuleType:
    """The ``build`` package (PEP 517 front end) that turns the checkout into an sdist and a wheel."""
    return import_or_missing("build", "pip install -e '.[dev]' (make setup)")


def _unwaited_collectives() -> int:
    """torch's count of functional collectives issued and not yet waited (its work registry), or 0
    before a test has imported torch."""
    if "torch" not in sys.modules:
        return 0
    try:
        from torch._C._distributed_c10d import _get_work_registry_size
    except ImportError:  # a build without distributed
        return 0
    return int(_get_work_registry_size())


@pytest.fixture(autouse=True)
def no_unwaited_collectives() -> Generator[None, None, None]:
    """A test (or fxviz) that leaves a collective unwaited fails here, by name, instead of one warning
    at the suite's exit that names nobody: a user's program would warn, and a real backend hang."""
    before = _unwaited_collectives()
    yield
    left = _unwaited_collectives() - before
    if left > 0:
        pytest.fail(f"{left} collective(s) left unwaited (torch's work registry); wait them "
                    "(fxviz.torchbridge.distributed.wait_collectives)", pytrace=False)


# ---- the CLI's targets ---------------------------------------------------------------------------


@pytest.fixture
def model_file(tmp_path: Path) -> str:
    """A copy of ``tests/cli_models.py`` (the CLI tests' factories) as a user's ``my_model.py``."""
    import shutil

    p = tmp_path / "my_model.py"
    shutil.copy(Path(__file__).parent / "cli_models.py", p)
    return str(p)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Graphs saved by ``fxviz json``: the example CNN and the example transformer."""
    from click.testing import CliRunner

    from fxviz.cli import cli

    d = tmp_path_factory.mktemp("saved")
    out = {}
    for name in ("cnn", "transformer"):
        path = str(d / f"{name}.json")
        r = CliRunner().invoke(cli, ["json", f"fxviz.examples:{name}", "-o", path])
        assert r.exit_code == 0, r.output
        out[name] = path
    return out


# ---- tiers --------------------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Property tests (hypothesis) run dozens of generated graphs each, a third of the suite's
    time: they belong to `make test`, so each one is marked ``slow`` here, new ones included."""
    for item in items:
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(pytest.mark.slow)
    _deselect_cuda(config, items)


def _deselect_cuda(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` need a GPU, which CI never has: without one they are deselected (and
    counted in the summary line), not skipped, so that ``CI=true`` stays strict about skips.
    ``pytest -m cuda`` on a GPU machine runs them."""
    gpu = [item for item in items if item.get_closest_marker("cuda") is not None]
    if not gpu:
        return
    import torch

    if torch.cuda.is_available():
        return
    config.hook.pytest_deselected(items=gpu)
    items[:] = [item for item in items if item.get_closest_marker("cuda") is None]


# ---- under CI=true, a skip is a failure ---------------------------------------------------------


def _skip_reason(longrepr: Any) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """A test (or a fixture it uses) that skipped fails instead when CI=true; xfail stays xfail."""
    outcome = yield
    report = outcome.get_result()
    if on_ci() and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"CI=true: this test would have been skipped: {_skip_reason(report.longrepr)}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    """A module that skipped itself while being collected (``pytest.importorskip``,
    ``pytest.skip(allow_module_level=True)``) is an error instead when CI=true."""
    outcome = yield
    report = outcome.get_result()
    if on_ci() and report.skipped:
        report.outcome = "failed"
        report.longrepr = f"CI=true: {collector.nodeid} would have been skipped: {_skip_reason(report.longrepr)}"
