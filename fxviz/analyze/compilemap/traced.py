"""The source lines Dynamo traced on the first input set, from Dynamo itself: the instruction
translator's ``starts_line`` (what ``TORCH_LOGS=trace_source`` prints, ``TRACE starts_line
model.py:12``), patched for the run and restored. Needs torch.

Where the forward breaks, the ops no graph holds are of two kinds: those that ran eagerly (the op a
graph broke at, the whole of a frame whose compile failed) and those that did not run under
torch.compile at all (``if not torch.compiler.is_compiling(): ...``: Dynamo evaluated the test
and never traced the branch). Dynamo traces every line a compiled frame runs, the line a graph
breaks at included (the break's instruction is stepped before it is found unsupported), and the
rest of the frame again as a resume function. So an op is :func:`unrun` when Dynamo traced the
function that holds its line (a line of its code was traced) but never that line, and that function
is not one of the frames whose compile failed (torch's compilation metrics' ``fail_type``: Dynamo
gave up on it and ran it, whole, eagerly, the lines after the failure untraced).
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from fxviz.analyze.compilemap.records import Recording
from fxviz.ir import Node


class TracedLines:
    """What :meth:`kept` saw Dynamo trace while ``rec``'s first input set ran its forward: per file,
    the lines traced (:attr:`lines`); per traced function (file, first line, name), its code's lines
    (:attr:`codes`)."""

    def __init__(self, rec: Recording) -> None:
        self.rec = rec
        self.by_code: dict[Any, set[int]] = {}  # code object -> the lines traced in it
        self.seen = False  # whether the patch was in place (another torch: no starts_line)

    @contextlib.contextmanager
    def kept(self) -> Iterator[None]:
        from torch._dynamo.symbolic_convert import InstructionTranslatorBase

        original = getattr(InstructionTranslatorBase, "starts_line", None)
        if original is None:
            yield
            return
        rec, get, by_code = self.rec, self.by_code.get, self.by_code

        # called on every line Dynamo traces (GPT-2's 12 blocks: about 40,000 times): one dict
        # lookup by the code object and a set insert; files and functions are read after the run
        def starts_line(tx: Any, lineno: int) -> None:
            if rec.input_set == 0 and rec.phase == "forward":
                code = tx.f_code
                got = get(code)
                if got is None:
                    got = by_code[code] = set()
                got.add(lineno)
            original(tx, lineno)

        InstructionTranslatorBase.starts_line = starts_line  # type: ignore[method-assign,assignment]
        self.seen = True
        try:
            yield
        finally:
            InstructionTranslatorBase.starts_line = original  # type: ignore[method-assign]

    @property
    def lines(self) -> dict[str, set[int]]:
        """File -> the lines Dynamo traced in it."""
        out: dict[str, set[int]] = {}
        for code, got in self.by_code.items():
            out.setdefault(code.co_filename, set()).update(got)
        return out

    @property
    def codes(self) -> dict[tuple[str, int, str], frozenset[int]]:
        """(file, first line, name) of each function Dynamo traced -> its code's lines."""
        return {(c.co_filename, c.co_firstlineno, c.co_name): frozenset(ln for _, _, ln in c.co_lines() if ln)
                for c in self.by_code}

    def unrun(self, ops: Sequence[Node], assigned: dict[str, str], unrun: str,
              filled: Collection[str] = ()) -> list[Node]:
        """The ops not assigned ``unrun`` that did not run under torch.compile (see the module's
        docstring): ``eager`` ones, and ones the matching put inside a graph because the ops
        around them are in it (:mod:`.match` fills in what Dynamo folded away, but Dynamo folds
        nothing on a line it never traced). Of those put in a graph with no Dynamo op of their own
        (``filled``: filled in or claimed by :mod:`.match`), also the ones whose line Dynamo traced
        in no function at all: a function the compiled forward never called (transformers'
        ``fast_all`` of the padding mask, which the eager forward calls between two ops of the
        graph). None where the lines were not recorded."""
        if not self.seen:
            return []
        failed = {(f[0], f[1], f[2]) for b in self.rec.breaks if b.skipped and b.input_set == 0 and b.phase == "forward"
                  for f in b.stack[:1]}
        held: dict[str, set[int]] = {}  # file -> the lines of the functions Dynamo traced
        ran_eagerly: dict[str, set[int]] = {}  # file -> the lines of the frames that ran whole, eagerly
        traced = self.lines
        for key, lines in self.codes.items():
            held.setdefault(key[0], set()).update(lines)
            if key in failed:
                ran_eagerly.setdefault(key[0], set()).update(lines)
        return [n for n in ops if (src := n.source) is not None and assigned.get(n.name, unrun) != unrun
                and (src.line in held.get(src.file, ()) or n.name in filled)
                and src.line not in traced.get(src.file, ()) and src.line not in ran_eagerly.get(src.file, ())]


__all__ = ["TracedLines"]
