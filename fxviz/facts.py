"""What a capture records about where things came from and how it went: source locations, capture
attempts, the assumptions a symbolic graph rests on, module facts. Plain data, no torch; the IR
(:mod:`fxviz.ir`) re-exports each name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SourceLoc:
    """Where in the user's code a node came from."""

    file: str
    line: int
    func: str = ""
    code: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    def short(self) -> str:
        """``model.py:12`` (file name without directories)."""
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}"

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "func": self.func, "code": self.code}


@dataclass(frozen=True, slots=True)
class Attempt:
    """One capture attempt: which method, whether it worked, and why not. A ``skipped`` attempt
    never ran: the chain knew it could not succeed for the reason an earlier one failed
    (``message`` says which)."""

    method: str
    ok: bool
    seconds: float = 0.0
    error_type: str = ""
    message: str = ""
    source: SourceLoc | None = None
    skipped: bool = False

    def reason(self) -> str:
        """The failure in one line: ``GuardOnDataDependentSymNode: Could not guard on ... (m.py:12)``,
        or ``skipped: ...`` for an attempt that never ran."""
        if self.ok:
            return "ok"
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        if self.skipped:
            return f"skipped: {first}" if first else "skipped"
        text = f"{self.error_type}: {first}" if first else self.error_type
        return f"{text} ({self.source.short()})" if self.source else text

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"method": self.method, "ok": self.ok, "seconds": round(self.seconds, 4)}
        if not self.ok:
            d.update(error_type=self.error_type, message=self.message)
        if self.skipped:
            d["skipped"] = True
        if self.source is not None:
            d["source"] = self.source.to_dict()
        return d


@dataclass(frozen=True, slots=True)
class Assumption:
    """A condition on the inputs that symbolic capture took as given: a shape guard from user code
    (``x.shape[0] > 2`` where the forward branches on it), or a runtime assertion export deferred
    to its graph (``u0 == 2`` from ``torch._check(n == 2)``, kind ``assertion``). The captured graph
    holds only for inputs that meet it; ``holds`` says whether the example inputs do."""

    expr: str
    source: SourceLoc | None = None
    holds: bool | None = None  # for the example inputs; None when they were not checked
    kind: str = "guard"  # "guard" (a choice export made) or "assertion" (checked when the graph runs)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"expr": self.expr}
        if self.source is not None:
            d["source"] = self.source.to_dict()
        if self.holds is not None:
            d["holds"] = self.holds
        if self.kind != "guard":
            d["kind"] = self.kind
        return d


@dataclass(frozen=True, slots=True)
class ModuleInfo:
    """Facts about one submodule of the model, known at capture time."""

    cls: str  # class name, e.g. "GPT2Block"
    qualname: str = ""  # "transformers.models.gpt2.modeling_gpt2.GPT2Block"

    def to_dict(self) -> dict[str, Any]:
        return {"cls": self.cls, "qualname": self.qualname}
