"""init-nat's --watch following the HA role file (docs/ha.md) in the lab's gateway namespace: ``standby``
drops the WireGuard port on NIC2 (IKE and ESP for an IPsec plan: tests/integration/test_ha_ipsec.py, with
traffic), ``active`` and a missing file lift the drop, an unreadable word stands by (fail closed), the
drop survives drift repair, and the status file says which role is in force. Real iptables, real
``python -m initnat``, a real WireGuard handshake refused and then completed."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from gwplan import Grant, SecretRef, WireGuard, dumps
from lab.wait import wait_for
from lab.world import Lab
from tests.integration.test_initnat_traffic import (
    GRANT_S1_WEB,
    PY,
    Procs,
    handshaken,
    peer_routing_into_its_tunnel,
    plan,
)

pytestmark = [pytest.mark.lab]

STANDBY = "vpngw HA standby: not serving"
GW_TUNNEL = "10.99.0.1"


def standby_lines(lab: Lab) -> list[str]:
    return [r for r in lab.gw.run("iptables-save").stdout.decode().splitlines() if STANDBY in r]


def write_role(path: Path, text: str) -> None:
    tmp = path.with_name(".ha-role.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def status_role(path: Path) -> str | None:
    try:
        return json.loads(path.read_text()).get("role")  # type: ignore[no-any-return]
    except (FileNotFoundError, ValueError):
        return None


def test_the_role_file_toggles_the_nic2_drop_and_absence_is_active(
    pod_lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    lab = pod_lab
    s1 = lab.add_site()
    wg_plan = dataclasses.replace(
        plan(lab, (Grant("s1", "web", "exposure", (s1.lans[0],), GRANT_S1_WEB),)),
        type="wireguard",
        wireguard=WireGuard("wg0", 51820, f"{GW_TUNNEL}/24", SecretRef("gw-wg", "privateKey")),
    )
    plan_file, status, role = tmp_path / "plan.json", tmp_path / "initnat-status.json", tmp_path / "ha-role"
    plan_file.write_bytes(dumps(wg_plan))
    procs.start(
        lab.gw, PY, "-m", "initnat", "--plan", str(plan_file), "--watch", "--resync", "2",
        "--status-file", str(status), name="initnat",
    )  # fmt: skip
    wait_for(lambda: status_role(status) == "active", 20, "the first apply, active without a role file")
    assert standby_lines(lab) == [], "no role file: active (a gateway without HA never has one)"

    write_role(role, "standby\n")
    wait_for(lambda: standby_lines(lab), 5, "the standby drop")
    assert standby_lines(lab) == [
        "-A VPNGW-INPUT -i ens7 -p udp -m udp --dport 51820 "
        '-m comment --comment "vpngw HA standby: not serving" -j DROP'
    ]
    save = lab.gw.run("iptables-save").stdout.decode().splitlines()
    chain = [r for r in save if r.startswith("-A VPNGW-INPUT ")]
    assert STANDBY in chain[0], "first in the chain, ahead of the replies rule"
    wait_for(lambda: status_role(status) == "standby", 5, "the status file to say standby")

    # Traffic: the site's handshake toward the standby goes unanswered, then completes once active.
    peer_routing_into_its_tunnel(lab, s1, tmp_path, f"{GW_TUNNEL}/32")
    s1.ping(GW_TUNNEL, count=2, wait=1)  # makes the site handshake (the ping itself is never answered)
    assert not handshaken(s1), "the standby's WireGuard port answered a handshake"

    # Drift repair (resync every 2 s) keeps the drop: a rule of ours deleted by someone comes back.
    lab.gw.run("iptables", "-D", "VPNGW-INPUT", "1")  # the standby drop, first in the chain
    assert standby_lines(lab) == []
    wait_for(lambda: standby_lines(lab), 10, "the drop restored by the resync")

    write_role(role, "active\n")
    wait_for(lambda: not standby_lines(lab), 5, "the drop lifted")
    # (the ping itself is dropped by the pod guard: tunnel traffic is not for the pod; it makes the
    # site's wireguard-go handshake)
    wait_for(
        lambda: not s1.ping(GW_TUNNEL, count=1, wait=1) and handshaken(s1), 20, "the handshake once active"
    )

    write_role(role, "who knows")
    wait_for(lambda: standby_lines(lab), 5, "an unreadable role stands by")
    assert "initnat.role_unreadable" in procs.output("initnat")
    role.unlink()
    wait_for(lambda: not standby_lines(lab), 5, "no role file: active again")
    wait_for(lambda: status_role(status) == "active", 5, "the status file to say active")

    # A refused plan keeps the last good ruleset in force, and a role change still reaches it.
    tmp = plan_file.with_name(".plan.tmp")
    tmp.write_bytes(b"{ not a plan")
    os.replace(tmp, plan_file)
    wait_for(lambda: "initnat.rejected" in procs.output("initnat"), 5, "the bad plan refused")
    write_role(role, "standby\n")
    wait_for(lambda: standby_lines(lab), 5, "the drop, on the plan in force")
