"""init-nat's --watch following the HA role file (docs/ha.md) in the lab's gateway namespace: ``standby``
drops the WireGuard port on NIC2 (IKE and ESP for an IPsec plan: tests/integration/test_ha_ipsec.py, with
traffic), ``active`` and a missing file (a plan without ``ha``) lift the drop, an unreadable word or a
missing file under ``ha`` stands by (fail closed), the drop survives drift repair, the status file says
which role is in force, and a serving pod whose plan gains ``ha`` never blips. Real iptables, real
``python -m initnat``, a real WireGuard handshake refused and then completed."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from pathlib import Path

import pytest

from agent.ha import Api, LeaseElector
from gwplan import Grant, Ha, Plan, SecretRef, WireGuard, dumps, plan_hash
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


def test_the_role_file_toggles_the_nic2_drop_and_absence_without_ha_is_active(
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


def status_hash(path: Path) -> str | None:
    try:
        return json.loads(path.read_text()).get("planHash")  # type: ignore[no-any-return]
    except (FileNotFoundError, ValueError):
        return None


async def _no_api() -> Api:
    raise RuntimeError("no API in this test")


def test_a_plan_gaining_ha_on_a_serving_pod_never_stands_by_and_a_missing_file_under_ha_does(
    pod_lab: Lab, procs: Procs, tmp_path: Path
) -> None:
    """HA turned on for a serving gateway: the live plan file (which init-nat's watch reads as well as the
    agent) gains ``ha``. The agent wrote ``active`` when it started (its first plan had no ``ha``), so
    init-nat, whether it sees the new plan before or after the agent, never drops (sampled every 10 ms
    across the change). A missing role file under ``ha`` stands by (fail closed); without ``ha`` it is
    active; and the init container's one-shot run with an ``ha`` plan and no file starts standby."""
    lab = pod_lab
    s1 = lab.add_site()
    wg_plan = dataclasses.replace(
        plan(lab, (Grant("s1", "web", "exposure", (s1.lans[0],), GRANT_S1_WEB),)),
        type="wireguard",
        wireguard=WireGuard("wg0", 51820, f"{GW_TUNNEL}/24", SecretRef("gw-wg", "privateKey")),
    )
    with_ha = dataclasses.replace(wg_plan, ha=Ha("gw-ha"))
    plan_file, status, role = tmp_path / "plan.json", tmp_path / "initnat-status.json", tmp_path / "ha-role"

    def publish(p: Plan) -> None:  # as the agent's PlanFollower does: temp file and rename
        tmp = plan_file.with_name(".plan.tmp")
        tmp.write_bytes(dumps(p))
        os.replace(tmp, plan_file)

    # The init container: a plan with ha, nothing written yet: standby from the first rule on.
    publish(with_ha)
    once = lab.gw.run(PY, "-m", "initnat", "--plan", str(plan_file), "--status-file", str(status))
    assert once.returncode == 0, once.stderr
    assert len(standby_lines(lab)) == 1 and status_role(status) == "standby"

    publish(wg_plan)
    LeaseElector(_no_api, "gw-a-0", None, role_file=role)  # the agent's start (no ha): writes active
    assert role.read_text() == "active\n"
    procs.start(
        lab.gw, PY, "-m", "initnat", "--plan", str(plan_file), "--watch", "--resync", "2",
        "--status-file", str(status), name="initnat",
    )  # fmt: skip
    wait_for(lambda: status_role(status) == "active" and not standby_lines(lab), 20, "serving without ha")

    seen: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.append(len(standby_lines(lab)))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        publish(with_ha)
        wait_for(lambda: status_hash(status) == plan_hash(with_ha), 10, "the plan with ha applied")
        time.sleep(0.5)  # and a few role polls after it
    finally:
        stop.set()
        sampler.join()
    assert len(seen) > 10 and set(seen) == {0}, "no standby blip on a serving pod gaining ha"
    assert status_role(status) == "active"

    role.unlink()  # the file gone (or never written) while the plan has ha: fail closed
    wait_for(lambda: standby_lines(lab), 5, "a missing role file under ha stands by")
    wait_for(lambda: status_role(status) == "standby", 5, "the status file to say standby")
    assert "initnat.role_absent" in procs.output("initnat")
    publish(wg_plan)  # ha gone, still no file: a gateway without HA serves
    wait_for(lambda: not standby_lines(lab), 10, "no ha, no file: active")
