"""A recompile Dynamo refused at its limit is told from torch's structured record, not from the
words of its message: its compilation metrics entry raised Dynamo's ``Unsupported`` of the break
type torch's graph-break registry files as ``GB0039`` (under every name torch has given that type),
and the limit's value is the dynamo config torch recorded with that compile."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import torch
from torch._dynamo.exc import _load_gb_type_to_gb_id_map
from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

from fxviz.analyze.compilemap import compile_map
from fxviz.analyze.compilemap.failed import FailedFrames
from fxviz.analyze.compilemap.limit import LimitWatch
from fxviz.analyze.compilemap.record import Recording

#: torch's registry id of the refused-recompile break type (its current name in torch 2.13)
LIMIT_ID = _load_gb_type_to_gb_id_map()["Dynamo recompile limit exceeded"]


class Sine(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sin() + 1


def _sets(n: int) -> list[tuple[torch.Tensor]]:
    return [(torch.randn(k + 2, 3),) for k in range(n)]


@pytest.fixture(scope="module")
def run() -> dict[str, Any]:
    """Eleven batch sizes, dynamic=False: the eighth recompile is refused (torch's default limit, 8)."""
    clear_compilation_metrics()  # torch keeps its last 64: a full record would hide this run's entries
    before = len(get_compilation_metrics())
    args, *more = _sets(11)
    cmap = compile_map(Sine(), args, backend="eager", dynamic=False, inputs=more)
    # torch's own record of the run (compile_map raises torch's limit on kept entries while it runs)
    return {"cmap": cmap, "metrics": list(get_compilation_metrics()[before:])}


def _refused(metrics: list[Any]) -> list[Any]:
    """torch's record of the refused compiles: the entries that raised GB0039 (by the registry)."""
    ids = _load_gb_type_to_gb_id_map()
    return [m for m in metrics if m.fail_reason and ids.get(m.fail_reason.split("\n", 1)[0]) == LIMIT_ID]


def test_the_limit_the_map_names_is_torchs_refused_compile(run: dict[str, Any]) -> None:
    cmap, (m,) = run["cmap"], _refused(run["metrics"])
    (lim,) = cmap.limits
    recorded = json.loads(m.dynamo_config)
    assert (lim.compile_id, lim.setting, lim.limit) == (m.compile_id, "recompile_limit", recorded["recompile_limit"])
    assert lim.input_set == 8 and lim.eager_sets == [8, 9, 10]
    # a refused recompile is no frame torch failed to compile: no 'function skipped' row for it
    assert not [g for g in cmap.breaks if g.category == "skip"]


@pytest.fixture
def former(run: dict[str, Any]) -> Any:
    """torch's entry for the refused compile as a torch that spelled the type by its former name
    (the registry lists both under GB0039) records it."""
    (m,) = _refused(run["metrics"])
    names = [t for t, i in _load_gb_type_to_gb_id_map().items() if i == LIMIT_ID]
    old = next(t for t in names if not m.fail_reason.startswith(t))
    current = m.fail_reason.split("\n", 1)[0]
    return dataclasses.replace(m, fail_reason=m.fail_reason.replace(current, old, 1))


def test_a_refusal_under_the_types_former_name_is_a_limit_not_a_skipped_frame(
        former: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Matched by the text 'Dynamo recompile limit exceeded', the refusal was read as a frame torch
    failed to compile (a 'function skipped' row) and no limit was said."""
    monkeypatch.setattr("torch._dynamo.utils.get_compilation_metrics", lambda: [former])
    rec = Recording()
    failed = FailedFrames(rec)
    failed.seen = 0
    failed.take()
    assert rec.breaks == []
    watch = LimitWatch()
    watch.done(0)
    assert [(h.frame, h.setting, h.limit, h.compile_id) for h in watch.hits] == [
        (0, "recompile_limit", json.loads(former.dynamo_config)["recompile_limit"], former.compile_id)]
    from fxviz.analyze.compilemap.limit import limit_refusal
    assert limit_refusal(former) == ("recompile_limit", json.loads(former.dynamo_config)["recompile_limit"])


def test_another_failure_is_no_limit(run: dict[str, Any]) -> None:
    """Dynamo's hard failure at the limit (fail_on_recompile_limit_hit) is not the refusal that runs
    the frame eagerly: torch raises it to the caller."""
    from fxviz.analyze.compilemap.limit import limit_refusal

    (m,) = _refused(run["metrics"])
    hard = dataclasses.replace(m, fail_type="FailOnRecompileLimitHit")
    assert limit_refusal(hard) is None and limit_refusal(m) is not None
