"""An HA gateway's slot b and Lease (``controller.desired``, docs/ha.md) are the controller's to find and
delete like its other objects in the gateway namespace (``desired.home_slots``): with the gateway, and when
the gateway is gone without its finalizer. The HA objects are planted as the controller would make them
(the reconcile does not render them yet)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from controller.desired import HA_SLOTS, desired
from controller.names import GatewayKey
from lab.cluster import GATEWAY_NAMESPACE, Cluster, home_of
from lab.wait import wait_for
from tests.component.test_controller_operator import (
    NS,
    OWNED,
    VPN,
    apply_ipsec,
    cluster,
    converged,
    gateway,
    start,
)
from tests.unit.test_controller_desired_ha import ha_inputs

__all__ = ["cluster"]  # the operator module's fixture


def plant_ha_objects(c: Cluster) -> list[tuple[str, str, str]]:
    """Slot b's objects and the Lease of gateway acme, as ``desired`` makes them for its uid:
    (apiVersion, kind, name) of each."""
    return plant_ha_objects_for_uid(c, gateway(c)["metadata"]["uid"])


def plant_ha_objects_for_uid(c: Cluster, uid: str) -> list[tuple[str, str, str]]:
    d = desired(dataclasses.replace(ha_inputs(), key=GatewayKey("VPNGateway", NS, "acme"), uid=uid))
    out = []
    for slot in HA_SLOTS:
        obj: dict[str, Any] | None = d.get(slot)
        assert obj is not None, slot
        c.kube.create(copy.deepcopy(obj))
        out.append((str(obj["apiVersion"]), str(obj["kind"]), str(obj["metadata"]["name"])))
    return out


def gone(c: Cluster, objects: list[tuple[str, str, str]]) -> bool:
    return all(c.get(api, kind, name, GATEWAY_NAMESPACE) is None for api, kind, name in objects)


def test_deleting_an_ha_gateway_deletes_its_slot_b_and_lease(cluster: Cluster) -> None:
    start(cluster)
    apply_ipsec(cluster)
    wait_for(lambda: converged(cluster), 20, "every owned object")
    planted = plant_ha_objects(cluster)
    assert [k for _, k, _ in planted] == [*HA_SLOTS.values()]
    cluster.kube.delete(VPN, "VPNGateway", "acme", NS)
    wait_for(lambda: cluster.get(VPN, "VPNGateway", "acme", NS) is None, 10, "the gateway gone")
    wait_for(lambda: gone(cluster, planted), 20, "slot b and the Lease deleted")
    assert not any(cluster.owned(a, k, "acme", NS) for a, k in OWNED)


def test_an_ha_gateway_gone_without_its_finalizer_leaves_no_slot_b_nor_lease(cluster: Cluster) -> None:
    """Gone while the controller was away; then even a Lease alone (everything else deleted by hand) is
    found at start and deleted: the Leases of the gateway namespace are watched like the rest."""
    ctl = start(cluster)
    apply_ipsec(cluster)
    wait_for(lambda: converged(cluster), 20, "every owned object")
    planted = plant_ha_objects(cluster)
    ctl.stop()
    cluster.kube.patch(VPN, "VPNGateway", "acme", {"metadata": {"finalizers": None}}, NS)
    cluster.kube.delete(VPN, "VPNGateway", "acme", NS)
    ctl = start(cluster)
    wait_for(lambda: gone(cluster, planted), 20, "the orphans deleted at start")
    assert not any(cluster.owned(a, k, "acme", NS) for a, k in OWNED)
    ctl.stop()
    planted = plant_ha_objects_for_uid(cluster, "uid-gone")
    lease = planted[-1]
    for api, kind, name in planted[:-1]:
        cluster.kube.delete(api, kind, name, GATEWAY_NAMESPACE)
    assert lease[1] == "Lease" and lease[2] == home_of("acme", NS)[0]
    start(cluster)
    wait_for(lambda: gone(cluster, [lease]), 20, "the Lease alone deleted at start")
