"""The gateway pods' programs log in the controller's format (``--log-format``, the chart's ``logFormat``):
each command line in the pod spec is parsed by that program's own parser, so the flag is one it accepts."""

from __future__ import annotations

from typing import Any

import pytest

import gwplan
from agent.__main__ import parse_settings
from controller.__main__ import build_parser as controller_parser
from controller.names import GatewayKey
from controller.podspec import containers
from controller.reconcile import Snapshot, peers_of, render_gateway
from controller.runcli import settings_of
from controller.settings import GatewayPod, Settings
from exporter.__main__ import parser as exporter_parser
from initnat.__main__ import build_parser as initnat_parser
from tests.examples import example_docs

KEY = GatewayKey("VPNGateway", "tenant-acme", "acme")


def plan(kind: str) -> gwplan.Plan:
    docs = example_docs(f"{kind}.yaml")
    gateway = {**docs[0], "metadata": {**docs[0]["metadata"], "uid": "u", "generation": 1}}
    snap = Snapshot(KEY, gateway, peers_of(KEY, [d for d in docs[1:] if d["kind"] == "VPNPeer"]))
    rendered = render_gateway(snap, Settings())
    assert rendered.plan is not None
    return rendered.plan


def log_format_of(name: str, command: list[str]) -> str:
    """The format the program would log in, read by its own parser from the container's command."""
    assert command[:2] == ["python3", "-m"], command
    program, argv = command[2], command[3:]
    if program == "agent":
        return parse_settings(argv)[2]
    parsers: dict[str, Any] = {"exporter": exporter_parser, "initnat": initnat_parser}
    return str(parsers[program]().parse_args(argv).log_format)


@pytest.mark.parametrize("kind", ["ipsec", "wireguard"])
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_every_program_in_the_gateway_pod_logs_in_the_configured_format(kind: str, fmt: str) -> None:
    settings = Settings(pod=GatewayPod(log_format="json" if fmt == "json" else "text"))
    init, main = containers(KEY, plan(kind), settings)
    ours = {c["name"]: c["command"] for c in init + main if c["command"][:2] == ["python3", "-m"]}
    assert sorted(ours) == ["exporter", "init-nat", "init-nat-watch", "status-agent"]
    for name, command in ours.items():
        assert log_format_of(name, command) == fmt, name
        # text is the programs' default: no flag, so a text installation's pods are the ones it had
        assert ("--log-format" in command) == (fmt == "json"), name


def test_the_controllers_log_format_is_the_one_it_gives_the_gateway_pods() -> None:
    for argv, want in (([], "text"), (["--log-format", "json"], "json")):
        args = controller_parser().parse_args([*argv, "run"])
        assert settings_of(args).pod.log_format == want
