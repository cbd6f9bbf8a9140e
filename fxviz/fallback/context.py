"""Where each recorded call happens: the module call it runs in (:class:`ModuleStack`), the line of
the user's code that made it (:class:`Sources`), and the node's unique name (:class:`Names`)."""

from __future__ import annotations

import linecache
import sys
import types

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


class Sources:
    """The innermost user frame behind the current op. Decisions and locations are cached per code
    object and line, so a model's hot loop costs a few dict lookups per op."""

    __slots__ = ("_locs", "_user_code")

    def __init__(self) -> None:
        self._user_code: dict[types.CodeType, bool] = {}
        self._locs: dict[tuple[types.CodeType, int], SourceLoc] = {}

    def find(self) -> SourceLoc | None:
        # skip this frame and the recorder's; the walk passes over torch's and fxviz's frames
        f: types.FrameType | None = sys._getframe(2)
        user = self._user_code
        while f is not None:
            code = f.f_code
            u = user.get(code)
            if u is None:
                u = user[code] = is_user_file(code.co_filename)
            if u:
                key = (code, f.f_lineno)
                loc = self._locs.get(key)
                if loc is None:
                    line = linecache.getline(code.co_filename, f.f_lineno).strip()
                    loc = self._locs[key] = SourceLoc(code.co_filename, f.f_lineno, code.co_name, line)
                return loc
            f = f.f_back
        return None


class ModuleStack:
    """The module calls running now, outermost first, with a call index per module path
    (``h.0``'s second call is ``("h.0", 1)``, export's ``@1``). Kept by the module hooks of
    :mod:`fxviz.fallback.modes`; ``current`` is the stack every recorded node gets."""

    __slots__ = ("_calls", "_frames", "current")

    def __init__(self) -> None:
        self.current: tuple[ModuleCall, ...] = ()
        self._calls: dict[str, int] = {}
        self._frames: list[tuple[str, tuple[ModuleCall, ...]]] = []

    def enter(self, path: str) -> None:
        n = self._calls.get(path, 0)
        self._calls[path] = n + 1
        self._frames.append((path, self.current))
        self.current = (*self.current, (path, n))

    def leave(self, path: str) -> None:
        # pop through frames a forward that raised (and was caught by the model) left behind
        frames = self._frames
        while frames:
            p, outer = frames.pop()
            if p == path:
                self.current = outer
                return


__all__ = ["ModuleStack", "Names", "Sources"]
