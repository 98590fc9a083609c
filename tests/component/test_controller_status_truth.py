"""The status tells the truth when a write fails (issue 21, item 5): the controller as a process against
the API emulator (the same world as tests/component/test_controller_operator.py).

* Multus' NetworkAttachmentDefinition CRD is not installed (404 NotFound), an object of our name without
  our labels is in the gateway namespace (409 AlreadyExists), the tenant's Role is refused (403,
  injected: the emulator's RBAC escalation check is the real one's, but the admin token passes it): every
  other object is still written, and the status says all three with the API's reasons, once (one Warning
  Event, however often the reconcile is retried). Healed, the condition goes.
"""

from __future__ import annotations

from typing import Any

import yaml

from lab.cluster import MANIFESTS, Cluster, home_of
from lab.wait import wait_for
from tests.component.test_controller_operator import NS, apply_ipsec, cluster, gateway, start
from tests.helpers import condition

__all__ = ["cluster"]  # the fixture

NAD_CRD = "network-attachment-definitions.k8s.cni.cncf.io"
THEIRS = {"app.kubernetes.io/managed-by": "someone-else"}
FORBIDDEN = (
    'roles.rbac.authorization.k8s.io "vpngw-acme" is forbidden: user "system:serviceaccount:vpngw-system:'
    'vpngw-controller" (groups=["system:serviceaccounts"]) is attempting to grant RBAC permissions not '
    "currently held"
)


def owned_objects(cluster: Cluster) -> dict[str, Any]:
    """The gateway's OwnedObjects condition; empty while it has none."""
    return condition(gateway(cluster), "OwnedObjects")


def warnings(cluster: Cluster, reason: str) -> int:
    uid = gateway(cluster)["metadata"]["uid"]
    return sum(
        1
        for e in cluster.kube.list("v1", "Event", NS)
        if e.get("involvedObject", {}).get("uid") == uid and e["type"] == "Warning" and e["reason"] == reason
    )


def test_refused_writes_are_said_in_the_status_once_and_the_rest_is_written(cluster: Cluster) -> None:
    name, home = home_of("acme", NS)
    cluster.kube.delete("apiextensions.k8s.io/v1", "CustomResourceDefinition", NAD_CRD)
    wait_for(
        lambda: cluster.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", NAD_CRD) is None,
        10,
        "gone",
    )
    taken = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": home, "labels": THEIRS},
        "spec": {"podSelector": {}},
    }
    cluster.kube.create(taken)
    cluster.kube.inject_fault(403, -1, verb="create", resource="roles", namespace=NS, message=FORBIDDEN)
    ctl = start(cluster)
    apply_ipsec(cluster)

    def said() -> dict[str, Any] | None:
        c = owned_objects(cluster)
        return c if c and c["message"].count(": ") >= 3 and "Role" in c["message"] else None

    c = wait_for(said, 30, "OwnedObjects saying every refused write")
    assert c["status"] == "False"
    msg = c["message"]
    assert (
        f"create NetworkAttachmentDefinition {home}/{name}: NotFound: the API server does not serve "
        "NetworkAttachmentDefinition (its CustomResourceDefinition is not installed): 404 page not found"
        in msg
    ), msg
    assert f"create NetworkPolicy {home}/{name}: AlreadyExists: " in msg
    assert (
        "(it is not this gateway's: labels app.kubernetes.io/managed-by=someone-else; ownerReferences none)"
        in msg
    )
    assert f"create Role {NS}/vpngw-acme: Forbidden: {FORBIDDEN}" in msg
    assert condition(gateway(cluster), "Ready")["status"] == "False"
    # Every write the API accepts is made.
    for api, kind in (("v1", "ConfigMap"), ("v1", "ServiceAccount"), ("apps/v1", "Deployment")):
        assert cluster.owned(api, kind, "acme", NS) is not None, kind
    assert cluster.get("networking.k8s.io/v1", "NetworkPolicy", name, home)["metadata"]["labels"] == THEIRS  # type: ignore[index]
    # Never the plan: the ConfigMap's content is nowhere in the status.
    plan = cluster.owned("v1", "ConfigMap", "acme", NS)
    assert plan is not None
    for value in plan.get("data", {}).values():
        assert value not in yaml.safe_dump(gateway(cluster)["status"])

    # Retried with backoff (each retry asks the API again), said once.
    since = cluster.kube.requests()[-1].seq
    wait_for(
        lambda: len(cluster.kube.requests(verb="create", resource="networkpolicies", since=since)) >= 2,
        10,
        "the reconcile retried twice while writes fail",
    )
    reason = c["reason"]
    assert warnings(cluster, reason) == 1, "one Warning Event for the same failure, however many retries"
    status_writes = cluster.kube.requests(
        verb="patch", resource="vpngateways", subresource="status", since=since
    )
    assert [(r.code, r.seq) for r in status_writes if r.code < 300] == [], "the same failure: no status write"

    # Healed: Multus installed, the foreign object gone, the Role allowed. The condition goes.
    cluster.kube.clear_faults()
    cluster.kube.delete("networking.k8s.io/v1", "NetworkPolicy", name, home)
    cluster.kube.create(yaml.safe_load((MANIFESTS / "network-attachment-definition.yaml").read_text()))
    wait_for(lambda: not owned_objects(cluster), 60, "OwnedObjects gone once every write succeeds")
    assert cluster.owned("k8s.cni.cncf.io/v1", "NetworkAttachmentDefinition", "acme", NS) is not None
    assert cluster.get("rbac.authorization.k8s.io/v1", "Role", "vpngw-acme", NS) is not None
    assert ctl.proc.poll() is None, ctl.log()
