"""Deletion and cloud resources against a REAL Neutron (lab/openstack; the Nova os-interface emulator):
nothing leaks, ever (issue 21, item 2).

* Twenty gateways deleted at random moments of their first reconcile (Neutron's writes slowed down, so
  the moments fall before, during and after the cloud steps): once the CRs are gone, nothing tagged with
  the installation remains. Before the finalizer came first, 3 of 6 such gateways left their port,
  floating IP and security group behind for good.
* A gateway deleted after its finalizer was removed by hand has its cloud resources released, whether
  the controller saw the deletion or finds the gateway's objects in the gateway namespace at start;
  counted in ``vpngw_controller_cloud_swept_total``. Another installation's resources for a gateway of
  the same name, and a foreign route on the same router, are not touched.
* Resources tagged with this installation and this cluster for a gateway the cluster does not hold (no
  deletion seen, no object left: the whole gateway namespace gone, say) are swept at start; those of
  another cluster with the same instance name stay.
"""

from __future__ import annotations

import copy
import random
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from controller.cloud import CloudWant
from controller.cloudplan import cluster_tag, instance_tag, tags
from controller.names import GatewayKey
from controller.openstack import OpenStackCloud, OpenStackSettings
from controller.reconcile import Snapshot, peers_of, render_gateway
from controller.settings import Settings
from lab.cluster import Cluster, clouds_yaml, openstack_args, secrets_for
from lab.openstack.fixtures import OpenStackLab
from lab.openstack.proxy import Fault
from lab.wait import wait_for
from tests.examples import example_docs

pytestmark = pytest.mark.lab

NS = "tenant-acme"
GATEWAYS = 20


def gateway_docs(i: int) -> list[dict[str, Any]]:
    """Gateway ``gw<i>`` with one site peer: the smallest gateway that renders, so it gets a port."""
    gw, _, peer = (copy.deepcopy(d) for d in example_docs("ipsec.yaml"))
    gw["metadata"]["name"] = f"gw{i}"
    gw["spec"]["serviceCIDR"] = f"198.18.{i}.0/24"
    del gw["spec"]["exposures"], gw["spec"]["reverseExposures"]
    peer["metadata"]["name"] = f"site{i}"
    peer["spec"].update(
        gatewayRef={"name": f"gw{i}"},
        endpoint=f"198.51.100.{10 + i}",
        ipsec={"id": f"site{i}.lab.example", "remoteSubnets": [f"203.0.113.{16 * (i % 16)}/28"]},
        authorization={},
    )
    return [gw, peer]


def tagged(conn: Any, tag: str) -> dict[str, list[str]]:
    return {
        "ports": [p.id for p in conn.network.ports(tags=tag)],
        "floating IPs": [f.id for f in conn.network.ips(tags=tag)],
        "security groups": [s.id for s in conn.network.security_groups(tags=tag)],
    }


def nothing(found: dict[str, list[str]]) -> bool:
    return not any(found.values())


def backend(lab: OpenStackLab, instance: str, cluster: str | None = None) -> OpenStackCloud:
    """The OpenStack backend of an installation (and a cluster), as a test's stand-in for another one."""
    net = lab.cloud
    return OpenStackCloud(
        lab.connect(connect_retries=0, status_code_retries=0),
        OpenStackSettings(
            net.gateway.network_id, net.external.network_id, net.gateway.subnet_id, instance, cluster=cluster
        ),
    )


def plan_for(key: GatewayKey, i: int) -> Any:
    """Gateway ``gw<i>``'s plan (``gateway_docs``), rendered for ``key``."""
    gw, peer = gateway_docs(i)
    peers = peers_of(key, [{**peer, "metadata": {**peer["metadata"], "uid": "p"}}])
    snap = Snapshot(key, {**gw, "metadata": {**gw["metadata"], "uid": "u", "generation": 1}}, peers)
    rendered = render_gateway(snap, Settings())
    assert rendered.plan is not None, rendered.problems
    return rendered.plan


def start(c: Cluster, lab: OpenStackLab, tmp_path: Path, instance: str, *extra: str) -> Any:
    """The controller with the OpenStack backend (a new name each time: its own log)."""
    net = lab.cloud
    cfg = clouds_yaml(tmp_path / "clouds.yaml", lab.network_url, lab.compute_url)
    args = openstack_args(net.gateway.network_id, net.gateway.subnet_id, net.external.network_id)
    ctl = c.start_controller(
        {},
        *args,
        "--instance",
        instance,
        *extra,
        name=f"controller-{len(c.controllers)}",
        env={"OS_CLIENT_CONFIG_FILE": str(cfg)},
    )
    wait_for(ctl.ready, 30, "the controller")
    return ctl


def test_gateways_deleted_during_their_first_reconcile_leave_nothing(
    openstack_lab: OpenStackLab, tmp_path: Path
) -> None:
    lab = openstack_lab
    instance = "deleted-early"
    conn = lab.connect(direct=True)
    seed = random.randrange(1 << 30)  # noqa: S311 (test timing, printed on failure)
    rng = random.Random(seed)  # noqa: S311
    # Every Neutron write takes 0.3 s longer: a first reconcile (group, rules, port, tags, floating IP,
    # attach) takes a few seconds, and the deletes below fall at every moment of it.
    slow = [lab.neutron_proxy.add(m, r"^/v2\.0/", Fault.delay(0.3)) for m in ("POST", "PUT")]
    with Cluster(tmp_path / "k8s") as c:
        for n in lab.cloud.nodes[:2]:
            c.add_node(n.name, provider_id=n.provider_id)
        ctl = start(c, lab, tmp_path, instance, "--workers", "4")
        docs = [d for i in range(GATEWAYS) for d in gateway_docs(i)]
        c.apply(secrets_for(docs))
        offsets = sorted((rng.uniform(0.0, 4.0), i) for i in range(GATEWAYS))
        begun = time.monotonic()
        c.apply(docs)
        for at, i in offsets:
            time.sleep(max(0.0, begun + at - time.monotonic()))
            c.kube.delete("vpn.bnerd.net/v1alpha1", "VPNGateway", f"gw{i}", NS)
        wait_for(
            lambda: all(
                c.get("vpn.bnerd.net/v1alpha1", "VPNGateway", f"gw{i}", NS) is None for i in range(GATEWAYS)
            ),
            180,
            "every gateway gone (its finalizer released)",
        )
        for rule in slow:
            lab.neutron_proxy.remove(rule)
        left = tagged(conn, instance_tag(instance))
        assert nothing(left), f"seed {seed}: left behind {left}\n{ctl.log()[-3000:]}"
        assert ctl.proc.poll() is None
        # It did reach the cloud: the deletes fell during the cloud steps, not all before them.
        assert "cloud.released" in ctl.log(), f"seed {seed}: no gateway got as far as the cloud"


def test_a_gateway_gone_without_its_finalizer_has_its_cloud_resources_released_and_nothing_else(
    openstack_lab: OpenStackLab, tmp_path: Path
) -> None:
    """Its finalizer removed by hand, then deleted: while the controller runs (the deletion seen) and while
    it is away (found at start by its objects in the gateway namespace). Another installation's resources
    for a gateway of the same name, and a route another party keeps on the same router, stay."""
    lab = openstack_lab
    instance = "swept"
    conn = lab.connect(direct=True)
    net = lab.cloud

    # Another installation (same gateway name, another instance tag) holds resources for gw3 too.
    theirs = GatewayKey("VPNGateway", NS, "gw3")
    anyio.run(backend(lab, "someone-else").ensure, CloudWant(theirs, None, None, plan_for(theirs, 3), ()))
    router = net.clusters[0].router_id
    foreign = {"destination": "198.51.100.128/25", "nexthop": str(_free_address(conn, net.gateway.subnet_id))}
    conn.network.add_extra_routes_to_router(router, {"router": {"routes": [foreign]}})

    def held(name: str) -> dict[str, list[str]]:
        return tagged(conn, ",".join(tags(GatewayKey("VPNGateway", NS, name), instance)))

    def strip_and_delete(c: Cluster, name: str) -> None:
        c.kube.patch("vpn.bnerd.net/v1alpha1", "VPNGateway", name, {"metadata": {"finalizers": None}}, NS)
        c.kube.delete("vpn.bnerd.net/v1alpha1", "VPNGateway", name, NS)

    try:
        with Cluster(tmp_path / "k8s") as c:
            for n in net.nodes[:2]:
                c.add_node(n.name, provider_id=n.provider_id)
            ctl = start(c, lab, tmp_path, instance)
            docs = gateway_docs(3) + gateway_docs(5)
            c.apply(secrets_for(docs))
            c.apply(docs)
            wait_for(lambda: all(held("gw3").values()), 60, "gw3's port, floating IP and group")
            wait_for(lambda: all(held("gw5").values()), 60, "gw5's port, floating IP and group")
            strip_and_delete(c, "gw3")  # seen: released at once
            wait_for(lambda: nothing(held("gw3")), 60, "gw3's resources released")
            # Logged once the deletes returned, a moment after Neutron shows them gone: wait for it.
            swept = "cloud.swept gateway=VPNGateway/tenant-acme/gw3 deleted=3"
            wait_for(lambda: swept in ctl.log(), 10, swept)
            ctl.stop()
            strip_and_delete(c, "gw5")  # while no controller runs
            again = start(c, lab, tmp_path, instance)
            wait_for(lambda: nothing(held("gw5")), 60, "gw5's resources released at start")
            # The counter goes up once the deletes returned, a moment after Neutron shows them: wait for it.
            wait_for(
                lambda: "vpngw_controller_cloud_swept_total 3.0" in again.get("/metrics")[1],
                10,
                "vpngw_controller_cloud_swept_total 3.0",
            )
            kept = tagged(conn, ",".join(tags(theirs, "someone-else")))
            assert all(len(ids) == 1 for ids in kept.values()), kept
            assert foreign in list(conn.network.get_router(router).routes or [])
    finally:
        conn.network.remove_extra_routes_from_router(router, {"router": {"routes": [foreign]}})
        anyio.run(backend(lab, "someone-else").release, theirs)
    assert nothing(tagged(conn, instance_tag(instance)))


def test_what_this_cluster_tagged_for_a_gateway_it_does_not_hold_is_swept_and_another_clusters_stays(
    openstack_lab: OpenStackLab, tmp_path: Path
) -> None:
    lab = openstack_lab
    instance = "sweep-cluster"
    conn = lab.connect(direct=True)

    def made(cluster: str, i: int) -> GatewayKey:
        key = GatewayKey("VPNGateway", NS, f"gw{i}")
        anyio.run(backend(lab, instance, cluster).ensure, CloudWant(key, None, None, plan_for(key, i), ()))
        return key

    ours, theirs = made("ours", 7), made("theirs", 8)

    def held(key: GatewayKey) -> dict[str, list[str]]:
        return tagged(conn, ",".join(tags(key, instance)))

    assert all(held(ours).values()) and all(held(theirs).values())
    try:
        with Cluster(tmp_path / "k8s") as c:
            ctl = start(c, lab, tmp_path, instance, "--cluster-id", "ours", "--sweep-grace-seconds", "0")
            wait_for(
                lambda: nothing(held(ours)), 60, "the resources of gw7, which this cluster does not hold"
            )
            assert "cloud.sweep_found gateway=VPNGateway/tenant-acme/gw7" in ctl.log()
            _, metrics = ctl.get("/metrics")
            assert "vpngw_controller_cloud_swept_total 3.0" in metrics, metrics
            assert all(len(ids) == 1 for ids in held(theirs).values()), "another cluster's stay"
            assert "gw8" not in ctl.log()
    finally:
        anyio.run(backend(lab, instance, "theirs").release, theirs)
        anyio.run(backend(lab, instance, "ours").release, ours)


def test_two_clusters_with_one_instance_name_never_share_or_release_each_others_gateway(
    openstack_lab: OpenStackLab,
) -> None:
    """The same gateway (namespace and name) in two clusters of one project, both installed as "vpngw":
    each gets its own port and floating IP (found by the cluster tag too), and releasing one leaves the
    other's. Without the cluster tag in ``_find``, the second cluster took the first's port from its node
    and released it on delete."""
    lab = openstack_lab
    conn = lab.connect(direct=True)

    key = GatewayKey("VPNGateway", NS, "gw9")
    plan = plan_for(key, 9)
    try:
        a = anyio.run(backend(lab, "vpngw", "a").ensure, CloudWant(key, None, None, plan, ()))
        b = anyio.run(backend(lab, "vpngw", "b").ensure, CloudWant(key, None, None, plan, ()))
        assert a.public_ip != b.public_ip and a.nic is not None and b.nic is not None
        assert a.nic.mac != b.nic.mac, "b made its own port"
        ours_a = tagged(conn, ",".join([*tags(key, "vpngw"), cluster_tag("a")]))
        assert all(len(ids) == 1 for ids in ours_a.values()), ours_a
        anyio.run(backend(lab, "vpngw", "b").release, key)
        assert tagged(conn, ",".join([*tags(key, "vpngw"), cluster_tag("a")])) == ours_a, "a's stay"
        assert nothing(tagged(conn, ",".join([*tags(key, "vpngw"), cluster_tag("b")])))
    finally:
        anyio.run(backend(lab, "vpngw", "b").release, key)
        anyio.run(backend(lab, "vpngw", "a").release, key)
    assert nothing(tagged(conn, ",".join(tags(key, "vpngw"))))


def test_a_wider_route_someone_points_at_the_gateway_stays_until_its_port_goes(
    openstack_lab: OpenStackLab,
) -> None:
    """We program /32s only: a route another party pointed at the gateway's port is theirs while the port
    lives, and goes with the port (its address is then free for any other port)."""
    lab = openstack_lab
    net = lab.cloud
    conn = lab.connect(direct=True)
    cloud = backend(lab, "routes")
    key = GatewayKey("VPNGateway", NS, "gw4")
    router = net.clusters[0].router_id
    want = CloudWant(key, None, None, plan_for(key, 4), (router,))
    try:
        state = anyio.run(cloud.ensure, want)
        assert state.nic is not None
        theirs = {"destination": "198.51.100.0/25", "nexthop": state.nic.address.split("/")[0]}
        conn.network.add_extra_routes_to_router(router, {"router": {"routes": [theirs]}})
        anyio.run(cloud.ensure, want)
        assert theirs in list(conn.network.get_router(router).routes or []), "a reconcile took it"
    finally:
        anyio.run(cloud.release, key)
    assert theirs not in list(conn.network.get_router(router).routes or []), "left pointing at a free address"


def _free_address(conn: Any, subnet_id: str) -> str:
    """An address of the subnet no port holds (a foreign route's next hop)."""
    import ipaddress

    subnet = conn.network.get_subnet(subnet_id)
    used = {ip["ip_address"] for p in conn.network.ports() for ip in p.fixed_ips or []}
    return next(str(a) for a in ipaddress.ip_network(subnet.cidr).hosts() if str(a) not in used)
