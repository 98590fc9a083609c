"""The gateway pod follows its plan through the API: the real controller renders a gateway's ConfigMap and
Role in the API emulator; the status-agent (a process, ``--follow-configmap``) runs with a token of the
gateway's own ServiceAccount, so only with the rights that Role grants (the emulator enforces RBAC, with
resourceNames), and writes the plan and the plan's Secrets to its live directory.

A revoked grant reaches the live plan while a kubelet's volume refresh would still be a minute away; a PSK
reference added makes the controller widen the Role and the agent fetch that Secret, without a restart;
a Secret no longer referenced leaves the directory; the mounted copy is the plan at boot.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import gwplan
from lab.cluster import Cluster, Controller, gateway_secret, home_of
from lab.wait import wait_for
from tests.component.test_controller_operator import CONFIG, converged
from tests.examples import example_docs

ROOT = Path(__file__).resolve().parents[2]
NS = "tenant-acme"
VPN = "vpn.bnerd.net/v1alpha1"
PSK = "follow-test-psk-7d1c"  # test-only value
SECRETS = {"acme-psk": {"psk": PSK}, "s1-psk": {"psk": PSK + "-s1"}, "s2-psk": {"psk": PSK + "-s2"}}


def secret(name: str, data: dict[str, str]) -> dict[str, object]:
    return gateway_secret(NS, name, data)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Cluster, Controller]]:
    with Cluster(tmp_path / "k8s") as c:
        c.add_node("node-a")
        ctl = c.start_controller(CONFIG)
        wait_for(ctl.ready, 30, "the controller")
        c.apply([secret(n, d) for n, d in SECRETS.items()])
        c.apply(example_docs("ipsec.yaml"))
        wait_for(lambda: converged(c), 20, "the gateway's objects")
        yield c, ctl


HOME, HOME_NS = home_of("acme", NS)
"""The pod's ServiceAccount and plan ConfigMap, in the gateway namespace (made by the controller)."""


def start_agent(c: Cluster, tmp: Path, *extra: str) -> subprocess.Popen[bytes]:
    token = c.kube.mint_token(HOME_NS, HOME)  # the gateway pod's ServiceAccount, made by the controller
    kubeconfig = c.kube.write_kubeconfig(tmp / "pod.kubeconfig", token, HOME_NS, HOME)
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
        HOME,
        "--live-dir",
        str(live),
        "--kubeconfig",
        str(kubeconfig),
        "--kube-status",
        "--poll-interval",
        "0.05",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "POD_NAMESPACE": HOME_NS}
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
            r for r in c.kube.requests(user=f"system:serviceaccount:{HOME_NS}:{HOME}") if r.code == 403
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
        cm = c.owned("v1", "ConfigMap", "acme", NS)
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


def test_a_secret_its_owner_did_not_opt_in_is_never_read_nor_granted(
    world: tuple[Cluster, Controller], tmp_path: Path
) -> None:
    """A CR can name any Secret of its namespace: the controller grants, and the agent reads, only those
    labelled for gateways. Taking the label off revokes it: the pod's copy goes."""
    c, _ = world
    secrets = tmp_path / "live" / "secrets"
    agent = start_agent(c, tmp_path)
    try:
        wait_for(lambda: (secrets / "s1-psk" / "psk").exists(), 15, "s1's opted-in Secret")
        c.kube.patch(
            "v1", "Secret", "s1-psk", {"metadata": {"labels": {"vpn.bnerd.net/gateway-secret": None}}}, NS
        )
        wait_for(lambda: not (secrets / "s1-psk").exists(), 15, "s1's Secret gone once it is not opted in")

        def role_names() -> list[str]:
            role = c.get("rbac.authorization.k8s.io/v1", "Role", "vpngw-acme", NS) or {}
            return [
                n
                for r in role.get("rules", [])
                for n in r.get("resourceNames", [])
                if r["resources"] == ["secrets"]
            ]

        wait_for(lambda: "s1-psk" not in role_names(), 15, "the grant withdrawn")
        assert role_names() == ["acme-psk"]
        wait_for(
            lambda: (p := live_plan(tmp_path)) and p.ipsec and [t.name for t in p.ipsec.tunnels] == ["s2"],
            10,
            "s1 left out of the live plan: its key is no longer for gateways",
        )

        def said() -> bool:
            gw = c.get(VPN, "VPNGateway", "acme", NS) or {}
            conds = {x["type"]: x for x in gw.get("status", {}).get("conditions", [])}
            message = conds.get("ConfigRendered", {}).get("message", "")
            return "names Secret s1-psk, which does not exist or is not opted in" in message

        wait_for(said, 10, "ConfigRendered naming the Secret")
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(10)


def test_a_plan_planted_in_the_configmap_is_never_taken(
    world: tuple[Cluster, Controller], tmp_path: Path
) -> None:
    """Someone adds a second plan under another key (the API server refuses the plan's own key in both
    data and binaryData): the agent refuses a ConfigMap holding anything but one plan key, and the
    controller removes the extra key."""
    c, ctl = world
    agent = start_agent(c, tmp_path)
    try:
        good = wait_for(lambda: live_plan(tmp_path), 15, "the live plan")
        planted = gwplan.dumps(dataclasses.replace(good, nat=dataclasses.replace(good.nat, grants=())))
        ctl.proc.send_signal(signal.SIGSTOP)  # the agent alone, for a while, with the planted ConfigMap
        try:
            extra = {"binaryData": {"plan.json.gz": base64.b64encode(gzip.compress(planted)).decode()}}
            c.kube.patch("v1", "ConfigMap", HOME, extra, HOME_NS)
            wait_for(lambda: "follow.plan_refused" in (tmp_path / "agent.log").read_text(), 10, "the refusal")
            assert live_plan(tmp_path) == good, "the planted plan reached the pod"
        finally:
            ctl.proc.send_signal(signal.SIGCONT)
        wait_for(
            lambda: "binaryData" not in (c.owned("v1", "ConfigMap", "acme", NS) or {}), 15, "the key removed"
        )
        time.sleep(0.5)  # the scenario: the agent's next polls (every 0.05 s) change nothing
        assert live_plan(tmp_path) == good
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(10)


def test_a_revocation_reaches_the_pod_after_its_watches_went_half_open(
    world: tuple[Cluster, Controller], tmp_path: Path
) -> None:
    """Every watch goes half-open (the connection stays, nothing more comes: no event, no bookmark, no end)
    and then a grant is revoked. With bookmarks a real server sends something at least every minute
    (k8s.io/apiserver cacher.go), so 90 s of silence is a dead watch: the controller's and the agent's
    are made again, and the revocation reaches the live plan (before: only after the watch's 330 s read
    timeout)."""
    c, _ = world
    agent = start_agent(c, tmp_path)
    try:
        wait_for(lambda: live_plan(tmp_path), 15, "the live plan")
        assert c.kube.stall_watches() > 0
        c.kube.patch(VPN, "VPNPeer", "s2", {"spec": {"authorization": {"exposures": []}}}, NS)
        wait_for(
            lambda: (p := live_plan(tmp_path)) and not any(g.peer == "s2" for g in p.nat.grants),
            90 + 10,
            "the revocation in the live plan after the half-open watches",
        )
        assert agent.poll() is None
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(10)
