"""Each planned VPNPeer's status, written by the gateway's status-agent through the Role the controller
renders for it (the API emulator enforces RBAC): the controller runs with exactly its declared rights and
creates the gateway's Roles; the agent (``python -m agent --kube-status``, its ServiceAccount's token)
writes ``vpnpeers/<name>/status`` of exactly the peers of its plan (the controller adds their
observedGeneration), and the emulator refuses it a VPNPeer of the same namespace that is not in its
plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from gwkit.kube.client import VPNPEERS, KubeClient
from gwkit.kube.config import from_kubeconfig
from gwkit.kube.errors import ApiError
from lab.cluster import Cluster, home_of, wait_for
from tests.component.test_controller_operator import CONFIG, NS, apply_with_secrets, converged
from tests.component.test_controller_rbac import bind
from tests.examples import example_docs
from tests.helpers import agent_as_pod

VPN = "vpn.bnerd.net/v1alpha1"


async def _patch_status(kubeconfig: Path, name: str) -> int:
    async with KubeClient(from_kubeconfig(kubeconfig)) as kube:
        try:
            await kube.patch(VPNPEERS, name, {"status": {"state": "Down"}}, NS, subresource="status")
        except ApiError as exc:
            return exc.code
    return 200


def test_the_agent_writes_the_status_of_exactly_its_planned_peers(tmp_path: Path) -> None:
    with Cluster(tmp_path) as c:
        c.add_node("node-a", provider_id="openstack:///11111111-1111-4111-8111-111111111111")
        ctl = c.start_controller(CONFIG, "--resync-seconds", "600", kubeconfig=bind(c, (NS,)))
        docs = example_docs("ipsec.yaml")
        # A VPNPeer in the same namespace whose gateway does not exist: never in acme's plan.
        stranger = next(d for d in docs if d["kind"] == "VPNPeer" and d["metadata"]["name"] == "s1")
        stranger = {**stranger, "metadata": {**stranger["metadata"], "name": "stranger"}}
        stranger["spec"] = {**stranger["spec"], "gatewayRef": {"name": "elsewhere"}}
        apply_with_secrets(c, [*docs, stranger])
        wait_for(lambda: converged(c) or ctl.proc.poll() is not None, 60, "the gateway's objects")
        assert ctl.proc.poll() is None, ctl.log()

        _, home = home_of("acme", NS)
        sa = c.owned("v1", "ServiceAccount", "acme", NS)
        plan = c.owned("v1", "ConfigMap", "acme", NS)
        assert sa is not None and plan is not None
        agent_user = f"system:serviceaccount:{home}:{sa['metadata']['name']}"
        kubeconfig = tmp_path / "agent.kubeconfig"
        with agent_as_pod(c.kube, home, sa["metadata"]["name"], plan["data"]["plan.json"], tmp_path) as proc:

            def peers() -> dict[str, Any] | None:
                got = {n: (c.get(VPN, "VPNPeer", n, NS) or {}).get("status") for n in ("s1", "s2")}
                return got if all(s and "state" in s for s in got.values()) else None

            statuses = wait_for(lambda: peers() or proc.poll() is not None, 30, "the peers' statuses")
            assert proc.poll() is None, (tmp_path / "agent.log").read_text()
            assert isinstance(statuses, dict)
            for s in statuses.values():
                assert s["state"] == "Down" and "charon unreachable" in s["reason"], s
                assert s["observedGeneration"] == 1, "the controller's key, beside the agent's"
                assert {c_["type"]: c_["status"] for c_ in s["conditions"]} == {
                    "Admitted": "True",
                    "Ready": "False",
                }
            # The agent's token may not write a peer outside its plan, even in its gateway's namespace.
            assert anyio.run(_patch_status, kubeconfig, "stranger") == 403
            assert anyio.run(_patch_status, kubeconfig, "s1") == 200, "the same request for a planned peer"
        written = {
            (r.resource, r.name) for r in c.kube.requests(user=agent_user, verb="patch") if r.code < 300
        }
        assert written == {("vpngateways", "acme"), ("vpnpeers", "s1"), ("vpnpeers", "s2")}
        assert not (c.get(VPN, "VPNPeer", "stranger", NS) or {}).get("status")
        assert ctl.proc.poll() is None, ctl.log()
