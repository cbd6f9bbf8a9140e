"""The house's layers are a contract: imports (deferred ones included) only go down, producers of
graphs do not import each other, nothing forms a cycle, and everything a saved graph needs imports
and runs with torch absent."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "fxviz"

#: Bottom to top. A module may import its own layer and the layers below it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("fxviz.errors", "fxviz.text", "fxviz.ops", "fxviz.calls", "fxviz.callbounds", "fxviz.callnodes", "fxviz.scopes", "fxviz.nodelist", "fxviz.schema", "fxviz.saved", "fxviz.facts", "fxviz.ir", "fxviz.progress")),
    ("analysis", ("fxviz.passes", "fxviz.graphdiff", "fxviz.tracefile")),
    ("render", ("fxviz.render",)),
    ("bridge", ("fxviz.torchbridge",)),
    ("producers", ("fxviz.symbolic", "fxviz.fallback")),
    ("analyzers", ("fxviz.analyze",)),
    ("api", ("fxviz.api", "fxviz.training", "fxviz.target", "fxviz.targets", "fxviz.examples")),
    ("cli", ("fxviz.cli", "fxviz.__main__")),
    ("package", ("fxviz",)),
]
#: Layers that make up what a saved graph needs: no torch, directly or through an import.
TORCH_FREE = ("core", "analysis", "render")
#: Packages of one layer that must not import each other.
SIBLINGS = [("fxviz.symbolic", "fxviz.fallback")]


def modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        name = ".".join(p.relative_to(REPO).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


MODULES = modules()


def layer_of(module: str) -> int:
    best, best_len = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = i, len(prefix)
    return best


def imports(module: str) -> set[str]:
    """Every fxviz module ``module`` imports, wherever the import statement is (a function body
    too); ``if TYPE_CHECKING:`` blocks are not run-time imports and do not count. Third-party
    modules appear by their top-level name (``torch``)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only.update(id(sub) for sub in ast.walk(node))
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_pkg else module.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        for name in names:
            if not name.startswith("fxviz"):
                found.add(name.split(".")[0])
                continue
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


GRAPH = {m: {i for i in imports(m) if i in MODULES} for m in MODULES}


def test_every_module_has_a_layer() -> None:
    assert [m for m in MODULES if layer_of(m) < 0] == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_go_down(module: str) -> None:
    mine = layer_of(module)
    up = sorted(i for i in GRAPH[module] if layer_of(i) > mine)
    assert up == [], f"{module} ({LAYERS[mine][0]}) imports from layers above it: {up}"
    for a, b in SIBLINGS:
        for x, y in ((a, b), (b, a)):
            if module == x or module.startswith(x + "."):
                assert not any(i == y or i.startswith(y + ".") for i in GRAPH[module]), (
                    f"{module} imports {y}: capture and fallback are siblings that meet in api"
                )


def test_no_import_cycles() -> None:
    """Tarjan's strongly connected components over every import, deferred ones included. A
    package's ``__init__`` importing its submodules is an edge like any other, so a submodule must
    import its siblings directly, never through its package."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0
    for start in sorted(GRAPH):
        if start in index:
            continue
        work = [(start, iter(sorted(GRAPH[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(GRAPH[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    cycles.append(sorted(comp))
    assert cycles == []


@pytest.mark.parametrize("module", sorted(m for m in MODULES if LAYERS[layer_of(m)][0] in TORCH_FREE))
def test_torch_free_layers_do_not_import_torch(module: str) -> None:
    assert "torch" not in imports(module)


_NO_TORCH = textwrap.dedent("""
    import importlib.abc, sys

    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
            return None

    sys.meta_path.insert(0, NoTorch())
""")


def test_a_saved_graph_renders_without_torch(tmp_path: Path) -> None:
    """Block torch with a meta-path finder in a fresh interpreter; import every torch-free module,
    then load a graph from JSON and draw it as a tree and a report, and diff it with itself."""
    from tests.irbuild import cnn_graph

    saved = tmp_path / "g.json"
    saved.write_text(cnn_graph().to_json(), encoding="utf-8")
    torch_free = sorted(m for m in MODULES if LAYERS[layer_of(m)][0] in TORCH_FREE)
    code = _NO_TORCH + textwrap.dedent(f"""
        import importlib, json
        for m in {torch_free!r}:
            importlib.import_module(m)
        import fxviz
        g = fxviz.Graph.from_json(open({str(saved)!r}).read())
        text = str(g)
        page = g.to_html()
        d = fxviz.diff(g, g)
        try:
            fxviz.capture
        except ModuleNotFoundError as e:
            lazy = str(e)
        print(json.dumps({{"torch": "torch" in __import__("sys").modules, "lines": len(text.splitlines()),
                           "html": len(page), "diff": len(d), "lazy": lazy}}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["torch"] is False
    assert out["lines"] >= 5 and out["html"] > 10_000 and out["diff"] == 0
    assert "torch" in out["lazy"], "capture needs torch and says so when it is missing"


#: Public class names fxviz defines twice, each for its own thing (a test model beside a pass's
#: class; the compile map's recording backend beside the eager tracer's recorder). Keep this short.
TWICE = {"Block": {"fxviz.examples", "fxviz.passes.structure"},
         "Recorder": {"fxviz.fallback.recorder", "fxviz.analyze.compilemap.record"}}


def test_a_public_class_name_names_one_class() -> None:
    """Two public classes of one name are two things a reader (and a grep) takes for one: the
    eager tracer's register of the model's tensors was ``ModelState``, as the snapshot every capture
    restores the model from (torchbridge.guard) is."""
    where: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                where.setdefault(node.name, set()).add(module)
    twice = {name: mods for name, mods in where.items() if len(mods) > 1}
    assert twice == TWICE
