"""The far side of the lab's tunnels: remote sites configured independently of our code, over VICI.

A tenant's firewall does not run our agent, so remote sites are set up here by hand-written VICI
dictionaries (what a network admin's swanctl.conf would say), never by the gateway's renderer.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gwkit.vici import ViciSession
from lab import netns
from lab.world import Host, Lab


def psk_conn(
    name: str,
    *,
    local_addr: str,
    remote_addr: str,
    local_id: str,
    remote_id: str,
    children: Mapping[str, tuple[Sequence[str], Sequence[str]]],
    child_options: Mapping[str, str] | None = None,
    proposals: str = "aes256-sha256-modp2048",
    esp: str = "aes256gcm16-modp2048",
) -> dict[str, Any]:
    """An IKEv2 PSK connection as a tenant's swanctl.conf would say it; ``children`` maps a child name to
    its (local_ts, remote_ts)."""
    return {name: {
        "version": "2", "local_addrs": [local_addr], "remote_addrs": [remote_addr], "proposals": [proposals],
        "local": {"auth": "psk", "id": local_id}, "remote": {"auth": "psk", "id": remote_id},
        "children": {
            child: {"local_ts": list(lts), "remote_ts": list(rts), "esp_proposals": [esp],
                    **(child_options or {})}
            for child, (lts, rts) in children.items()
        },
    }}  # fmt: skip


def site_conn(
    name: str,
    *,
    local_addr: str,
    remote_addr: str,
    local_id: str,
    remote_id: str,
    local_ts: list[str],
    remote_ts: list[str],
    child_options: dict[str, str] | None = None,
    proposals: str = "aes256-sha256-modp2048",
    esp: str = "aes256gcm16-modp2048",
) -> dict[str, Any]:
    """A site-to-site connection with one CHILD_SA per local subnet (as the tenant side would write it)."""
    children = {f"{name}-{i}": ([ts], remote_ts) for i, ts in enumerate(local_ts)}
    return psk_conn(name, local_addr=local_addr, remote_addr=remote_addr, local_id=local_id,
                    remote_id=remote_id, children=children, child_options=child_options,
                    proposals=proposals, esp=esp)  # fmt: skip


async def configure_site(
    session: ViciSession,
    *,
    name: str,
    psk: str,
    local_addr: str,
    remote_addr: str,
    local_id: str,
    remote_id: str,
    local_ts: list[str],
    remote_ts: list[str],
    child_options: dict[str, str] | None = None,
) -> None:
    """Load the PSK and the connection into a remote site's charon (the site only responds)."""
    await session.call(
        "load-shared", {"id": f"psk-{name}", "type": "IKE", "data": psk, "owners": [local_id, remote_id]}
    )
    await session.call(
        "load-conn",
        site_conn(
            name,
            local_addr=local_addr,
            remote_addr=remote_addr,
            local_id=local_id,
            remote_id=remote_id,
            local_ts=local_ts,
            remote_ts=remote_ts,
            child_options=child_options,
        ),
    )


def keypair() -> tuple[str, str]:
    private = subprocess.run(["wg", "genkey"], capture_output=True, check=True).stdout.strip()
    public = subprocess.run(["wg", "pubkey"], input=private, capture_output=True, check=True).stdout.strip()
    return private.decode(), public.decode()


def wireguard_pair(lab: Lab, site: Host, tmp: Path, *, psk: str | None = None) -> dict[str, tuple[str, str]]:
    """wireguard-go on the gateway (listening, 10.99.0.1) and the site (10.99.0.2, initiating), the
    responder configured first (LAB-FACTS). Returns {role: (private, public)}."""
    wg_gw, wg_site = lab.start_wireguard(lab.gw), lab.start_wireguard(site)
    keys = {h.role: keypair() for h in (lab.gw, site)}
    for host, wgd, addr, peer, peer_ip, endpoint in (
        (lab.gw, wg_gw, "10.99.0.1/24", site, "10.99.0.2/32", None),
        (site, wg_site, "10.99.0.2/24", lab.gw, "10.99.0.1/32", f"{lab.gw.addresses[0]}:51820"),
    ):
        keyfile = tmp / f"{host.role}.key"
        keyfile.write_text(keys[host.role][0])
        args = ["set", "wg0", "private-key", str(keyfile), "peer", keys[peer.role][1], "allowed-ips", peer_ip]
        if psk is not None:
            pskfile = tmp / "psk"
            pskfile.write_text(psk)
            args += ["preshared-key", str(pskfile)]
        if endpoint:
            args += ["endpoint", endpoint]
        else:
            args[2:2] = ["listen-port", "51820"]
        wgd.wg(*args)
        netns.addr(host.ns, "wg0", addr)
        netns.run(["ip", "-n", host.ns, "link", "set", "wg0", "up"])
    return keys
