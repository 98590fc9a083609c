"""Which CA vouches for which peer, against live charon daemons: trust is pinned per connection, and a CA
the plan withdraws is forgotten at once.

charon's VICI ``load-cert`` (flag CA) adds a trust anchor to a credential set that nothing but
``clear-creds`` (or a restart) empties, and a connection without ``cacerts`` in its remote auth round
accepts a certificate from ANY CA charon holds. So before the fix: a CA the plan replaced kept vouching
for the peer id it used to (the holder of an old certificate authenticated again right after the agent cut
its tunnel), and a CA meant for peer A vouched for peer B. The gateway's charon is configured only by the
status-agent (``python -m agent``) from a plan file; the peers are stock charon daemons configured by hand
over VICI, as a tenant's laptop or firewall would be. The evidence is the gateway's own log: ``no trusted
... public key found`` for a CA it no longer holds, ``constraint check failed`` for a CA pinned to another
peer, and ``IKE_SA ... established`` when it accepts one.

Real daemons (lab marker); the Lab context manager tears down namespaces and daemons, the fixtures stop
the agent, on every exit path.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gwkit.vici import ViciCommandFailed, ViciSession
from gwplan import Child, IkeCertificate, IkePrivateKey, IkeSecret, Ipsec, Plan, SecretRef, Tunnel
from lab.peers import psk_conn
from lab.wait import wait_for_async
from lab.world import SERVICE_CIDR, Host, Lab
from tests.integration.test_agent_ipsec import GATEWAY, GW_ID, Agent, gw_sas
from tests.integration.test_agent_ipsec_pubkey import issue, openssl

pytestmark = [pytest.mark.lab, pytest.mark.anyio]

PROPOSALS = ["aes256-sha256-ecp256"]
ESP = ["aes256gcm16"]
P_PSK = "ca-lab-psk-p-0c51"  # test-only value


# --- a PKI made with openssl -------------------------------------------------------------------------


def make_ca(d: Path, subject: str) -> bytes:
    """A self-signed CA in its own directory ``d`` (``ca.crt``, ``ca.key``; ``issue`` signs with them)."""
    d.mkdir(parents=True)
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "ca.key", "-out", "ca.crt", "-subj", subject, "-days", "2", cwd=d)  # fmt: skip
    return (d / "ca.crt").read_bytes()


@dataclass(frozen=True)
class Credentials:
    """What a peer presents: a certificate for ``ike_id`` and its key, and the CA it trusts the gateway by."""

    ike_id: str
    cert: bytes
    key: bytes


class Pki:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.serial = 100
        self.gw_ca = make_ca(root / "gw-ca", "/CN=lab gateway CA")
        self.gw_cert, self.gw_key = self.issue("gw-ca", GW_ID)

    def ca(self, name: str, subject: str) -> bytes:
        return make_ca(self.root / name, subject)

    def issue(self, ca: str, ike_id: str) -> tuple[bytes, bytes]:
        self.serial += 1
        return issue(self.root / ca, f"leaf{self.serial}", ike_id, self.serial)

    def peer(self, ca: str, ike_id: str) -> Credentials:
        cert, key = self.issue(ca, ike_id)
        return Credentials(ike_id, cert, key)


def write_secret(secrets: Path, name: str, key: str, data: bytes) -> None:
    d = secrets / name
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{key}.tmp"
    tmp.write_bytes(data)
    tmp.replace(d / key)


# --- the gateway's plan ------------------------------------------------------------------------------


def rw_id(host: Host) -> str:
    return f"{host.role}.lab.example"


def rw_tunnel(lab: Lab, host: Host, *cas: str) -> Tunnel:
    """A road warrior's conn on the gateway (the peer dials in), as the controller renders it: its peer's
    certificate must chain to one of ``cas`` (none: the peer authenticates with a PSK)."""
    auth = "pubkey" if cas else "psk"
    name = host.role
    child = Child(f"{name}-0", host.lans[0])
    conn = {name: {
        "version": "2", "local_addrs": [lab.gw.addresses[0]], "remote_addrs": ["%any"],
        "proposals": PROPOSALS, "unique": "replace",
        "local": {"auth": auth, "id": GW_ID}, "remote": {"auth": auth, "id": rw_id(host)},
        "children": {child.name: {"mode": "tunnel", "local_ts": [SERVICE_CIDR], "remote_ts": [host.lans[0]],
                                  "esp_proposals": ESP, "start_action": "none"}},
    }}  # fmt: skip
    return Tunnel(name, False, (child,), conn, peer_cas=cas or None)


GW_CERT = IkeCertificate("gateway", SecretRef("gw-tls", "tls.crt"))
GW_KEY = IkePrivateKey("gateway", SecretRef("gw-tls", "tls.key"))


def ca_cert(cid: str, secret: str) -> IkeCertificate:
    return IkeCertificate(cid, SecretRef(secret, "ca.crt"), ca=True)


# --- the peers: stock charon, configured by hand ------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    up: bool
    """The peer's IKE_SA and CHILD_SA came up."""
    gateway_log: str
    """What the gateway's charon logged during the attempt."""

    def accepted(self, ike_id: str) -> bool:
        """The gateway's charon set up an IKE_SA with a peer it authenticated as ``ike_id`` (a verified
        signature alone is not enough: charon logs ``authentication of ... successful`` before it checks
        the conn's constraints, the pinned CA among them)."""
        established = (
            rf"IKE_SA \S+ established between \S+\[{re.escape(GW_ID)}\]\.\.\.\S+\[{re.escape(ike_id)}\]"
        )
        return re.search(established, self.gateway_log) is not None


async def dial(
    lab: Lab,
    host: Host,
    pki: Pki,
    *,
    creds: Credentials | None = None,
    psk: str | None = None,
    keep: bool = False,
) -> Attempt:
    """``host``'s charon initiates to the gateway presenting ``creds`` (a certificate) or ``psk``. Whatever
    the host held before is dropped first, so one host can present one certificate, then another.
    ``keep``: leave the SA up."""
    c = host.charon or lab.start_charon(host)
    assert lab.gw.charon is not None
    ike_id = creds.ike_id if creds else rw_id(host)
    async with await ViciSession.connect(c.vici_socket) as v:
        await v.call("terminate", {"ike": "gw", "force": "yes", "timeout": "-1"}, check=False)
        await v.call("unload-conn", {"name": "gw"}, check=False)
        await v.call("clear-creds")
        mark = len(lab.gw.charon.log_text())
        if creds is not None:
            await v.call("load-cert", {"type": "X509", "flag": "CA", "data": pki.gw_ca.decode()})
            await v.call("load-cert", {"type": "X509", "flag": "NONE", "data": creds.cert.decode()})
            await v.call("load-key", {"type": "any", "data": creds.key.decode()})
        else:
            assert psk is not None
            await v.call("load-shared", {"id": "k", "type": "IKE", "data": psk, "owners": [ike_id]})
        conn = psk_conn("gw", local_addr=host.addresses[0], remote_addr=lab.gw.addresses[0], local_id=ike_id,
                        remote_id=GW_ID, children={"lan": ([host.lans[0]], [SERVICE_CIDR])},
                        proposals=PROPOSALS[0], esp=ESP[0])  # fmt: skip
        if creds is not None:
            conn["gw"]["local"]["auth"] = conn["gw"]["remote"]["auth"] = "pubkey"
        await v.call("load-conn", conn)
        try:
            # The gateway logs its verdict before it answers IKE_AUTH: the log is complete when this returns.
            await v.stream("initiate", {"child": "lan", "ike": "gw", "timeout": "5000"}, "control-log")
            up = True
        except ViciCommandFailed:
            up = False
        if not keep:
            await v.call("terminate", {"ike": "gw", "force": "yes", "timeout": "-1"}, check=False)
    return Attempt(up, lab.gw.charon.log_text()[mark:])


async def gw_sa(lab: Lab, name: str) -> dict[str, Any] | None:
    sa = (await gw_sas(lab)).get(name)
    return sa if sa and sa.get("state") == "ESTABLISHED" else None


@pytest.fixture
def agent(lab: Lab, tmp_path: Path) -> Iterator[Agent]:
    a = Agent(lab, tmp_path / "pod")
    try:
        yield a
    finally:
        a.stop()


def no_key_leaked(agent: Agent, *keys: bytes) -> None:
    text = agent.log() + agent.status_file.read_text()
    for key in keys:
        body = b"".join(key.splitlines()[1:-1]).decode()
        assert body[:40] not in text, "a private key leaked into the agent's log or status"
    assert P_PSK not in text, "a PSK leaked into the agent's log or status"


# --- (a) a CA replaced: the old one no longer vouches for anyone --------------------------------------


@pytest.mark.parametrize("how", ["replaced-by-another-id", "rotated-in-place"])
async def test_a_replaced_ca_stops_vouching_at_once_and_the_new_one_takes_over(
    lab: Lab, agent: Agent, tmp_path: Path, how: str
) -> None:
    """CA-old is replaced by CA-new (same subject name: a rotation keeps it): either the plan names another
    CA (``ca-old`` -> ``ca-new``), or the Secret's ``ca.crt`` is replaced under the same id, as
    cert-manager rotates a CA. The tunnel CA-old vouched for is cut, CA-old's certificate is refused from
    then on (the gateway holds no such CA any more), a CA-new certificate for the same id authenticates,
    and a PSK peer's SA is left alone while its key, dropped with the rest by clear-creds, is loaded again."""
    pki = Pki(tmp_path / "pki")
    old_ca = pki.ca("ca-old", "/CN=lab tenant CA")
    new_ca = pki.ca("ca-new", "/CN=lab tenant CA")
    rw, p = lab.add_site("rw"), lab.add_site("p")
    lab.start_charon(lab.gw)
    old = pki.peer("ca-old", rw_id(rw))
    new = pki.peer("ca-new", rw_id(rw))

    write_secret(agent.secrets, "gw-tls", "tls.crt", pki.gw_cert)
    write_secret(agent.secrets, "gw-tls", "tls.key", pki.gw_key)
    write_secret(agent.secrets, "ca-old", "ca.crt", old_ca)
    write_secret(agent.secrets, "p-psk", "psk", P_PSK.encode())
    first_id, then_id = ("ca-old", "ca-new") if how == "replaced-by-another-id" else ("ca", "ca")

    def plan(cid: str) -> Plan:
        return Plan(gateway=GATEWAY, type="ipsec", ipsec=Ipsec(
            secrets=(IkeSecret("psk-p", (rw_id(p),), SecretRef("p-psk", "psk")),),
            tunnels=(rw_tunnel(lab, rw, cid), rw_tunnel(lab, p)),
            certificates=(GW_CERT, ca_cert(cid, "ca-old" if cid in ("ca-old", "ca") else "ca-new")),
            private_keys=(GW_KEY,),
        ))  # fmt: skip

    agent.write_plan(plan(first_id))
    agent.start()
    await wait_for_async(lambda: f"credential.loaded id=cert/{first_id}" in agent.log(), 20, "CA-old loaded")
    await wait_for_async(lambda: "conn.loaded name=rw" in agent.log(), 20, "the conn loaded")

    before = await dial(lab, rw, pki, creds=old, keep=True)
    assert before.up and before.accepted(rw_id(rw)), before.gateway_log[-3000:]
    psk_before = await dial(lab, p, pki, psk=P_PSK, keep=True)
    assert psk_before.up and psk_before.accepted(rw_id(p)), psk_before.gateway_log[-3000:]
    p_sa = await gw_sa(lab, "p")
    assert p_sa is not None and await gw_sa(lab, "rw") is not None

    if how == "replaced-by-another-id":
        write_secret(agent.secrets, "ca-new", "ca.crt", new_ca)
        agent.write_plan(plan(then_id))
        await wait_for_async(lambda: "credential.loaded id=cert/ca-new" in agent.log(), 20, "CA-new loaded")
    else:
        write_secret(agent.secrets, "ca-old", "ca.crt", new_ca)  # the same Secret key, a new CA
        await wait_for_async(
            lambda: agent.log().count("credential.loaded id=cert/ca ") >= 2, 20, "CA-new loaded"
        )

    async def rw_cut() -> bool:
        return await gw_sa(lab, "rw") is None

    await wait_for_async(rw_cut, 20, "the SA CA-old vouched for cut")
    again = await dial(lab, rw, pki, creds=old)
    assert not again.accepted(rw_id(rw)), "the gateway still trusts the CA the plan replaced"
    assert not again.up
    assert f"no trusted ECDSA public key found for '{rw_id(rw)}'" in again.gateway_log, again.gateway_log[
        -3000:
    ]

    fresh = await dial(lab, rw, pki, creds=new)
    assert fresh.up and fresh.accepted(rw_id(rw)), fresh.gateway_log[-3000:]

    still = await gw_sa(lab, "p")
    assert still is not None and still["uniqueid"] == p_sa["uniqueid"], "the PSK peer's SA was cut"
    psk_after = await dial(lab, p, pki, psk=P_PSK)
    assert psk_after.up and psk_after.accepted(rw_id(p)), "the PSK was not loaded again after the clear"
    no_key_leaked(agent, pki.gw_key, old.key, new.key)


# --- (b) two peers, two CAs: neither vouches for the other's peer --------------------------------------


async def test_a_ca_pinned_to_one_peer_cannot_vouch_for_another(
    lab: Lab, agent: Agent, tmp_path: Path
) -> None:
    """Peers a and b, each pinned to its own CA. A certificate for b's id issued by a's CA (a's CA
    signing whatever it likes, or a's admin minting one) is refused for b, from b's own address; each
    still authenticates with a certificate from its own CA, so the refusal is not a broken gateway."""
    pki = Pki(tmp_path / "pki")
    ca_a = pki.ca("ca-a", "/CN=lab CA of a")
    ca_b = pki.ca("ca-b", "/CN=lab CA of b")
    a, b = lab.add_site("a"), lab.add_site("b")
    lab.start_charon(lab.gw)
    write_secret(agent.secrets, "gw-tls", "tls.crt", pki.gw_cert)
    write_secret(agent.secrets, "gw-tls", "tls.key", pki.gw_key)
    write_secret(agent.secrets, "ca-a", "ca.crt", ca_a)
    write_secret(agent.secrets, "ca-b", "ca.crt", ca_b)
    plan = Plan(gateway=GATEWAY, type="ipsec", ipsec=Ipsec(
        tunnels=(rw_tunnel(lab, a, "ca-a"), rw_tunnel(lab, b, "ca-b")),
        certificates=(GW_CERT, ca_cert("ca-a", "ca-a"), ca_cert("ca-b", "ca-b")),
        private_keys=(GW_KEY,),
    ))  # fmt: skip
    agent.write_plan(plan)
    agent.start()
    await wait_for_async(lambda: "conn.loaded name=b" in agent.log(), 20, "the conns loaded")

    forged = pki.peer("ca-a", rw_id(b))
    attempt = await dial(lab, b, pki, creds=forged)
    assert not attempt.accepted(rw_id(b)), "a's CA vouched for b"
    assert not attempt.up
    assert "constraint check failed: peer not authenticated by CA" in attempt.gateway_log, (
        attempt.gateway_log[-3000:]
    )

    for host in (a, b):
        own = await dial(lab, host, pki, creds=pki.peer(f"ca-{host.role}", rw_id(host)))
        assert own.up and own.accepted(rw_id(host)), own.gateway_log[-3000:]
    no_key_leaked(agent, pki.gw_key, forged.key)


# --- (a') a CA dropped while the agent was down ---------------------------------------------------------


async def test_a_ca_dropped_while_the_agent_was_down_is_forgotten_when_it_comes_back(
    lab: Lab, agent: Agent, tmp_path: Path
) -> None:
    """The agent's container restarts (charon keeps running, with the CA the old process loaded) and the
    new plan has replaced that CA meanwhile. VICI lists no certificates, so the new process cannot see
    what charon holds: it clears charon's credentials before loading its own, and CA-old stops vouching."""
    pki = Pki(tmp_path / "pki")
    old_ca, new_ca = pki.ca("ca-old", "/CN=lab tenant CA"), pki.ca("ca-new", "/CN=lab tenant CA")
    rw = lab.add_site("rw")
    lab.start_charon(lab.gw)
    old, new = pki.peer("ca-old", rw_id(rw)), pki.peer("ca-new", rw_id(rw))
    write_secret(agent.secrets, "gw-tls", "tls.crt", pki.gw_cert)
    write_secret(agent.secrets, "gw-tls", "tls.key", pki.gw_key)
    write_secret(agent.secrets, "ca-old", "ca.crt", old_ca)
    write_secret(agent.secrets, "ca-new", "ca.crt", new_ca)

    def plan(cid: str) -> Plan:
        return Plan(gateway=GATEWAY, type="ipsec", ipsec=Ipsec(
            tunnels=(rw_tunnel(lab, rw, cid),),
            certificates=(GW_CERT, ca_cert(cid, cid)),
            private_keys=(GW_KEY,),
        ))  # fmt: skip

    agent.write_plan(plan("ca-old"))
    agent.start()
    await wait_for_async(lambda: "conn.loaded name=rw" in agent.log(), 20, "the conn loaded")
    before = await dial(lab, rw, pki, creds=old)
    assert before.up and before.accepted(rw_id(rw)), before.gateway_log[-3000:]

    agent.stop()
    agent.write_plan(plan("ca-new"))
    agent.start()
    await wait_for_async(lambda: "credential.loaded id=cert/ca-new" in agent.log(), 20, "CA-new loaded")
    await wait_for_async(lambda: agent.log().count("conn.loaded name=rw") >= 2, 20, "the conn loaded again")

    again = await dial(lab, rw, pki, creds=old)
    assert not again.accepted(rw_id(rw)), "CA-old, loaded by the agent's previous process, still vouches"
    assert f"no trusted ECDSA public key found for '{rw_id(rw)}'" in again.gateway_log, again.gateway_log[
        -3000:
    ]
    fresh = await dial(lab, rw, pki, creds=new)
    assert fresh.up and fresh.accepted(rw_id(rw)), fresh.gateway_log[-3000:]
