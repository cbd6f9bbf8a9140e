"""Run one capture attempt in a child process, so that the memory it borrows is given back.

torch.export keeps what it built alive after its result is deleted: about 1 MB per decoder layer
(one exported ``GraphModule`` with its fake tensors, held from C++ where the collector cannot free
it; ``torch._dynamo.reset()``, ``gc.collect()`` and ``malloc_trim`` give back under 2% of it).
Capturing a 1,200-layer decoder left 1.6 GB resident. An attempt run in a forked child keeps none
of it: the child builds the graph, sends it back pickled (the IR is plain Python, a few MB), and
exits; the parent never held export's objects. The child is a fork, so the model, its inputs and
the process are the parent's as they are at the call, and whatever the attempt does to them stays
in the child.

Only where fork is safe: Linux (macOS forbids it after Objective-C runtimes load), and not once CUDA
is initialised (a forked child cannot use it). The child runs torch on one thread: OpenMP's thread
pool does not survive a fork, and a child that uses it after the parent did hangs.

A child is watched: its private memory (``/proc/<pid>/smaps_rollup``, the pages it wrote, not
the ones it shares with the parent) may not pass a budget, ``FXVIZ_CAPTURE_MEMORY`` (``4G``,
``800M``) or else 80% of the memory available when it starts. torch.export's memory grows with
the square of a model's nesting depth (3.6 GB at 1,000 modules deep, more than 24 GB at 2,000):
a child past its budget is stopped and the attempt fails with that said, so the next method gets
its turn before the kernel's out-of-memory killer picks a process, maybe not this one.

Failures travel back too: the exception itself when it pickles (``ModelError`` with its partial
graph, ``RejectedInputs``), else a :class:`Relayed` error with the type name and message; either way
the child attaches the :class:`~fxviz.ir.Attempt` it made from the original, with its source line
(:func:`fxviz.torchbridge.run.failed_attempt` uses it). A Ctrl-C reaches both processes; the child
is killed and reaped whatever ends the wait.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import signal
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import nn

from fxviz.errors import CaptureError, ModelError

T = TypeVar("T")

#: Module count from which ``isolate=None`` runs symbolic attempts apart: export keeps ~1 MB per
#: decoder layer (~13 modules), so about 80 MB from here, +20% of a bare process with torch and
#: transformers. Running apart costs about 0.5 s (copy-on-write faults, the graph pickled back,
#: caches the child warms and loses): +16% on a 24-layer LLaMA on meta (3.9 s), under 5% on the
#: captures of 10 s and more that models of this size take.
ISOLATE_FROM_MODULES = 1024

#: The environment variable that sets the budget of a child's private memory (``4G``, ``800M``).
MEMORY_ENV = "FXVIZ_CAPTURE_MEMORY"

#: How often the parent reads the child's memory, in seconds.
WATCH_EVERY = 0.05

#: The attribute a relayed exception carries its :class:`~fxviz.ir.Attempt` in.
ATTEMPT_ATTR = "fxviz_attempt"


class Relayed(Exception):
    """A failure of an attempt run apart whose exception did not survive pickling: its type name
    and message (``str()`` is the original message)."""

    def __init__(self, message: str, type_name: str = "") -> None:
        super().__init__(message)
        self.type_name = type_name


def can_fork() -> bool:
    """Whether an attempt can run in a forked child here."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_initialized())


def worth_isolating(model: nn.Module) -> bool:
    """Whether ``model`` is deep enough that export's leftovers matter (``ISOLATE_FROM_MODULES``)."""
    return any(k + 1 >= ISOLATE_FROM_MODULES for k, _ in enumerate(model.modules()))


def memory_budget() -> int | None:
    """The bytes a child may write: ``FXVIZ_CAPTURE_MEMORY``, else 80% of ``MemAvailable``;
    ``None`` where neither can be read. A malformed setting is a :class:`CaptureError`."""
    text = os.environ.get(MEMORY_ENV, "").strip()
    if text:
        m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)B?", text, re.IGNORECASE)
        if m is None:
            raise CaptureError(f"{MEMORY_ENV}={text!r} is not a size: write it as 4G, 800M or a number of bytes")
        return int(float(m[1]) * 1024 ** " KMGT".index(m[2].upper() or " "))
    available = _meminfo_kb("/proc/meminfo", "MemAvailable")
    return None if available is None else int(available * 1024 * 0.8)


def _meminfo_kb(path: str, *fields: str) -> int | None:
    """The sum of ``fields`` (in kB) of a ``/proc`` file of ``Name: value kB`` lines, or ``None``."""
    try:
        with open(path) as f:
            values = [int(line.split()[1]) for line in f if line.split(":")[0] in fields]
    except (OSError, ValueError, IndexError):
        return None
    return sum(values) if values else None


def _private_bytes(pid: int) -> int | None:
    """The memory ``pid`` holds for itself: pages it wrote or made, not those it shares (kB → bytes)."""
    kb = _meminfo_kb(f"/proc/{pid}/smaps_rollup", "Private_Clean", "Private_Dirty", "SwapPss")
    return None if kb is None else kb * 1024


class _Watch:
    """A thread that stops the child ``pid`` when its private memory passes ``budget`` bytes."""

    def __init__(self, pid: int, budget: int | None) -> None:
        self.pid, self.budget, self.used = pid, budget, 0
        self.over = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fxviz-apart-watch", daemon=True)
        if budget is not None:
            self._thread.start()

    def _run(self) -> None:
        assert self.budget is not None
        while not self._done.wait(WATCH_EVERY):
            used = _private_bytes(self.pid)
            if used is None:  # gone, or /proc is not there
                return
            self.used = max(self.used, used)
            if used > self.budget:
                self.over = True
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                return

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GB" if n >= 2**30 else f"{n / 2**20:.0f} MB"


def _send(fd: int, payload: bytes) -> None:
    with os.fdopen(fd, "wb") as f:
        f.write(struct.pack("<Q", len(payload)))
        f.write(payload)


def _receive(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return b""
        (size,) = struct.unpack("<Q", head)
        data = f.read(size)
    return data if len(data) == size else b""


def _child(fn: Callable[[], Any], make_attempt: Callable[[BaseException], Any], fd: int) -> None:
    """The child's whole life: run ``fn``, send its result or its failure, flush what the model
    printed, and exit without running the parent's exit handlers."""
    code = 0
    try:
        torch.set_num_threads(1)
        try:
            message: tuple[Any, ...] = ("ok", fn())
        except KeyboardInterrupt:
            message = ("interrupt",)
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
            message = _failure(e, make_attempt)
        try:
            payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001 - a result that does not pickle is reported, not lost
            payload = pickle.dumps(("error", None, None, type(e).__name__,
                                    f"the capture ran apart but its result could not be sent back: {e}"),
                                   protocol=pickle.HIGHEST_PROTOCOL)
        _send(fd, payload)
    except BaseException:  # noqa: BLE001 - nothing may escape a forked child
        code = 1
    finally:
        _flush(sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
        os._exit(code)


def _flush(*streams: Any) -> None:
    for stream in streams:
        with contextlib.suppress(Exception):  # a closed or missing stream has nothing to flush
            stream.flush()


def _failure(e: BaseException, make_attempt: Callable[[BaseException], Any]) -> tuple[Any, ...]:
    """``("error", attempt, pickled exception or None, type name, message)``."""
    attempt = make_attempt((e.__cause__ or e) if isinstance(e, ModelError) else e)
    try:
        pickled: bytes | None = pickle.dumps(e, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - torch's errors may hold values that do not pickle
        pickled = None
    return ("error", attempt, pickled, type(e).__name__, str(e))


def _revive(pickled: bytes | None, type_name: str, text: str) -> BaseException:
    """The child's exception, or :class:`Relayed` when it does not come back as it was (torch's
    exceptions whose ``__init__`` takes other arguments than ``args`` unpickle wrong, or not)."""
    if pickled is not None:
        try:
            exc = pickle.loads(pickled)
            if isinstance(exc, BaseException) and str(exc) == text:
                return exc  # type: ignore[no-any-return]
        except Exception:  # noqa: BLE001, S110 - relayed by name below
            pass
    return Relayed(text, type_name)


def run_apart(fn: Callable[[], T], make_attempt: Callable[[BaseException], Any]) -> T:
    """``fn()`` run in a forked child: its result, or its exception raised here with the attempt
    ``make_attempt`` made of the original attached (``ATTEMPT_ATTR``). A child that dies (killed
    for memory, a crash in native code) is a :class:`CaptureError` naming the signal."""
    budget = memory_budget()
    _flush(sys.stdout, sys.stderr)  # what is buffered now must not be written twice
    read, write = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        os.close(read)
        _child(fn, make_attempt, write)
    os.close(write)
    watch = _Watch(pid, budget)
    try:
        data = _receive(read)
    finally:
        watch.stop()
        status = _reap(pid)
    if watch.over and budget is not None:
        raise CaptureError(f"the capture process used more than {_size(budget)} of memory and was stopped after "
                           f"{time.perf_counter() - t0:.1f} s (the budget is {MEMORY_ENV}, or 80% of the memory "
                           "available when it started)")
    if not data:
        how = (f"was killed by signal {signal.Signals(-status).name}" if status < 0 else f"exited with {status}")
        hint = " (out of memory?)" if status == -signal.SIGKILL else ""
        raise CaptureError(f"the capture process {how}{hint} after {time.perf_counter() - t0:.1f} s; "
                           "pass isolate=False to capture in this process")
    message = pickle.loads(data)
    if message[0] == "ok":
        return message[1]  # type: ignore[no-any-return]
    if message[0] == "interrupt":
        raise KeyboardInterrupt
    _, attempt, pickled, type_name, text = message
    exc = _revive(pickled, type_name, text)
    if attempt is not None:
        setattr(exc, ATTEMPT_ATTR, attempt)
    raise exc


def _reap(pid: int) -> int:
    """Wait for the child (killing it first if it is still running: an interrupted wait) and
    return its exit code, negative for a signal."""
    done, status = os.waitpid(pid, os.WNOHANG)
    if done == 0:
        deadline = time.monotonic() + 2.0
        while done == 0 and time.monotonic() < deadline:  # a child that sent its result is exiting
            time.sleep(0.005)
            done, status = os.waitpid(pid, os.WNOHANG)
        if done == 0:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


__all__ = ["ISOLATE_FROM_MODULES", "MEMORY_ENV", "Relayed", "memory_budget", "can_fork", "run_apart", "worth_isolating"]
