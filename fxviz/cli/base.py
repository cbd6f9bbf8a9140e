"""The `fxviz` group, the options its commands share, and where every outcome is decided.

Every outcome of a command is decided in one place, :class:`FxvizGroup`: an error prints one line
(``--verbose`` adds the traceback) and exits with its class's ``exit_code`` (see
:mod:`fxviz.errors`), Ctrl-C exits 130, a bug in fxviz 70. torch is imported only when a target
needs a capture: ``fxviz --help`` and ``fxviz tree g.json`` never import it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from fxviz.errors import (
    CaptureError,
    CollectiveTimeout,
    FxvizError,
    ModelError,
    PassError,
    RenderError,
    TargetError,
)
from fxviz.progress import listening
from fxviz.targets.parse import METHODS, TargetSpec, read_graph, recognise
from fxviz.text import clean, one_line

if TYPE_CHECKING:
    from rich.console import Console

    from fxviz.ir import Graph

#: Exit codes that are not an error class's: a bug in fxviz (sysexits' EX_SOFTWARE), Ctrl-C
#: (128 + SIGINT, as a shell reports it), a reader that went away (``fxviz tree g.json | head``:
#: 128 + SIGPIPE, what ``yes | head`` gives).
EXIT_BUG = 70
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

_VERBOSE = "fxviz.verbose"  # key in ctx.meta, which every context of one invocation shares
_PARTIAL = "fxviz.partial"  # key in ctx.meta: how the running command writes a partial graph

EXIT_CODES: list[tuple[int, str]] = [
    (0, "done (fxviz diff: whether or not the graphs differ)"),
    (ModelError.exit_code, "the model raised (the partial graph is shown), or a CI gate failed: --fail-on-diff, "
                           "--fail-on-break, --fail-above"),
    (TargetError.exit_code, "the target, an option or a saved graph is unusable (click's usage errors too)"),
    (CaptureError.exit_code, "no capture method produced a graph"),
    (PassError.exit_code, "an analysis pass failed"),
    (RenderError.exit_code, "the output could not be written"),
    (EXIT_BUG, "a bug in fxviz: re-run with --verbose and report the traceback"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
]


def spinner(text: str) -> contextlib.AbstractContextManager[Any]:
    """A progress line on stderr while an analysis runs (seconds to minutes on a real model), when
    stderr is a terminal: ``text``, the stage the analysis has reached (:func:`fxviz.progress.stage`:
    the method a capture tries, the graph Dynamo hands the backend, the input set) and the time
    elapsed; nothing otherwise (a pipe or a CI log gets no control codes)."""
    if not sys.stderr.isatty():
        return contextlib.nullcontext()
    return _progress_line(text)


@contextlib.contextmanager
def _progress_line(text: str, console: Any = None) -> Iterator[None]:
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    head = text.rstrip(" …")
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console or Console(stderr=True), transient=True) as bar:
        task = bar.add_task(text, total=None)
        with listening(lambda now: bar.update(task, description=f"{head}: {now} …")):
            yield


def write_json(text: str, dest: str, *, what: str) -> None:
    """An analysis's JSON to ``dest``: ``-`` is stdout (then nothing else goes there), else a file."""
    if dest == "-":
        click.echo(text)
        return
    from fxviz.render.files import write_text

    write_text(dest, text, what=what)


def out_console() -> Console:
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal:  # piped or captured: don't wrap trees at 80 columns
        console.width = max(console.width, 140)
    return console


def _text(e: BaseException) -> str:
    """``str(e)``, even for an exception whose ``__str__`` raises (a model's exception can)."""
    try:
        return str(e)
    except Exception:  # noqa: BLE001 - the message is what we are reporting; never fail on it
        return f"<{type(e).__name__} whose message cannot be printed>"


def _echo_err(line: str) -> None:
    click.echo(line, err=True)


class FxvizGroup(click.Group):
    """The one place that turns what a command raised into output and an exit code.

    A :class:`~fxviz.errors.FxvizError` prints ``error: <message>`` on one line (control
    characters escaped, line breaks folded) and exits with the class's ``exit_code``; a
    :class:`~fxviz.errors.ModelError` shows its partial graph first. ``--verbose`` adds the
    traceback and, for a :class:`~fxviz.errors.CaptureError`, each attempt's reason, before that
    line. click's usage errors keep click's handling (exit 2); Ctrl-C prints ``interrupted`` and
    exits 130; anything else is a bug in fxviz: one line that says so, exit 70."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except KeyboardInterrupt:
            _echo_err("interrupted")
            ctx.exit(EXIT_INTERRUPTED)
        except BrokenPipeError:
            # whoever read our output stopped reading: nothing to report, and nothing left to flush
            with contextlib.suppress(OSError, ValueError):  # stdout may have no file descriptor
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            ctx.exit(EXIT_BROKEN_PIPE)
        except BaseException as e:  # noqa: BLE001 - every outcome is decided here, SystemExit too
            ctx.exit(report(e, verbose=bool(ctx.meta.get(_VERBOSE)), write_partial=ctx.meta.get(_PARTIAL)))

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Exit codes"):
            formatter.write_dl([(str(code), meaning) for code, meaning in EXIT_CODES])


def report(e: BaseException, *, verbose: bool, write_partial: Callable[[Graph], None] | None = None) -> int:
    """Print ``e`` as one line on stderr (after the traceback with ``verbose``); its exit code.

    A :class:`~fxviz.errors.ModelError` carries the graph up to the failure: ``write_partial`` (the
    running command's way to write it: ``fxviz html`` its report, ``fxviz render`` its image) gets
    it, or the tree is printed."""
    if verbose:
        _echo_err(clean("".join(traceback.format_exception(e)).rstrip()))
    if not isinstance(e, FxvizError):
        line = (f"error: {type(e).__name__}: {one_line(_text(e), limit=500)} (this is a bug in fxviz: "
                "re-run with --verbose and report the traceback)")
        _echo_err(line)
        _tell_launcher(line)
        return EXIT_BUG
    graph = getattr(e, "graph", None)
    if graph is not None and write_partial is not None:  # write what ran, then say why it stops there
        try:
            write_partial(graph)
        except Exception as written:  # noqa: BLE001 - the model's error must reach the user all the same
            _echo_err(f"error: the partial graph could not be written: {one_line(_text(written))}")
    elif graph is not None:  # a partial graph is still worth showing
        with contextlib.suppress(Exception):  # the error must reach the user; the tree is a bonus
            out_console().print(graph.tree())
    if verbose and isinstance(e, CaptureError):
        for line in e.details():
            _echo_err(f"  {one_line(line)}")
    line = f"error: {one_line(_text(e))}"
    _echo_err(line)
    _tell_launcher(line)
    return int(e.exit_code)


def _tell_launcher(line: str) -> None:
    """Under ``torchrun``, give its summary of the failed ranks (its root cause's ``traceback :``
    field, "To enable traceback see ..." otherwise) this rank's ``line``: through the error file its
    agent names in ``TORCHELASTIC_ERROR_FILE``, in the format of torch's own ``@record``."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    info = {"py_callstack": line, "timestamp": str(int(time.time()))}
    with contextlib.suppress(OSError), open(path, "w") as f:
        json.dump({"message": {"message": line, "extraInfo": info}}, f)


# ---- options: each declared once, shared by the commands that take it --------------------------


def _set_verbose(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[_VERBOSE] = True


verbose_option = click.option(
    "--verbose", "-v", is_flag=True, expose_value=False, is_eager=True, callback=_set_verbose,
    help="On an error, also show the traceback (and why each capture method failed).",
)


def target_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """How to capture a factory's model: ``--method``, ``--input-shape``, ``--dtype``. A saved
    graph or a ``.pt2`` file was captured already, so they are refused for one."""
    fn = click.option("--method", "-m", type=click.Choice(METHODS), default="auto", show_default=True,
                      help="Capture method; auto tries export, export-strict, fx, then eager.")(fn)
    fn = click.option("--dtype", default="float32", show_default=True,
                      help="dtype of the --input-shape tensors.")(fn)
    fn = click.option("--input-shape", "-i", "input_shapes", multiple=True, metavar="1,3,32,32",
                      help="Shape of a random input tensor (repeat for several inputs).")(fn)
    fn = click.option("--no-validate", is_flag=True, expose_value=False, callback=_set_no_validate,
                      help="Do not run the captured program once on the inputs to confirm they run.")(fn)
    return verbose_option(fn)


_NO_VALIDATE = "fxviz.no_validate"


def _set_no_validate(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[_NO_VALIDATE] = True


_BACKWARD = "fxviz.backward"


def _set_backward(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[_BACKWARD] = True


_LOSS = "fxviz.loss"


def _set_loss(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta[_LOSS] = value


def backward_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--backward``: capture one training step, forward and backward (``capture(backward=True)``);
    ``--loss FN``: the step's loss (``capture(loss=...)``), which implies ``--backward``."""
    fn = click.option("--loss", metavar="FILE.py:FN", default=None, expose_value=False, callback=_set_loss,
                      help="The training step's loss, a function of the model's output returning a scalar tensor "
                           "(file.py:name or package.module:name); implies --backward.")(fn)
    return click.option("--backward", is_flag=True, expose_value=False, callback=_set_backward,
                        help="Capture one training step: forward and backward of the sum of the outputs (or of "
                             "--loss), with the activations saved for the backward (overlays phase, saved).")(fn)


_WORLD_SIZE = "fxviz.world_size"


def _set_world_size(ctx: click.Context, _param: click.Parameter, value: int | None) -> None:
    if value is None:
        return
    from fxviz.torchbridge.distributed import launched_world_size

    launched = launched_world_size()
    if launched is not None:  # each rank would run its own fake group and write its own output
        rank = os.environ.get("RANK", "0")
        raise TargetError(f"{'' if rank == '0' else f'rank {rank} of {launched}: '}--world-size {value} runs the factory in a fake process group inside one process, but "
                          f"this process is one of the {launched} ranks torchrun launched: drop --world-size to "
                          "capture every rank in the launch's own group (rank 0 shows its graph), or run fxviz "
                          "without torchrun")
    ctx.meta[_WORLD_SIZE] = value


def world_size_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--world-size N``: the factory runs in a fake process group of N ranks (``capture(world_size=N)``)."""
    return click.option("--world-size", type=click.IntRange(min=1), default=None, expose_value=False,
                        callback=_set_world_size,
                        help="Run the factory in a fake process group of N ranks (no cluster) so it can shard "
                             "the model (init_device_mesh, parallelize_module); collectives are recorded "
                             "(overlay comm).")(fn)


def world_size(ctx: click.Context) -> int | None:
    """The ``--world-size`` given to this command, if any."""
    value = ctx.meta.get(_WORLD_SIZE)
    return int(value) if value is not None else None


_CAPTURE_OPTIONS = ("method", "input_shapes", "dtype", "no_validate", "backward", "loss", "world_size")


def given_options(ctx: click.Context, names: tuple[str, ...]) -> list[str]:
    """The options among ``names`` that the user gave (not left at their default), as spelled."""
    out = []
    for p in ctx.command.params:
        if p.name in names and ctx.get_parameter_source(p.name) not in (None, ParameterSource.DEFAULT):
            out.append(p.opts[0])
    return out


def refuse_capture_options(ctx: click.Context, *specs: TargetSpec) -> None:
    given = given_options(ctx, _CAPTURE_OPTIONS)
    if given and not any(s.captures for s in specs):
        s, many = specs[0], len(given) > 1
        raise TargetError(
            f"{', '.join(given)} only {'apply' if many else 'applies'} when fxviz captures a model from a "
            f"factory; {s.text!r} is {s.what}, captured already: leave {'them' if many else 'it'} out"
        )


def spec_graph(spec: TargetSpec, input_shapes: tuple[str, ...], dtype: str, method: str) -> Graph:
    """The graph of one target; torch is imported only for a factory or a ``.pt2`` file."""
    if spec.kind == "graph":
        return read_graph(spec.path)
    meta = click.get_current_context().meta
    validate = not meta.get(_NO_VALIDATE, False)
    backward: dict[str, Any] = {"backward": True} if meta.get(_BACKWARD) else {}
    if meta.get(_WORLD_SIZE) is not None:
        backward["world_size"] = meta[_WORLD_SIZE]
    if meta.get(_LOSS) is not None:
        backward["loss"] = with_torch(spec).load_function(meta[_LOSS], "--loss")
    factory = with_torch(spec)
    ranks = factory.launched_world_size() if meta.get(_WORLD_SIZE) is None else None
    if ranks is None:
        # a capture takes seconds (a sharded GPT-2's step, tens): say what runs, on a terminal
        where = f" in a fake process group of {meta[_WORLD_SIZE]} ranks" if meta.get(_WORLD_SIZE) is not None else ""
        with spinner(f"capturing {one_line(spec.text)}{where} …") if spec.captures else contextlib.nullcontext():
            return factory.load_graph(spec, input_shapes=input_shapes, dtype=dtype, method=method, validate=validate,
                                      **backward)
    return _launched_graph(spec, ranks, input_shapes=input_shapes, dtype=dtype, method=method, validate=validate,
                           **backward)


def _launched_graph(spec: TargetSpec, ranks: int, **options: Any) -> Graph:
    """Under ``torchrun``: every rank captures its own graph in the launch's (gloo) group, rank 0
    takes them all (a failed rank's partial one too), flags the collectives where ranks differ, and
    is the one that writes; the other ranks say only why they failed, or nothing."""
    from fxviz.ir import Graph
    from fxviz.passes.comm import compare_ranks

    factory = with_torch(spec)
    failure: FxvizError | None = None
    graph: Graph | None = None
    with factory.launched_world() as rank:
        try:  # rank 0 says what runs, on a terminal (the ranks share it)
            with spinner(f"capturing {one_line(spec.text)}: rank 0 of {ranks} (torchrun) …") \
                    if rank == 0 and spec.captures else contextlib.nullcontext():
                graph = factory.load_graph(spec, world_size=ranks, **options)
        except FxvizError as e:
            failure, graph = e, e.graph if isinstance(e, ModelError) else None
        texts = factory.exchange_graphs(graph.to_json() if graph is not None else None,
                                        patient=failure is None or isinstance(failure, CollectiveTimeout))
    if rank == 0 and graph is not None and texts is not None:
        compare_ranks([graph, *(Graph.from_json(t) if t else None for t in texts[1:])])
        differ = next((f for f in graph.annotations.get("rank_mismatches", []) if "index" in f), None)
        if failure is not None and differ is not None and failure.args:  # why rank 0's collective failed (gloo
            # says only that the peer closed the connection, or timed out): the ranks issued different ones
            failure.args = (f"{failure.args[0]}; the ranks issued different collectives: collective {differ['index'] + 1} "
                            f"on {differ['group'] or 'the default group'} is "
                            + ", ".join(f"rank {k}'s {v}" for k, v in differ["ranks"].items()), *failure.args[1:])
    if failure is not None:  # rank 0 writes the partial graph and says why; the others only why
        if rank != 0:
            failure.args = (f"rank {rank} of {ranks}: {failure.args[0] if failure.args else failure}",
                            *failure.args[1:])
            if isinstance(failure, ModelError):
                failure.graph = None
        raise failure
    if rank != 0 or graph is None:
        click.get_current_context().exit(0)
    return graph


def _has_torch() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def with_torch(spec: TargetSpec) -> ModuleType:
    """:mod:`fxviz.targets.factory`, which needs torch: without it, say so for this target."""
    try:
        from fxviz.targets import factory
    except ImportError as e:
        if _has_torch():
            raise
        raise TargetError(
            f"{spec.text!r} is {spec.what}: {'capturing its model' if spec.captures else 'loading it'} needs "
            "torch, which is not installed here "
            "(a saved graph, g.json, needs no torch)"
        ) from e
    return factory


def target_graph(target: str, input_shapes: tuple[str, ...], dtype: str, method: str,
                  write: Callable[[Graph], None] | None = None) -> Graph:
    """The graph of ``target``. ``write`` is how the command writes its output: when the model
    raises, the partial graph goes through it before the error is reported (exit 1)."""
    ctx = click.get_current_context()
    spec = recognise(target)
    refuse_capture_options(ctx, spec)
    if write is not None:
        ctx.meta[_PARTIAL] = write
    return spec_graph(spec, input_shapes, dtype, method)


def add_overlays(graph: Graph, given: tuple[str, ...]) -> str | None:
    """Add each ``--overlay`` that is a JSON file to ``graph`` (one line on stderr for keys that
    name nothing in it); the name of the last one given, file or overlay name, which the output
    shows. An unknown name is refused, with the names there are."""
    from fxviz.passes.overlays import overlays, read_overlay

    last = None
    for value in given:
        if value.endswith(".json") or os.path.isfile(value):
            try:
                with open(value, "rb") as f:
                    text = f.read()
            except OSError as e:
                raise TargetError(f"cannot read overlay file {value!r} ({e.strerror or e}): check the path") from e
            name, spec, unmatched = read_overlay(text, graph, where=value)
            graph.annotations.setdefault("overlays", {})[name] = spec
            if unmatched:
                _echo_err(f"note: {len(unmatched)} of the keys in {value} name no node or module of "
                          f"{one_line(graph.name or 'the graph')} (first: {one_line(repr(unmatched[0]), limit=80)})")
            last = name
        else:
            known = overlays(graph)
            if value not in known:
                raise TargetError(f"{value!r} is neither a JSON file nor an overlay of {graph.name or 'the graph'!r}; "
                                  f"its overlays: {', '.join(known) or 'none'}")
            last = value
    return last


overlay_option = click.option(
    "--overlay", "overlays_given", multiple=True, metavar="NAME|data.json",
    help="Colour by an overlay: a name (params, flops, bytes, family, plumbing) or a JSON file mapping "
         "node names or module paths to values (Model Explorer's node data too). Repeatable.")


# ---- commands ------------------------------------------------------------------------------------


@click.group(cls=FxvizGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="fxviz")
@verbose_option
def cli() -> None:
    """See what a PyTorch model really computes in its forward pass.

    TARGET is path/to/file.py:factory or package.module:factory (the factory returns a model,
    (model, args) or (model, args, kwargs)), a graph saved by `fxviz json TARGET -o g.json`
    (read without torch), or a program saved by torch.export.save (model.pt2).
    """


def main() -> None:
    # torch.profiler's kineto writes "USDT: ... profiler_start" and "profiler_stop" to stderr around
    # every profile (--inside's kernel times); 6 is above its highest level, so it says nothing.
    # A level the user set is kept. Set before the first profile, which is when kineto reads it.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    cli(prog_name="fxviz")

