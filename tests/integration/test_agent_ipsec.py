"""The IPsec status-agent (``python -m agent``) against live charon daemons in the lab.

The gateway's charon is driven only by the agent, from a plan built here with gwplan dataclasses. Every
remote site is configured independently over VICI (lab/peers.py), as a tenant's firewall would be. The agent
runs as a subprocess (so charon can be killed under it), stopped in the fixture's teardown.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent.vici import ViciSession
from gwplan import Child, GatewayRef, IkeSecret, Ipsec, Plan, SecretRef, Tunnel, dumps
from lab.peers import configure_site
from lab.world import SERVICE_CIDR, Host, Lab

pytestmark = [pytest.mark.lab, pytest.mark.anyio]

PSK = "agent-lab-psk-7d41e0"  # test-only values
PSK2 = "agent-lab-psk-rotated-55aa"
GW_ID = "gw.lab.example"
GATEWAY = GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "tenant-a", "gw")


def site_id(site: Host) -> str:
    return f"{site.role}.lab.example"


def gw_tunnel(lab: Lab, site: Host, child_options: dict[str, str] | None = None) -> Tunnel:
    children = tuple(Child(f"{site.role}-{i}", lan) for i, lan in enumerate(site.lans))
    conn = {
        site.role: {
            "version": "2",
            "local_addrs": [lab.gw.addresses[0]],
            "remote_addrs": [site.addresses[0]],
            "proposals": ["aes256-sha256-modp2048"],
            "rekey_time": "3600",
            "local": {"auth": "psk", "id": GW_ID},
            "remote": {"auth": "psk", "id": site_id(site)},
            "children": {
                c.name: {
                    "local_ts": [SERVICE_CIDR],
                    "remote_ts": [c.remote_subnet],
                    "esp_proposals": ["aes256gcm16-modp2048"],
                    **(child_options or {}),
                }
                for c in children
            },
        }
    }
    return Tunnel(site.role, True, children, conn)


def make_plan(lab: Lab, sites: list[Host], child_options: dict[str, str] | None = None) -> Plan:
    return Plan(
        gateway=GATEWAY,
        type="ipsec",
        ipsec=Ipsec(
            secrets=tuple(
                IkeSecret(f"psk-{s.role}", (GW_ID, site_id(s)), SecretRef("tenant-psk", "psk")) for s in sites
            ),
            tunnels=tuple(gw_tunnel(lab, s, child_options) for s in sites),
        ),
    )


async def setup_site(
    lab: Lab, site: Host, psk: str = PSK, child_options: dict[str, str] | None = None
) -> None:
    assert site.charon is not None
    async with await ViciSession.connect(site.charon.vici_socket) as v:
        await configure_site(
            v,
            name="gw",
            psk=psk,
            local_addr=site.addresses[0],
            remote_addr=lab.gw.addresses[0],
            local_id=site_id(site),
            remote_id=GW_ID,
            local_ts=site.lans,
            remote_ts=[SERVICE_CIDR],
            child_options=child_options,
        )


class Agent:
    """``python -m agent`` on a plan file, a secrets dir and a status file, as the pod runs it."""

    def __init__(self, lab: Lab, work: Path) -> None:
        self.lab = lab
        self.work = work
        self.plan_file = work / "plan.json"
        self.secrets = work / "secrets"
        self.status_file = work / "status.json"
        self.log_file = work / "agent.log"
        self.proc: subprocess.Popen[bytes] | None = None
        (self.secrets / "tenant-psk").mkdir(parents=True, exist_ok=True)

    def write_plan(self, plan: Plan) -> None:
        tmp = self.plan_file.with_suffix(".tmp")
        tmp.write_bytes(dumps(plan))
        os.replace(tmp, self.plan_file)

    def write_psk(self, psk: str) -> None:
        tmp = self.secrets / "tenant-psk" / ".psk.tmp"
        tmp.write_text(psk)
        os.replace(tmp, self.secrets / "tenant-psk" / "psk")

    def start(self, *extra: str) -> None:
        assert self.lab.gw.charon is not None
        argv = [
            sys.executable, "-m", "agent",
            "--plan", str(self.plan_file),
            "--secrets-dir", str(self.secrets),
            "--vici-socket", str(self.lab.gw.charon.vici_socket),
            "--status-file", str(self.status_file),
            "--poll-interval", "0.2",
            "--resync-seconds", "2",
            *extra,
        ]  # fmt: skip
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def status(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.status_file.read_text()))
        except (FileNotFoundError, ValueError):
            return {}

    def tunnels(self) -> dict[str, dict[str, Any]]:
        return {t["name"]: t for t in self.status().get("tunnels", [])}

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def wait_for(self, cond: Callable[[dict[str, dict[str, Any]]], bool], timeout: float, what: str) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if cond(self.tunnels()):
                return time.monotonic() - start
            assert self.proc is not None and self.proc.poll() is None, f"agent exited:\n{self.log()[-3000:]}"
            time.sleep(0.02)
        raise AssertionError(f"{what} not reached in {timeout}s: {self.tunnels()}\n{self.log()[-3000:]}")


def all_established(names: list[str]) -> Callable[[dict[str, dict[str, Any]]], bool]:
    return lambda ts: all(ts.get(n, {}).get("state") == "Established" for n in names)


@pytest.fixture
def agent(lab: Lab, tmp_path: Path) -> Iterator[Agent]:
    a = Agent(lab, tmp_path)
    try:
        yield a
    finally:
        a.stop()


async def gw_sas(lab: Lab) -> dict[str, dict[str, Any]]:
    assert lab.gw.charon is not None
    async with await ViciSession.connect(lab.gw.charon.vici_socket) as v:
        events, _ = await v.stream("list-sas", {}, "list-sa")
    return {name: sa for e in events for name, sa in e.items()}


def start_sites(lab: Lab, n: int) -> list[Host]:
    sites = [lab.add_site() for _ in range(n)]
    lab.start_charon(lab.gw)
    for s in sites:
        lab.start_charon(s)
    return sites


async def bring_up(lab: Lab, agent: Agent, n: int, child_options: dict[str, str] | None = None) -> list[Host]:
    sites = start_sites(lab, n)
    for s in sites:
        await setup_site(lab, s, child_options=child_options)
    agent.write_psk(PSK)
    agent.write_plan(make_plan(lab, sites, child_options))
    agent.start()
    agent.wait_for(all_established([s.role for s in sites]), 30, "all tunnels Established")
    return sites


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


# --- acceptance ------------------------------------------------------------------------------------------


async def test_twenty_site_tunnels_established_with_rekey_at_from_charon(lab: Lab, agent: Agent) -> None:
    sites = await bring_up(lab, agent, 20)
    sas = await gw_sas(lab)
    now = datetime.now(UTC)
    tunnels = agent.tunnels()
    assert len(sas) == 20, "exactly one IKE_SA per site: the watchdog never duplicates"
    for s in sites:
        t = tunnels[s.role]
        expected = now.timestamp() + int(sas[s.role]["rekey-time"])
        assert abs(parse_time(t["rekeyAt"]).timestamp() - expected) <= 2, (t, sas[s.role]["rekey-time"])
        assert t["children"] == [{"name": f"{s.role}-0", "remoteSubnet": s.lans[0], "state": "Established",
                                  "rekeyAt": t["children"][0]["rekeyAt"]}]  # fmt: skip
        assert t["lastError"] is None and parse_time(t["establishedAt"]) <= now
    assert agent.status()["agent"]["connected"] is True
    assert PSK not in agent.log() and PSK not in agent.status_file.read_text()
