"""What the eager tracer keys its per-op caches by: each fact must stay the fact of the object it was
worked out for, however the caches are keyed for speed (issue 18, point 9)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

from fxviz.fallback import trace_eager
from fxviz.ir import Ref
from fxviz.torchbridge.guard import named_modules
from fxviz.torchbridge.values import mark_tied

TWIN = '''import torch
from torch import nn


class Block(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2
'''


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)
    return mod


def test_twin_forwards_in_two_files_each_get_their_own_source_lines(tmp_path: Path) -> None:
    # the same text in two files compiles to code objects that compare equal (a code object's
    # equality ignores its file name): the tracer's line cache once gave the second file's ops
    # the first file's location
    for p in (tmp_path / "twin_a.py", tmp_path / "twin_b.py"):
        p.write_text(TWIN)
    a, b = (_load(tmp_path / f"twin_{k}.py") for k in "ab")
    try:
        assert a.Block.forward.__code__ == b.Block.forward.__code__  # what made them collide
        g = trace_eager(nn.Sequential(a.Block(), b.Block()), (torch.randn(2),))
        files = {n.name: (n.module, n.source.file if n.source else None, n.source.line if n.source else None)
                 for n in g.ops}
        # Python's own record of where each forward is: its code object
        ca, cb = a.Block.forward.__code__, b.Block.forward.__code__
        line = ca.co_firstlineno + 1
        assert files == {
            "relu": ("0", ca.co_filename, line), "mul": ("0", ca.co_filename, line),
            "relu_1": ("1", cb.co_filename, line), "mul_1": ("1", cb.co_filename, line),
        }
        assert ca.co_filename != cb.co_filename
    finally:
        sys.modules.pop("twin_a", None)
        sys.modules.pop("twin_b", None)


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.shared = nn.Linear(4, 4)
        self.again = self.shared  # one module under two paths
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.norm = nn.BatchNorm1d(4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.again(self.shared(self.emb(ids)))))


def test_tied_tensors_are_named_as_torch_lists_them() -> None:
    """``mark_tied`` reads one walk of the modules; the names and their order are torch's own
    (``named_parameters`` / ``named_buffers`` with ``remove_duplicate=False``)."""
    torch.manual_seed(0)
    model = _Tied().eval()
    g = trace_eager(model, (torch.tensor([1, 2, 3]),))
    names: dict[int, list[str]] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        names.setdefault(id(t), []).append(name)
    tied = {ns[0]: ns[1:] for ns in names.values() if len(ns) > 1}
    assert tied == {"emb.weight": ["head.weight"], "shared.weight": ["again.weight"],
                    "shared.bias": ["again.bias"]}
    state = {n.target: n for n in g.nodes if n.kind in ("parameter", "buffer")}
    assert {t: n.attrs["shared_with"] for t, n in state.items() if "shared_with" in n.attrs} == tied
    # the walk given by the caller and the one mark_tied makes itself agree
    for n in g.nodes:
        n.attrs.pop("shared_with", None)
    mark_tied(g.nodes, model, named_modules(model, remove_duplicate=False))
    assert {n.target: n.attrs["shared_with"] for n in g.nodes if "shared_with" in n.attrs} == tied


class _TiedOnly(nn.Module):
    """A tensor under two names with no module met twice (a tied weight alone)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids))


class _SharedOnly(nn.Module):
    """A module met under two paths, no tensor shared otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = self.a

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def _torch_ties(model: nn.Module) -> dict[str, list[str]]:
    names: dict[int, list[str]] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        names.setdefault(id(t), []).append(name)
    return {ns[0]: ns[1:] for ns in names.values() if len(ns) > 1}


def test_ties_found_by_either_sign_the_recorder_reads() -> None:
    """The tracer runs ``mark_tied`` only when its own walk saw a tensor under two names or a
    module under two paths: each alone still gives torch's ties, and a model with none has none."""
    torch.manual_seed(0)
    cases = [(_TiedOnly(), (torch.tensor([1, 2]),)), (_SharedOnly(), (torch.randn(2, 4),)),
             (nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),))]
    expected = [{"emb.weight": ["head.weight"]}, {"a.weight": ["b.weight"], "a.bias": ["b.bias"]}, {}]
    for (model, args), want in zip(cases, expected, strict=True):
        g = trace_eager(model.eval(), args)
        assert _torch_ties(model) == want
        got = {n.target: n.attrs["shared_with"] for n in g.nodes if "shared_with" in n.attrs}
        assert got == want


class _Lines(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = torch.relu(x) + 1  # one line, two ops, run three times
        y = (torch.sigmoid(x)
             * torch.tanh(x))  # one statement over two lines
        return y


class _Where(torch.overrides.TorchFunctionMode):
    """Python's own record of each call's line: ``f_lineno`` of the calling frame."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[int] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.lines.append(sys._getframe(1).f_lineno)
        return func(*args, **(kwargs or {}))


def test_source_lines_cached_per_instruction_are_pythons_own() -> None:
    """The tracer caches an op's location per instruction of a frame's code (``f_lasti``); each
    op's line is still the line Python itself reports for the call (``f_lineno``)."""
    model, x = _Lines(), torch.randn(3)
    where = _Where()
    with where:
        model(x)
    g = trace_eager(model, (x,))
    assert [n.source.line if n.source else None for n in g.ops] == where.lines
    assert len(set(where.lines)) == 3  # the loop's line, and the statement's two lines


class _Scalars(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.dropout(x * 0.5, p=0.25, training=False)
        y = y.view(y.size()) + float("inf")
        y = torch.pow(y, -0.0).clamp(min=-1.5, max=float("nan"))
        return torch.nn.functional.layer_norm(y, (y.shape[-1],), eps=1e-5)


class _Tuple(tuple):  # type: ignore[type-arg]
    """A tuple subclass: :func:`encode`'s general path for sequences."""


def test_scalar_and_size_arguments_are_recorded_as_the_general_encoding_records_them() -> None:
    """The tracer takes finite floats as plain arguments without :func:`encode`, and encodes a
    ``torch.Size`` by the fast path for tuples of plain items: the attrs are what the general
    encoding gives (display, and an exact form only where the display loses something)."""
    from fxviz.fallback.values import encode

    g = trace_eager(_Scalars(), (torch.randn(3, 4),))
    by_target = {n.target: n for n in g.ops}
    never = lambda t: pytest.fail("no tensor here")  # noqa: E731
    cases = [("Tensor.mul", "arg1", 0.5), ("torch.nn.functional.dropout", "p", 0.25),
             ("Tensor.add", "arg1", float("inf")), ("torch.pow", "arg1", -0.0),
             ("Tensor.clamp", "min", -1.5), ("Tensor.clamp", "max", float("nan")),
             ("torch.nn.functional.layer_norm", "eps", 1e-5), ("Tensor.view", "arg1", torch.Size([3, 4]))]
    for target, key, value in cases:
        attrs = by_target[target].attrs
        display, exact = encode(value, never)
        assert attrs[key] == display, (target, key)
        assert attrs.get("py", {}).get(key) == exact, (target, key)
    assert encode(torch.Size([3, 4]), never) == encode(_Tuple((3, 4)), never) == ([3, 4], {"tuple": [3, 4]})
    assert by_target["Tensor.add"].attrs["py"] == {"arg1": {"float": "inf"}}
    assert by_target["torch.pow"].attrs["arg1"] == 0.0 and str(by_target["torch.pow"].attrs["arg1"]) == "-0.0"


def test_opaque_found_at_any_depth() -> None:
    from fxviz.fallback.values import has_opaque

    assert has_opaque({"a": {"list": [1, {"tuple": [2, {"opaque": "function"}]}]}})
    assert has_opaque([{"opaque": "generator"}])
    assert not has_opaque({"a": {"tuple": [1, 2, 3]}, "b": {"list": ["x", {"slice": [None, 2, None]}]}})


def test_torch_loggers_quiet_during_an_attempt_and_as_before_after() -> None:
    """:func:`quiet_torch` sets the levels with one clearing of logging's caches: every logger's
    answer (cached by ``isEnabledFor``) follows the levels in and after the block."""
    import logging

    from fxviz.torchbridge.run import quiet_torch

    child, own = logging.getLogger("torch.fxviz_test.child"), logging.getLogger("torch.fxviz_test")
    own.setLevel(logging.DEBUG)
    try:
        assert child.isEnabledFor(logging.INFO) and own.isEnabledFor(logging.DEBUG)  # cached now
        with quiet_torch():
            assert not child.isEnabledFor(logging.INFO) and not own.isEnabledFor(logging.ERROR)
            assert own.level == logging.CRITICAL
        assert child.isEnabledFor(logging.INFO) and own.isEnabledFor(logging.DEBUG)
        assert own.level == logging.DEBUG
    finally:
        own.setLevel(logging.NOTSET)


def test_torch_loggers_made_between_and_during_attempts_are_quieted_and_put_back() -> None:
    """The list of torch's loggers is kept between captures (filtering transformers' ~400 loggers
    by name twice per capture, and clearing every logger's cache, was ~0.9 M instructions of a
    gpt2-narrow capture): a logger made since (a placeholder turned into a logger, at the same
    place in logging's registry) is quieted like the others, and one made inside the block, whose
    cache answered under the quiet levels, answers as its levels say after it."""
    import logging

    from fxviz.torchbridge.run import quiet_torch

    logging.getLogger("torch.fxviz_kept.a.leaf")  # "torch.fxviz_kept.a" is a placeholder now
    with quiet_torch():
        pass
    made = logging.getLogger("torch.fxviz_kept.a")  # the placeholder, now a logger of its own
    made.setLevel(logging.DEBUG)
    try:
        with quiet_torch():
            assert made.level == logging.CRITICAL and not made.isEnabledFor(logging.ERROR)
            inside = logging.getLogger("torch.fxviz_kept.inside")
            assert not inside.isEnabledFor(logging.ERROR)  # cached under the quiet level
        assert made.level == logging.DEBUG and made.isEnabledFor(logging.DEBUG)
        assert inside.isEnabledFor(logging.ERROR) == logging.getLogger("torch").isEnabledFor(logging.ERROR)
    finally:
        made.setLevel(logging.NOTSET)


def test_torchs_structured_trace_keeps_its_records_while_fxviz_quiets_torch() -> None:
    """torch's structured-trace logger is "always at debug level" and prints nothing: a user's
    ``TORCH_TRACE`` file must get the records of compiles fxviz runs. A handler on it sees
    Dynamo's records of a compile map run inside :func:`quiet_torch`'s block."""
    import logging

    from torch._logging._internal import trace_log

    from fxviz.analyze.compilemap import compile_map
    from fxviz.torchbridge.run import quiet_torch

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(next(iter(record.metadata)) if isinstance(getattr(record, "metadata", None), dict) else "")

    level, h = trace_log.level, Keep()
    trace_log.setLevel(logging.DEBUG)
    trace_log.addHandler(h)
    try:
        with quiet_torch():
            assert trace_log.level == logging.DEBUG and trace_log.isEnabledFor(logging.DEBUG)
        compile_map(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),), backend="eager")
    finally:
        trace_log.removeHandler(h)
        trace_log.setLevel(level)
    assert "dynamo_start" in seen and "dynamo_output_graph" in seen


def test_tensor_keyword_arguments_are_recorded_as_the_general_encoding_records_them() -> None:
    """A tensor passed by keyword (``layer_norm(..., weight=w)``) is read without :func:`encode`'s
    reader: an input of the node, shown as ``%name`` with its exact form, as encode gives."""
    from fxviz.fallback.values import encode

    norm = nn.LayerNorm(4)
    g = trace_eager(norm, (torch.randn(2, 4),))
    op = next(n for n in g.ops if n.target == "torch.nn.functional.layer_norm")
    names = {n.target: n.name for n in g.nodes if n.kind == "parameter"}
    refs = {norm.weight: names["weight"], norm.bias: names["bias"]}
    inputs: list[str] = []
    for key, t in (("weight", norm.weight), ("bias", norm.bias)):
        display, exact = encode(t, lambda t: (inputs.append(refs[t]), Ref(refs[t]))[1])
        assert op.attrs[key] == display and op.attrs["py"][key] == exact
    assert [r.node for r in op.inputs][1:] == inputs


def test_plain_tuple_arguments_are_recorded_as_the_general_encoding_records_them() -> None:
    """A shape or a tuple of dims (``x.view(x.size())``, ``layer_norm``'s normalized shape,
    ``x.permute((1, 0))``) is encoded inline without :func:`encode`: the same display and exact
    form, and no replay blocker."""
    from fxviz.fallback.values import encode

    class Shapes(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x.view(x.size()).permute((1, 0)).reshape((2, 4))
            y = torch.nn.functional.layer_norm(y, (4,), eps=1e-5)
            return y.view(torch.Size([8])).sum((0,), keepdim=False) + x.new_zeros((1,), dtype=torch.float32)

    g = trace_eager(Shapes(), (torch.randn(2, 4),))
    seen = 0
    for op in g.ops:
        for key, value in op.attrs.items():
            if key in ("py", "dtype") or not isinstance(value, list):
                continue
            display, exact = encode(tuple(value), lambda t: Ref("unused"))
            assert value == display and op.attrs["py"][key] == exact, (op.name, key)
            seen += 1
    assert seen == 7  # view, permute, reshape, layer_norm, view, sum, new_zeros
    assert g.annotations["replay"] == {"ok": True}
