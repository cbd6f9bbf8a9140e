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
from collections.abc import Iterator, Sequence
from typing import Any

from fxviz.analyze.compilemap.records import Recording
from fxviz.ir import Node


class TracedLines:
    """What :meth:`kept` saw Dynamo trace while ``rec``'s first input set ran its forward: per file,
    the lines traced; per traced function (file, first line, name), its code's lines."""

    def __init__(self, rec: Recording) -> None:
        self.rec = rec
        self.lines: dict[str, set[int]] = {}
        self.codes: dict[tuple[str, int, str], frozenset[int]] = {}
        self.seen = False  # whether the patch was in place (another torch: no starts_line)

    @contextlib.contextmanager
    def kept(self) -> Iterator[None]:
        from torch._dynamo.symbolic_convert import InstructionTranslatorBase

        original = getattr(InstructionTranslatorBase, "starts_line", None)
        if original is None:
            yield
            return
        rec, lines, codes = self.rec, self.lines, self.codes

        def starts_line(tx: Any, lineno: int) -> None:
            if rec.input_set == 0 and rec.phase == "forward":
                code = tx.f_code
                lines.setdefault(code.co_filename, set()).add(lineno)
                key = (code.co_filename, code.co_firstlineno, code.co_name)
                if key not in codes:
                    codes[key] = frozenset(ln for _, _, ln in code.co_lines() if ln)
            original(tx, lineno)

        InstructionTranslatorBase.starts_line = starts_line  # type: ignore[method-assign,assignment]
        self.seen = True
        try:
            yield
        finally:
            InstructionTranslatorBase.starts_line = original  # type: ignore[method-assign]

    def unrun(self, ops: Sequence[Node], assigned: dict[str, str], unrun: str) -> list[Node]:
        """The ops not assigned ``unrun`` that did not run under torch.compile (see the module's
        docstring): ``eager`` ones, and ones the matching put inside a graph because the ops
        around them are in it (:mod:`.match` fills in what Dynamo folded away, but Dynamo folds
        nothing on a line it never traced); none where the lines were not recorded."""
        if not self.seen:
            return []
        failed = {(f[0], f[1], f[2]) for b in self.rec.breaks if b.skipped and b.input_set == 0 and b.phase == "forward"
                  for f in b.stack[:1]}
        held: dict[str, set[int]] = {}  # file -> the lines of the functions Dynamo traced
        ran_eagerly: dict[str, set[int]] = {}  # file -> the lines of the frames that ran whole, eagerly
        for key, lines in self.codes.items():
            held.setdefault(key[0], set()).update(lines)
            if key in failed:
                ran_eagerly.setdefault(key[0], set()).update(lines)
        return [n for n in ops if (src := n.source) is not None and assigned.get(n.name, unrun) != unrun
                and src.line in held.get(src.file, ()) and src.line not in self.lines.get(src.file, ())
                and src.line not in ran_eagerly.get(src.file, ())]


__all__ = ["TracedLines"]
