"""``--inside``'s and ``--per-kernel``'s module attribution against torch's own provenance record of
the same compiled run (issue 18): kernel -> post-grad nodes (``cppCodeToPost``) -> pre-grad nodes
(``postToPre``) -> those nodes' ``nn_module_stack``, read from the pre-grad graph Inductor itself
compiled (handed to a ``pre_grad_custom_pass`` that only keeps it). And Inductor's
``metrics.generated_kernel_count`` against what fxviz lists (the output code's definitions).

Models: a residual add + LayerNorm pair (fusions across module boundaries) and a ConvNeXt-like
block (depthwise conv, permutes, LayerNorm, GELU MLP, residual). One compile each, shared."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # Inductor compiles

from torch import nn  # noqa: E402

import fxviz  # noqa: E402
from fxviz.torchbridge.tracelog import structured_trace  # noqa: E402
from tests.inside_models import ConvNeXt, Residual  # noqa: E402


class _Keep:
    """A pre-grad pass that changes nothing and keeps the graph Inductor compiles."""

    def __init__(self) -> None:
        self.graphs: list[Any] = []

    def __call__(self, graph: Any) -> None:
        self.graphs.append(graph)


def _path(dynamo_path: str) -> str:
    """Dynamo's ``L['self'].block.layers[0]`` -> ``block.layers.0``."""
    p = re.sub(r"^L\['[^']+'\]\.?", "", dynamo_path)
    return re.sub(r"\[(\d+)\]", r".\1", p).strip(".")


def _torch_modules(mapping: dict[str, Any], pre_graph: Any) -> dict[str, list[str]]:
    """Provenance handle -> the modules of its nodes, innermost module of each, first seen first,
    as torch's records alone give them."""
    stacks = {n.name: n.meta.get("nn_module_stack") for n in pre_graph.nodes}
    out: dict[str, list[str]] = {}
    for handle, post in mapping["cppCodeToPost"].items():
        mods: list[str] = []
        for p in post:
            for pre in mapping["postToPre"].get(p, ()):
                st = stacks.get(pre)
                m = _path(list(st.values())[-1][0]) if st else ""
                if m not in mods:
                    mods.append(m)
        out[handle] = mods
    return out


@contextlib.contextmanager
def _built() -> Iterator[list[str]]:
    """The C++ kernel objects Inductor's code generator builds while the block runs: each
    ``CppKernelProxy`` (one loop nest) and each ``OuterLoopFusedKernel`` (nests merged)."""
    from torch._inductor.codegen import cpp

    built: list[str] = []
    classes = (cpp.CppKernelProxy, cpp.OuterLoopFusedKernel)
    saved = [cls.__init__ for cls in classes]

    def counting(init: Any) -> Any:
        def wrapped(self: Any, *a: Any, **k: Any) -> None:
            built.append(type(self).__name__)
            init(self, *a, **k)
        return wrapped

    for cls, init in zip(classes, saved, strict=True):
        cls.__init__ = counting(init)  # type: ignore[method-assign]
    try:
        yield built
    finally:
        for cls, init in zip(classes, saved, strict=True):
            cls.__init__ = init  # type: ignore[method-assign]


def _compile(model: nn.Module, args: tuple[Any, ...]) -> dict[str, Any]:
    import torch._inductor.config as inductor_config
    from torch._inductor import metrics

    keep = _Keep()
    torch._dynamo.reset()
    before = metrics.generated_kernel_count
    with structured_trace() as events, inductor_config.patch({"force_disable_caches": True,
                                                                "pre_grad_custom_pass": keep}), _built() as built:
        cm = fxviz.compile_map(model, args, backend="inductor", inside=True)
    payloads = {}
    for meta, p in events:
        name = meta.get("artifact", {}).get("name") or ("inductor_output_code" if "inductor_output_code" in meta else "")
        payloads.setdefault(name, []).append(p)
    return {"cm": cm, "pre": keep.graphs, "count": metrics.generated_kernel_count - before, "built": built,
            "maps": [json.loads(p) for p in payloads.get("inductor_provenance_tracking_node_mappings", [])],
            "codes": payloads.get("inductor_output_code", []),
            "stacks": [json.loads(p) for p in payloads.get("inductor_provenance_tracking_kernel_stack_traces", [])]}


@pytest.fixture(scope="module")
def residual() -> dict[str, Any]:
    torch.manual_seed(0)
    return _compile(Residual(), (torch.randn(4, 16),))


@pytest.fixture(scope="module")
def convnext() -> dict[str, Any]:
    torch.manual_seed(0)
    return _compile(ConvNeXt(), (torch.randn(1, 3, 16, 16),))


@pytest.mark.parametrize("run", ["residual", "convnext"])
def test_each_kernels_modules_are_torchs_provenance(run: str, request: pytest.FixtureRequest) -> None:
    r = request.getfixturevalue(run)
    inside = r["cm"].inside
    assert inside is not None and len(inside.graphs) == 1 and len(r["maps"]) == 1 and len(r["pre"]) == 1
    theirs = _torch_modules(r["maps"][0], r["pre"][0])
    mine = {k.id: k.modules for k in inside.kernels if k.calls}
    assert list(mine) == list(theirs)  # every kernel call, in the order call() runs them
    assert mine == theirs
    # a fusion across module boundaries is attributed to each module it spans
    assert any(len(m) > 1 for m in theirs.values())
    # the user lines shown are those of torch's kernel stack traces, innermost file name and line
    assert len(r["stacks"]) == 1
    for k in inside.kernels:
        if k.calls:
            frames = re.findall(r'File "([^"]+)", line (\d+)', "\n".join(r["stacks"][0].get(k.id, ())))
            assert k.lines == list(dict.fromkeys(f"{f.rsplit('/', 1)[-1]}:{n}" for f, n in frames)), k.id
    assert any(k.lines for k in inside.kernels)


def test_residual_fusions_span_the_add_and_the_norm(residual: dict[str, Any]) -> None:
    fused = [k for k in residual["cm"].inside.kernels if "layer_norm" in k.name]
    assert [k.modules for k in fused] == [["ln", ""], ["", "ln2"]]  # the add is the model's own op


def test_generated_kernel_count_is_not_the_kernels_defined(convnext: dict[str, Any]) -> None:
    """torch's counter counts the kernel objects Inductor's code generator constructs (on CPU one
    per ``CppKernelProxy``, including those built only to try an outer-loop fusion), summed over
    every compile since ``metrics.reset()``; fxviz lists the kernels the output code defines."""
    code = convnext["codes"][0]
    defined = set(re.findall(r"^(\w+) = async_compile\.\w+\(", code, re.M))
    mine = {k.name for k in convnext["cm"].inside.kernels if k.kind != "extern"}
    assert mine == defined
    assert convnext["count"] >= len(defined)
    assert convnext["count"] != len(defined)  # the README's --inside section says why
    # what it counts: every C++ kernel object code generation built, thrown away or not
    assert convnext["count"] == len(convnext["built"])
    assert convnext["built"].count("CppKernelProxy") > len(defined)


def test_per_kernel_reports_each_kernel_in_its_modules() -> None:
    """``--per-kernel``: every kernel call of the output code, in the order ``call()`` runs them
    (its provenance comments), each reported in a module torch's provenance gives that kernel."""
    import torch._inductor.config as inductor_config

    from fxviz.analyze.numerics import numerics

    torch.manual_seed(0)
    keep = _Keep()
    torch._dynamo.reset()
    with structured_trace() as events, inductor_config.patch({"pre_grad_custom_pass": keep}):
        r = numerics(Residual(), (torch.randn(4, 16),), against="compile:inductor", per_kernel=True)
    events = list(events)
    maps = [json.loads(p) for meta, p in events if meta.get("artifact", {}).get("name") ==
            "inductor_provenance_tracking_node_mappings"]
    codes = [p for meta, p in events if "inductor_output_code" in meta]
    assert len(maps) == len(codes) == len(keep.graphs) == 1 and r.kernels is not None
    order = re.findall(r"# \[Provenance debug handles\] (\S+)", codes[0])
    assert [k.handle for k in r.kernels] == order
    theirs = _torch_modules(maps[0], keep.graphs[0])
    for k in r.kernels:
        assert k.module in theirs[k.handle], (k.handle, k.module, theirs[k.handle])
