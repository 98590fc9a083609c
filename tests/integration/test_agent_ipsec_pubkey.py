"""Certificate (pubkey) authentication end to end, against live charon daemons.

The gateway's plan references a ``kubernetes.io/tls`` Secret (tls.crt, tls.key, ca.crt); the agent loads
them with load-cert / load-key and the tunnel authenticates with certificates issued by a test CA made
here with openssl. A renewed certificate (the Secret's files replaced, as cert-manager does) is loaded
again and the SA set up with the old one is cut: the site tunnel comes back at once with the renewed
certificate (agent.ipsec.plan.cuts). The private key never reaches the agent's log or status.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gwkit.vici import ViciSession
from gwplan import Child, IkeCertificate, IkePrivateKey, Ipsec, Plan, SecretRef, Tunnel
from lab.wait import wait_for_async
from lab.world import SERVICE_CIDR, Host, Lab
from tests.integration.test_agent_ipsec import (
    GATEWAY,
    GW_ID,
    Agent,
    all_established,
    gw_sas,
    site_id,
)

pytestmark = [pytest.mark.lab, pytest.mark.anyio]


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(d: Path) -> None:
    openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=lab test CA",
        "-days",
        "2",
        cwd=d,
    )


def issue(d: Path, name: str, san: str, serial: int) -> tuple[bytes, bytes]:
    """A leaf certificate for ``san`` signed by the CA in ``d``: (cert PEM, key PEM)."""
    openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={san}",
        cwd=d,
    )
    (d / f"{name}.ext").write_text(f"subjectAltName=DNS:{san}\nextendedKeyUsage=serverAuth,clientAuth\n")
    openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-set_serial",
        str(serial),
        "-days",
        "2",
        "-extfile",
        f"{name}.ext",
        "-out",
        f"{name}.crt",
        cwd=d,
    )
    return (d / f"{name}.crt").read_bytes(), (d / f"{name}.key").read_bytes()


def pubkey_conn(
    name: str, local: str, remote: str, lid: str, rid: str, lts: list[str], rts: list[str]
) -> dict[str, Any]:
    return {name: {
        "version": "2", "local_addrs": [local], "remote_addrs": [remote],
        "proposals": ["aes256-sha256-ecp256"],
        "local": {"auth": "pubkey", "id": lid}, "remote": {"auth": "pubkey", "id": rid},
        "children": {f"{name}-{i}": {"local_ts": lts, "remote_ts": [r], "esp_proposals": ["aes256gcm16"]}
                     for i, r in enumerate(rts)},
    }}  # fmt: skip


def write_tls_secret(secrets: Path, cert: bytes, key: bytes, ca: bytes) -> None:
    d = secrets / "gw-tls"
    d.mkdir(parents=True, exist_ok=True)
    for fname, data in (("tls.crt", cert), ("tls.key", key), ("ca.crt", ca)):
        tmp = d / f".{fname}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, d / fname)


async def setup_site(site: Host, lab: Lab, cert: bytes, key: bytes, ca: bytes) -> None:
    assert site.charon is not None
    async with await ViciSession.connect(site.charon.vici_socket) as v:
        await v.call("load-cert", {"type": "X509", "flag": "CA", "data": ca.decode()})
        await v.call("load-cert", {"type": "X509", "flag": "NONE", "data": cert.decode()})
        await v.call("load-key", {"type": "any", "data": key.decode()})
        await v.call(
            "load-conn",
            pubkey_conn(
                "gw", site.addresses[0], lab.gw.addresses[0], site_id(site), GW_ID, site.lans, [SERVICE_CIDR]
            ),
        )


def plan(lab: Lab, site: Host) -> Plan:
    conn = pubkey_conn(
        site.role, lab.gw.addresses[0], site.addresses[0], GW_ID, site_id(site), [SERVICE_CIDR], site.lans
    )
    children = tuple(Child(f"{site.role}-{i}", lan) for i, lan in enumerate(site.lans))
    return Plan(gateway=GATEWAY, type="ipsec", ipsec=Ipsec(
        tunnels=(Tunnel(site.role, True, children, conn, peer_cas=("ca",)),),
        certificates=(IkeCertificate("gateway", SecretRef("gw-tls", "tls.crt")),
                      IkeCertificate("ca", SecretRef("gw-tls", "ca.crt"), ca=True)),
        private_keys=(IkePrivateKey("gateway", SecretRef("gw-tls", "tls.key")),),
    ))  # fmt: skip


async def test_certificate_tunnel_comes_up_and_a_renewed_certificate_brings_it_back_with_the_new_one(
    lab: Lab, tmp_path: Path
) -> None:
    pki = tmp_path / "pki"
    pki.mkdir()
    make_ca(pki)
    ca = (pki / "ca.crt").read_bytes()
    gw_cert, gw_key = issue(pki, "gw", GW_ID, 10)
    site = lab.add_site()
    lab.start_charon(lab.gw)
    lab.start_charon(site)
    site_cert, site_key = issue(pki, "site", site_id(site), 11)
    await setup_site(site, lab, site_cert, site_key, ca)

    agent = Agent(lab, tmp_path / "pod")
    try:
        write_tls_secret(agent.secrets, gw_cert, gw_key, ca)
        agent.write_plan(plan(lab, site))
        agent.start()
        agent.wait_for(all_established([site.role]), 30, "certificate tunnel Established")
        assert lab.gw.ping(site.lan_host, src="198.18.0.1", count=2)
        before = (await gw_sas(lab))[site.role]
        assert before["local-id"] == GW_ID and before["remote-id"] == site_id(site)

        # cert-manager renews the gateway's certificate (new key, new serial): loaded again, and the SA
        # authenticated with the old one is cut; the watchdog brings the site back with the renewed one.
        new_cert, new_key = issue(pki, "gw2", GW_ID, 12)
        write_tls_secret(agent.secrets, new_cert, new_key, ca)
        await wait_for_async(
            lambda: agent.log().count("credential.loaded id=cert/gateway") >= 2, 10, "renewal loaded"
        )

        async def reauthenticated() -> bool:
            sa = (await gw_sas(lab)).get(site.role, {})
            return sa.get("state") == "ESTABLISHED" and sa.get("uniqueid") != before["uniqueid"]

        await wait_for_async(reauthenticated, 30, "a new IKE_SA authenticated with the renewed certificate")
        assert f"tunnel.cut name={site.role} why=cert/gateway" in agent.log()
        agent.wait_for(all_established([site.role]), 10, "Established with the renewed certificate")
        assert lab.gw.charon is not None
        certs = lab.gw.charon.swanctl("--list-certs").stdout.decode()
        assert "0c" in certs.lower(), "the renewed certificate (serial 12 = 0x0c) is in charon's store"

        log_and_status = agent.log() + agent.status_file.read_text()
        for secret in (gw_key, new_key):
            body = b"".join(secret.splitlines()[1:-1]).decode()
            assert body[:40] not in log_and_status, "a private key leaked into the log or status"
    finally:
        agent.stop()
