"""Every command the README shows runs as written: each ``fxviz ...`` line of its fenced ``bash``,
``sh`` and ``console`` (``$ ...``) blocks is run in process through click's CliRunner and must exit
0 and print its key line. A command the README adds must be listed here, run or not run (with the
reason), or this test fails."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from fxviz.cli import cli

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")

#: Commands shown but not run here, and why.
NOT_RUN = {
    "make demo": "sets a fresh machine up (apt, npm, a virtual environment) before it runs fxviz",
    "make test": "runs the whole suite, this test included",
}

#: Each command run, and a line its output must hold. The ``my_model.py`` ones run on the README's
#: own ``my_model.py`` (a 12-layer GPT-2, narrowed to 32 wide so that it captures in seconds).
EXPECT = {
    "fxviz tree fxviz.examples:cnn": "CoolCNN  captured by torch.export  ·  269.1K params  ·  15 ops",
    "fxviz tree fxviz.examples:CoolCNN --input-shape 1,3,32,32": "CoolCNN  captured by torch.export  ·  269.1K params",
    "fxviz tree tests/fallback_models.py:DataDependentIf --input-shape 2,8":
        "DataDependentIf  captured by the eager tracer  ·  72 params  ·  5 ops",
    "fxviz passes fxviz.examples:cnn --pass examples.my_passes:fuse_linear_relu --pass "
    "examples.my_passes:swap_add_for_sub": "numbers first diverge at stage 2 (swap_add_for_sub)",
    "fxviz tree my_model.py:build": "h.0-11 ×12 (GPT2Block)",
    "fxviz tree my_model.py:build --depth 2": "h.0-11 ×12 (GPT2Block)",
    "fxviz tree my_model.py:build --unfold": "h.11 (GPT2Block)",
    "fxviz tree my_model.py:build --method eager": "GPT2LMHeadModel  captured by the eager tracer",
    "fxviz json my_model.py:build -o graph.json": "",  # prints nothing: the file is checked
    "fxviz html my_model.py:build -o report.html": "wrote report.html",
    "fxviz render my_model.py:build -f svg --depth 2": ".svg",
    "fxviz diff my_model.py:build": "transformer (GPT2Model)",
}


def readme_commands() -> list[str]:
    """The commands of the README's fenced shell blocks, comments cut."""
    out = []
    for lang, body in re.findall(r"```(\w+)\n(.*?)```", README, re.S):
        for line in body.splitlines():
            text = line.strip()
            if lang == "console":
                if not text.startswith("$ "):
                    continue
                text = text[2:]
            elif lang not in ("bash", "sh"):
                continue
            words = shlex.split(text, comments=True)
            if words and (words[0] in ("fxviz", "make") or words[:3] == ["python", "-m", "fxviz"]):
                out.append(" ".join(words))
    return out


def test_every_readme_command_is_run_or_says_why_not() -> None:
    commands = readme_commands()
    assert len(commands) >= 10 and len(set(commands)) == len(commands)
    assert set(commands) == set(EXPECT) | set(NOT_RUN)


def _run(command: str, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(cwd)
    words = shlex.split(command)
    args = words[3:] if words[0] == "python" else words[1:]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, f"{command}\n{res.output}"
    assert EXPECT[command] in res.output, f"{command}\n{res.output}"


@pytest.mark.parametrize("command", [c for c in EXPECT if "my_model.py" not in c])
def test_readme_command_runs(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _run(command, REPO, monkeypatch)


def _my_model() -> str:
    """The README's ``my_model.py``, as written but 32 wide."""
    block = next(b for b in re.findall(r"```python\n(.*?)```", README, re.S) if b.startswith("# my_model.py"))
    assert "GPT2Config(n_layer=12)" in block
    return block.replace("GPT2Config(n_layer=12)", "GPT2Config(n_layer=12, n_embd=32, n_head=2)")


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c in EXPECT if "my_model.py" in c])
def test_readme_command_on_my_model_runs(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_model.py").write_text(_my_model(), encoding="utf-8")
    _run(command, tmp_path, monkeypatch)
    for name in ("graph.json", "report.html"):
        if f"-o {name}" in command:
            assert (tmp_path / name).stat().st_size > 1000 and "transformer.h.11" in (tmp_path / name).read_text()
