"""The controller's watch of an HA gateway's Lease (``Operator._changed`` for kind Lease): every version
is recorded for ``controller.ha.observe`` (the renewals are what expiry is measured by), but only a
holder change, or the Lease coming or going, queues a reconcile. The agents renew about every second: a
reconcile per renewal would be a reconcile and a cloud call per HA gateway per second."""

from __future__ import annotations

import time
from typing import Any

import pytest

from controller.cloud import StaticCloud
from controller.leader import AlwaysLeader
from controller.names import GatewayKey, home_labels
from controller.run import Operator
from controller.settings import Settings
from gwkit.kube import ClusterConfig, KubeClient

KEY = GatewayKey("VPNGateway", "tenant-acme", "acme")


def lease(holder: str, renew: str, rv: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": KEY.home_name,
            "namespace": "vpngw-gateways",
            "resourceVersion": rv,
            "labels": home_labels(KEY, "vpngw", "uid-1"),
        },
        "spec": {"holderIdentity": holder, "renewTime": renew, "leaseDurationSeconds": 3},
    }


@pytest.mark.anyio
async def test_a_renewal_is_recorded_but_queues_nothing_and_a_new_holder_queues_its_gateway() -> None:
    op = Operator(
        KubeClient(ClusterConfig("https://127.0.0.1:9", False)), Settings(), StaticCloud({}), AlwaysLeader()
    )
    first = lease("pod-a", "2026-12-03T16:00:00.000000Z", "1")
    op._changed("Lease", None, first)
    assert op.queue.waiting() == 1, "a Lease that appears: its gateway looks"
    assert (await op.queue.get()) == KEY
    op.queue.done(KEY)
    seen = op.leases[KEY].seen_at

    renewed = lease("pod-a", "2026-12-03T16:00:01.000000Z", "2")
    op._changed("Lease", first, renewed)
    assert op.queue.waiting() == 0, "a renewal queues no reconcile"
    record = op.leases[KEY].record
    assert record is not None and record.renew_time.endswith("01.000000Z")
    assert op.leases[KEY].seen_at >= seen

    taken = lease("pod-b", "2026-12-03T16:00:09.000000Z", "3")
    op._changed("Lease", renewed, taken)
    assert op.queue.waiting() == 1, "a new holder: its gateway looks (the floating IP may move)"
    prev = op.leases[KEY].previous
    assert prev is not None and prev.holder == "pod-a" and not prev.released

    op._changed("Lease", taken, None)
    assert op.leases[KEY].record is None


@pytest.mark.anyio
async def test_a_lease_of_no_gateway_is_ignored() -> None:
    op = Operator(
        KubeClient(ClusterConfig("https://127.0.0.1:9", False)), Settings(), StaticCloud({}), AlwaysLeader()
    )
    stray = lease("x", "2026-12-03T16:00:00.000000Z", "1")
    stray["metadata"]["labels"] = {}
    op._changed("Lease", None, stray)
    assert op.queue.waiting() == 0 and op.leases == {}


@pytest.mark.anyio
async def test_a_lease_relabelled_as_another_gateways_is_ignored_and_pod_written_fields_are_not_trusted() -> (
    None
):
    """The pods may write their Lease whole: labels, duration, holder. A Lease counts for a gateway only
    under that gateway's home name; its duration is the configured one; a holder that cannot be a pod's
    name is a placeholder (found by review: a relabelled Lease with a 2^31 s duration froze another
    tenant's failover)."""
    op = Operator(
        KubeClient(ClusterConfig("https://127.0.0.1:9", False)), Settings(), StaticCloud({}), AlwaysLeader()
    )
    other = GatewayKey("VPNGateway", "tenant-evil", "evil")
    forged = lease("x", "2026-12-03T16:00:00.000000Z", "1")
    forged["metadata"]["name"] = other.home_name  # tenant-evil's own Lease, labelled as acme's
    op._changed("Lease", None, forged)
    assert op.queue.waiting() == 0 and op.leases == {}

    own = lease("pod-a\nforged log line", "2026-12-03T16:00:00.000000Z", "1")
    own["spec"]["leaseDurationSeconds"] = 2**31 - 1
    op._changed("Lease", None, own)
    record = op.leases[KEY].record
    assert record is not None
    assert record.duration == Settings().ha_lease_seconds
    assert record.holder == "invalid-holder-identity"


@pytest.mark.anyio
async def test_a_relist_of_the_leases_fences_every_gateway_again() -> None:
    """Versions the informer never delivered (a watch too old to resume) may hide a renewal: each fence
    starts again from now, as for a controller that just started."""
    op = Operator(
        KubeClient(ClusterConfig("https://127.0.0.1:9", False)), Settings(), StaticCloud({}), AlwaysLeader()
    )
    op._changed("Lease", None, lease("pod-a", "2026-12-03T16:00:00.000000Z", "1"))
    before = op.leases[KEY].fence_until
    op._leases_relisted()
    assert op.leases[KEY].fence_until >= before
    assert op.leases[KEY].fence_until >= time.monotonic() + Settings().ha_lease_seconds - 0.5
