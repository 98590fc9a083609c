"""The gateway pod follows its plan through the API: the real controller renders a gateway's ConfigMap and
Role in the API emulator; the status-agent (a process, ``--follow-configmap``) runs with a token of the
gateway's own ServiceAccount, so only with the rights that Role grants (the emulator enforces RBAC, with
resourceNames), and writes the plan and the plan's Secrets to its live directory.

A revoked grant reaches the live plan while a kubelet's volume refresh would still be a minute away; a PSK
reference added makes the controller widen the Role and the agent fetch that Secret, without a restart;
a Secret no longer referenced leaves the directory; the mounted copy is the plan at boot.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import gwplan
from lab.cluster import Cluster, Controller, wait_for
from tests.component.test_controller_operator import CONFIG, converged
from tests.examples import example_docs

ROOT = Path(__file__).resolve().parents[2]
NS = "tenant-acme"
VPN = "vpn.bnerd.net/v1alpha1"
PSK = "follow-test-psk-7d1c"  # test-only value
SECRETS = {"acme-psk": {"psk": PSK}, "s1-psk": {"psk": PSK + "-s1"}, "s2-psk": {"psk": PSK + "-s2"}}


def secret(name: str, data: dict[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NS},
        "stringData": data,
    }


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Cluster, Controller]]:
    with Cluster(tmp_path / "k8s") as c:
        c.add_node("node-a")
        ctl = c.start_controller(CONFIG)
        wait_for(ctl.ready, 30, "the controller")
        c.apply(example_docs("ipsec.yaml"))
        c.apply([secret(n, d) for n, d in SECRETS.items()])
        wait_for(lambda: converged(c), 20, "the gateway's objects")
        yield c, ctl


def start_agent(c: Cluster, tmp: Path, *extra: str) -> subprocess.Popen[bytes]:
    token = c.kube.mint_token(NS, "vpngw-acme")  # the gateway pod's ServiceAccount, made by the controller
    kubeconfig = c.kube.write_kubeconfig(tmp / "pod.kubeconfig", token, NS, "vpngw-acme")
    live = tmp / "live"
    argv = [
        sys.executable,
        "-m",
        "agent",
        "--plan",
        str(live / "plan.json"),
        "--secrets-dir",
        str(live / "secrets"),
        "--vici-socket",
        str(tmp / "no-charon.vici"),
        "--follow-configmap",
        "vpngw-acme",
        "--live-dir",
        str(live),
        "--kubeconfig",
        str(kubeconfig),
        "--kube-status",
        "--poll-interval",
        "0.05",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "POD_NAMESPACE": NS}
    out = (tmp / "agent.log").open("wb")
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)


def live_plan(tmp: Path) -> gwplan.Plan | None:
    try:
        return gwplan.loads((tmp / "live" / "plan.json").read_bytes())
    except (OSError, gwplan.PlanError):
        return None


def test_the_agent_follows_plan_and_secrets_with_only_its_roles_rights(
    world: tuple[Cluster, Controller], tmp_path: Path
) -> None:
    c, _ = world
    agent = start_agent(c, tmp_path)
    try:
        wait_for(lambda: live_plan(tmp_path), 15, "the live plan")
        secrets = tmp_path / "live" / "secrets"
        wait_for(
            lambda: (secrets / "s1-psk" / "psk").exists() and (secrets / "acme-psk" / "psk").exists(),
            15,
            "the plan's Secrets",
        )
        assert (secrets / "s1-psk" / "psk").read_text() == PSK + "-s1"
        assert oct((secrets / "s1-psk" / "psk").stat().st_mode & 0o777) == "0o400"
        assert not (secrets / "s2-psk").exists(), (
            "s2 uses the gateway's default PSK: its own is not referenced"
        )
        # A grant revoked: the live plan has it at once (a kubelet's volume would be 60-90 s late).
        c.kube.patch(VPN, "VPNPeer", "s2", {"spec": {"authorization": {"exposures": []}}}, NS)
        wait_for(
            lambda: (p := live_plan(tmp_path)) and not any(g.peer == "s2" for g in p.nat.grants),
            10,
            "the revocation in the live plan",
        )
        # A PSK reference added: the controller widens the Role, the agent fetches the Secret; no restart.
        c.kube.patch(
            VPN, "VPNPeer", "s2", {"spec": {"ipsec": {"pskSecretRef": {"name": "s2-psk", "key": "psk"}}}}, NS
        )
        wait_for(lambda: (secrets / "s2-psk" / "psk").exists(), 15, "the newly referenced Secret")
        assert (secrets / "s2-psk" / "psk").read_text() == PSK + "-s2"
        # Its Secret changed: the new value follows.
        c.kube.patch("v1", "Secret", "s2-psk", {"stringData": {"psk": PSK + "-rotated"}}, NS)
        wait_for(
            lambda: (secrets / "s2-psk" / "psk").read_text() == PSK + "-rotated", 10, "the rotated value"
        )
        # No longer referenced: removed.
        c.kube.patch(VPN, "VPNPeer", "s1", {"spec": {"ipsec": {"pskSecretRef": None}}}, NS)
        wait_for(lambda: not (secrets / "s1-psk").exists(), 15, "the unreferenced Secret gone")
        assert agent.poll() is None, "never restarted"
        forbidden = [
            r for r in c.kube.requests(user=f"system:serviceaccount:{NS}:vpngw-acme") if r.code == 403
        ]
        assert forbidden == [], [(r.verb, r.path) for r in forbidden]
        gw = c.get(VPN, "VPNGateway", "acme", NS)
        assert gw is not None and "agent" in gw["status"], "the status patch, with the same token"
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(10)
    log = (tmp_path / "agent.log").read_text()
    assert PSK not in log and "follow.secret_written secret=s2-psk" in log


def test_the_mounted_plan_is_the_plan_at_boot_when_the_api_cannot_be_reached(
    world: tuple[Cluster, Controller], tmp_path: Path
) -> None:
    c, _ = world
    mounted = tmp_path / "mounted.json"

    def plan_granting_s2() -> str | None:
        # `converged` says the objects exist; the first plan may predate the peers (same apply)
        cm = c.get("v1", "ConfigMap", "vpngw-acme", NS)
        text = cm["data"]["plan.json"] if cm else None
        return text if text and any(g.peer == "s2" for g in gwplan.loads(text).nat.grants) else None

    mounted.write_text(wait_for(plan_granting_s2, 20, "a plan with s2's grants"))
    c.kube.inject_fault(503, count=-1, resource="configmaps")  # the API cannot give the plan
    agent = start_agent(c, tmp_path, "--plan-fallback", str(mounted))
    try:
        plan = wait_for(lambda: live_plan(tmp_path), 15, "the mounted plan copied to the live directory")
        assert gwplan.plan_hash(plan) == gwplan.plan_hash(gwplan.loads(mounted.read_bytes()))
        c.kube.clear_faults()
        c.kube.patch(VPN, "VPNPeer", "s2", {"spec": {"authorization": {"exposures": []}}}, NS)
        wait_for(
            lambda: (p := live_plan(tmp_path)) and not any(g.peer == "s2" for g in p.nat.grants),
            20,
            "the API's newer plan once it answers",
        )
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(10)
    log = (tmp_path / "agent.log").read_text()
    assert "follow.plan_written source=mounted" in log and "follow.plan_written source=api" in log, log
