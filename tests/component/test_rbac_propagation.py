"""RBAC that is not in force at once (issue: the API server's own rules): kube-apiserver's RBAC authorizer
reads informer caches, so a Role or binding just written may be refused for a moment. With the API
emulator's RBAC delay on (``set_rbac_delay``: a change is seen by the authorizer only after it), the
controller starts with bindings as fresh as a Helm install's and creates a gateway's Roles and bindings,
and the gateway's status-agent (``python -m agent --kube-status``, its ServiceAccount's token) writes
the CR's status through them: nobody exits, the first writes are refused, and the status the agent
published arrives once the authorizer sees the binding - none is lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.cluster import Cluster, home_of, wait_for
from tests.component.test_controller_operator import CONFIG, NS, apply_with_secrets, converged
from tests.component.test_controller_rbac import SA, bind
from tests.examples import example_docs
from tests.helpers import agent_as_pod

DELAY = 4.0
"""Seconds before the authorizer sees an RBAC change (real servers: well under a second, more under
load; long enough here to be met by both processes' first requests)."""
VPN = "vpn.bnerd.net/v1alpha1"


def test_roles_the_authorizer_does_not_see_yet_lose_no_write(tmp_path: Path) -> None:
    with Cluster(tmp_path) as c:
        c.kube.set_rbac_delay(DELAY)
        c.add_node("node-a", provider_id="openstack:///11111111-1111-4111-8111-111111111111")
        ctl = c.start_controller(CONFIG, "--resync-seconds", "600", kubeconfig=bind(c, (NS,)))
        apply_with_secrets(c, example_docs("ipsec.yaml"))
        wait_for(lambda: converged(c) or ctl.proc.poll() is not None, 60, "the gateway's objects")
        assert ctl.proc.poll() is None, ctl.log()
        assert [r for r in c.kube.requests(user=SA) if r.code == 403], "the controller met no delay"

        _, home = home_of("acme", NS)
        sa = c.owned("v1", "ServiceAccount", "acme", NS)
        plan = c.owned("v1", "ConfigMap", "acme", NS)
        assert sa is not None and plan is not None
        agent_user = f"system:serviceaccount:{home}:{sa['metadata']['name']}"
        with agent_as_pod(c.kube, home, sa["metadata"]["name"], plan["data"]["plan.json"], tmp_path) as proc:

            def reported() -> dict[str, Any] | None:
                gw = c.get(VPN, "VPNGateway", "acme", NS)
                return gw if gw and (gw.get("status") or {}).get("tunnels") else None

            gw = wait_for(lambda: reported() or proc.poll() is not None, DELAY + 20, "the agent's status")
            assert proc.poll() is None, (tmp_path / "agent.log").read_text()
        assert isinstance(gw, dict)
        patches = c.kube.requests(user=agent_user, verb="patch")
        refused = [r for r in patches if r.code == 403]
        assert refused, "the agent met no delay: nothing was tested"
        assert refused[0].subresource == "status"
        # Written once the authorizer saw the binding, and soon after: the agent backs off from a 403
        # as from any failed write (2 s), not for the 10 s of a write that cannot succeed. Measured
        # between the server's own records of the last refusal and the first write it took, not over
        # the agent's start-up (a shuffled run under load took 7.1 s from the bindings to the status,
        # the retry itself on time).
        status_patches = [r for r in patches if r.subresource == "status"]
        taken = next(r for r in status_patches if r.code < 300)
        last_refusal = max(r.time for r in status_patches if r.code == 403 and r.time <= taken.time)
        assert taken.time - last_refusal < 8.0, [(r.time, r.code) for r in status_patches]
        tunnels = gw["status"]["tunnels"]
        assert tunnels and all(
            t["state"] == "Down" and "charon unreachable" in t["lastError"] for t in tunnels
        )
        assert ctl.proc.poll() is None, ctl.log()
