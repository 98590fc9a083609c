"""The end-to-end world of a warm-standby HA gateway on OpenStack (docs/ha.md), for
tests/integration/test_e2e_ha.py and bench/bench_ha_e2e.py.

::

   E2EWorld with two nodes: node-a (the lab's gw namespace) and node-b, each a lab kubelet with its own
   node namespace and its own NIC2 (ens7) on the router's bridge (r-br, 192.0.2.1/26)
   the controller: --cloud openstack --allow-ha, against the REAL Neutron and the Nova emulator
   rtr namespace: the Neutron router's floating-IP NAT, programmed from Neutron by lab/l3follower.py
   sites s1, s2: charon, configured with status.publicIP (the floating IP)

The controller gives each slot its own Neutron port, attached to its node's server; the lab plays the
hypervisor (``plug_ports``: the node's ens7 takes the attached port's MAC, the lab kubelet's host-device
moves it into the slot's pod). The floating IP moves in Neutron; the follower moves the router's NAT.

``fail_over`` kills -9 every container of the serving pod (its kubelet restarts them, as a kubelet
would) and records, from the kill, when each milestone was first seen (``Failover``). Nothing about
timing is asserted here: the test asserts what happened, the bench reports the times.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from controller.cloudplan import tags
from controller.names import GatewayKey
from gwkit.vici import ViciError, ViciSession
from lab import netns
from lab.cluster import clouds_yaml, home_of, openstack_args
from lab.kubelet.pod import PodWorker
from lab.kubelet.world import NODE, E2EWorld, secret_doc
from lab.l3follower import L3Follower
from lab.openstack.fixtures import OpenStackLab
from lab.world import Host

Slot = Literal["a", "b"]
NS = "tenant-acme"
GATEWAY = "acme"
KEY = GatewayKey("VPNGateway", NS, GATEWAY)
NODE_B = "node-b"
COORD = "coordination.k8s.io/v1"
LANS = {"s1": ["198.19.1.0/28", "198.19.1.16/28"], "s2": ["198.19.2.0/28"]}
"""Outside 203.0.113.0/24: the cloud's floating IPs come from there."""
REACH = {"s1": ("db", 5432), "s2": ("web", 80)}
"""What each site may reach through its tunnel (the example's exposures)."""

PROBE = """
import socket, sys, time
src, dst, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
while True:
    t = time.time()
    s = socket.socket(); s.bind((src, 0)); s.settimeout(0.5)
    try:
        s.connect((dst, port)); s.sendall(b"p\\n"); ok = s.recv(16) == b"p\\n"
    except OSError:
        ok = False
    finally:
        s.close()
    print("ok" if ok else "fail", t, flush=True)
    time.sleep(0.1)
"""
"""A new TCP round trip every ~0.1 s; each line says whether it came back and when it was sent."""


def other(slot: Slot) -> Slot:
    return "b" if slot == "a" else "a"


def list_sas(sock: Path) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        async with await ViciSession.connect(sock) as v:
            sas, _ = await v.stream("list-sas", {}, "list-sa")
        return {k: ike for sa in sas for k, ike in sa.items()}

    return asyncio.run(go())


@dataclass
class Failover:
    """One failover, from the kill: seconds until each milestone was first seen (absent: never)."""

    killed_slot: Slot
    killed_pod: str
    seconds: dict[str, float] = field(default_factory=dict)
    serving: Slot | None = None
    """The slot serving once traffic flows again (its own ``killed_slot``: recovered in place)."""
    pinned: list[str] = field(default_factory=list)
    """The router's conntrack entries of the new port's fixed IP without the floating IP's NAT that
    ``crash(forget_pinned=True)`` found (and deleted) once the floating IP was on the new port."""

    def __post_init__(self) -> None:
        if self.serving is None:
            self.serving = self.killed_slot

    def line(self) -> str:
        return " ".join(f"{k}={v:.2f}" for k, v in sorted(self.seconds.items(), key=lambda kv: kv[1]))


class HAWorld:
    """``with HAWorld(workdir, openstack_lab) as h:`` the two-node OpenStack world; ``h.up()`` applies the
    HA gateway and its sites and waits until both slots run and both tunnels are Established."""

    def __init__(self, workdir: Path, lab: OpenStackLab) -> None:
        self.os = lab
        cloud = lab.cloud
        cfg = clouds_yaml(workdir / "clouds.yaml", lab.network_url, lab.compute_url)
        args = openstack_args(cloud.gateway.network_id, cloud.gateway.subnet_id, cloud.external.network_id)
        self.servers = {cloud.nodes[0].server_id: NODE, cloud.nodes[1].server_id: NODE_B}
        self.w = E2EWorld(
            workdir / "e2e",
            static_nic=None,
            provider_id=cloud.nodes[0].provider_id,
            extra_nodes={NODE_B: cloud.nodes[1].provider_id},
            controller_args=[*args, "--allow-ha"],
            controller_env={"OS_CLIENT_CONFIG_FILE": str(cfg)},
        )
        self.follower: L3Follower | None = None
        self.sites: dict[str, Host] = {}
        self.fip = ""
        self.ports: dict[Slot, Any] = {}
        self.run_ids: list[str] = []
        self._stack = contextlib.ExitStack()
        self._probes = 0
        self._probe_procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> HAWorld:
        try:
            self._stack.enter_context(self.w)
            self.run_ids = [k.run_id for k in self.w.kubelets.values()]
            self.follower = L3Follower(
                self.os.neutron.endpoint,
                self.os.cloud.router_id,
                self.w.lab.rtr.ns,
                external_dev="r-s+",  # SNAT towards the sites only (the L3 agent: out of the gateway port)
                interval=0.2,
            )
            self._stack.enter_context(self.follower)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stack.close()

    def leftovers(self) -> list[str]:
        """Namespaces of this run still there (empty after ``__exit__``)."""
        prefixes = [*self.run_ids, self.w.lab.prefix]
        return [n for n in netns.list_namespaces() if any(n.startswith(p) for p in prefixes)]

    # --- the cluster and the cloud, as read ----------------------------------------------------------

    def slot_pod(self, slot: Slot) -> PodWorker | None:
        """The running worker of ``slot``'s pod, on whichever node (slot b's Deployment is ``<home>-b``)."""
        home, home_ns = home_of(GATEWAY, NS)
        for k in self.w.kubelets.values():
            for pw in list(k.kubelet.workers.values()):
                if pw.namespace != home_ns or pw.deleting or not pw.name.startswith(home + "-"):
                    continue
                if pw.name.startswith(home + "-b-") == (slot == "b"):
                    return pw
        return None

    def holder(self) -> str | None:
        home, home_ns = home_of(GATEWAY, NS)
        lease = self.w.c.get(COORD, "Lease", home, home_ns) or {}
        return (lease.get("spec") or {}).get("holderIdentity") or None

    def ha(self) -> dict[str, Any]:
        return dict((self.w.gateway().get("status") or {}).get("ha") or {})

    def neutron_ports(self) -> dict[Slot, Any]:
        """Slot -> the gateway's Neutron port (slot b's tagged ``vpngw-slot:b``)."""
        out: dict[Slot, Any] = {}
        for p in self.os.connect(direct=True).network.ports(tags=",".join(tags(KEY, "vpngw"))):
            out["b" if "vpngw-slot:b" in p.tags else "a"] = p
        return out

    def fip_port(self) -> str | None:
        """The port the gateway's floating IP is on in Neutron (None: on none)."""
        ips = list(self.os.connect(direct=True).network.ips(tags=",".join(tags(KEY, "vpngw"))))
        return str(ips[0].port_id) if ips and ips[0].port_id else None

    def sas(self, slot: Slot) -> dict[str, Any] | None:
        """The IKE_SAs in ``slot``'s charon (None: no pod, or its charon does not answer)."""
        pw = self.slot_pod(slot)
        if pw is None:
            return None
        try:
            return list_sas(pw.volume_path("vici") / "charon.vici")
        except (OSError, EOFError, ViciError):
            return None

    # --- bringing it up ------------------------------------------------------------------------------

    def plug_ports(self) -> bool:
        """The hypervisor's part: each slot's port, once attached to a node's server, appears on that node
        as its ens7 with the port's MAC. True once both are plugged."""
        ports = self.neutron_ports()
        for slot, port in ports.items():
            node = self.servers.get(str(port.device_id))
            if node is None:
                continue
            ns = self.w.node_ns[node]
            have = netns.run(["ip", "-n", ns, "-o", "link", "show", "dev", "ens7"], check=False)
            if have.returncode == 0 and port.mac_address not in have.stdout.decode():
                netns.run(["ip", "-n", ns, "link", "set", "ens7", "address", port.mac_address])
            self.ports[slot] = port
        return len(self.ports) == 2 and all(self.servers.get(str(p.device_id)) for p in self.ports.values())

    def up(self, docs: list[dict[str, Any]]) -> None:
        """Apply ``docs`` (the example's IPsec gateway and its two site peers, tests/examples.py) with the
        sites' addresses and LANs, first WITHOUT HA: plug slot a's port, configure the sites with the
        floating IP, wait for both tunnels. Then enable HA, as docs/ha.md's order has it (slot a keeps
        serving and takes the free Lease; slot b's port is created, attached and plugged, its pod stands
        by) and wait for the pair."""
        w = self.w
        self.sites = {n: w.add_ipsec_site(lans) for n, lans in LANS.items()}
        docs[0]["spec"]["reverseExposures"][0]["target"]["address"] = "198.19.1.1"  # inside s1's LAN
        for p in docs[1:]:
            site = self.sites[p["metadata"]["name"]]
            p["spec"]["endpoint"] = site.addresses[0]
            p["spec"]["ipsec"]["remoteSubnets"] = site.lans
        w.apply(docs)
        w.c.apply(
            [secret_doc(NS, "acme-psk", {"psk": w.psk}), secret_doc(NS, "s1-psk", {"psk": w.psk + "-s1"})]
        )
        w.wait(lambda: self.plug_ports() or "a" in self.ports, 60, "slot a's port attached and plugged")
        self.fip = w.wait(lambda: w.gateway().get("status", {}).get("publicIP"), 60, "status.publicIP")
        for name, site in self.sites.items():
            w.configure_ipsec_site(
                site,
                psk=w.psk + "-s1" if name == "s1" else w.psk,
                site_id=f"{name}.lab.example",
                gateway_addr=self.fip,
            )
        w.wait(lambda: w.established(list(self.sites)), 90, "every tunnel Established (no HA yet)")
        docs[0]["spec"]["ha"] = {"enabled": True}
        w.apply(docs[:1])
        w.wait(self.plug_ports, 90, "both slots' Neutron ports attached to their nodes' servers")
        w.wait(lambda: self.slot_pod("a") and self.slot_pod("b"), 90, "both slots' pods running")
        w.wait(lambda: self.ha().get("standbyPod"), 90, "status.ha naming the standby pod")

    def router_ike_flows(self) -> str:
        """The router's conntrack entries of IKE (UDP 500), for a failure's message."""
        res = netns.run(
            netns.ns_exec(self.w.lab.rtr.ns, "conntrack", "-L", "-p", "udp", "--dport", "500"), check=False
        )
        return res.stdout.decode(errors="replace")

    # --- traffic -------------------------------------------------------------------------------------

    def start_probes(self) -> dict[str, str]:
        """A prober per site (``PROBE``) towards what it may reach; returns site -> its output's name."""
        (self.w.scripts / "probe.py").write_text(PROBE)
        out = {}
        for name, site in self.sites.items():
            self._probes += 1
            exposure, port = REACH[name]
            out[name] = f"probe-{name}-{self._probes}"
            self._probe_procs.append(
                self.w.start(site, "probe", site.lan_host, self.w.vip(exposure), str(port), name=out[name])
            )
        return out

    def probe_lines(self, out: str) -> list[tuple[bool, float]]:
        lines = []
        for line in self.w.output(out).splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] in ("ok", "fail"):
                lines.append((parts[0] == "ok", float(parts[1])))
        return lines

    # --- the failover --------------------------------------------------------------------------------

    def kill_all(self, slot: Slot) -> str:
        """kill -9 every container process of ``slot``'s pod (its kubelet restarts them); its name."""
        pw = self.slot_pod(slot)
        assert pw is not None, f"no pod in slot {slot}"
        kubelet = next(k for k in self.w.kubelets.values() if pw in k.kubelet.workers.values())
        for container in list(pw.instances):
            kubelet.portal.call(pw.kill, container)
        return pw.name

    def pinned_flows(self, slot: Slot, delete: bool = False) -> list[str]:
        """The router's conntrack entries from ``slot``'s fixed IP that were NOT given the floating IP's
        SNAT (their reply goes to the fixed IP itself): the flows that slot started while the floating IP
        was elsewhere. ``delete``: delete them too (the lab standing in for a fix, see the test). Parsed
        here from the whole UDP table (conntrack's own orig/reply filters are not relied upon)."""
        fixed = str(self.ports[slot].fixed_ips[0]["ip_address"])
        rtr = self.w.lab.rtr.ns
        res = netns.run(netns.ns_exec(rtr, "conntrack", "-L", "-p", "udp"), check=False)
        found = []
        for line in res.stdout.decode(errors="replace").splitlines():
            kv = [t.split("=", 1) for t in line.split() if "=" in t]
            src = [v for k, v in kv if k == "src"]
            dst = [v for k, v in kv if k == "dst"]
            ports = [v for k, v in kv if k in ("sport", "dport")]
            if len(src) < 2 or len(dst) < 2 or len(ports) < 2 or src[0] != fixed or dst[1] != fixed:
                continue
            found.append(line)
            if delete:
                orig = ["-s", src[0], "-d", dst[0], "--sport", ports[0], "--dport", ports[1]]
                netns.run(netns.ns_exec(rtr, "conntrack", "-D", "-p", "udp", *orig), check=False)
        return found

    def crash(self, timeout: float = 60.0, *, forget_pinned: bool = False) -> Failover:
        """kill -9 every container of the serving slot's pod; wait until every site's traffic flows again
        and every tunnel is Established anew, recording when each milestone was first seen (seconds from
        the kill). Which slot serves afterwards is the system's decision: ``Failover.serving``.
        ``forget_pinned``: once the floating IP is on the new active's port, delete the router's conntrack
        entries that slot's IKE started without it (``pinned_flows``; recorded in ``Failover.pinned``).

        The kubelet restarts a container that exited at once the first time and only after a back-off
        (CrashLoopBackOff, 10 s, doubling) when it crashes again: the first crash of a pod is over before
        its Lease expires (its restarted agent, with the same pod name, renews its own Lease); a second
        one within the back-off leaves the Lease to expire, and the other slot takes over."""
        w = self.w
        active: Slot = self.ha().get("activeSlot", "a")
        standby = self.slot_pod(other(active))
        assert standby is not None, f"no standby pod in slot {other(active)}"
        before = {n: t.get("establishedAt") for n, t in w.tunnels().items()}
        probes = self.start_probes()
        w.wait(
            lambda: all(any(ok for ok, _ in self.probe_lines(o)) for o in probes.values()),
            30,
            "traffic through every tunnel before the kill",
        )
        wall0, t0 = time.time(), time.monotonic()
        f = Failover(active, self.kill_all(active))
        seen = f.seconds
        port_of = {slot: str(port.id) for slot, port in self.ports.items()}

        def mark(what: str, cond: Callable[[], bool] | bool) -> None:
            if what not in seen and (cond if isinstance(cond, bool) else cond()):
                seen[what] = time.monotonic() - t0

        def done() -> bool:
            if self.holder() == standby.name:
                f.serving = other(active)
            mark("lease", lambda: self.holder() == standby.name)
            mark("status_ha", lambda: self.ha().get("activeSlot") == other(active))
            mark("fip", lambda: self.fip_port() == port_of[other(active)])
            if forget_pinned and "fip" in seen and not f.pinned:
                f.pinned = self.pinned_flows(other(active), delete=True)
                mark("pinned_forgotten", bool(f.pinned))
            tunnels = w.tunnels()
            for n in self.sites:
                t = tunnels.get(n, {})
                new = t.get("state") == "Established" and t.get("establishedAt") != before.get(n)
                mark(f"established_{n}", new)
            for n, o in probes.items():
                lines = [(ok, t) for ok, t in self.probe_lines(o) if t >= wall0]
                failed = next((i for i, (ok, _) in enumerate(lines) if not ok), None)
                if failed is not None and "traffic_" + n not in seen:
                    back = next((t for ok, t in lines[failed:] if ok), None)
                    if back is not None:
                        seen["traffic_" + n] = back - wall0
            flowing = all(f"{k}_{n}" in seen for n in self.sites for k in ("established", "traffic"))
            moved = all(k in seen for k in ("lease", "status_ha", "fip"))
            return flowing and (f.serving == active or moved)

        try:
            w.wait(done, timeout, f"traffic again after killing slot {active}'s pod", interval=0.05)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nmilestones seen (s from the kill): {seen}") from None
        finally:
            for proc in self._probe_procs:
                proc.kill()
                proc.wait(timeout=5)
            self._probe_procs.clear()
        return f
