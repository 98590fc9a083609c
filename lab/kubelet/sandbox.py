"""A node's pod network and each pod's sandbox, in network namespaces (iproute2, as a CNI plugin does).

The node is a network namespace (in the e2e world: the lab's gateway namespace, i.e. the Nova instance
whose Neutron port is NIC2). It gets a bridge ``cbr0`` holding the pod CIDR's first address (kubenet's
layout) and the cluster services' addresses on ``lo`` (the API server's in-cluster address, cluster DNS).

A pod's sandbox is a network namespace of its own, named with the run's prefix (``lab.netns``), where:

* ``eth0`` is one end of a veth whose node end is on ``cbr0`` (the pod's IP from the node's pod CIDR,
  default route via the bridge address), as the cluster CNI gives it;
* each additional network of the pod (Multus' ``k8s.v1.cni.cncf.io/networks``) that is a host-device
  NAD moves the node's interface with the NAD's MAC (``hwaddr``) or name (``device``) into the pod and
  renames it to the interface name Multus gives (``net1`` ...), up, its addresses gone (an interface
  that changes namespace loses them): host-device's ADD. Teardown moves it back under its old name
  (DEL), before the namespace is deleted (a veth destroyed with its namespace would take its peer);
* the pod's ``securityContext.sysctls`` are written into the namespace, as the runtime does, after it
  starts from the worst host's settings (``lab.netns.POD_SYSCTLS``: no forwarding, strict rp_filter).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from ipaddress import IPv4Interface, IPv4Network

from lab import netns
from lab.netns import LabError

log = logging.getLogger(__name__)

BRIDGE = "cbr0"


def ip_json(*args: str) -> list[dict[str, object]]:
    out = netns.run(["ip", "-j", *args]).stdout.decode() or "[]"
    parsed = json.loads(out)
    return parsed if isinstance(parsed, list) else []


def link_by_mac(ns: str, mac: str) -> str | None:
    for link in ip_json("-n", ns, "link", "show"):
        if str(link.get("address", "")).lower() == mac.lower():
            return str(link["ifname"])
    return None


def link_exists(ns: str, name: str) -> bool:
    return any(link.get("ifname") == name for link in ip_json("-n", ns, "link", "show"))


@dataclass
class NodeNetwork:
    """The node side: ``cbr0`` with the pod CIDR's gateway address, service addresses on ``lo``."""

    ns: str
    pod_cidr: IPv4Network
    service_addresses: tuple[str, ...]
    used: set[str] = field(default_factory=set)

    @property
    def gateway(self) -> IPv4Interface:
        return IPv4Interface(f"{next(self.pod_cidr.hosts())}/{self.pod_cidr.prefixlen}")

    def setup(self) -> None:
        if not link_exists(self.ns, BRIDGE):
            netns.run(["ip", "-n", self.ns, "link", "add", BRIDGE, "type", "bridge"])
        netns.run(["ip", "-n", self.ns, "addr", "replace", str(self.gateway), "dev", BRIDGE])
        netns.run(["ip", "-n", self.ns, "link", "set", BRIDGE, "up"])
        for a in self.service_addresses:
            netns.run(["ip", "-n", self.ns, "addr", "replace", f"{a}/32", "dev", "lo"])

    def teardown(self) -> None:
        netns.run(["ip", "-n", self.ns, "link", "del", BRIDGE], check=False)
        for a in self.service_addresses:
            netns.run(["ip", "-n", self.ns, "addr", "del", f"{a}/32", "dev", "lo"], check=False)

    def allocate(self) -> IPv4Interface:
        gw = self.gateway.ip
        for host in self.pod_cidr.hosts():
            if host != gw and str(host) not in self.used:
                self.used.add(str(host))
                return IPv4Interface(f"{host}/{self.pod_cidr.prefixlen}")
        raise LabError(f"pod CIDR {self.pod_cidr} of node namespace {self.ns} is full")

    def release(self, ip: IPv4Interface) -> None:
        self.used.discard(str(ip.ip))

    def give_link(self, mac: str, to_ns: str) -> bool:
        """Move the node's interface with ``mac`` (if it is here) to network namespace ``to_ns``."""
        name = link_by_mac(self.ns, mac)
        if name is None:
            return False
        netns.run(["ip", "-n", self.ns, "link", "set", name, "down"])
        netns.run(["ip", "-n", self.ns, "link", "set", name, "netns", to_ns])
        netns.run(["ip", "-n", to_ns, "link", "set", name, "up"])
        log.info("kubelet.link_given ns=%s interface=%s to=%s mac=%s", self.ns, name, to_ns, mac)
        return True


@dataclass
class Moved:
    """An interface host-device moved into a pod: its node name, its pod name, its MAC."""

    node_name: str
    pod_name: str
    mac: str


@dataclass
class Sandbox:
    """One pod's network namespace and what was attached to it."""

    ns: str
    node: NodeNetwork
    veth: str
    ip: IPv4Interface | None = None
    moved: list[Moved] = field(default_factory=list)

    def create(self, sysctls: list[tuple[str, str]]) -> None:
        netns.add_ns(self.ns, netns.POD_SYSCTLS)
        for name, value in sysctls:
            netns.run(netns.ns_exec(self.ns, "sysctl", "-q", "-w", f"{name}={value}"))
        self.ip = self.node.allocate()
        netns.run(
            [
                "ip",
                "-n",
                self.ns,
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                self.veth,
                "netns",
                self.node.ns,
            ]
        )
        netns.run(["ip", "-n", self.node.ns, "link", "set", self.veth, "master", BRIDGE, "up"])
        netns.run(["ip", "-n", self.ns, "addr", "add", str(self.ip), "dev", "eth0"])
        netns.run(["ip", "-n", self.ns, "link", "set", "eth0", "up"])
        netns.run(
            [
                "ip",
                "-n",
                self.ns,
                "route",
                "replace",
                "default",
                "via",
                str(self.node.gateway.ip),
                "dev",
                "eth0",
            ]
        )

    def attach_host_device(self, interface: str, mac: str | None, device: str | None) -> Moved:
        """host-device ADD: the node's interface (by MAC, else by name) into the pod as ``interface``."""
        name = link_by_mac(self.node.ns, mac) if mac else device
        if not name or not link_exists(self.node.ns, name):
            raise LabError(
                f"host-device: no interface {'with MAC ' + mac if mac else repr(device)} on the node"
            )
        netns.run(["ip", "-n", self.node.ns, "link", "set", name, "down"])
        netns.run(["ip", "-n", self.node.ns, "link", "set", name, "netns", self.ns])
        if name != interface:
            netns.run(["ip", "-n", self.ns, "link", "set", name, "name", interface])
        netns.run(["ip", "-n", self.ns, "link", "set", interface, "alias", name])
        netns.run(["ip", "-n", self.ns, "link", "set", interface, "up"])
        got = link_by_mac(self.ns, mac) if mac else interface
        moved = Moved(node_name=name, pod_name=interface, mac=mac or "")
        self.moved.append(moved)
        log.info("kubelet.host_device.added ns=%s interface=%s from=%s mac=%s", self.ns, got, name, mac)
        return moved

    def take_host_device(self, mac: str, to_ns: str) -> bool:
        """The attached interface with ``mac`` leaves this pod for network namespace ``to_ns`` (another
        node), under its node name, down as an interface fresh on a node is until its pod takes it; the
        pod forgets it (its teardown does not move it back). False when this pod does not hold it."""
        for m in list(self.moved):
            if m.mac.lower() != mac.lower():
                continue
            netns.run(["ip", "-n", self.ns, "link", "set", m.pod_name, "down"])
            if m.pod_name != m.node_name:
                netns.run(["ip", "-n", self.ns, "link", "set", m.pod_name, "name", m.node_name])
            netns.run(["ip", "-n", self.ns, "link", "set", m.node_name, "netns", to_ns])
            self.moved.remove(m)
            log.info(
                "kubelet.host_device.taken ns=%s interface=%s to=%s mac=%s", self.ns, m.pod_name, to_ns, mac
            )
            return True
        return False

    def teardown(self) -> list[str]:
        """Move attached interfaces back (host-device DEL), delete the namespace. Errors are returned, not
        raised: teardown always goes to the end."""
        errors: list[str] = []
        for m in reversed(self.moved):
            cmds = [["ip", "-n", self.ns, "link", "set", m.pod_name, "down"]]
            if m.pod_name != m.node_name:
                cmds.append(["ip", "-n", self.ns, "link", "set", m.pod_name, "name", m.node_name])
            cmds += [
                ["ip", "-n", self.ns, "link", "set", m.node_name, "netns", self.node.ns],
                ["ip", "-n", self.node.ns, "link", "set", m.node_name, "up"],
            ]
            for cmd in cmds:
                res = netns.run(cmd, check=False)
                if res.returncode != 0:
                    errors.append(f"{' '.join(cmd)}: {res.stderr.decode(errors='replace').strip()}")
                    break
        self.moved.clear()
        netns.destroy_ns(self.ns)
        netns.run(["ip", "-n", self.node.ns, "link", "del", self.veth], check=False)
        if self.ip is not None:
            self.node.release(self.ip)
        return errors
