"""The controller's OpenStack backend against a REAL Neutron (PyPI neutron 29 on MariaDB, lab/openstack)
and the Nova os-interface EMULATOR (which writes the port through the real Neutron, as Nova does).

A gateway with site peers, a road warrior and a hostname peer, exposures and reverse exposures, linked by
a ClusterLink: every resource exists with the right fields; a peer removed deletes its rules; a reverse
exposure removed deletes its pair and routes; another customer's ClusterLink router gets none of this
gateway's routes; a crash between the port and the floating IP never duplicates; another client's
address pairs survive our updates, also when it races us (a real 412); Neutron down is reported and
recovered; release leaves nothing tagged.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from controller.cloud import CloudError, CloudState, CloudWant
from controller.cloudplan import cluster_tag, tags
from controller.names import GATEWAY_KINDS, GatewayKey
from controller.openstack import OpenStackCloud, OpenStackSettings, server_of
from controller.reconcile import Snapshot, peers_of, render_gateway
from controller.settings import Allowance, Settings
from lab.openstack.fixtures import OpenStackLab
from lab.openstack.neutron import ADMIN_PROJECT
from lab.openstack.proxy import Fault
from lab.wait import wait_for
from tests.component.test_controller_quantities import reconciles
from tests.examples import example_docs

pytestmark = pytest.mark.lab

KEY = GatewayKey("VPNGateway", "tenant-acme", "acme")
SETTINGS = Settings(
    internal_source_cidrs=("192.0.2.64/26",), default_allowance=Allowance(exposure_targets=("192.0.2.64/26",))
)
CONFIG = {
    "internalSourceCIDRs": ["192.0.2.64/26"],
    "allowances": {"default": {"exposureTargets": ["192.0.2.64/26"]}},
}


def docs(hostname_peer: bool = True, road_warrior: bool = True) -> list[dict[str, Any]]:
    out = example_docs("ipsec.yaml")
    if hostname_peer:
        hq = copy.deepcopy(out[2])
        hq["metadata"]["name"] = "hq"
        hq["spec"]["endpoint"] = "vpn.hq.example"
        hq["spec"]["ipsec"] = {"id": "hq.example", "remoteSubnets": ["203.0.113.32/28"]}
        hq["spec"]["authorization"] = {}
        out.append(hq)
    if road_warrior:
        rw = copy.deepcopy(out[2])
        rw["metadata"]["name"] = "laptop"
        rw["spec"] = {
            "gatewayRef": {"name": "acme"},
            "type": "roadWarrior",
            "ipsec": {"id": "laptop.example", "remoteSubnets": ["203.0.113.48/28"]},
        }
        out.append(rw)
    return out


def plan_of_docs(d: list[dict[str, Any]]) -> Any:
    gw = {**d[0], "metadata": {**d[0]["metadata"], "uid": "u", "generation": 1}}
    peers = peers_of(KEY, [{**p, "metadata": {**p["metadata"], "uid": "p"}} for p in d[1:]])
    rendered = render_gateway(Snapshot(KEY, gw, peers), SETTINGS)
    assert rendered.plan is not None, rendered.problems
    return rendered.plan


@pytest.fixture
def lab(openstack_lab: OpenStackLab) -> Iterator[OpenStackLab]:
    yield openstack_lab


def backend(lab: OpenStackLab, **kw: Any) -> OpenStackCloud:
    conn = lab.connect(connect_retries=0, status_code_retries=0)
    return OpenStackCloud(
        conn,
        OpenStackSettings(
            lab.cloud.gateway.network_id,
            lab.cloud.external.network_id,
            lab.cloud.gateway.subnet_id,
            "test",
            **kw,
        ),
    )


def want(
    lab: OpenStackLab, d: list[dict[str, Any]] | None = None, node: int = 0, links: int = 1
) -> CloudWant:
    n = lab.cloud.nodes[node]
    routers = tuple(c.router_id for c in lab.cloud.clusters[:links])
    return CloudWant(KEY, n.name, n.provider_id, plan_of_docs(d if d is not None else docs()), routers)


def ensure(cloud: OpenStackCloud, w: CloudWant) -> CloudState:
    return anyio.run(cloud.ensure, w)


def tagged(lab: OpenStackLab, what: str) -> list[Any]:
    conn = lab.connect(direct=True)
    listing = {"ports": conn.network.ports, "ips": conn.network.ips, "sgs": conn.network.security_groups}[
        what
    ]
    return list(listing(tags=",".join(tags(KEY, "test"))))


def ingress(lab: OpenStackLab) -> set[tuple[str, int | None, str]]:
    conn = lab.connect(direct=True)
    (sg,) = tagged(lab, "sgs")
    return {
        (r.protocol, r.port_range_min, r.remote_ip_prefix)
        for r in conn.network.security_group_rules(security_group_id=sg.id)
        if r.direction == "ingress"
    }


def ingress_of(conn: Any, key_tags: str) -> set[tuple[str, int | None, str]]:
    out = set()
    for sg in conn.network.security_groups(tags=key_tags):
        for r in conn.network.security_group_rules(security_group_id=sg.id):
            if r.direction == "ingress":
                out.add((r.protocol, r.port_range_min, r.remote_ip_prefix))
    return out


def routes_on(lab: OpenStackLab, router_id: str) -> list[dict[str, str]]:
    return list(lab.connect(direct=True).network.get_router(router_id).routes or [])


def test_every_resource_exists_with_the_right_fields(lab: OpenStackLab) -> None:
    cloud = backend(lab)
    state = ensure(cloud, want(lab))
    (port,) = tagged(lab, "ports")
    (fip,) = tagged(lab, "ips")
    (sg,) = tagged(lab, "sgs")
    assert port.network_id == lab.cloud.gateway.network_id and sg.id in port.security_group_ids
    assert port.fixed_ips[0]["subnet_id"] == lab.cloud.gateway.subnet_id
    assert port.mac_address.startswith("fa:16:3e:")
    assert state.nic is not None and state.nic.mac == port.mac_address
    assert state.nic.address == f"{port.fixed_ips[0]['ip_address']}/26" and state.nic.gateway == "192.0.2.1"
    assert fip.port_id == port.id and state.public_ip == fip.floating_ip_address
    assert port.device_id == server_of(lab.cloud.nodes[0].provider_id)
    assert port.device_owner == "compute:nova"
    assert [p["ip_address"] for p in port.allowed_address_pairs] == ["198.18.0.4/32"] or all(
        p["ip_address"].startswith("198.18.0.") for p in port.allowed_address_pairs
    )
    rules = ingress(lab)
    for site in ("198.51.100.2/32", "198.51.100.6/32"):
        assert {("udp", 500, site), ("udp", 4500, site), ("esp", None, site)} <= rules
    assert ("udp", 500, "0.0.0.0/0") in rules, "hostname peer and road warrior open IKE"
    assert ("tcp", 631, "192.0.2.64/26") in rules, "reverse exposure from internalSourceCIDRs"
    conds = {c.type: c for c in state.conditions}
    assert conds["CloudReady"].status and conds["RoutingReady"].reason == "RoutesProgrammed"
    scoped = conds["SecurityGroupScoped"]
    assert (scoped.status, scoped.reason) == (False, "HostnameEndpointOpensPort")
    assert (
        "hq (hostname endpoint vpn.hq.example)" in scoped.message
        and "laptop (road warrior)" in scoped.message
    )
    vip = port.allowed_address_pairs[0]["ip_address"]
    mine = routes_on(lab, lab.cloud.clusters[0].router_id)
    assert {"destination": vip, "nexthop": port.fixed_ips[0]["ip_address"]} in mine
    assert not any(
        r["nexthop"] == port.fixed_ips[0]["ip_address"]
        for r in routes_on(lab, lab.cloud.clusters[1].router_id)
    ), "another customer's router gets none of this gateway's routes"


def test_a_no_op_ensure_only_reads(lab: OpenStackLab) -> None:
    cloud = backend(lab)
    ensure(cloud, want(lab))
    lab.neutron_proxy.clear_log()
    lab.nova_proxy.clear_log()
    ensure(cloud, want(lab))
    assert lab.neutron_proxy.writes(r".") == [] and lab.nova_proxy.writes(r".") == []


def test_all_pinned_peers_make_the_group_scoped(lab: OpenStackLab) -> None:
    state = ensure(backend(lab), want(lab, docs(hostname_peer=False, road_warrior=False)))
    scoped = next(c for c in state.conditions if c.type == "SecurityGroupScoped")
    assert (scoped.status, scoped.reason) == (True, "AllSourcesPinned")
    assert not any(remote == "0.0.0.0/0" for _, _, remote in ingress(lab))


def test_a_peer_removed_deletes_its_rules_and_a_reverse_exposure_removed_its_pair_and_routes(
    lab: OpenStackLab,
) -> None:
    cloud = backend(lab)
    ensure(cloud, want(lab))
    (port,) = tagged(lab, "ports")
    addr = port.fixed_ips[0]["ip_address"]
    d = [x for x in docs() if x["metadata"]["name"] != "s2"]
    d[0] = copy.deepcopy(d[0])
    del d[0]["spec"]["reverseExposures"]
    for p in d[1:]:
        p["spec"].setdefault("authorization", {}).pop("reverseExposures", None)
    ensure(cloud, want(lab, d))
    rules = ingress(lab)
    assert not any(remote == "198.51.100.6/32" for _, _, remote in rules), "s2's rules deleted"
    assert ("udp", 500, "198.51.100.2/32") in rules, "s1's kept"
    assert ("tcp", 631, "192.0.2.64/26") not in rules
    (port,) = tagged(lab, "ports")
    assert port.allowed_address_pairs == []
    assert not any(r["nexthop"] == addr for r in routes_on(lab, lab.cloud.clusters[0].router_id))


def test_a_crash_between_the_port_and_the_floating_ip_never_duplicates(lab: OpenStackLab) -> None:
    cloud = backend(lab)
    lab.neutron_proxy.fail("POST", r"^/v2\.0/floatingips$", 503, times=1)
    with pytest.raises(CloudError) as err:
        ensure(cloud, want(lab))
    assert err.value.step == "FloatingIPFailed"
    assert len(tagged(lab, "ports")) == 1 and tagged(lab, "ips") == []
    fresh = backend(lab)  # a restarted controller: no memory of the first attempt
    ensure(fresh, want(lab))
    assert len(tagged(lab, "ports")) == 1 and len(tagged(lab, "ips")) == 1


def test_a_port_left_untagged_by_a_crash_is_adopted_not_duplicated(lab: OpenStackLab) -> None:
    cloud = backend(lab)
    lab.neutron_proxy.fail("PUT", r"^/v2\.0/ports/[^/]+/tags$", 503, times=1)  # created, never tagged
    with pytest.raises(CloudError):
        ensure(cloud, want(lab))
    conn = lab.connect(direct=True)
    assert len(list(conn.network.ports(name="vpngw-acme.tenant-acme"))) == 1
    ensure(backend(lab), want(lab))
    assert len(list(conn.network.ports(name="vpngw-acme.tenant-acme"))) == 1
    assert len(tagged(lab, "ports")) == 1


def test_a_port_and_floating_ip_the_earlier_release_made_are_adopted_by_the_command_and_kept(
    lab: OpenStackLab, tmp_path: Any
) -> None:
    """Moving from the seed: its gateway's port (its own name and tags, attached to the node its pod ran
    on) and the floating IP remote peers know are tagged as the gateway's by ``python -m controller
    adopt``; the reconcile then uses them (same port, same address, same floating IP, moved to the
    gateway's node), creating no other. Refused with exit 2 and nothing tagged: a port another gateway
    owns, one on another network, a DHCP port, one without port security, one attached to a server that
    is not a node of the cluster (unless --force), and any port once the gateway has been reconciled."""
    from lab.cluster import Cluster, clouds_yaml, openstack_args

    net = lab.cloud
    conn = lab.connect(direct=True)
    seed_port = conn.network.create_port(network_id=net.gateway.network_id, name="bnerd-vpn-acme")
    conn.network.set_tags(seed_port, ["bnerd-vpn-operator"])
    seed_fip = conn.network.create_ip(floating_network_id=net.external.network_id, port_id=seed_port.id)
    nodes, stranger = net.nodes[:2], net.nodes[2]
    lab.connect().compute.create_server_interface(nodes[1].server_id, port_id=seed_port.id)
    other = conn.network.create_port(network_id=net.gateway.network_id, name="someone-elses")
    conn.network.set_tags(other, list(tags(GatewayKey("VPNGateway", "tenant-b", "b"), "test")))
    off_net = conn.network.create_port(network_id=net.external.network_id, name="off-net")
    dhcp = conn.network.create_port(network_id=net.gateway.network_id, name="d", device_owner="network:dhcp")
    open_port = conn.network.create_port(
        network_id=net.gateway.network_id, name="o", port_security_enabled=False
    )
    vm_port = conn.network.create_port(network_id=net.gateway.network_id, name="a-vm")
    lab.connect().compute.create_server_interface(stranger.server_id, port_id=vm_port.id)
    cfg = clouds_yaml(tmp_path / "clouds.yaml", lab.network_url, lab.compute_url)
    flags = [
        *openstack_args(net.gateway.network_id, net.gateway.subnet_id, net.external.network_id)[2:],
        "--instance",
        "test",
        "--cluster-id",
        "c1",
    ]
    with Cluster(tmp_path / "k8s") as c:
        for n in nodes:
            c.add_node(n.name, provider_id=n.provider_id)

        def adopt(port: str, *extra: str) -> subprocess.CompletedProcess[str]:
            argv = [sys.executable, "-m", "controller", "adopt", "tenant-acme/acme", port, *flags, *extra]
            env = {**os.environ, "OS_CLIENT_CONFIG_FILE": str(cfg), "KUBECONFIG": str(c.kubeconfig)}
            return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)

        wait_for(lambda: conn.network.get_port(seed_port.id).device_id, 30, "the seed port attached")
        wait_for(lambda: conn.network.get_port(vm_port.id).device_id, 30, "the VM's port attached")
        for refused, why in (
            (other, "vpngw-gateway:VPNGateway.tenant-b.b"),
            (off_net, "not the gateway network"),
            (dhcp, "is a network:dhcp port"),
            (open_port, "port security off"),
            (vm_port, f"attached to server {stranger.server_id}, not one of this cluster's nodes"),
        ):
            r = adopt(refused.id)
            assert r.returncode == 2 and why in r.stderr, r.stderr
        assert set(conn.network.get_port(other.id).tags) == set(
            tags(GatewayKey("VPNGateway", "tenant-b", "b"), "test")
        )
        assert not conn.network.get_port(vm_port.id).tags, "refused: nothing tagged"
        assert adopt(vm_port.id, "--dry-run", "--force").returncode == 0, "--force takes any server's"
        dry = adopt(seed_port.id, "--dry-run")
        assert (
            dry.returncode == 0 and f"would tag: port/{seed_port.id}, floatingip/{seed_fip.id}" in dry.stdout
        )
        assert f"on server {nodes[1].server_id}" in dry.stdout
        assert tagged(lab, "ports") == [] and tagged(lab, "ips") == [], "a dry run tags nothing"
        r = adopt(seed_port.id)
        assert r.returncode == 0 and seed_fip.floating_ip_address in r.stdout, r.stderr
        assert set(conn.network.get_port(seed_port.id).tags) == {
            "bnerd-vpn-operator",
            *tags(KEY, "test"),
            cluster_tag("c1"),
        }
        state = ensure(backend(lab, cluster="c1"), want(lab, node=0))
        assert [p.id for p in tagged(lab, "ports")] == [seed_port.id]
        assert [f.id for f in tagged(lab, "ips")] == [seed_fip.id]
        assert state.public_ip == seed_fip.floating_ip_address
        port = conn.network.get_port(seed_port.id)
        assert state.nic is not None and state.nic.address.split("/")[0] == port.fixed_ips[0]["ip_address"]
        assert port.device_id == nodes[0].server_id, "moved to the gateway's node"
        again = adopt(seed_port.id)
        assert again.returncode == 0 and "nothing (already the gateway's)" in again.stdout
        late = adopt(vm_port.id, "--force")
        assert late.returncode == 2 and "it was reconciled already" in late.stderr, late.stderr
    anyio.run(backend(lab, cluster="c1").release, KEY)
    assert tagged(lab, "ports") == [] and tagged(lab, "ips") == []


def test_another_clients_address_pairs_survive_also_when_it_races_us(lab: OpenStackLab) -> None:
    cloud = backend(lab)
    ensure(cloud, want(lab, docs(hostname_peer=False, road_warrior=False)))
    (port,) = tagged(lab, "ports")
    other = lab.connect(direct=True)
    theirs = {"ip_address": "192.0.2.50/32"}
    other.network.update_port(port, allowed_address_pairs=[*port.allowed_address_pairs, theirs])
    # Our next update (a new reverse exposure) is held in the proxy while the other client edits again:
    # our If-Match revision is stale by the time it reaches Neutron (a real 412), we read again, redo ours.
    d = docs(hostname_peer=False, road_warrior=False)
    d[0]["spec"]["reverseExposures"].append(
        {"name": "scanner", "target": {"address": "203.0.113.2"}, "ports": [{"port": 9100}]}
    )
    d[1]["spec"]["authorization"]["reverseExposures"].append("scanner")
    lab.neutron_proxy.clear_log()
    # Held until the other client's edit is in (``clear()`` releases it), not for a fixed time: a loaded
    # machine took longer than 2 s for that edit, and our update went first.
    rule = lab.neutron_proxy.add("PUT", rf"^/v2\.0/ports/{port.id}$", Fault.delay(60.0), times=1)
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(ensure(cloud, want(lab, d))))
    t.start()
    wait_for(lambda: rule.hits == 1, 20, "our address-pairs update held in the proxy")
    current = other.network.get_port(port.id)
    late = {"ip_address": "192.0.2.51/32"}
    other.network.update_port(current, allowed_address_pairs=[*current.allowed_address_pairs, late])
    lab.neutron_proxy.clear()  # releases our held update, whose If-Match revision is now stale
    t.join(30)
    assert rule.hits == 1 and result, "ensure finished"
    puts = [r for r in lab.neutron_proxy.calls("PUT", rf"^/v2\.0/ports/{port.id}$")]
    assert [r.status for r in puts] == [412, 200], "the held update met a newer revision, then ours went in"
    pairs = {p["ip_address"] for p in other.network.get_port(port.id).allowed_address_pairs}
    assert {"192.0.2.50/32", "192.0.2.51/32"} <= pairs, "theirs, both times"
    assert len([p for p in pairs if p.startswith("198.18.0.")]) == 2, "ours: both reverse exposures"


def test_neutron_down_is_a_named_failure_and_the_next_ensure_recovers(lab: OpenStackLab) -> None:
    cloud = backend(lab)
    ensure(cloud, want(lab))
    lab.neutron.stop()
    try:
        with pytest.raises(CloudError) as err:
            ensure(cloud, want(lab))
        assert err.value.retryable and err.value.step.endswith("Failed")
    finally:
        lab.neutron.start()
    state = ensure(cloud, want(lab))
    assert next(c for c in state.conditions if c.type == "CloudReady").status


def test_re_pinning_moves_the_port_to_the_new_nodes_server(lab: OpenStackLab) -> None:
    cloud = backend(lab)
    ensure(cloud, want(lab, node=0))
    ensure(cloud, want(lab, node=1))
    (port,) = tagged(lab, "ports")
    assert port.device_id == server_of(lab.cloud.nodes[1].provider_id)
    detaches = lab.nova_proxy.calls("DELETE", r"/os-interface/")
    assert len(detaches) == 1 and str(server_of(lab.cloud.nodes[0].provider_id)) in detaches[0].path


def test_release_leaves_nothing_tagged_and_no_route(lab: OpenStackLab) -> None:
    cloud = backend(lab)
    ensure(cloud, want(lab))
    (port,) = tagged(lab, "ports")
    addr = port.fixed_ips[0]["ip_address"]
    anyio.run(cloud.release, KEY)
    assert tagged(lab, "ports") == tagged(lab, "ips") == tagged(lab, "sgs") == []
    for c in lab.cloud.clusters:
        assert not any(r["nexthop"] == addr for r in routes_on(lab, c.router_id))
    anyio.run(cloud.release, KEY)  # idempotent


def test_the_controller_process_with_the_openstack_backend_creates_and_releases_everything(
    lab: OpenStackLab, tmp_path: Any
) -> None:
    """The whole path: the controller as a process, the API emulator, the real Neutron and the Nova emulator
    through their proxies. The gateway's NIC2 in the plan is the port Neutron allocated, status.publicIP
    its floating IP; SIGKILLed between the port and the floating IP, a new controller finishes the job
    without a duplicate; deleting the gateway leaves nothing tagged."""
    from controller.desired import plan_of
    from lab.cluster import Cluster, clouds_yaml, openstack_args, secrets_for
    from lab.wait import wait_for

    key_tags = ",".join(tags(KEY, "vpngw"))
    conn = lab.connect(direct=True)
    with Cluster(tmp_path / "k8s") as c:
        for n in lab.cloud.nodes[:2]:
            c.add_node(n.name, provider_id=n.provider_id)
        cfg = clouds_yaml(tmp_path / "clouds.yaml", lab.network_url, lab.compute_url)
        net = lab.cloud
        args = openstack_args(net.gateway.network_id, net.gateway.subnet_id, net.external.network_id)
        env = {"OS_CLIENT_CONFIG_FILE": str(cfg)}
        held = lab.neutron_proxy.add("POST", r"^/v2\.0/floatingips$", Fault.hang(120), times=1)
        # tenant-acme may put routes on its own cluster's router, not on another's (allowances)
        acme = {"exposureTargets": ["192.0.2.64/26"], "clusterLinkRouters": [net.clusters[0].router_id]}
        config = {**CONFIG, "allowances": {"namespaces": {"tenant-acme": acme}}}
        first = c.start_controller(config, *args, name="first", env=env)
        wait_for(first.ready, 30, "the controller")
        c.apply(secrets_for(docs()))
        c.apply(docs())
        # This customer's ClusterLink names the gateway; another customer's link (another namespace, another
        # router) names only its own gateway: it must get none of this gateway's routes.
        c.apply(
            [
                {
                    "apiVersion": "ipsec.bnerd.net/v1alpha1",
                    "kind": "ClusterLink",
                    "metadata": {"name": "services", "namespace": "tenant-acme"},
                    "spec": {"routerID": net.clusters[0].router_id, "gateways": ["acme"]},
                },
                {
                    "apiVersion": "ipsec.bnerd.net/v1alpha1",
                    "kind": "ClusterLink",
                    "metadata": {"name": "services", "namespace": "tenant-other"},
                    "spec": {"routerID": net.clusters[1].router_id, "gateways": ["other"]},
                },
            ]
        )
        wait_for(lambda: list(conn.network.ports(tags=key_tags)), 30, "the port")
        wait_for(lambda: held.hits == 1, 30, "the floating IP's POST, held")
        first.stop(signal.SIGKILL)
        lab.neutron_proxy.clear()
        second = c.start_controller(config, *args, name="second", env=env)
        gw = wait_for(
            lambda: (
                (g := c.get("vpn.bnerd.net/v1alpha1", "VPNGateway", "acme", "tenant-acme"))
                and (g.get("status") or {}).get("publicIP")
                and g
            ),
            60,
            "status.publicIP",
        )
        (port,) = conn.network.ports(tags=key_tags)
        (fip,) = conn.network.ips(tags=key_tags)
        assert gw["status"]["publicIP"] == fip.floating_ip_address and fip.port_id == port.id
        plan = plan_of(c.owned("v1", "ConfigMap", "acme", "tenant-acme"))  # type: ignore[arg-type]
        assert plan.nic.mac == port.mac_address
        assert plan.nic.address == f"{port.fixed_ips[0]['ip_address']}/26"
        conds = {x["type"]: x for x in gw["status"]["conditions"]}
        assert conds["SecurityGroupScoped"]["reason"] == "HostnameEndpointOpensPort"
        assert conds["CloudReady"]["status"] == "True" and conds["RoutingReady"]["status"] == "True"
        addr = port.fixed_ips[0]["ip_address"]
        wait_for(
            lambda: any(r["nexthop"] == addr for r in routes_on(lab, net.clusters[0].router_id)),
            30,
            "the linked router's route",
        )
        assert not any(r["nexthop"] == addr for r in routes_on(lab, net.clusters[1].router_id))

        # A ClusterLink of tenant-acme naming a router its allowance does not hold: no route there, and the
        # gateway says so.
        c.apply(
            [
                {
                    "apiVersion": "ipsec.bnerd.net/v1alpha1",
                    "kind": "ClusterLink",
                    "metadata": {"name": "infra", "namespace": "tenant-acme"},
                    "spec": {"routerID": net.clusters[1].router_id, "gateways": ["acme"]},
                }
            ]
        )

        def routing() -> dict[str, Any]:
            gw = c.get("vpn.bnerd.net/v1alpha1", "VPNGateway", "acme", "tenant-acme") or {}
            conds = {y["type"]: y for y in (gw.get("status") or {}).get("conditions") or []}
            return dict(conds.get("RoutingReady") or {})

        refused = wait_for(
            lambda: (r := routing()).get("reason") == "RouterNotAllowed" and r, 30, "RouterNotAllowed"
        )
        assert f"ClusterLink infra (router {net.clusters[1].router_id})" in refused["message"]
        # The reconcile that said RouterNotAllowed had done its route work; one more with the link in place,
        # made to happen (the controller's own status write triggers none, and its resync is 10 min away)
        # and counted on /metrics, not guessed from a pause: a change to the link enqueues the key of each
        # gateway kind it names, and each one's reconcile counts once it ended.
        seen = reconciles(second)
        c.kube.patch(
            "ipsec.bnerd.net/v1alpha1",
            "ClusterLink",
            "infra",
            {"metadata": {"labels": {"touched": "1"}}},
            "tenant-acme",
        )
        wait_for(
            lambda: reconciles(second) >= seen + len(GATEWAY_KINDS),
            30,
            "a reconcile with the ClusterLink in place",
        )
        assert not any(r["nexthop"] == addr for r in routes_on(lab, net.clusters[1].router_id))
        assert any(r["nexthop"] == addr for r in routes_on(lab, net.clusters[0].router_id)), (
            "the allowed one kept"
        )
        c.kube.delete("ipsec.bnerd.net/v1alpha1", "ClusterLink", "infra", "tenant-acme")

        # What a release that ran the pod in the tenant's namespace left there goes; the port and the
        # floating IP are the gateway's and stay: the public address does not change.
        uid = gw["metadata"]["uid"]
        ref = [
            {
                "apiVersion": "vpn.bnerd.net/v1alpha1",
                "kind": "VPNGateway",
                "name": "acme",
                "uid": uid,
                "controller": True,
            }
        ]
        old = {
            "name": "vpngw-acme",
            "namespace": "tenant-acme",
            "ownerReferences": ref,
            "labels": {"vpn.bnerd.net/operator": "vpngw"},
        }
        c.apply([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": old, "data": {"plan.json": "{}"}}])
        wait_for(
            lambda: c.get("v1", "ConfigMap", "vpngw-acme", "tenant-acme") is None, 30, "the leftover deleted"
        )
        assert [p.id for p in conn.network.ports(tags=key_tags)] == [port.id]
        assert [(f.id, f.floating_ip_address) for f in conn.network.ips(tags=key_tags)] == [
            (fip.id, fip.floating_ip_address)
        ]

        # Neutron away for a minute while a peer is added: reported, and the change lands once it is back.
        def cloud_ready() -> str:
            gw = c.get("vpn.bnerd.net/v1alpha1", "VPNGateway", "acme", "tenant-acme") or {}
            conds = {y["type"]: y for y in (gw.get("status") or {}).get("conditions") or []}
            return str(conds.get("CloudReady", {}).get("status"))

        extra = copy.deepcopy(docs()[1])
        extra["metadata"]["name"] = "s9"
        extra["spec"].update(
            endpoint="198.51.100.30",
            ipsec={"id": "s9.example", "remoteSubnets": ["203.0.113.64/28"]},
            authorization={"exposures": ["web"]},
        )
        down = time.monotonic()
        lab.neutron.stop()
        try:
            c.apply([extra])
            wait_for(lambda: cloud_ready() == "False", 60, "CloudReady=False while Neutron is down")
            time.sleep(max(0.0, 60 - (time.monotonic() - down)))
        finally:
            lab.neutron.start()
        try:
            wait_for(lambda: ("udp", 500, "198.51.100.30/32") in ingress_of(conn, key_tags), 60, "s9's rules")
        except AssertionError:
            gw = c.get("vpn.bnerd.net/v1alpha1", "VPNGateway", "acme", "tenant-acme") or {}
            raise AssertionError(
                f"s9's rules never came: {(gw.get('status') or {}).get('conditions')}"
            ) from None
        wait_for(lambda: cloud_ready() == "True", 30, "CloudReady again")
        assert second.proc.poll() is None, "survived"
        c.kube.delete("vpn.bnerd.net/v1alpha1", "VPNGateway", "acme", "tenant-acme")
        wait_for(
            lambda: c.get("vpn.bnerd.net/v1alpha1", "VPNGateway", "acme", "tenant-acme") is None,
            60,
            "deleted",
        )
        assert list(conn.network.ports(tags=key_tags)) == list(conn.network.ips(tags=key_tags)) == []
        assert list(conn.network.security_groups(tags=key_tags)) == []
        assert second.proc.poll() is None


def test_a_rule_someone_else_created_meanwhile_is_a_success_not_a_failure(lab: OpenStackLab) -> None:
    """Neutron's bulk rule create is all or nothing: one of our new rules created by someone else between
    our read and our POST (409 SecurityGroupRuleExists) makes the backend create the rest one by one, the
    duplicate counting as done."""
    d = docs(hostname_peer=False, road_warrior=False)
    cloud = backend(lab)
    ensure(cloud, want(lab, d[:2]))  # s1 only
    (sg,) = tagged(lab, "sgs")
    other = lab.connect(direct=True)
    lab.neutron_proxy.clear_log()
    held = lab.neutron_proxy.add("POST", r"^/v2\.0/security-group-rules$", Fault.delay(2.0), times=1)
    done: list[Any] = []
    t = threading.Thread(target=lambda: done.append(ensure(cloud, want(lab, d))))
    t.start()
    wait_for(lambda: held.hits == 1, 20, "our bulk POST, held")
    other.network.create_security_group_rule(
        security_group_id=sg.id,
        direction="ingress",
        protocol="udp",
        port_range_min=500,
        port_range_max=500,
        remote_ip_prefix="198.51.100.6/32",
    )
    t.join(30)
    assert done, "ensure finished"
    site2 = {
        ("udp", 500, "198.51.100.6/32"),
        ("udp", 4500, "198.51.100.6/32"),
        ("esp", None, "198.51.100.6/32"),
    }
    assert site2 <= ingress(lab)
    statuses = [r.status for r in lab.neutron_proxy.calls("POST", r"^/v2\.0/security-group-rules$")]
    assert statuses[0] == 409 and statuses.count(409) == 2 and statuses.count(201) == 2


def test_a_full_rule_quota_is_a_failure_not_a_rule_that_exists(lab: OpenStackLab) -> None:
    """Found by review: Neutron's OverQuota is a 409 like SecurityGroupRuleExists, and every 409 counted
    as done: the ensure succeeded with the new peer's IKE/ESP rules missing. With the project's rule quota
    full, the step fails naming the quota, and succeeds once there is room."""
    d = docs(hostname_peer=False, road_warrior=False)
    cloud = backend(lab)
    ensure(cloud, want(lab, d[:2]))  # s1 only
    conn = lab.connect(direct=True)
    project = ADMIN_PROJECT
    used = len(list(conn.network.security_group_rules(project_id=project)))
    conn.network.update_quota(project, security_group_rules=used)
    try:
        with pytest.raises(CloudError) as err:
            ensure(cloud, want(lab, d))  # s2's three rules do not fit
        assert err.value.step == "SecurityGroupFailed" and "quota" in str(err.value).lower()
        assert ("udp", 500, "198.51.100.6/32") not in ingress(lab)
    finally:
        conn.network.update_quota(project, security_group_rules=-1)
    ensure(cloud, want(lab, d))
    assert ("udp", 500, "198.51.100.6/32") in ingress(lab)


def test_a_router_off_the_transit_subnet_gets_no_route_and_never_keeps_the_port_from_its_node(
    lab: OpenStackLab,
) -> None:
    """Routes come last and only on routers with an interface on the gateway subnet: a ClusterLink router
    without one is named in RoutingReady (the reconcile retried) while the port is attached all the same;
    and a router of another network, whose route's next hop is our port's address on THEIR subnet, is
    left alone (found by review: any router with a route to that address counted as ours)."""
    direct = lab.connect(direct=True).network
    net = direct.create_network(name="elsewhere-net")
    router = sub = None
    try:
        sub = direct.create_subnet(
            network_id=net.id,
            ip_version=4,
            cidr="192.0.2.0/26",
            gateway_ip="192.0.2.1",
            is_dhcp_enabled=False,
        )
        router = direct.create_router(name="elsewhere-router")
        direct.add_interface_to_router(router, subnet=sub.id)
        cloud = backend(lab)
        w = want(lab)
        state = ensure(cloud, dataclasses.replace(w, routers=(*w.routers, router.id)))
        (port,) = tagged(lab, "ports")
        addr = port.fixed_ips[0]["ip_address"]
        assert state.failed and state.nic is not None and state.nic.mac == port.mac_address
        assert port.device_id == server_of(lab.cloud.nodes[0].provider_id), "attached all the same"
        conds = {c.type: c for c in state.conditions}
        assert conds["CloudReady"].status and not conds["RoutingReady"].status
        assert (
            f"{router.id} not found or without an interface on the gateway subnet"
            in conds["RoutingReady"].message
        )
        assert any(r["nexthop"] == addr for r in routes_on(lab, lab.cloud.clusters[0].router_id))
        theirs = {"destination": "10.77.0.0/24", "nexthop": addr}
        direct.add_extra_routes_to_router(router, {"router": {"routes": [theirs]}})
        ensure(cloud, want(lab, links=0))  # no ClusterLink now: our routes go
        assert not any(r["nexthop"] == addr for r in routes_on(lab, lab.cloud.clusters[0].router_id))
        assert theirs in routes_on(lab, router.id), "another network's route with the same next hop stays"
    finally:
        if router is not None:
            direct.update_router(router, routes=[])
            if sub is not None:
                direct.remove_interface_from_router(router, subnet=sub.id)
            direct.delete_router(router)
        direct.delete_network(net)
