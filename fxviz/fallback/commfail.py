"""Why a sharded capture failed, in one line: a collective that ran out of time (a rank that never
issued it), what torch's fake process group cannot do (a receive it has nothing to deliver), a
pipeline schedule's step under fxviz's ``no_grad``, shards that do not split evenly. Each reads
the exception torch raised and the collectives recorded up to it (:mod:`fxviz.fallback.comms`)."""

from __future__ import annotations

import inspect
import math
import re
from typing import Any

import torch.distributed as dist
from torch.distributed.tensor import DTensor

#: how torch words a collective that ran out of time: NCCL's watchdog, gloo's wait on a peer (a
#: ``RuntimeError``), and gloo's later ops on the pair a timeout closed
TIMEOUT = re.compile(r"collective operation timeout|timed out waiting|application timeout|timed out after", re.I)


#: gloo's words when the rank a collective waits on has ended (its process exited or was killed)
PEER_GONE = re.compile(r"Connection (?:closed|reset) by peer", re.I)


def first_line(e: BaseException) -> str:
    """torch's message without the C++ file gloo puts in front (``[.../unbound_buffer.cc:78] ``)."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return re.sub(r"^\[[^\]]*\]\s*", "", text)


def timed_out(error: BaseException, records: list[dict[str, Any]]) -> str | None:
    """One line for a capture that failed because a collective never returned: the one that hung
    (the last issued: a blocking collective waits before the next is issued), where, and what torch
    said; ``None`` when ``error`` (or its cause) is no collective timeout."""
    cause = error.__cause__ or error
    gone = PEER_GONE.search(str(cause))
    if not records or not (isinstance(cause, dist.DistBackendError) or TIMEOUT.search(str(cause)) or gone):
        return None
    last = records[-1]
    last.setdefault("error", first_line(cause))
    last["timed_out"] = True
    where = f" in {last['module'] or 'the model'}" + (f" ({last['source']})" if last.get("source") else "")
    if gone:  # gloo: the rank it waited on ended first (timed out in another collective, or failed)
        return (f"a collective never returned: {last['kind']} on group {last['group'] or '?'} "
                f"({last['group_size'] or '?'} ranks){where} lost its peer ({gone.group(0)}): another rank ended "
                f"first, timed out in a collective of its own or failed (its line says which); the partial graph "
                f"(err.graph) keeps the {len(records)} collectives issued, this one marked timed_out")
    return (f"a collective never returned: {last['kind']} on group {last['group'] or '?'} "
            f"({last['group_size'] or '?'} ranks){where} waited past the process group's timeout "
            f"({first_line(cause)}); some rank did not issue it or issued another collective first; the "
            f"partial graph (err.graph) keeps the {len(records)} collectives issued, this one marked timed_out")


def fake_cannot(error: BaseException, records: list[dict[str, Any]], fake: bool = True) -> str | None:
    """One line for a capture that failed because the group cannot do what the model asked (``fake``:
    torch's fake one, whose receives deliver nothing): a receive from any source (``dist.recv``
    without ``src``) has no sender to report; ``dist.recv_object_list`` (a pipeline stage's
    metadata) unpickles bytes nobody sent; on any group, a pipeline schedule with a ``loss_fn``
    runs its backward in ``step()``, refused under the ``no_grad`` fxviz records a forward in.
    ``None`` for any other failure (the model's own)."""
    cause = error.__cause__ or error
    pipelined = _raised_in_module(cause, "torch.distributed.pipelining")
    needs_grad = pipelined and "step() requires gradients to be enabled" in str(cause)
    objects = fake and _raised_in(cause, dist.recv_object_list)
    size = dist.get_world_size() if dist.is_initialized() else 0
    then = ("; under the fake process group it then fails where rank 0's stage takes the next stage's metadata "
            f"(recv_object_list: fake receives deliver nothing): launch it with torchrun --nproc-per-node {size}")
    if needs_grad:
        return ("a pipeline schedule with a loss_fn runs its backward in step(), refused under the torch.no_grad() "
                "fxviz records a forward in: call step() inside `with torch.enable_grad():` in the model's forward"
                + (then if fake and size > 1 else ""))
    if pipelined and "Output gradient: ('None',)" in str(cause) and (stage := _static_stage(cause)) is not None:
        return (f"a pipeline stage given its shapes (PipelineStage input_args/output_args) with a loss_fn fails in "
                f"torch's own backward, fxviz or not: torch's static metadata takes requires_grad from those example "
                f"tensors, made without it, so stage {stage}'s output expects no gradient (torch: \"Output gradient: "
                f"None\"); make them with requires_grad=True (output_args of every stage but the last, input_args "
                f"of every stage but the first), or give no shapes and let the stage infer them")
    if pipelined and objects and _raised_in_function(cause, "_backward_metadata_inference"):
        return ("a pipeline schedule (torch.distributed.pipelining) with a loss_fn cannot run its step under the fake "
                "process group: rank 0's stage takes the next stage's gradient metadata from it (recv_object_list), "
                f"and fake receives deliver nothing; launch it with torchrun --nproc-per-node {size}, or give the "
                "schedule no loss_fn to capture its forward here")
    if pipelined and objects:
        return ("a pipeline schedule (torch.distributed.pipelining) with several stages per rank cannot run under the "
                "fake process group: a later stage on rank 0 takes its inputs' metadata from the stage before it, on "
                f"another rank (recv_object_list), and fake receives deliver nothing; launch it with torchrun "
                f"--nproc-per-node {size}, or capture a schedule of one stage per rank here (rank 0's is stage 0)")
    if objects:
        return ("dist.recv_object_list cannot run under the fake process group: no rank sends, so it unpickles "
                f"bytes nobody sent; run on real ranks (torchrun --nproc-per-node {size}), where the other rank sends them")
    if not fake or not records or records[-1]["op"] != "c10d.recv_any_source_" or not _raised_in(cause, dist.recv):
        return None
    last = records[-1]
    last.setdefault("error", first_line(cause))
    where = f" in {last['module'] or 'the model'}" + (f" ({last['source']})" if last.get("source") else "")
    return (f"a receive from any source{where} cannot run under the fake process group: no rank sends, so "
            f"it has no sender to report; pass src= to dist.recv, or run on real ranks (torchrun); the "
            f"partial graph (err.graph) keeps what ran up to it, collectives included ({len(records)}, this "
            f"one marked with its error)")


def sharded_hint(error: BaseException, params: Any) -> str:
    """What to do about a sharded model whose run failed in the fake process group: shards that do
    not split (:func:`uneven_shards`), or a forward that needs what the fake group has not (a GPU:
    ``x.cuda()``; the factory's own failures get the same words,
    :func:`~fxviz.torchbridge.distributed.fake_world_hint`). ``""`` where nothing fits."""
    from fxviz.torchbridge.distributed import fake_world_hint

    return uneven_shards(error, params) or loss_parallel_backward(error) or fake_world_hint(error.__cause__ or error)


#: torch's words when a loss that ``loss_parallel()`` computed on class-sharded logits is
#: differentiated outside that context (its backward ops then meet the plain target tensor)
_LOSS_BACKWARD = re.compile(r"the backward raised .*aten\.(?:nll_loss\w*_backward|_log_softmax_backward_data)"
                            r"\S* got mixed torch\.Tensor and DTensor")


def loss_parallel_backward(error: BaseException) -> str:
    """A loss computed under torch's ``loss_parallel()``, whose backward must run inside it too (as
    torch's docs say): the step's backward runs after the forward returned, outside it. ``""`` else."""
    if not _LOSS_BACKWARD.search(str(error)):
        return ""
    return ("; a loss computed under loss_parallel() must also be differentiated inside it, and the step's backward "
            "runs after the forward returned: call loss.backward() inside `with loss_parallel():` in the forward "
            "and capture without --backward (backward=True), the backward is then in the graph")


def uneven_shards(error: BaseException, params: Any) -> str:
    """Why DTensor's sharding propagation failed, where a parameter's sharded dimension does not
    split evenly over its mesh dimension (``params``: ``(name, parameter)`` pairs): the
    tensor-parallel styles rebuild a layer's output from its local shard (``DTensor.from_local``),
    which takes the shards to be even, so the next layer sees a wrong global shape (DTensor's
    sharding propagation fails), or the model's own code sees a local shard of a size it cannot use
    (``q.view(b, s, -1, head_dim)`` on 11 of 32 features). ``""`` where no such parameter is found
    or the error is not torch's complaint about a shape (a ``RuntimeError``)."""
    cause = error.__cause__ or error
    if not isinstance(cause, RuntimeError):
        return ""
    sharded = [(name, p, i, dim) for name, p in params if isinstance(p, DTensor)
               for i, place in enumerate(p.placements) if place.is_shard() and (dim := getattr(place, "dim", None)) is not None]
    for name, p, i, dim in sharded:
        if p.shape[dim] % p.device_mesh.size(i):
            return (f"; {name}'s dimension {dim} ({p.shape[dim]}) does not split evenly over the "
                    f"{p.device_mesh.size(i)} ranks of {_over(p.device_mesh, i)}, and the tensor-parallel styles "
                    f"take even shards: {_even_sizes(p, i, dim, sharded)}")
    # the model's own view of a local shard into heads (`[b, s, -1, head_dim]`): the features it was
    # given (its input's size over the leading dimensions) are a parameter's shard per rank
    view = VIEW.search(str(cause))
    shape = [int(d) for d in view.group(1).split(",")] if view else []
    lead = math.prod(shape[:-2]) if len(shape) >= 2 and min(shape[:-2], default=1) > 0 else 0
    unit = shape[-1] if lead else 0
    size = int(view.group(2)) if view else 0
    features = size // lead if unit > 1 and size % lead == 0 else 0
    for name, p, i, dim in sharded if features else ():
        n = p.device_mesh.size(i)
        if p.shape[dim] // n == features and p.shape[dim] % unit == 0 and features % unit:  # whole heads, not per rank
            heads = p.shape[dim] // unit
            return (f"; {name}'s dimension {dim} ({p.shape[dim]}: {heads} of {unit}) splits into "
                    f"{p.shape[dim] // n} per rank over the {n} ranks of {_over(p.device_mesh, i)}, not whole "
                    f"units of {unit} (the view's last dimension): use a world size that divides {heads} "
                    f"(with tensor parallel, each rank takes whole heads)")
    return ""


def _even_sizes(p: Any, i: int, dim: int, sharded: list[tuple[str, Any, int, int]]) -> str:
    """What to do about ``p``'s uneven ``dim`` over its mesh dimension ``i``: a world size that
    divides it, where that evens every dimension sharded over that mesh dimension; else the sizes
    of the mesh dimension that divide them all (a decoder's vocabulary of 100 and hidden size of 64
    over 3 ranks: dividing 100 is not enough, 2 or 4 are)."""
    sizes = sorted({int(q.shape[d]) for _, q, j, d in sharded
                    if q.device_mesh == p.device_mesh and j == i}, reverse=True)
    common = math.gcd(*sizes)
    if common == p.shape[dim]:
        return "use a world size that divides it"
    fits = [str(k) for k in range(2, common + 1) if common % k == 0]
    told = ", ".join(map(str, sizes[:6])) + (", ..." if len(sizes) > 6 else "")
    return (f"use a world size that gives {_over(p.device_mesh, i)} a size dividing every dimension sharded over "
            f"it ({told}): " + (" or ".join([", ".join(fits[:-1]), fits[-1]]) if len(fits) > 1 else fits[0] if fits
                                 else "none but 1 does"))


#: torch's words for a view its input cannot take, and the view's last dimension (a head's size)
VIEW = re.compile(r"shape '\[([-\d, ]+)\]' is invalid for input of size (\d+)")


def _over(mesh: Any, i: int) -> str:
    """``mesh dimension tp`` where the mesh names its dimensions, else ``the mesh``."""
    dims = mesh.mesh_dim_names
    return f"mesh dimension {dims[i]}" if dims else "the mesh"


def _static_stage(error: BaseException) -> int | None:
    """The index of the pipeline stage ``error`` was raised in (a ``self`` on its traceback) when
    the user gave it its shapes (torch's static metadata) as tensors without ``requires_grad``: its
    output, torch then takes it, needs no gradient; ``None`` otherwise."""
    tb = error.__traceback__
    while tb is not None:
        stage = tb.tb_frame.f_locals.get("self")
        meta = getattr(stage, "_user_meta", None)
        outputs = getattr(meta, "outputs", None)
        if outputs and not all(getattr(m, "requires_grad", True) for m in outputs):
            return int(getattr(stage, "stage_index", 0))
        tb = tb.tb_next
    return None


def _raised_in_module(error: BaseException, prefix: str) -> bool:
    """Whether ``error`` was raised inside code of a module named ``prefix`` (or under it)."""
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__", "").startswith(prefix):
            return True
        tb = tb.tb_next
    return False


def _raised_in_function(error: BaseException, name: str) -> bool:
    """Whether ``error`` was raised inside a call of a function named ``name``."""
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == name:
            return True
        tb = tb.tb_next
    return False


def _raised_in(error: BaseException, func: Any) -> bool:
    """Whether ``error`` was raised inside a call of the Python function ``func`` (its code is on
    the traceback; decorators unwrapped)."""
    code = inspect.unwrap(func).__code__
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return True
        tb = tb.tb_next
    return False


__all__ = ["fake_cannot", "first_line", "sharded_hint", "timed_out", "uneven_shards"]
