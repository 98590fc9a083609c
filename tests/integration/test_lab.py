"""The lab itself, against real daemons: IKEv2 PSK between two live charons driven over VICI, a WireGuard
handshake between two wireguard-go peers, charon fault injection, and teardown that leaves nothing."""

from __future__ import annotations

import os
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from gwkit.vici import ViciCommandFailed, ViciSession, ViciTimeout, ViciUnavailable
from lab import netns
from lab.peers import psk_conn, wireguard_pair
from lab.world import SERVICE_CIDR, Host, Lab

pytestmark = [pytest.mark.lab, pytest.mark.anyio]

PSK = "lab-psk-1f2e3d"  # test-only value


def site_conn(
    name: str, local: str, remote: str, lid: str, rid: str, lts: list[str], rts: list[str]
) -> dict[str, Any]:
    return psk_conn(name, local_addr=local, remote_addr=remote, local_id=lid, remote_id=rid,
                    children={f"{name}-{i}": (lts, [r]) for i, r in enumerate(rts)})  # fmt: skip


async def configure_pair(gw: ViciSession, site: ViciSession, lab: Lab, s: Host) -> None:
    for v, me, peer in ((gw, "gw.lab.example", "s1.lab.example"), (site, "s1.lab.example", "gw.lab.example")):
        await v.call("load-shared", {"id": "psk", "type": "IKE", "data": PSK, "owners": [me, peer]})
    await gw.call(
        "load-conn",
        site_conn(
            "s1",
            lab.gw.addresses[0],
            s.addresses[0],
            "gw.lab.example",
            "s1.lab.example",
            [SERVICE_CIDR],
            s.lans,
        ),
    )
    await site.call(
        "load-conn",
        site_conn(
            "gw",
            s.addresses[0],
            lab.gw.addresses[0],
            "s1.lab.example",
            "gw.lab.example",
            s.lans,
            [SERVICE_CIDR],
        ),
    )


async def test_ikev2_psk_tunnel_carries_traffic_between_inner_subnets(lab: Lab) -> None:
    s = lab.add_site()
    g, c = lab.start_charon(lab.gw), lab.start_charon(s)
    assert not lab.gw.ping(s.lan_host, src="198.18.0.1"), (
        "inner subnets must not be reachable without a tunnel"
    )
    async with await ViciSession.connect(g.vici_socket) as gv, await ViciSession.connect(c.vici_socket) as sv:
        await configure_pair(gv, sv, lab, s)
        await gv.stream("initiate", {"child": "s1-0", "timeout": "5000"}, "control-log")
        sas, _ = await gv.stream("list-sas", {}, "list-sa")
        (ike,) = [sa["s1"] for sa in sas]
        assert ike["state"] == "ESTABLISHED"
        assert [ch["state"] for ch in ike["child-sas"].values()] == ["INSTALLED"]
        assert lab.gw.ping(s.lan_host, src="198.18.0.1", count=3)
        sas, _ = await sv.stream("list-sas", {}, "list-sa")
        child = next(iter(sas[0]["gw"]["child-sas"].values()))
        assert int(child["packets-in"]) >= 3, "the pings must have crossed the ESP SA"


async def test_wrong_psk_fails_with_charons_reason_in_the_log(lab: Lab) -> None:
    s = lab.add_site()
    g, c = lab.start_charon(lab.gw), lab.start_charon(s)
    async with await ViciSession.connect(g.vici_socket) as gv, await ViciSession.connect(c.vici_socket) as sv:
        await configure_pair(gv, sv, lab, s)
        await sv.call(
            "load-shared",
            {
                "id": "psk",
                "type": "IKE",
                "data": "another-key",
                "owners": ["s1.lab.example", "gw.lab.example"],
            },
        )
        with pytest.raises(ViciCommandFailed) as info:
            await gv.stream("initiate", {"child": "s1-0", "timeout": "5000"}, "control-log")
        assert any("AUTHENTICATION_FAILED" in line for line in info.value.log)
        assert PSK not in str(info.value) and "another-key" not in " ".join(info.value.log)


async def test_killed_charon_is_noticed_and_a_restarted_one_answers(lab: Lab) -> None:
    g = lab.start_charon(lab.gw)
    session = await ViciSession.connect(g.vici_socket)
    first = await session.call("stats")
    g.kill()
    with pytest.raises(ViciUnavailable):
        await session.call("stats")
    assert session.closed
    with pytest.raises(ViciUnavailable):  # the stale socket file is refused, not hung on
        await ViciSession.connect(g.vici_socket)
    g.start()
    async with await ViciSession.connect(g.vici_socket) as again:
        second = await again.call("stats")
    assert first["uptime"]["since"] <= second["uptime"]["since"]
    assert g.starts == 2


async def test_sigstopped_charon_times_out_and_recovers_on_sigcont(lab: Lab) -> None:
    g = lab.start_charon(lab.gw)
    session = await ViciSession.connect(g.vici_socket, timeout=0.5)
    g.pause()
    try:
        with pytest.raises(ViciTimeout):
            await session.call("version")
        assert session.closed, "a timed-out session is desynchronised and must be discarded"
    finally:
        g.resume()
    async with await ViciSession.connect(g.vici_socket) as again:
        assert (await again.call("version"))["daemon"] == "charon"


async def test_wireguard_go_peers_handshake_and_carry_traffic(lab: Lab, tmp_path: Any) -> None:
    s = lab.add_site()
    keys = wireguard_pair(lab, s, tmp_path)
    wg_gw = lab.gw.wireguard["wg0"]
    assert s.ping("10.99.0.1", count=2)
    dump = wg_gw.wg("show", "wg0", "latest-handshakes")
    assert keys["s1"][1] in dump and not dump.strip().endswith("\t0")
    assert keys["gw"][0] not in wg_gw.wg("show", "wg0")


def test_teardown_leaves_nothing_even_after_a_failure() -> None:
    lab = Lab()
    prefix = lab.prefix
    pids: list[int | None] = []
    with pytest.raises(RuntimeError), lab:
        s = lab.add_site()
        lab.start_charon(lab.gw)
        lab.start_wireguard(s)
        assert lab.gw.charon is not None
        pids += [lab.gw.charon.pid, s.wireguard["wg0"].pid]
        raise RuntimeError("test failure inside the lab")
    assert not [ns for ns in netns.list_namespaces() if ns.startswith(prefix)]
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not lab.dir.exists()


async def test_two_labs_coexist_without_collisions() -> None:
    with Lab() as a, Lab() as b:
        assert a.prefix != b.prefix
        ca, cb = a.start_charon(a.gw), b.start_charon(b.gw)
        async with (
            await ViciSession.connect(ca.vici_socket) as va,
            await ViciSession.connect(cb.vici_socket) as vb,
        ):
            await va.call("load-shared", {"id": "x", "type": "IKE", "data": "only-in-a", "owners": ["a"]})
            keys_b = await vb.call("get-shared")
            assert "x" not in keys_b.get("keys", [])
        await anyio.lowlevel.checkpoint()
