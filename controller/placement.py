"""Which node a gateway is pinned to. Pure.

A gateway's Neutron port is attached to one Nova instance, so its pod is hard-pinned (``nodeName``) to
that instance's node. The choice is sticky: the node in ``status.nodeName`` stays as long as it is Ready
and still matches the operator's node selector, whatever else changed (re-pinning means re-attaching
the port and rolling the pod: an outage). Otherwise the choice is, among nodes that are Ready,
schedulable, match the selector, carry no taint the gateway pod does not tolerate, and have room (the
per-node cap: Nova's interface limit), the one with the fewest gateways, then by name (deterministic).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Placement:
    node: str | None
    reason: str
    """``Pinned`` (sticky), ``Placed`` (chosen now), ``Repinned`` (moved off a node that cannot keep it),
    ``NoSchedulableNode``, ``NotRendered`` (nothing to serve: no slot taken)."""
    message: str
    moved_from: str | None = None


def ready(node: Mapping[str, Any]) -> bool:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False


def matches(node: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    have = (node.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in selector.items())


def tolerated(taint: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    for t in tolerations:
        effect_ok = not t.get("effect") or t.get("effect") == taint.get("effect")
        if t.get("operator") == "Exists":
            key_ok = not t.get("key") or t.get("key") == taint.get("key")
            if key_ok and effect_ok:
                return True
        elif t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", "") and effect_ok:
            return True
    return False


def keeps(node: Mapping[str, Any], selector: Mapping[str, str]) -> bool:
    """A node that may keep a gateway already pinned to it (a cordon does not move it)."""
    return ready(node) and matches(node, selector)


def takes(
    node: Mapping[str, Any], selector: Mapping[str, str], tolerations: Sequence[Mapping[str, Any]]
) -> bool:
    """A node that may take a new gateway."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable") or not keeps(node, selector):
        return False
    return all(
        tolerated(t, tolerations)
        for t in spec.get("taints") or []
        if t.get("effect") in ("NoSchedule", "NoExecute")
    )


def place(
    current: str | None,
    nodes: Sequence[Mapping[str, Any]],
    pinned: Mapping[str, int],
    *,
    selector: Mapping[str, str],
    tolerations: Sequence[Mapping[str, Any]],
    cap: int = 0,
) -> Placement:
    """``pinned``: how many OTHER gateways each node holds."""
    by_name = {str((n.get("metadata") or {}).get("name")): n for n in nodes}
    if current is not None and current in by_name and keeps(by_name[current], selector):
        return Placement(current, "Pinned", f"pinned to node {current}")
    candidates = [
        name
        for name, n in by_name.items()
        if takes(n, selector, tolerations) and (cap <= 0 or pinned.get(name, 0) < cap)
    ]
    if not candidates:
        why = [f"{len(by_name)} node(s)"]
        if cap > 0:
            why.append(f"cap {cap} gateway(s) per node")
        if selector:
            why.append("selector " + ",".join(f"{k}={v}" for k, v in sorted(selector.items())))
        return Placement(
            None, "NoSchedulableNode", "no Ready node can take the gateway (" + "; ".join(why) + ")"
        )
    best = min(candidates, key=lambda n: (pinned.get(n, 0), n))
    if current is None:
        return Placement(best, "Placed", f"pinned to node {best}")
    gone = "is gone" if current not in by_name else "is not Ready or no longer matches the node selector"
    return Placement(best, "Repinned", f"node {current} {gone}: re-pinned to {best}", moved_from=current)


OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
"""The taint an administrator puts on a node known to be down (Kubernetes' non-graceful node shutdown,
KEP-2268): its pods may go without their kubelet's word."""


def stranded(
    pods: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    pin: str | None,
    *,
    fenced: bool,
) -> list[Mapping[str, Any]]:
    """The gateway's pods to delete without waiting for their kubelet (grace 0): already being deleted
    (the Recreate rollout), on a node other than the pin that is not Ready, so no kubelet will confirm
    their deletion, and the Recreate Deployment would wait for them forever before it starts the pod on
    the pin. Only when none of them can still serve:
    the cloud ``fenced`` the old node off (NIC2 is attached to the pin's server now), or, without a
    fence, the node is gone or tainted out-of-service (a NotReady node may only be cut off from the API,
    its pod still holding NIC2 and the tunnels)."""
    if pin is None:
        return []
    by_name = {str((n.get("metadata") or {}).get("name")): n for n in nodes}
    out = []
    for pod in pods:
        on = str((pod.get("spec") or {}).get("nodeName") or "")
        if not on or on == pin:
            continue
        if not (pod.get("metadata") or {}).get("deletionTimestamp"):
            # Not yet deleted by the Recreate rollout (the Deployment controller scales the old
            # ReplicaSet to 0 first): gone now, the ReplicaSet would make it again, on the dead node
            # (podgc's gcTerminating takes only terminating pods, for the same reason).
            continue
        node = by_name.get(on)
        if node is not None and ready(node):
            continue
        out_of_service = node is not None and any(
            t.get("key") == OUT_OF_SERVICE for t in (node.get("spec") or {}).get("taints") or []
        )
        if fenced or node is None or out_of_service:
            out.append(pod)
    return out
