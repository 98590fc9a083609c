"""Every program's command line: each option, positional and subcommand says what it is in ``--help``,
``--version`` prints the project's version and exits 0, and ``--log-format`` offers text and json. The
parsers are walked as argparse holds them (subcommands included), so a flag added without help fails here."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator

import pytest

import agent.__main__
import controller.__main__
import exporter.__main__
import initnat.__main__
import lab.controlplane.cli
import lab.demo
import lab.kubeapi.cli
import lab.openstack.__main__
from gwkit.version import version

PROGRAMS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "controller": controller.__main__.build_parser,
    "agent": agent.__main__.build_parser,
    "exporter": exporter.__main__.parser,
    "initnat": initnat.__main__.build_parser,
    "lab": lab.demo.parser,
    "lab-controlplane": lab.controlplane.cli.parser,
    "lab-kubeapi": lab.kubeapi.cli.parser,
    "lab-openstack": lab.openstack.__main__.build_parser,
}


def walk(p: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
    """(where, action) of every action of ``p`` and of its subcommands' parsers."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            helped = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if sub.add_help:  # lab's "controlplane" entry: only listed, its own parser is another program
                    assert helped.get(name), f"{path} {name}: a subcommand without help"
                    yield from walk(sub, f"{path} {name}")
        else:
            yield path, action


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_option_has_help(program: str) -> None:
    missing = [
        f"{where}: {'/'.join(a.option_strings) or a.dest}"
        for where, a in walk(PROGRAMS[program](), program)
        if a.help != argparse.SUPPRESS and not (a.help or "").strip()
    ]
    assert not missing, f"options without help text: {missing}"


def test_the_walk_sees_subcommands_and_would_catch_a_bare_flag() -> None:
    p = controller.__main__.build_parser()
    seen = {(where, s) for where, a in walk(p, "controller") for s in a.option_strings}
    assert ("controller run", "--kubeconfig") in seen and ("controller render", "--nic-mac") in seen
    p.add_argument("--bare")
    assert any(a.dest == "bare" and not a.help for _, a in walk(p, "controller"))


@pytest.mark.parametrize("program", PROGRAMS)
def test_version_prints_the_version_and_exits_0(program: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        PROGRAMS[program]().parse_args(["--version"])
    assert exit_.value.code in (0, None)
    out = capsys.readouterr().out
    assert out.strip().endswith(f" {version()}")


@pytest.mark.parametrize("program", PROGRAMS)
def test_log_format_is_text_or_json(program: str) -> None:
    (action,) = [a for a in PROGRAMS[program]()._actions if "--log-format" in a.option_strings]
    assert tuple(action.choices or ()) == ("text", "json") and action.default == "text"


def test_the_agent_exits_0_on_version(capsys: pytest.CaptureFixture[str]) -> None:
    """The agent parses through its own wrapper (exit codes of its own): --version is still 0."""
    assert agent.__main__.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"python -m agent {version()}"
