"""Text from a model or a file, made safe to print: names, messages and source lines reach a
terminal only through :func:`clean` (or :func:`one_line`). No torch.

A module named ``"\\x1b]0;PWNED\\x07"`` would set the terminal's title, ``"\\x1b[2J"`` clear the
screen, and a right-to-left override (U+202E) reorder what follows it; rich passes all of these
through. :func:`clean` shows control characters escaped (``\\x1b``), makes bidirectional controls
visible (``⟨U+202E⟩``) and escapes lone surrogates, so what is printed is what the string holds.

    >>> clean("evil\\x1b[2J\\u202eexe.txt")
    'evil\\\\x1b[2J⟨U+202E⟩exe.txt'
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# bidirectional formatting characters: embeddings, overrides, isolates, marks
_BIDI = re.compile(r"[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_SPACE = re.compile(r"\s*\n\s*")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(m: re.Match[str]) -> str:
    ch = m.group()
    return _NAMED.get(ch) or f"\\x{ord(ch):02x}"


def clean(text: str, *, newlines: bool = True) -> str:
    """``text`` with control characters escaped (``\\x1b``), bidirectional controls shown as
    ``⟨U+202E⟩`` and lone surrogates escaped. ``newlines=False`` escapes newlines and tabs too."""
    if not isinstance(text, str):
        text = str(text)
    if text.isprintable() and text.isascii():
        return text  # the common case, fast
    text = _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    text = _BIDI.sub(lambda m: f"⟨U+{ord(m.group()):04X}⟩", text)
    text = _CONTROL.sub(_escape, text)
    if not newlines:
        text = text.replace("\t", "\\t").replace("\n", "\\n")
    return text


#: How much of an analysis's answer, and of each note under it, the terminal prints and the report
#: shows: the same in both (a note cut in one output and whole in the other says two things).
ANSWER_CHARS = 600
NOTE_CHARS = 2000


def one_line(text: str, *, limit: int = 2000) -> str:
    """``text`` cleaned and on one line (line breaks become `` ⏎ ``), cut at ``limit`` characters."""
    text = _SPACE.sub(" ⏎ ", clean(str(text)).strip()).replace("\t", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: the address in an object's default ``repr`` (``<Work object at 0x7f...>``)
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def without_address(text: str) -> str:
    """``text`` without the memory address a default ``repr`` holds: the same text on every run
    (a graph's JSON compares equal between two captures of one model)."""
    return _ADDRESS.sub("", text) if " at 0x" in text else text


__all__ = ["clean", "one_line", "without_address"]
