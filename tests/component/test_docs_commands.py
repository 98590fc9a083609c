"""The commands the README and the examples tell a user to run by hand, run as written (a new user's first
contact: a command that exits 2 there is the first bug they meet)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    """The controller commands of README's "Try it by hand" block (continuation lines joined, comments
    dropped)."""
    text = (REPO / "README.md").read_text()
    block = text.split("## Try it by hand", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = [line.split("#", 1)[0].strip() for line in joined.splitlines()]
    return [line for line in lines if " -m controller " in line]


def _example_commands() -> list[str]:
    """Each example's own ``# Render: python -m controller ...`` line."""
    out = []
    for path in sorted((REPO / "docs" / "examples").glob("*.yaml")):
        m = re.search(r"^# Render: (python -m controller .+)$", path.read_text(), re.MULTILINE)
        assert m, f"{path.name}: no '# Render:' line"
        out.append(m.group(1))
    return out


def test_the_readme_shows_controller_commands() -> None:
    assert len(_readme_commands()) >= 3


@pytest.mark.parametrize("command", _readme_commands() + _example_commands())
def test_a_documented_command_succeeds_as_written(command: str) -> None:
    argv = shlex.split(command)
    argv[0] = sys.executable  # ".venv/bin/python" or "python": this interpreter either way
    if "|" in argv:
        argv = argv[: argv.index("|")]
    res = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, f"{command}\n{res.stderr[-2000:]}"
    assert res.stdout.strip(), f"{command}: printed nothing"
