"""Numerics: where another way of running a model changes its numbers, per op and per module call,
against eager float32.

:func:`numerics` runs the model eagerly once under the eager tracer's recorder (the results land on
the graph ``fxviz.capture(method="eager")`` draws) and, in the same run, the other side:

- ``dtype:bfloat16`` / ``dtype:float16`` / ``autocast:bfloat16`` by shadow execution
  (:mod:`~fxviz.analyze.numerics.shadow`): each op again on low-precision shadows of its inputs;
- ``export`` / ``decompose`` by stepping the ExportedProgram's graph in step with the eager run
  (:mod:`~fxviz.analyze.numerics.program`), aligned per module call and per op by
  :func:`fxviz.graphdiff.diff`;
- ``compile[:backend]`` by watching each compiled Dynamo graph's calls (:mod:`~fxviz.analyze.numerics.compiled`):
  every value that enters or leaves compiled code, and with ``aot_eager`` each ATen node of the
  AOT forward graph, compared with the eager op it belongs to.

Every value is reduced to an :class:`Error` (max abs, max rel, cosine, SNR; :mod:`.metrics`) as
soon as both sides have it, so memory stays near one forward. What an empty op returns
(``torch.empty_like``) is memory not yet written: never compared; the in-place write that fills it
is. Eager runs twice, fingerprinted, and a value eager does not reproduce is beyond tolerance only
past its own noise (:mod:`.floor`). The result (:class:`Numerics`,
:mod:`.result`, torch-free) names the first divergence, where the error is born (:mod:`.find`),
and writes the ``error`` overlay and the ``divergence`` panel on the eager graph.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from fxviz.analyze.numerics.compiled import budget, compiled_errors
from fxviz.analyze.numerics.find import births, module_errors
from fxviz.analyze.numerics.floor import Prints, settle
from fxviz.analyze.numerics.gradresult import annotate_grads
from fxviz.analyze.numerics.grads import gradient_errors
from fxviz.analyze.numerics.kernelresult import kernel_note
from fxviz.analyze.numerics.kernels import KernelWatch
from fxviz.analyze.numerics.metrics import FLOAT32, TOLERANCES, tolerance
from fxviz.analyze.numerics.program import ProgramWatcher, aligned, export_program, stage_program
from fxviz.analyze.numerics.result import Error, Numerics, annotate
from fxviz.analyze.numerics.run import SameRng, Watcher, Watchers, run_eager
from fxviz.analyze.numerics.shadow import ShadowWatcher
from fxviz.analyze.pipeline.run import DEFAULT_PASSES
from fxviz.analyze.pipeline.steps import steps_of
from fxviz.errors import InputError, TargetError
from fxviz.fallback.trace import uses_meta
from fxviz.ir import Graph
from fxviz.torchbridge.lazy import initialised
from fxviz.torchbridge.normalize import flatten_inputs
from fxviz.torchbridge.run import normalize_args, quiet_torch
from fxviz.torchbridge.training import check_trainable

#: The sides :func:`numerics` compares against (``compile`` takes ``:backend``).
SIDES = ("export", "decompose", "compile", "dtype:bfloat16", "dtype:float16", "autocast:bfloat16", "stage:N")
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
#: Short names of sides.
_ALIASES = {"bf16": "dtype:bfloat16", "fp16": "dtype:float16"}


def numerics(
    model: nn.Module,
    args: Any = (),
    kwargs: dict[str, Any] | None = None,
    *,
    against: str = "export",
    rtol: float | None = None,
    atol: float | None = None,
    seed: int | None = 0,
    decompositions: Mapping[Any, Any] | None = None,
    passes: Sequence[Any] | None = None,
    per_kernel: bool = False,
    backward: bool = False,
    loss: Any = None,
) -> Numerics:
    """Compare ``model(*args, **kwargs)`` run eagerly in float32 with the same model run another
    way (``against``, one of :data:`SIDES`), op by op and module call by module call.

    ``rtol``/``atol`` override the tolerance of the side's dtype (:func:`~.metrics.tolerance`: for
    bfloat16 and float16 four unit roundoffs from ``torch.finfo``, what the dtype is expected to give;
    float32 sides torch.testing's): a value is beyond it when ``‖other − eager‖₂ > atol·√n + rtol·‖eager‖₂``. ``seed`` seeds torch's RNG
    before the run (``None``: leave it). ``decompositions`` (op overload -> function) are added to
    torch's default table for ``against="decompose"``, and given to AOT Autograd for
    ``against="compile:aot_eager"``. ``against="stage:N"`` compares stage N of
    the pass pipeline (:func:`fxviz.pipeline`: export, then ``passes``, by default ``["decompose"]``;
    stage 0 is the export). ``per_kernel`` (with ``against="compile:inductor"``): every
    Inductor kernel's output buffers are compared with the eager values of the ops it replaces
    (:mod:`~fxviz.analyze.numerics.kernels`); ``result.kernels`` lists them in execution order and
    ``result.first_kernel`` is the first beyond tolerance. Inputs must be real tensors: on ``meta``
    or fake there are no numbers to compare (:class:`~fxviz.errors.InputError`). ``backward``: one
    training step too (``loss=fn(output) -> scalar``, default the sum of the outputs), each
    parameter's gradient compared at the same tolerance (``result.grads``: per parameter, per
    module, and ``grads.first``, the first module in backward order beyond tolerance;
    :mod:`~fxviz.analyze.numerics.grads`); the ``grad_error`` overlay on the parameter nodes.

        >>> r = fxviz.numerics(gpt2, (ids,), against="dtype:bfloat16")
        >>> r.headline()
        'GPT2LMHeadModel against dtype:bfloat16: ... all within what bfloat16 is expected to give ...'
        >>> r = fxviz.numerics(gpt2, (ids,), against="dtype:bfloat16", rtol=2**-8)  # one rounding's worth
        >>> r.where(r.first)
        'addmm (torch.addmm) in transformer.h.0.attn.c_attn at pytorch_utils.py:119'
        >>> r.worst_snr()   # dB, the module call whose output drifted most
        42.2
        >>> print(r.tree(depth=2))   # the module tree with an error column, the divergence panel
    """
    rng = torch.get_rng_state()  # the runs seed torch's RNG: the caller's state is given back
    try:
        return _numerics(model, args, kwargs, against=against, rtol=rtol, atol=atol, seed=seed,
                         decompositions=decompositions, passes=passes, per_kernel=per_kernel, backward=backward,
                         loss=loss)
    finally:
        torch.set_rng_state(rng)


def check_options(against: str, *, per_kernel: bool = False, backward: bool = False,
                  passes: Sequence[Any] | None = None, decompositions: Mapping[Any, Any] | None = None,
                  rtol: float | None = None, atol: float | None = None) -> tuple[str, str, str]:
    """``against`` in full, its side and its detail, or the :class:`~fxviz.errors.TargetError` that
    refuses the combination of options, before anything runs: every refusal that needs only the
    options (not the model) is made here, so a wrong combination costs no export, compile or run.

        >>> check_options("bf16")
        ('dtype:bfloat16', 'dtype', 'bfloat16')
        >>> check_options("stage:1", backward=True)   # raises TargetError: --backward compares gradients ...
    """
    for flag, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not value >= 0:  # a negative or NaN tolerance puts every value beyond it
            raise TargetError(f"--{flag} {value}: a tolerance is a number >= 0 (0: only exact values are within)")
    against = _ALIASES.get(against, against)
    side, _, detail = against.partition(":")
    if side not in ("export", "decompose", "compile", "dtype", "autocast", "stage"):
        raise TargetError(f"--against {against!r} is not one of {', '.join(SIDES)} (compile takes :backend)")
    if side in ("dtype", "autocast") and (detail not in _DTYPES or (side == "autocast" and detail != "bfloat16")):
        raise TargetError(f"{against!r}: give dtype:bfloat16, dtype:float16 or autocast:bfloat16")
    if side in ("export", "decompose") and detail:
        raise TargetError(f"{against!r}: {side} takes no ':' part")
    if side == "stage" and not detail.isdigit():
        raise TargetError(f"{against!r}: give stage:N, N a stage of the pass pipeline (0: the export)")
    if per_kernel and (side != "compile" or (detail or "inductor") != "inductor"):
        raise TargetError(f"per-kernel numerics compare Inductor's kernels: use --against compile:inductor, not {against!r}")
    if passes and side != "stage":
        raise TargetError("--pass applies to --against stage:N (a stage of the pass pipeline)")
    if decompositions and not (side == "decompose" or (side == "compile" and detail == "aot_eager")):
        raise TargetError(f"decompositions apply to --against decompose and compile:aot_eager, not {against}")
    if backward and side == "stage":
        raise TargetError(f"--backward compares gradients against compile[:backend], export, decompose, dtype:bfloat16, "
                          f"dtype:float16 or autocast:bfloat16, not {against!r}: leave --backward out for a stage of "
                          "the pass pipeline, or compare gradients with --against decompose")
    if side == "stage":
        # the stages the pipeline will have (export, then one per pass): known before anything runs
        names = ["export", *(s.name for s in steps_of(DEFAULT_PASSES if passes is None else passes))]
        if int(detail) >= len(names):
            raise TargetError(f"stage:{detail}: the pipeline has stages 0 to {len(names) - 1} "
                              f"({', '.join(f'{i} {n}' for i, n in enumerate(names))})")
    return against, side, detail


def _numerics(model: nn.Module, args: Any, kwargs: dict[str, Any] | None, *, against: str, rtol: float | None,
              atol: float | None, seed: int | None, decompositions: Mapping[Any, Any] | None,
              passes: Sequence[Any] | None, per_kernel: bool, backward: bool, loss: Any) -> Numerics:
    against, side, detail = check_options(against, per_kernel=per_kernel, backward=backward, passes=passes,
                                          decompositions=decompositions, rtol=rtol, atol=atol)
    args, kwargs = normalize_args(model, args, kwargs)
    if backward:
        check_trainable(model, args)  # before the forward's runs: a model with nothing to train is refused now
    _check_real(model, args, kwargs)
    model, notes = initialised(model, args, kwargs)  # a copy, when lazy modules wait for a first forward
    t0 = time.perf_counter()
    watch: KernelWatch | None = None
    same_rng = SameRng(seed)

    def run(watcher: Watcher) -> Graph:  # one eager run, from the same RNG state as every other
        same_rng()
        return run_eager(model, args, kwargs, watcher, seed=None)[0]

    expected = ""  # the low-precision dtype whose expected error the default tolerance stands for
    prints = Prints(), Prints()  # two eager runs' fingerprints: the noise floor
    with quiet_torch():
        if side in ("dtype", "autocast"):
            dtype = _DTYPES[detail]
            expected = detail if rtol is None and atol is None else ""
            r_default, a_default = tolerance(dtype)
            rtol, atol = (rtol if rtol is not None else r_default), (atol if atol is not None else a_default)
            shadow = ShadowWatcher(dtype, autocast=side == "autocast", rtol=rtol, atol=atol)
            run(prints[0])
            graph = run(Watchers(shadow, prints[1]))
            errors, random = shadow.errors, shadow.random
            seconds = {"run": time.perf_counter() - t0}
            if shadow.raised:  # a finding: without this note the headline said "all within"
                notes.append(f"{len(shadow.raised)} op(s) raised in {dtype} ({', '.join(shadow.raised[:5])}"
                             f"{', ...' if len(shadow.raised) > 5 else ''}): not compared, and the ops after them "
                             "start again from eager's value")
        elif side in ("export", "decompose", "stage"):
            rtol, atol = (rtol if rtol is not None else FLOAT32[0]), (atol if atol is not None else FLOAT32[1])
            if side == "stage":
                ep, program_graph, inputs, name = stage_program(model, args, kwargs, int(detail), passes)
                notes.append(f"stage {detail} of the pass pipeline: {name}")
            else:
                ep, program_graph, inputs = export_program(model, args, kwargs, decompose=side == "decompose",
                                                           decompositions=decompositions)
            t1 = time.perf_counter()
            first = run(prints[0])
            pairs = aligned(program_graph, first)
            t2 = time.perf_counter()
            watcher = ProgramWatcher(ep.graph_module, inputs, pairs, rtol=rtol, atol=atol)
            graph = run(Watchers(watcher, prints[1]))
            if [n.name for n in graph.nodes] != [n.name for n in first.nodes]:
                notes.append("the model ran differently the second time: the alignment may be off")
            errors, random = watcher.errors, watcher.not_comparable
            unaligned = sum(1 for n in graph.ops if n.name not in pairs)
            if unaligned:
                notes.append(f"{unaligned} eager op(s) have no counterpart in the program (views and "
                             "in-place ops export rewrites, or ops it folded away): not compared")
            seconds = {"export": t1 - t0, "align": t2 - t1, "run": time.perf_counter() - t2}
        elif side == "compile":
            rtol, atol = (rtol if rtol is not None else FLOAT32[0]), (atol if atol is not None else FLOAT32[1])
            watch = KernelWatch(model, rtol=rtol, atol=atol) if per_kernel else None
            found = compiled_errors(model, args, kwargs, backend=detail or "inductor", rtol=rtol, atol=atol,
                                    seed=seed, decompositions=decompositions, kernels=watch)
            graph, errors, random, seconds = found.graph, found.errors, found.random, found.seconds
            notes.extend(found.notes)
        else:  # pragma: no cover - every side is handled above
            raise TargetError(f"--against {against!r} is not one of {', '.join(SIDES)}")
        if side != "compile":  # the compile side settles its own floor, with its own runs
            t3 = time.perf_counter()
            notes.extend(settle(errors, *prints, run, budget=budget(model), rtol=rtol, atol=atol))
            seconds["floor"] = time.perf_counter() - t3
    flat = {k: w for k, v in errors.items() if (w := Error.worst(v)) is not None}
    result = Numerics(against=against, rtol=rtol, atol=atol, expected=expected, graph=graph, nodes=flat,
                      modules=module_errors(graph, errors), not_comparable=list(random), notes=notes,
                      seconds=seconds)
    if watch is not None:
        result.kernels = watch.checks()
        notes.extend([kernel_note(result.kernels), *watch.notes])
    result.births = births(graph, flat)
    result.first = result.births[0] if result.births else None
    if backward:
        t4 = time.perf_counter()
        with quiet_torch():
            result.grads = gradient_errors(model, args, kwargs, against=against, rtol=rtol, atol=atol, loss=loss,
                                           seed=seed)
        result.seconds["grads"] = time.perf_counter() - t4
    annotate(result)
    if result.grads is not None:
        annotate_grads(graph, result.grads, against)
    return result


def _check_real(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    from torch._subclasses.fake_tensor import FakeTensor

    fake = any(isinstance(t, FakeTensor) for t in flatten_inputs(model, args, kwargs).tensors) or \
        any(isinstance(p, FakeTensor) for p in model.parameters())
    if fake or uses_meta(model, args, kwargs):
        raise InputError(
            f"numerics need real inputs and weights: {type(model).__name__} or its inputs are on "
            f"{'fake tensors' if fake else 'meta'}, which hold no numbers; build the model on cpu or "
            "cuda and pass real tensors (fxviz.capture works on meta)")


__all__ = ["SIDES", "TOLERANCES", "Error", "Numerics", "check_options", "numerics"]
