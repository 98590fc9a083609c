"""The embedded lab: a gateway pod's network world built from network namespaces.

::

      site ns (per remote site)            rtr ns ("the cloud": Neutron router + internet)
      wan0 198.51.100.(4i+2)/30  <---->  r-s<i> 198.51.100.(4i+1)/30
      LANs: /32s on lo (203.0.113.16i+1)   r-gw  192.0.2.1/26   <---->  gw ns: NIC2 192.0.2.2/26
      charon or wireguard-go              r-svc 192.0.2.65/26  <---->  svc ns: 192.0.2.66/26
                                                                         exposure targets: /32s on lo
      gw ns ("the gateway pod"): NIC2 (configurable name, fixed MAC; NOT net1 by default),
            serviceCIDR 198.18.0.0/24 with its first host on lo, charon or wireguard-go;
            pod_mode: also eth0 to a "cluster" ns holding the default route, as in a real pod,
            so replies leave through NIC2 only with source-policy routing (init-nat's job).

The gateway's public address is NIC2's address (the floating IP's 1:1 target). rtr routes serviceCIDR to
the gateway, like the reverse-exposure router route. Every name carries the run's unique prefix; teardown
(``close``) runs on every exit path and also from ``atexit`` as a last resort.
"""

from __future__ import annotations

import atexit
import ipaddress
import logging
import os
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from lab import netns
from lab.daemons import Charon, WireGuardGo
from lab.netns import LabError

log = logging.getLogger(__name__)

GW_NIC2_ADDR = "192.0.2.2"
RTR_NIC2_ADDR = "192.0.2.1"
NIC2_PREFIX = 26
SVC_ADDR = "192.0.2.66"
SVC_NET = "192.0.2.64/26"
SERVICE_CIDR = "198.18.0.0/24"
CLUSTER_GW = "10.244.0.1"
CLUSTER_POD = "10.244.0.2"

_open_labs: set[Lab] = set()


@atexit.register
def _close_all() -> None:  # pragma: no cover - last-resort teardown
    for lab in list(_open_labs):
        lab.close()


@dataclass
class Host:
    """One namespace of the lab."""

    role: str
    ns: str
    dir: Path
    addresses: list[str] = field(default_factory=list)
    lans: list[str] = field(default_factory=list)
    charon: Charon | None = None
    wireguard: dict[str, WireGuardGo] = field(default_factory=dict)

    @property
    def lan_host(self) -> str:
        """The first LAN subnet's first host (an address on lo, for pings through the tunnel)."""
        return str(next(ipaddress.ip_network(self.lans[0]).hosts()))

    def argv(self, *cmd: str) -> list[str]:
        return netns.ns_exec(self.ns, *cmd)

    def run(self, *cmd: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[bytes]:
        return netns.run(self.argv(*cmd), check=check, timeout=timeout)

    def ping(self, dst: str, *, src: str | None = None, count: int = 1, wait: float = 1.0) -> bool:
        cmd = ["ping", "-n", "-q", "-c", str(count), "-W", str(wait)]
        if src:
            cmd += ["-I", src]
        return self.run(*cmd, dst, check=False, timeout=count * wait + 10).returncode == 0


class Lab:
    """Builds the world on ``__enter__`` (or ``build()``), tears it all down on ``close()``."""

    def __init__(
        self,
        *,
        nic2_name: str = "nic2",
        nic2_mac: str | None = None,
        pod_mode: bool = False,
        workdir: Path | None = None,
    ) -> None:
        self.prefix = f"{netns.PREFIX}{os.getpid()}x{secrets.token_hex(3)}"
        self.nic2_name = nic2_name
        self.nic2_mac = nic2_mac or "fa:16:3e:{:02x}:{:02x}:{:02x}".format(*tuple(secrets.token_bytes(3)))
        self.pod_mode = pod_mode
        self._own_dir = workdir is None
        self._link: Path | None = None
        if workdir is None:
            self.dir = Path(tempfile.mkdtemp(prefix=f"{self.prefix}-"))
        else:
            # Reached through a short link under /tmp: the daemons' sockets below it must fit AF_UNIX's
            # 108 bytes (a pytest-xdist worker's tmp_path alone is ~70), and the files stay in ``workdir``.
            workdir.mkdir(parents=True, exist_ok=True)
            self._link = Path(tempfile.gettempdir()) / f"{self.prefix}-lab"
            self._link.symlink_to(workdir.resolve(), target_is_directory=True)
            self.dir = self._link
        self.hosts: dict[str, Host] = {}
        self.sites: list[Host] = []
        self._closed = False

    # --- building -----------------------------------------------------------------------------------

    def _host(self, role: str, sysctls: dict[str, int] | None = None) -> Host:
        ns = f"{self.prefix}-{role}"
        d = self.dir / role
        d.mkdir(parents=True, exist_ok=True)
        netns.add_ns(ns, sysctls)
        host = Host(role=role, ns=ns, dir=d)
        self.hosts[role] = host
        return host

    def build(self) -> Lab:
        _open_labs.add(self)
        try:
            rtr = self._host("rtr")
            gw = self._host("gw", netns.POD_SYSCTLS)  # init-nat, not the lab, makes it forward
            svc = self._host("svc")
            netns.veth(gw.ns, self.nic2_name, rtr.ns, "r-gw", mac_a=self.nic2_mac)
            netns.addr(gw.ns, self.nic2_name, f"{GW_NIC2_ADDR}/{NIC2_PREFIX}")
            netns.addr(rtr.ns, "r-gw", f"{RTR_NIC2_ADDR}/{NIC2_PREFIX}")
            gw.addresses.append(GW_NIC2_ADDR)
            netns.veth(svc.ns, "eth0", rtr.ns, "r-svc")
            netns.addr(svc.ns, "eth0", f"{SVC_ADDR}/{NIC2_PREFIX}")
            netns.addr(rtr.ns, "r-svc", "192.0.2.65/26")
            netns.route(svc.ns, "default", "via", "192.0.2.65")
            svc.addresses.append(SVC_ADDR)
            # The gateway's own address inside serviceCIDR: a local_ts with no local address fails to
            # install its route under kernel-libipsec (LAB-FACTS).
            service_source = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
            netns.addr(gw.ns, "lo", f"{service_source}/32")
            gw.lans.append(SERVICE_CIDR)
            netns.route(rtr.ns, SERVICE_CIDR, "via", GW_NIC2_ADDR)
            if self.pod_mode:
                cl = self._host("cl")
                netns.veth(gw.ns, "eth0", cl.ns, "c-gw")
                netns.addr(gw.ns, "eth0", f"{CLUSTER_POD}/30")
                netns.addr(cl.ns, "c-gw", f"{CLUSTER_GW}/30")
                netns.route(gw.ns, "default", "via", CLUSTER_GW)
            else:
                netns.route(gw.ns, "default", "via", RTR_NIC2_ADDR)
        except BaseException:
            self.close()
            raise
        return self

    def add_site(self, name: str | None = None, *, lans: int | list[str] = 1) -> Host:
        """A remote site behind the router with ``lans`` inner subnets (/28s of 203.0.113.0/24 by default)."""
        i = len(self.sites) + 1
        if i > 60:
            raise LabError("the lab has room for 60 sites")
        role = name or f"s{i}"
        site = self._host(role)
        try:
            wan = ipaddress.ip_network(f"198.51.100.{4 * (i - 1)}/30")
            rtr_addr, site_addr = (str(a) for a in wan.hosts())
            netns.veth(site.ns, "wan0", self.hosts["rtr"].ns, f"r-{role}"[:15])
            netns.addr(site.ns, "wan0", f"{site_addr}/30")
            netns.addr(self.hosts["rtr"].ns, f"r-{role}"[:15], f"{rtr_addr}/30")
            netns.route(site.ns, "default", "via", rtr_addr)
            site.addresses.append(site_addr)
            subnets = (
                lans
                if isinstance(lans, list)
                else [
                    f"203.0.113.{16 * (i - 1) % 256}/28" if j == 0 else f"198.19.{i}.{16 * j}/28"
                    for j in range(lans)
                ]
            )
            for subnet in subnets:
                host = next(ipaddress.ip_network(subnet).hosts())
                netns.addr(site.ns, "lo", f"{host}/32")
                site.lans.append(subnet)
        except BaseException:
            netns.del_ns(site.ns)
            self.hosts.pop(role, None)
            raise
        self.sites.append(site)
        return site

    def start_charon(self, host: Host) -> Charon:
        c = Charon(ns=host.ns, dir=host.dir / "charon")
        c.dir.mkdir(parents=True, exist_ok=True)
        host.charon = c
        c.start()
        return c

    def start_wireguard(self, host: Host, interface: str = "wg0") -> WireGuardGo:
        w = WireGuardGo(ns=host.ns, dir=host.dir / f"wg-{interface}", interface=interface)
        w.dir.mkdir(parents=True, exist_ok=True)
        host.wireguard[interface] = w
        w.start()
        return w

    @property
    def gw(self) -> Host:
        return self.hosts["gw"]

    @property
    def svc(self) -> Host:
        return self.hosts["svc"]

    @property
    def rtr(self) -> Host:
        return self.hosts["rtr"]

    # --- teardown -----------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        errors: list[str] = []
        for host in self.hosts.values():
            for daemon in [host.charon, *host.wireguard.values()]:
                if daemon is None:
                    continue
                try:
                    daemon.stop()
                except Exception as exc:  # keep tearing down; report at the end
                    errors.append(f"{host.ns}: {exc}")
        for host in reversed(list(self.hosts.values())):
            # Anything else a test started inside the namespace (agents, pings, listeners) goes too.
            netns.destroy_ns(host.ns)
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        if self._link is not None:
            self._link.unlink(missing_ok=True)
        _open_labs.discard(self)
        left = [ns for ns in netns.list_namespaces() if ns.startswith(self.prefix)]
        if left:
            errors.append(f"namespaces left behind: {left}")
        if errors:
            raise LabError("lab teardown: " + "; ".join(errors))

    def __enter__(self) -> Lab:
        return self.build()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def cleanup_stale() -> list[str]:
    """Remove namespaces left by lab runs whose process is gone; returns what was removed."""
    removed = []
    for ns in netns.stale_namespaces():
        netns.destroy_ns(ns)
        removed.append(ns)
    for link in Path(tempfile.gettempdir()).glob(f"{netns.PREFIX}*-lab"):
        pid = netns.owner_pid(link.name)
        if link.is_symlink() and pid is not None and not os.path.exists(f"/proc/{pid}"):
            link.unlink(missing_ok=True)  # a short link of a run that was SIGKILLed
    return removed
