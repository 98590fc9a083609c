"""Lab helpers shared by the exporter and VICI-query lab tests (no tests here).

Tunnels are set up as tests/integration/test_lab.py does: hand-written conn dicts over VICI between the
lab's gateway charon and a site charon. Many-children conns put one /32 per child on the site's ``lo``
(a child whose local_ts has no local address fails under kernel-libipsec: LAB-FACTS).
"""

from __future__ import annotations

import ipaddress
import subprocess
from typing import Any

from gwkit.vici import ViciSession
from lab.peers import psk_conn
from lab.wait import wait_for_async
from lab.world import Host, Lab

PSK = "lab-psk-exporter-7c1d"  # test-only value; tests grep the metrics for it
GW_ID, SITE_ID = "gw.lab.example", "s1.lab.example"


def child_ts(index: int, base: str = "10.200.0.0") -> str:
    return f"{ipaddress.ip_address(base) + index + 1}/32"


def conn(
    name: str,
    local: str,
    remote: str,
    lid: str,
    rid: str,
    children: dict[str, tuple[list[str], list[str]]],
    *,
    rekey_time: int | None = None,
) -> dict[str, Any]:
    """One IKEv2 PSK conn; ``children`` maps child name -> (local_ts, remote_ts)."""
    return psk_conn(
        name, local_addr=local, remote_addr=remote, local_id=lid, remote_id=rid, children=children,
        child_options=None if rekey_time is None else {"rekey_time": str(rekey_time)},
        proposals="aes128-sha256-modp2048", esp="aes128gcm16-modp2048",
    )  # fmt: skip


def add_site_addresses(site: Host, cidrs: list[str]) -> None:
    cmds = "".join(f"addr add {c} dev lo\n" for c in cidrs)
    subprocess.run(["ip", "-n", site.ns, "-batch", "-"], input=cmds.encode(), check=True, timeout=60)


async def load_pair(
    gv: ViciSession,
    sv: ViciSession,
    lab: Lab,
    site: Host,
    gw_conn: str,
    site_conn: str,
    children: dict[str, tuple[list[str], list[str]]],
    *,
    rekey_time: int | None = None,
    gw_id: str = GW_ID,
    site_id: str = SITE_ID,
) -> None:
    """Load PSK + mirrored conns on both sides. ``children`` is from the gateway's point of view."""
    for v, me, peer in ((gv, gw_id, site_id), (sv, site_id, gw_id)):
        await v.call(
            "load-shared", {"id": f"psk-{me}-{peer}", "type": "IKE", "data": PSK, "owners": [me, peer]}
        )
    mirrored = {k: (r, loc) for k, (loc, r) in children.items()}
    await gv.call(
        "load-conn",
        conn(
            gw_conn, lab.gw.addresses[0], site.addresses[0], gw_id, site_id, children, rekey_time=rekey_time
        ),
        timeout=30,
    )
    await sv.call(
        "load-conn",
        conn(
            site_conn, site.addresses[0], lab.gw.addresses[0], site_id, gw_id, mirrored, rekey_time=rekey_time
        ),
        timeout=30,
    )


async def initiate_all(gv: ViciSession, ike: str, children: list[str], *, settle: float = 120.0) -> None:
    """Bring up the first child (creates the IKE_SA), queue the rest without waiting, then poll until
    charon's ``stats``/list-sas by child name shows them INSTALLED (small per-child queries)."""
    await gv.stream("initiate", {"child": children[0], "ike": ike, "timeout": "10000"}, "control-log")
    for child in children[1:]:
        await gv.stream("initiate", {"child": child, "ike": ike, "timeout": "-1"}, "control-log", check=False)
    pending = set(children)

    async def all_installed() -> bool:
        for child in sorted(pending):
            events, _ = await gv.stream("list-sas", {"ike": ike, "child": child}, "list-sa")
            states = [c["state"] for e in events for sa in e.values() for c in sa["child-sas"].values()]
            if "INSTALLED" in states:
                pending.discard(child)
        return not pending

    await wait_for_async(all_installed, settle, f"{len(children)} child SAs of {ike} INSTALLED", interval=0.5)
