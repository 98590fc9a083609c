"""The cloud a gateway operator expects, built through openstacksdk in the lab's real Neutron.

::

    ext-net (flat "public", router:external)   ext-subnet 203.0.113.0/24, gw .1, pool .10-.254, no DHCP
        |  (router gateway: one address from the pool, SNAT on)
    gw-router ---- gw-net / gw-subnet 192.0.2.0/26, gateway_ip .1 (the router's interface),
        |                                pool .32-.62 (dynamic ports), .2-.31 kept for fixed addresses
        |          transit ports (fixed):  cluster-<x>-router at 192.0.2.11, .12, ...
    cluster-a-router ---- cluster-a-net / subnet 198.51.100.0/26   gateway .1
    cluster-b-router ---- cluster-b-net / subnet 198.51.100.64/26  gateway .65
    node-net / node-subnet 198.19.0.0/24: one primary port per node, bound to the node's server

The gateway network doubles as the TRANSIT network of ClusterLinks: every customer cluster router has an
interface on its own subnet AND one on gw-net, so extra routes through a transit nexthop are valid both
ways (``gw-router``: <cluster CIDR> via 192.0.2.1x; ``cluster-x-router``: <VPN remote CIDR> via the
gateway port's address on gw-net). Nodes are servers of the Nova emulator (``Server`` ids, hosts
``compute-<i>``, Kubernetes ``spec.providerID = openstack:///<server id>``); their primary ports carry
``device_id``/``device_owner``/``binding:host_id`` as Nova's boot leaves them.

Everything created here is tagged ``lab-baseline`` (set after creation: this Neutron refuses
``tags`` in a POST, a port POST drops them silently). ``Baseline`` remembers what existed after the build and
``sweep()`` returns Neutron to it after a test: resources a test created are deleted (floating IPs,
router interfaces, routers, ports, security groups and rules, subnets, networks), extra routes and tags of
the baseline routers, networks, subnets and ports are restored, quotas reset.
"""

from __future__ import annotations

import hashlib
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import openstack.connection

from lab.openstack.neutron import ADMIN_PROJECT, Neutron, Seed
from lab.openstack.nova import NovaEmulator, Server
from lab.openstack.rest import RestError, call

log = logging.getLogger(__name__)

BASELINE_TAG = "lab-baseline"
EXTERNAL_CIDR = "203.0.113.0/24"
GATEWAY_CIDR = "192.0.2.0/26"
NODE_CIDR = "198.19.0.0/24"
CLUSTER_CIDRS = ("198.51.100.0/26", "198.51.100.64/26", "198.51.100.128/26", "198.51.100.192/26")
TRANSIT_BASE = 11
"""Cluster router i takes 192.0.2.(11+i) on the gateway (transit) network."""


@dataclass(frozen=True)
class Net:
    """A network with one IPv4 subnet."""

    name: str
    network_id: str
    subnet_id: str
    cidr: str
    gateway_ip: str | None


@dataclass(frozen=True)
class ClusterNet:
    """A customer service cluster's network and router, linked to the gateway network (ClusterLink)."""

    name: str
    network: Net
    router_id: str
    router_name: str
    transit_port_id: str
    transit_ip: str
    """The cluster router's address on the gateway network: a valid nexthop for ``gw-router`` routes."""


@dataclass(frozen=True)
class Node:
    """A Kubernetes node's server (in the Nova emulator) and its primary port."""

    name: str
    server_id: str
    host: str
    provider_id: str
    """``openstack:///<server id>``: the Node's ``spec.providerID``."""
    port_id: str
    ip: str


@dataclass(frozen=True)
class Cloud:
    """The topology's names and ids (all ``lab-baseline``-tagged)."""

    project_id: str
    external: Net
    """Floating IPs come from its subnet (203.0.113.0/24)."""
    gateway: Net
    """Where gateway ports go (192.0.2.0/26, gateway_ip .1); also the ClusterLinks' transit network."""
    router_id: str
    router_name: str
    router_external_ip: str
    node_network: Net
    clusters: tuple[ClusterNet, ...]
    nodes: tuple[Node, ...]
    default_security_group_id: str

    def servers(self) -> list[Server]:
        """The nodes as Nova emulator servers (declare them with ``NovaEmulator.add_server``)."""
        return [Server(name=n.name, host=n.host, id=n.server_id) for n in self.nodes]

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cloud:
        def net(x: dict[str, Any]) -> Net:
            return Net(**x)

        return cls(
            project_id=d["project_id"],
            external=net(d["external"]),
            gateway=net(d["gateway"]),
            router_id=d["router_id"],
            router_name=d["router_name"],
            router_external_ip=d["router_external_ip"],
            node_network=net(d["node_network"]),
            clusters=tuple(ClusterNet(**{**c, "network": net(c["network"])}) for c in d["clusters"]),
            nodes=tuple(Node(**n) for n in d["nodes"]),
            default_security_group_id=d["default_security_group_id"],
        )


def _net(
    conn: openstack.connection.Connection,
    name: str,
    cidr: str,
    *,
    gateway_ip: str | None,
    network: dict[str, Any] | None = None,
    subnet: dict[str, Any] | None = None,
) -> Net:
    net = conn.network.create_network(name=name, **(network or {}))
    sub = conn.network.create_subnet(
        network_id=net.id,
        name=f"{name.removesuffix('-net')}-subnet",
        cidr=cidr,
        ip_version=4,
        gateway_ip=gateway_ip,
        **(subnet or {}),
    )
    return Net(name=name, network_id=net.id, subnet_id=sub.id, cidr=cidr, gateway_ip=sub.gateway_ip)


def build_cloud(
    conn: openstack.connection.Connection, *, clusters: int = 2, nodes: int = 3, physnet: str = "public"
) -> Cloud:
    """Create the topology (see the module docstring) and tag everything ``lab-baseline``."""
    if not 0 <= clusters <= len(CLUSTER_CIDRS):
        raise ValueError(f"clusters must be 0..{len(CLUSTER_CIDRS)}")
    project_id = str(conn.current_project_id or ADMIN_PROJECT)
    external = _net(
        conn,
        "ext-net",
        EXTERNAL_CIDR,
        gateway_ip="203.0.113.1",
        network={
            "is_router_external": True,
            "provider_network_type": "flat",
            "provider_physical_network": physnet,
        },
        subnet={
            "is_dhcp_enabled": False,
            "allocation_pools": [{"start": "203.0.113.10", "end": "203.0.113.254"}],
        },
    )
    gateway = _net(
        conn,
        "gw-net",
        GATEWAY_CIDR,
        gateway_ip="192.0.2.1",
        subnet={"is_dhcp_enabled": False, "allocation_pools": [{"start": "192.0.2.32", "end": "192.0.2.62"}]},
    )
    router = conn.network.create_router(
        name="gw-router", external_gateway_info={"network_id": external.network_id}
    )
    conn.network.add_interface_to_router(router, subnet=gateway.subnet_id)
    router = conn.network.get_router(router.id)
    ext_ips = (router.external_gateway_info or {}).get("external_fixed_ips") or [{}]
    cluster_nets = []
    for i in range(clusters):
        letter = chr(ord("a") + i)
        cidr = CLUSTER_CIDRS[i]
        first = cidr.split("/")[0].rsplit(".", 1)
        net = _net(
            conn,
            f"cluster-{letter}-net",
            cidr,
            gateway_ip=f"{first[0]}.{int(first[1]) + 1}",
            subnet={"is_dhcp_enabled": False},
        )
        crouter = conn.network.create_router(name=f"cluster-{letter}-router")
        conn.network.add_interface_to_router(crouter, subnet=net.subnet_id)
        transit_ip = f"192.0.2.{TRANSIT_BASE + i}"
        transit = conn.network.create_port(
            network_id=gateway.network_id,
            name=f"cluster-{letter}-transit",
            fixed_ips=[{"subnet_id": gateway.subnet_id, "ip_address": transit_ip}],
        )
        conn.network.add_interface_to_router(crouter, port=transit.id)
        cluster_nets.append(
            ClusterNet(
                name=f"cluster-{letter}",
                network=net,
                router_id=crouter.id,
                router_name=crouter.name,
                transit_port_id=transit.id,
                transit_ip=transit_ip,
            )
        )
    node_net = _net(conn, "node-net", NODE_CIDR, gateway_ip="198.19.0.1", subnet={"is_dhcp_enabled": False})
    node_refs = []
    for i in range(nodes):
        server = Server(name=f"node-{i}", host=f"compute-{i}")
        port = conn.network.create_port(
            network_id=node_net.network_id,
            name=f"node-{i}-eth0",
            fixed_ips=[{"subnet_id": node_net.subnet_id, "ip_address": f"198.19.0.{10 + i}"}],
            device_id=server.id,
            device_owner="compute:nova",
            binding_host_id=server.host,
        )
        node_refs.append(
            Node(
                name=server.name,
                server_id=server.id,
                host=server.host,
                provider_id=server.provider_id,
                port_id=port.id,
                ip=f"198.19.0.{10 + i}",
            )
        )
    for res in (*conn.network.networks(), *conn.network.subnets(), *conn.network.routers()):
        conn.network.set_tags(res, [BASELINE_TAG])
    for port in conn.network.ports():
        if port.device_owner not in _IMPLICIT_OWNERS:
            conn.network.set_tags(port, [BASELINE_TAG])
    sgs = list(conn.network.security_groups(name="default", project_id=project_id))
    default_sg = sgs[0].id if sgs else ""
    cloud = Cloud(
        project_id=project_id,
        external=external,
        gateway=gateway,
        router_id=router.id,
        router_name=router.name,
        router_external_ip=str(ext_ips[0].get("ip_address", "")),
        node_network=node_net,
        clusters=tuple(cluster_nets),
        nodes=tuple(node_refs),
        default_security_group_id=default_sg,
    )
    log.info("lab.openstack.cloud.built clusters=%d nodes=%d", clusters, nodes)
    return cloud


def cloud_seed(*, clusters: int = 2, nodes: int = 3) -> Seed:
    """The cloud as a ``Seed``: built once into the cached Neutron template, then every session starts
    with it (``Cloud.from_dict(neutron.seed_data["cloud"])``). The key follows this module's code."""
    code = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]

    def build(neutron: Neutron) -> dict[str, Any]:
        return {"cloud": build_cloud(neutron.connect(), clusters=clusters, nodes=nodes).to_dict()}

    return Seed(key=f"cloud-c{clusters}-n{nodes}-{code}", build=build)


def declare_nodes(nova: NovaEmulator, cloud: Cloud) -> None:
    for server in cloud.servers():
        nova.add_server(server)


RESOURCES = {
    "floatingips": "floatingips",
    "routers": "routers",
    "ports": "ports",
    "security_groups": "security-groups",
    "security_group_rules": "security-group-rules",
    "subnets": "subnets",
    "networks": "networks",
}
"""Neutron's collection key -> URL segment."""
TAGGED = ("routers", "ports", "security_groups", "subnets", "networks")
_INTERFACE_OWNERS = (
    "network:router_interface",
    "network:router_interface_distributed",
    "network:ha_router_replicated_interface",
)
_IMPLICIT_OWNERS = ("network:router_gateway", "network:floatingip", *_INTERFACE_OWNERS)


def _list_all(endpoint: str) -> dict[str, list[dict[str, Any]]]:
    """Every collection the sweep looks at, fetched in parallel (raw REST: this is plumbing, not the
    code under test), plus the projects with non-default quotas."""
    paths = {key: f"/v2.0/{seg}" for key, seg in RESOURCES.items()} | {"quotas": "/v2.0/quotas"}
    with ThreadPoolExecutor(max_workers=len(paths)) as pool:
        futures = {key: pool.submit(call, endpoint, "GET", path) for key, path in paths.items()}
        return {key: list(f.result()[key]) for key, f in futures.items()}


def _each(endpoint: str, method: str, paths_bodies: list[tuple[str, Any]]) -> None:
    """The same kind of call for several resources at once; a 404 (already gone) is fine."""

    def one(path: str, body: Any) -> None:
        try:
            call(endpoint, method, path, body)
        except RestError as e:
            if e.status != 404:
                raise

    if not paths_bodies:
        return
    with ThreadPoolExecutor(max_workers=min(8, len(paths_bodies))) as pool:
        for f in [pool.submit(one, p, b) for p, b in paths_bodies]:
            f.result()


@dataclass
class Baseline:
    """What exists right after ``build_cloud``; ``sweep`` removes what a test added and restores the rest."""

    ids: dict[str, set[str]] = field(default_factory=dict)
    tags: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    routes: dict[str, list[dict[str, str]]] = field(default_factory=dict)

    @classmethod
    def capture(cls, endpoint: str) -> Baseline:
        b = cls()
        for kind, items in _list_all(endpoint).items():
            if kind == "quotas":
                continue
            b.ids[kind] = {i["id"] for i in items}
            for i in items:
                if kind in TAGGED:
                    b.tags[(kind, i["id"])] = sorted(i.get("tags") or [])
                if kind == "routers":
                    b.routes[i["id"]] = list(i.get("routes") or [])
        return b

    def sweep(self, endpoint: str) -> dict[str, int]:
        """Delete what is not in the baseline, restore baseline routes and tags, reset quotas.

        Returns what it did, by kind (empty: Neutron was at the baseline already)."""
        now = _list_all(endpoint)
        done: dict[str, int] = {}

        def extra(kind: str) -> list[dict[str, Any]]:
            items = [i for i in now[kind] if i["id"] not in self.ids.get(kind, set())]
            if items:
                done[kind] = len(items)
            return items

        def count(key: str, n: int) -> None:
            if n:
                done[key] = done.get(key, 0) + n

        _each(endpoint, "DELETE", [(f"/v2.0/floatingips/{f['id']}", None) for f in extra("floatingips")])
        routers = {r["id"]: r for r in now["routers"]}
        fix_routes = [
            (f"/v2.0/routers/{rid}", {"router": {"routes": self.routes.get(rid, [])}})
            for rid, r in routers.items()
            if sorted(map(str, r.get("routes") or [])) != sorted(map(str, self.routes.get(rid, [])))
        ]
        count("routes_reset", len(fix_routes))
        # a route through an interface blocks removing the interface: routes first (cleared or restored)
        _each(endpoint, "PUT", [(p, {"router": {"routes": []}}) for p, _ in fix_routes])
        interfaces = [
            (f"/v2.0/routers/{p['device_id']}/remove_router_interface", {"port_id": p["id"]})
            for p in now["ports"]
            if p.get("device_owner") in _INTERFACE_OWNERS
            and p.get("device_id") in routers
            and (p["id"] not in self.ids["ports"] or p["device_id"] not in self.ids["routers"])
        ]
        count("router_interfaces", len(interfaces))
        _each(endpoint, "PUT", interfaces)
        _each(endpoint, "DELETE", [(f"/v2.0/routers/{r['id']}", None) for r in extra("routers")])
        _each(endpoint, "PUT", [(p, b) for p, b in fix_routes if p.rsplit("/", 1)[1] in self.ids["routers"]])
        ports = [p for p in extra("ports") if p.get("device_owner") not in _IMPLICIT_OWNERS]
        _each(endpoint, "DELETE", [(f"/v2.0/ports/{p['id']}", None) for p in ports])
        rules = [
            r for r in extra("security_group_rules") if r["security_group_id"] in self.ids["security_groups"]
        ]
        _each(endpoint, "DELETE", [(f"/v2.0/security-group-rules/{r['id']}", None) for r in rules])
        _each(
            endpoint, "DELETE", [(f"/v2.0/security-groups/{g['id']}", None) for g in extra("security_groups")]
        )
        _each(endpoint, "DELETE", [(f"/v2.0/subnets/{s['id']}", None) for s in extra("subnets")])
        _each(endpoint, "DELETE", [(f"/v2.0/networks/{n['id']}", None) for n in extra("networks")])
        tags = [
            (f"/v2.0/{RESOURCES[kind]}/{i['id']}/tags", {"tags": self.tags[(kind, i["id"])]})
            for kind in TAGGED
            for i in now[kind]
            if (kind, i["id"]) in self.tags and sorted(i.get("tags") or []) != self.tags[(kind, i["id"])]
        ]
        count("tags_restored", len(tags))
        _each(endpoint, "PUT", tags)
        quotas = [(f"/v2.0/quotas/{q['project_id']}", None) for q in now["quotas"]]
        count("quotas_reset", len(quotas))
        _each(endpoint, "DELETE", quotas)
        if done:
            log.info("lab.openstack.cloud.swept %s", " ".join(f"{k}={v}" for k, v in sorted(done.items())))
        return done
