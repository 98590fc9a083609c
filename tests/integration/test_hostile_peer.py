"""A hostile peer against the real thing: can one peer of a gateway authenticate as another?

The gateway's charon is configured only by the status-agent (``python -m agent``) from a plan the
controller rendered (``controller.plan.render``), with each peer's PSK in its own Secret file, exactly as
a pod runs it. The attackers are stock charon daemons configured by hand (what a patched client would send is
the same IKE_AUTH: the peer's claimed identity, signed with the attacker's own key).

charon's credential sets return a shared key when EITHER of its owners matches the local or the remote
identity of the exchange, and its PSK authenticator tries every key returned until one verifies
(LAB-FACTS.md, "Shared keys and identities"). A key owned by the gateway's own id is therefore tried for
every peer. The evidence is charon's own log line ``authentication of '<id>' with pre-shared key
successful``, written by the gateway the moment it accepts the claimed identity: a stock initiator then
gives up (it cannot verify the gateway's AUTH, made with the victim's key), a patched one would not.

Real daemons (lab marker); the Lab context manager tears down namespaces, daemons and the agent.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import gwplan
from controller.api.validate import InvalidInput
from controller.plan.render import RenderOptions, render_documents
from gwkit.vici import ViciCommandFailed, ViciSession
from lab.daemons import Charon
from lab.peers import psk_conn
from lab.wait import wait_for, wait_for_async
from lab.world import SERVICE_CIDR, Host, Lab

pytestmark = [pytest.mark.lab, pytest.mark.anyio]

GW_ID = "gw.lab.example"
# Test-only keys, one per peer, as the tenant's Secrets hold them.
KEYS = {"alice": "alice-psk-3f9a1c", "mallory": "mallory-psk-77be02", "s1": "s1-psk-c41d9e"}


def peer(name: str, kind: str, ike_id: str, subnet: str, endpoint: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "gatewayRef": {"name": "acme"},
        "type": kind,
        "ipsec": {
            "id": ike_id,
            "remoteSubnets": [subnet],
            "pskSecretRef": {"name": f"{name}-psk", "key": "psk"},
        },
    }
    if endpoint:
        spec["endpoint"] = endpoint
    return {"apiVersion": "vpn.bnerd.net/v1alpha1", "kind": "VPNPeer",
            "metadata": {"name": name, "namespace": "tenant-acme"}, "spec": spec}  # fmt: skip


def documents(alice: Host, mallory: Host, site: Host) -> list[dict[str, Any]]:
    gateway = {
        "apiVersion": "vpn.bnerd.net/v1alpha1",
        "kind": "VPNGateway",
        "metadata": {"name": "acme", "namespace": "tenant-acme"},
        "spec": {
            "type": "ipsec",
            "serviceCIDR": SERVICE_CIDR,
            "ipsec": {"localID": GW_ID, "ike": {"version": 2, "proposals": ["aes256-sha256-modp2048"]},
                      "esp": {"proposals": ["aes256gcm16-modp2048"]}},
        },
    }  # fmt: skip
    return [
        gateway,
        peer("alice", "roadWarrior", "alice.lab.example", alice.lans[0]),
        peer("mallory", "roadWarrior", "mallory.lab.example", mallory.lans[0]),
        peer("s1", "site", "s1.lab.example", site.lans[0], endpoint=site.addresses[0]),
    ]


class GatewayAgent:
    """``python -m agent`` driving the gateway's charon from a rendered plan and per-peer Secret files."""

    def __init__(self, lab: Lab, work: Path, plan: gwplan.Plan) -> None:
        assert lab.gw.charon is not None
        (work / "plan.json").write_bytes(gwplan.dumps(plan))
        for name, key in KEYS.items():
            (work / "secrets" / f"{name}-psk").mkdir(parents=True)
            (work / "secrets" / f"{name}-psk" / "psk").write_text(key)
        self.log = work / "agent.log"
        argv = [
            sys.executable, "-m", "agent", "--plan", str(work / "plan.json"),
            "--secrets-dir", str(work / "secrets"), "--vici-socket", str(lab.gw.charon.vici_socket),
            "--status-file", str(work / "status.json"), "--poll-interval", "0.2", "--resync-seconds", "2",
        ]  # fmt: skip
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=out, stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


@pytest.fixture
def world(lab: Lab, tmp_path: Path) -> Iterator[tuple[Lab, dict[str, Host], gwplan.Plan]]:
    hosts = {name: lab.add_site(name) for name in ("alice", "mallory", "s1")}
    plan = render_documents(
        documents(hosts["alice"], hosts["mallory"], hosts["s1"]),
        RenderOptions(internal_source_cidrs=("192.0.2.64/26",)),
    )
    g = lab.start_charon(lab.gw)
    agent = GatewayAgent(lab, tmp_path, plan)
    try:
        _wait_for_conns(g, {"alice", "mallory", "s1"})
        yield lab, hosts, plan
    finally:
        agent.stop()


def _wait_for_conns(charon: Charon, names: set[str], timeout: float = 20) -> None:
    def loaded() -> bool:
        out = charon.swanctl("--list-conns").stdout.decode()
        return all(re.search(rf"^{n}: ", out, re.M) for n in names)

    wait_for(loaded, timeout, f"the agent to load {sorted(names)} into the gateway's charon", interval=0.1)


async def claim(lab: Lab, host: Host, *, claimed_id: str, key: str, lan: str) -> tuple[bool, str]:
    """``host``'s own charon initiates to the gateway presenting ``claimed_id``, signing with ``key``.
    Returns (the initiator's SA came up, the gateway's log lines written during the attempt)."""
    c = host.charon or lab.start_charon(host)
    assert lab.gw.charon is not None
    mark = len(lab.gw.charon.log_text())
    async with await ViciSession.connect(c.vici_socket) as v:
        await v.call("load-shared", {"id": "k", "type": "IKE", "data": key, "owners": [claimed_id]})
        await v.call(
            "load-conn",
            psk_conn("gw", local_addr=host.addresses[0], remote_addr=lab.gw.addresses[0], local_id=claimed_id,
                     remote_id=GW_ID, children={"lan": ([lan], [SERVICE_CIDR])}),
        )  # fmt: skip
        try:
            await v.stream("initiate", {"child": "lan", "timeout": "5000"}, "control-log")
            up = True
        except ViciCommandFailed:
            up = False
        if up:
            await v.call("terminate", {"ike": "gw", "force": "yes", "timeout": "-1"})
        await v.call("unload-conn", {"name": "gw"})
        await v.call("unload-shared", {"id": "k"})
    charon = lab.gw.charon
    # The gateway logs its side of the exchange a moment later: waited for until its verdict on the
    # claimed identity is there (accepted, or its key's MAC mismatched / authentication failed).
    accepted_line = f"authentication of '{claimed_id}' with pre-shared key successful"
    verdicts = (accepted_line, "MAC mismatched", "AUTHENTICATION_FAILED", "AUTH_FAILED")
    await wait_for_async(
        lambda: any(v in charon.log_text()[mark:] for v in verdicts),
        10,
        f"the gateway's verdict on {claimed_id} in its log",
    )
    return up, charon.log_text()[mark:]


def accepted(gateway_log: str, ike_id: str) -> bool:
    """The gateway's charon says it authenticated ``ike_id`` by PSK."""
    return f"authentication of '{ike_id}' with pre-shared key successful" in gateway_log


async def test_a_road_warrior_cannot_authenticate_as_another_with_its_own_key(
    world: tuple[Lab, dict[str, Host], gwplan.Plan],
) -> None:
    lab, hosts, _ = world
    alice, mallory = hosts["alice"], hosts["mallory"]

    lan = mallory.lans[0]
    up, log = await claim(lab, mallory, claimed_id="alice.lab.example", key=KEYS["mallory"], lan=lan)
    assert not accepted(log, "alice.lab.example"), "the gateway accepted mallory's key for alice's identity"
    assert not up
    assert "MAC mismatched" in log or "AUTHENTICATION_FAILED" in log, log[-2000:]

    # Each still authenticates with her own key, so the refusal above is not a broken gateway.
    for host in (alice, mallory):
        own = f"{host.role}.lab.example"
        up, log = await claim(lab, host, claimed_id=own, key=KEYS[host.role], lan=host.lans[0])
        assert up and accepted(log, own), log[-2000:]


async def test_a_peer_at_a_site_peers_address_cannot_pass_as_the_site_with_its_own_key(
    world: tuple[Lab, dict[str, Host], gwplan.Plan],
) -> None:
    """The site peer's pinned endpoint is no shield against someone who can send from that address (the
    same NAT, a spoofed source on a path without filtering): mallory's charon runs at s1's address."""
    lab, hosts, _ = world
    site = hosts["s1"]
    up, log = await claim(lab, site, claimed_id="s1.lab.example", key=KEYS["mallory"], lan=site.lans[0])
    assert not accepted(log, "s1.lab.example"), "the gateway accepted mallory's key for the site's identity"
    assert not up
    up, log = await claim(lab, site, claimed_id="s1.lab.example", key=KEYS["s1"], lan=site.lans[0])
    assert up and accepted(log, "s1.lab.example"), log[-2000:]


async def test_charon_reads_an_ipv4_range_id_as_a_pattern_so_validation_refuses_it(lab: Lab) -> None:
    """Why ``0.0.0.1-255.255.255.254`` is no identity: loaded as a peer's id (bypassing validation), it
    lets a peer presenting ANY address id in it select that config and use that key. The controller
    refuses it (and gwplan.loads refuses it as a key owner)."""
    wide = "0.0.0.1-255.255.255.254"
    site = lab.add_site("wide")
    g = lab.start_charon(lab.gw)
    async with await ViciSession.connect(g.vici_socket) as v:
        await v.call("load-shared", {"id": "wide", "type": "IKE", "data": KEYS["mallory"], "owners": [wide]})
        conn = psk_conn("wide", local_addr=lab.gw.addresses[0], remote_addr="%any", local_id=GW_ID,
                        remote_id=wide, children={"lan": ([SERVICE_CIDR], [site.lans[0]])})  # fmt: skip
        await v.call("load-conn", conn)
    presented = "198.51.100.77"  # an address id nobody configured
    up, log = await claim(lab, site, claimed_id=presented, key=KEYS["mallory"], lan=site.lans[0])
    assert up and accepted(log, presented), log[-2000:]

    documents_ = documents(site, site, site)[:2]
    documents_[1]["spec"]["ipsec"]["id"] = wide
    with pytest.raises(InvalidInput, match="is an IPv4 address range"):
        render_documents(documents_, RenderOptions(internal_source_cidrs=("192.0.2.64/26",)))
    with pytest.raises(gwplan.PlanError, match="address range"):
        doc = gwplan.to_dict(render_documents(documents(site, site, site)[:2], RenderOptions()))
        doc.pop("hash", None)
        doc["ipsec"]["secrets"][0]["owners"] = [wide]
        gwplan.from_dict(doc)
