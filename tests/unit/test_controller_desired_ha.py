"""An HA gateway's desired objects (docs/ha.md "The build contract"), pure: slot a's objects as a gateway
without HA has them (enabling HA rolls no pod), slot b's ConfigMap, NAD and Deployment named
``<home_name>-b`` on their own NIC2 and node, the Lease created once and never written again, the pods'
Role granting that Lease by name; and HA off is today's objects exactly."""

from __future__ import annotations

from typing import Any

from controller.desired import Inputs, desired
from controller.names import GatewayKey
from tests.unit.test_controller_desired import CLOUD, HERE, IPSEC, SETTINGS, render_gateway, snapshot

KEY = GatewayKey("VPNGateway", "tenant-acme", "acme")


def plain_inputs() -> Inputs:
    """The example IPsec gateway's inputs as the reconcile builds them, without HA."""
    snap = snapshot(IPSEC)
    plan = render_gateway(snap, SETTINGS).in_force
    assert plan is not None
    return Inputs(snap.key, snap.uid, plan, SETTINGS, CLOUD.nic, HERE.node, snap.secrets)


def env_of(deployment: dict[str, Any], container: str) -> dict[str, Any]:
    spec = deployment["spec"]["template"]["spec"]
    (c,) = [c for c in spec["containers"] if c["name"] == container]
    return {e["name"]: e.get("valueFrom", e.get("value")) for e in c.get("env", [])}


def test_every_gateway_pods_agent_knows_its_pod_name_from_the_downward_api() -> None:
    """HA or not: enabling HA then never changes slot a's template (one roll, at the upgrade that brings
    it, which a new gateway image rolls anyway)."""
    dep = desired(plain_inputs()).get("Deployment")
    assert dep is not None
    env = env_of(dep, "status-agent")
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
