"""Where each recorded call happens: the module call it runs in (:class:`ModuleStack`), the line of
the user's code that made it (:class:`Sources`), and the node's unique name (:class:`Names`)."""

from __future__ import annotations

import linecache
import sys
import types
from collections.abc import Callable
from typing import Any

from fxviz.ir import ModuleCall, SourceLoc
from fxviz.torchbridge.source import is_user_file


class Names:
    """Unique node names: ``linear``, ``linear_1``, ... as fx names nodes."""

    __slots__ = ("_next", "_taken")

    def __init__(self) -> None:
        self._next: dict[str, int] = {}
        self._taken: set[str] = set()

    def unique(self, base: str) -> str:
        n = self._next.get(base, 0)
        name = base if n == 0 else f"{base}_{n}"
        while name in self._taken:  # ``linear_1`` may be taken by an input called that
            n += 1
            name = f"{base}_{n}"
        self._next[base] = n + 1
        self._taken.add(name)
        return name


#: The code of the functions that call the model (:func:`fxviz.fallback.trace.trace_eager`): a
#: frame outside the model's call is not the op's line (an op of a model made of ``torch.nn``
#: layers only has none, as under Dynamo and export, not the line that called fxviz).
MODEL_CALLERS: set[types.CodeType] = set()


class Sources:
    """The innermost user frame behind the current op, inside the model's call (up to a frame of
    :data:`MODEL_CALLERS`). Decisions and locations are cached per code object and line, so a
    model's hot loop costs a few dict lookups per op. The caches are keyed by the code object's
    ``id``, held with the code itself (checked by identity): hashing a code object hashes its
    bytecode's constants and names again on every call, which made the walk over torch's module
    call frames the costliest part of recording an op."""

    __slots__ = ("_user_code",)

    def __init__(self) -> None:
        #: id(code) -> (code, 1: user code, 0: not, -1: the model's caller, {f_lasti: location},
        #: {line: location}): an instruction's location costs a lookup, where ``f_lineno`` scans
        #: the code's line table; one location per line
        self._user_code: dict[int, tuple[types.CodeType, int, dict[int, SourceLoc], dict[int, SourceLoc]]] = {}

    def find(self) -> SourceLoc | None:
        # skip this frame and the recorder's; the walk passes over torch's and fxviz's frames
        f: types.FrameType | None = sys._getframe(2)
        user = self._user_code
        while f is not None:
            code = f.f_code
            e = user.get(id(code))
            if e is None or e[0] is not code:
                u = -1 if code in MODEL_CALLERS else int(is_user_file(code.co_filename))
                e = user[id(code)] = (code, u, {}, {})
            u = e[1]
            if u < 0:  # the model's caller: the rest is outside the model
                return None
            if u:
                loc = e[2].get(f.f_lasti)
                if loc is None:
                    loc = e[2][f.f_lasti] = self.at(code, f.f_lineno, e[3])
                return loc
            f = f.f_back
        return None

    @staticmethod
    def at(code: types.CodeType, line: int, lines: dict[int, SourceLoc]) -> SourceLoc:
        """The location of ``line`` of ``code`` (``lines``: those of ``code`` made so far)."""
        loc = lines.get(line)
        if loc is None:
            text = linecache.getline(code.co_filename, line).strip()
            loc = lines[line] = SourceLoc(code.co_filename, line, code.co_name, text)
        return loc


class ModuleStack:
    """The module calls running now, outermost first, with a call index per module path
    (``h.0``'s second call is ``("h.0", 1)``, export's ``@1``). Kept by the module hooks of
    :mod:`fxviz.fallback.modes`; ``current`` is the stack every recorded node gets.

    A call that recorded no node at all (an eval-mode ``Dropout`` at ATen level dispatches
    nothing, an ``Identity`` calls nothing) is handed to ``on_empty`` with its stack when it
    returns, so that every module that ran is in the graph. Module calls made by other threads
    are not on this stack (the recording modes see only the capturing thread's ops, and their
    calls must not wrap this thread's ops): :meth:`elsewhere` keeps them apart."""

    __slots__ = ("_calls", "_frames", "_nodes", "_on_empty", "_threads", "current")

    def __init__(
        self, nodes: list[Any] | None = None, on_empty: Callable[[tuple[ModuleCall, ...]], None] | None = None,
    ) -> None:
        self.current: tuple[ModuleCall, ...] = ()
        self._calls: dict[str, int] = {}
        self._frames: list[tuple[str, tuple[ModuleCall, ...], int]] = []
        self._nodes = nodes if nodes is not None else []
        self._on_empty = on_empty
        self._threads: dict[int, list[tuple[ModuleCall, ...]]] = {}  # thread -> its calls' stacks

    def enter(self, path: str) -> None:
        n = self._calls.get(path, 0)
        self._calls[path] = n + 1
        self._frames.append((path, self.current, len(self._nodes)))
        self.current = (*self.current, (path, n))

    def leave(self, path: str) -> None:
        # pop through frames a forward that raised (and was caught by the model) left behind
        frames = self._frames
        while frames:
            p, outer, recorded = frames.pop()
            if p == path:
                if recorded == len(self._nodes) and self._on_empty is not None:
                    self._on_empty(self.current)
                self.current = outer
                return

    def elsewhere(self, thread: int, path: str, entering: bool) -> tuple[ModuleCall, ...] | None:
        """A module call in another thread starts (``entering``) or returns. Its stack is this
        thread's stack when the other thread's outermost call started, then the other thread's
        own calls; returned on entry (None on return)."""
        stacks = self._threads.setdefault(thread, [])
        if not entering:
            if stacks:
                stacks.pop()
            return None
        n = self._calls.get(path, 0)
        self._calls[path] = n + 1
        outer = stacks[-1] if stacks else self.current
        stacks.append((*outer, (path, n)))
        return stacks[-1]


__all__ = ["ModuleStack", "Names", "Sources"]
