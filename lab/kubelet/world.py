"""The end-to-end world: everything between a ``kubectl apply`` and packets through live tunnels, for the
e2e tests (tests/integration/test_e2e_*.py), the benchmark (bench/bench_e2e.py) and by hand.

::

   kubectl ──> API emulator (127.0.0.1) <── controller (process)        <── lab kubelet (this process)
                    ^                                                        │ Deployment -> Pod, runs it
                    │ relay (kubelet)                                        v
   node ns (the lab's "gw" namespace = the Nova instance): cbr0 10.244.1.1/24, 10.96.0.1:443, 10.96.0.10:53
        ├── veth ── pod ns: eth0 10.244.1.x (default route)   init-nat, charon|wireguard-go, agent, exporter
        └── ens7 (NIC2, the port's MAC) ── host-device ──> pod ns: net1 192.0.2.2/26 ─── rtr ─── sites
                                                                                          └── svc (targets)

Remote sites are configured by hand-written VICI dictionaries or ``wg`` commands, as a tenant's firewall
would be (``configure_ipsec_site``, ``configure_wireguard_site``), never by our renderer. Every process,
namespace and file is removed by ``close`` (on every exit path; ``atexit`` too, through ``lab.world``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import yaml

from gwkit.vici import ViciSession
from lab import netns
from lab.cluster import Cluster, Controller, gateway_secret, home_of, wait_for
from lab.kubelet.kubelet import LabKubeletThread
from lab.kubelet.pod import PodWorker
from lab.kubelet.settings import KubeletSettings
from lab.peers import psk_conn
from lab.world import GW_NIC2_ADDR, NIC2_PREFIX, RTR_NIC2_ADDR, SERVICE_CIDR, SVC_ADDR, SVC_NET, Host, Lab

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".tools" / "bin" / "kubectl"
VPN = "vpn.bnerd.net/v1alpha1"
API_ADDRESS = "10.96.0.1"
DNS_ADDRESS = "10.96.0.10"
DB_ADDR = "192.0.2.67"
"""A second exposure target (the example's ``db``), a /32 on the service namespace's lo."""
NODE = "node-a"
T = TypeVar("T")

ECHO_SERVER = """
import socket, sys, threading
def serve(c):
    with c:
        while data := c.recv(4096):
            c.sendall(data)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(64); print("listening", flush=True)
while True:
    c, peer = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

LONG_CLIENT = """
import socket, sys, time
src, dst, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket(); s.bind((src, 0)); s.settimeout(3); s.connect((dst, port)); s.settimeout(0.3)
print("connected", time.time(), flush=True)
while True:
    sent = time.time()
    try:
        s.sendall(b"x\\n")
        if s.recv(16) != b"x\\n":
            raise OSError("bad echo")
    except OSError as e:
        print("cut", sent, type(e).__name__, flush=True); sys.exit(1)
    print("ok", sent, flush=True); time.sleep(0.05)
"""
"""A long-lived connection: one echo every 50 ms; ``cut <t>`` names the send time of the first echo that
did not come back within 0.3 s (the flow was alive at the previous one)."""

ONE_SHOT = """
import socket, sys
src, dst, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket(); s.bind((src, 0)); s.settimeout(1.5)
try:
    s.connect((dst, port)); s.sendall(b"hi\\n"); ok = s.recv(16) == b"hi\\n"
except OSError:
    ok = False
sys.exit(0 if ok else 1)
"""


def secret_doc(namespace: str, name: str, data: Mapping[str, str]) -> dict[str, Any]:
    return gateway_secret(namespace, name, data)


class LongClient:
    def __init__(self, proc: subprocess.Popen[bytes], out: Path) -> None:
        self.proc = proc
        self.out = out

    def lines(self) -> list[str]:
        try:
            return self.out.read_text().splitlines()
        except FileNotFoundError:
            return []

    def alive(self) -> bool:
        return self.proc.poll() is None and any(line.startswith("ok") for line in self.lines())

    def echoes(self) -> int:
        return sum(1 for line in self.lines() if line.startswith("ok"))

    def cut_at(self) -> float | None:
        for line in self.lines():
            if line.startswith("cut"):
                return float(line.split()[1])
        return None


def configure_ipsec_site(
    site: Host,
    *,
    psk: str,
    site_id: str,
    gateway_id: str = "gw.lab.example",
    gateway_addr: str = GW_NIC2_ADDR,
    initiate: bool = False,
) -> None:
    """What the tenant's firewall is told: the gateway's public address, both IDs, the PSK, its LANs
    against the gateway's serviceCIDR (one child per LAN), dead peer detection every 2 s; it responds (or
    initiates, ``initiate``). Never by our renderer: as a tenant's admin would, from the docs."""
    assert site.charon is not None

    async def go() -> None:
        async with await ViciSession.connect(site.charon.vici_socket) as v:  # type: ignore[union-attr]
            await v.call(
                "load-shared", {"id": "gw", "type": "IKE", "data": psk, "owners": [site_id, gateway_id]}
            )
            children = {f"gw-{i}": ([lan], [SERVICE_CIDR]) for i, lan in enumerate(site.lans)}
            conn = psk_conn(
                "gw",
                local_addr=site.addresses[0],
                remote_addr=gateway_addr,
                local_id=site_id,
                remote_id=gateway_id,
                children=children,
            )
            conn["gw"].update({"dpd_delay": "2s"})
            for child in conn["gw"]["children"].values():
                child["dpd_action"] = "clear"
            await v.call("load-conn", conn)
            if initiate:
                for child in conn["gw"]["children"]:
                    await v.stream("initiate", {"child": child, "timeout": "5000"}, "control-log")

    asyncio.run(go())


class E2EWorld:
    """``with E2EWorld(tmp) as w:`` the lab, the emulated cluster, the controller and the lab kubelet."""

    def __init__(
        self,
        workdir: Path,
        *,
        runtime: str = "process",
        volume_refresh_delay: float = 60.0,
        nic2_mac: str | None = None,
        controller_config: Mapping[str, Any] | None = None,
        controller_args: Sequence[str] = (),
        controller_env: Mapping[str, str] | None = None,
        provider_id: str | None = None,
        static_nic: str | None = "tenant-acme/acme",
        kubelet: Mapping[str, Any] | None = None,
        run_controller: bool = True,
        node_labels: Mapping[str, str] | None = None,
        node_taints: Sequence[Mapping[str, Any]] = (),
        extra_nodes: Mapping[str, str | None] | None = None,
    ) -> None:
        """``run_controller=False``: no controller process; the test installs one (the chart's Deployment,
        which the lab kubelet then runs). ``node_labels``/``node_taints``: the node's, as its kubelet
        would register them. ``extra_nodes``: more nodes (name -> providerID), each with its own lab
        kubelet (``kubelets[name]``; node-a's plays the Deployment controller and scheduler for all) and
        its own node namespace with its own NIC2 ``ens7`` on the router's NIC2 network (which becomes a
        bridge, ``r-br``, holding the router's address; node-a's ``r-gw`` is one of its ports)."""
        self.workdir = workdir
        self.runtime = runtime
        self.refresh_delay = volume_refresh_delay
        self.psk = "e2e-" + secrets.token_hex(12)  # test-only values, never logged
        self.lab = Lab(nic2_name="ens7", nic2_mac=nic2_mac, workdir=workdir / "lab")
        self.controller_config = dict(controller_config or {})
        self.controller_args = list(controller_args)
        self.controller_env = dict(controller_env or {})
        self.provider_id = provider_id
        self.static_nic = static_nic
        self.kubelet_options = dict(kubelet or {})
        self.run_controller = run_controller
        self.node_labels = dict(node_labels or {})
        self.node_taints = [dict(t) for t in node_taints]
        self.extra_nodes = dict(extra_nodes or {})
        self.cluster: Cluster | None = None
        self.controller: Controller | None = None
        self.kubelet: LabKubeletThread | None = None
        self.kubelets: dict[str, LabKubeletThread] = {}
        """Every node's lab kubelet by node name (``kubelet`` is node-a's)."""
        self.node_ns: dict[str, str] = {}
        """Every node's namespace by node name (node-a's is the lab's ``gw``)."""
        self._procs: list[subprocess.Popen[bytes]] = []
        self.targets: dict[str, subprocess.Popen[bytes]] = {}
        """The exposure targets' servers (``web``, ``db``), which must stay up while the world runs."""
        self._stack = contextlib.ExitStack()
        self.scripts = workdir / "scripts"

    # --- building --------------------------------------------------------------------------------------

    def __enter__(self) -> E2EWorld:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _build(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.scripts.mkdir(exist_ok=True)
        for name, body in (("echo", ECHO_SERVER), ("long", LONG_CLIENT), ("once", ONE_SHOT)):
            (self.scripts / f"{name}.py").write_text(body)
        self._stack.enter_context(self.lab)
        netns.addr(self.lab.svc.ns, "lo", f"{DB_ADDR}/32")
        netns.route(self.lab.rtr.ns, f"{DB_ADDR}/32", "via", SVC_ADDR)
        self.node_ns[NODE] = self.lab.gw.ns
        if self.extra_nodes:
            self._bridge_nic2_network()
        for i, name in enumerate(self.extra_nodes):
            self.node_ns[name] = self._add_node_ns(name, i)
        self.cluster = self._stack.enter_context(Cluster(self.workdir / "k8s", sans=(API_ADDRESS,)))
        self.cluster.add_node(NODE, provider_id=self.provider_id, labels=self.node_labels)
        for name, provider_id in self.extra_nodes.items():
            self.cluster.add_node(name, provider_id=provider_id, labels=self.node_labels)
        for name in self.node_ns:
            if self.node_taints:
                self.cluster.kube.patch("v1", "Node", name, {"spec": {"taints": self.node_taints}})
        if self.run_controller:
            self._start_controller()
        port = int(self.cluster.kube.url.rsplit(":", 1)[1])
        for i, (name, ns) in enumerate(self.node_ns.items()):
            options: dict[str, Any] = dict(self.kubelet_options)
            if i:  # one Deployment controller per cluster (node-a's); its own pod network
                options.update(deployments=False, pod_cidr=f"10.244.{i + 1}.0/24")
            settings = KubeletSettings(
                node=name,
                node_ns=ns,
                runtime=self.runtime,  # type: ignore[arg-type]
                volume_refresh_delay=self.refresh_delay,
                workdir=self.workdir if i == 0 else self.workdir / name,
                api_address=API_ADDRESS,
                dns_address=DNS_ADDRESS,
                keep_logs=True,
                **options,
            )
            kubelet = LabKubeletThread(
                settings, self.cluster.kubeconfig, ("127.0.0.1", port), self.cluster.kube.ca_file
            )
            if i == 0:
                self.kubelet = kubelet
            self.kubelets[name] = kubelet
            self._stack.enter_context(kubelet)
        self.targets["web"] = self.start(self.lab.svc, "echo", SVC_ADDR, "80", name="web")
        self.targets["db"] = self.start(self.lab.svc, "echo", DB_ADDR, "5432", name="db")
        wait_for(
            lambda: "listening" in self.output("web") and "listening" in self.output("db"),
            10,
            "the exposure targets",
        )

    def _bridge_nic2_network(self) -> None:
        """The router's NIC2 network as a switch: ``r-br`` takes the router's address from ``r-gw``, which
        becomes its port (the routes through that network are put back)."""
        rtr = self.lab.rtr.ns
        netns.run(["ip", "-n", rtr, "link", "add", "r-br", "type", "bridge"])
        netns.run(["ip", "-n", rtr, "addr", "del", f"{RTR_NIC2_ADDR}/{NIC2_PREFIX}", "dev", "r-gw"])
        netns.run(["ip", "-n", rtr, "link", "set", "r-gw", "master", "r-br"])
        netns.addr(rtr, "r-br", f"{RTR_NIC2_ADDR}/{NIC2_PREFIX}")
        netns.run(["ip", "-n", rtr, "link", "set", "r-br", "up"])
        netns.route(rtr, SERVICE_CIDR, "via", GW_NIC2_ADDR)

    def _add_node_ns(self, name: str, i: int) -> str:
        """Another node (a server of the cloud): its namespace in the lab's set (removed by its close) and
        its NIC2 ``ens7`` (a random MAC until the cloud's port is plugged) on the router's bridge."""
        role = name.replace("node-", "n")
        ns = f"{self.lab.prefix}-{role}"
        netns.add_ns(ns, netns.POD_SYSCTLS)
        self.lab.hosts[role] = Host(role=role, ns=ns, dir=self.lab.dir / role)
        port = f"r-{role}"[:15]
        netns.veth(ns, "ens7", self.lab.rtr.ns, port)
        netns.run(["ip", "-n", self.lab.rtr.ns, "link", "set", port, "master", "r-br"])
        return ns

    def static_nic_config(self) -> dict[str, str]:
        """The lab's NIC2 as the static cloud knows it (``staticNICs``, the chart's ``cloud.static.nics``)."""
        return {
            "mac": self.lab.nic2_mac,
            "address": f"{GW_NIC2_ADDR}/{NIC2_PREFIX}",
            "gateway": RTR_NIC2_ADDR,
            "publicIP": GW_NIC2_ADDR,
        }

    def _start_controller(self) -> None:
        assert self.cluster is not None
        cfg: dict[str, Any] = {
            "internalSourceCIDRs": [SVC_NET],
            "allowances": {"default": {"exposureTargets": [SVC_NET]}},  # the lab's fabric
            **self.controller_config,
        }
        if self.static_nic:
            cfg.setdefault("staticNICs", {})[self.static_nic] = self.static_nic_config()
        self.controller = self.cluster.start_controller(cfg, *self.controller_args, env=self.controller_env)
        wait_for(
            lambda: (
                self.controller is not None
                and (self.controller.ready() or self.controller.proc.poll() is not None)
            ),
            30,
            "the controller",
        )
        assert self.controller.proc.poll() is None, self.controller.log()[-3000:]

    def processes(self) -> list[tuple[str, subprocess.Popen[bytes] | None, Path | None]]:
        """What the world started and needs alive, each as it is now (a restarted site charon is its new
        process): ``(name, process, its log)`` for the controller, every site's charon and the exposure
        targets. The pod's containers are not here: the lab kubelet restarts those."""
        out: list[tuple[str, subprocess.Popen[bytes] | None, Path | None]] = []
        if self.controller is not None:
            out.append(("controller", self.controller.proc, self.controller.log_path))
        for site in self.lab.sites:
            if site.charon is not None:
                out.append((f"charon of site {site.role}", site.charon.proc, site.charon.log_path))
        for name, p in self.targets.items():
            out.append((f"exposure target {name}", p, self.workdir / f"{name}.out"))
        return out

    def stopped_thread(self) -> str | None:
        """The in-process part of the world that stopped while the world runs (the lab kubelet's loop, with
        its error; the API emulator's thread), or None."""
        fut = getattr(self.kubelet, "_future", None)  # LabKubeletThread's task on its portal
        if fut is not None and fut.done():
            exc = None if fut.cancelled() else fut.exception()
            return f"the lab kubelet stopped ({exc!r})" if exc else "the lab kubelet stopped"
        thread = getattr(self.cluster.kube, "_thread", None) if self.cluster is not None else None
        if thread is not None and not thread.is_alive():
            return "the API emulator's thread stopped"
        return None

    def close(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.kill()
        for p in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        self._procs.clear()
        self._stack.close()

    # --- processes in the lab --------------------------------------------------------------------------

    def start(self, host: Host, script: str, *args: str, name: str) -> subprocess.Popen[bytes]:
        out = self.workdir / f"{name}.out"
        with out.open("wb") as f:
            p = subprocess.Popen(
                host.argv(sys.executable, str(self.scripts / f"{script}.py"), *args),
                stdout=f,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self._procs.append(p)
        return p

    def output(self, name: str) -> str:
        try:
            return (self.workdir / f"{name}.out").read_text()
        except FileNotFoundError:
            return ""

    def reaches(self, site: Host, dst: str, port: int, src: str | None = None) -> bool:
        """One TCP round trip from the site's LAN address through its tunnel."""
        res = site.run(
            sys.executable,
            str(self.scripts / "once.py"),
            src or site.lan_host,
            dst,
            str(port),
            check=False,
            timeout=15,
        )
        return res.returncode == 0

    def long_client(self, site: Host, dst: str, port: int, name: str) -> LongClient:
        p = self.start(site, "long", site.lan_host, dst, str(port), name=name)
        return LongClient(p, self.workdir / f"{name}.out")

    # --- the cluster -----------------------------------------------------------------------------------

    @property
    def c(self) -> Cluster:
        assert self.cluster is not None
        return self.cluster

    @property
    def k(self) -> LabKubeletThread:
        assert self.kubelet is not None
        return self.kubelet

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        if not KUBECTL.exists():
            raise AssertionError(
                "kubectl is missing: run scripts/setup.sh (it installs kubectl into .tools/bin)"
            )
        cache = self.workdir / "kubectl-cache"
        p = subprocess.run(
            [str(KUBECTL), "--kubeconfig", str(self.c.kubeconfig), "--cache-dir", str(cache), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check and p.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({p.returncode}): {p.stderr}")
        return p

    def apply(self, docs: Sequence[Mapping[str, Any]]) -> str:
        for d in docs:
            ns = (d.get("metadata") or {}).get("namespace")
            if ns:
                self.c.namespace(str(ns))
        return self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([dict(d) for d in docs])).stdout

    def gateway(self, name: str = "acme", ns: str = "tenant-acme") -> dict[str, Any]:
        return self.c.get(VPN, "VPNGateway", name, ns) or {}

    def tunnels(self, name: str = "acme", ns: str = "tenant-acme") -> dict[str, dict[str, Any]]:
        return {t["name"]: t for t in (self.gateway(name, ns).get("status") or {}).get("tunnels") or []}

    def wg_peers(self, name: str, ns: str) -> dict[str, dict[str, Any]]:
        return {p["name"]: p for p in (self.gateway(name, ns).get("status") or {}).get("peers") or []}

    def plan(self, name: str = "acme", ns: str = "tenant-acme") -> Any:
        from controller.desired import plan_of

        cm = self.c.owned("v1", "ConfigMap", name, ns)
        assert cm is not None, "no plan ConfigMap"
        return plan_of(cm)

    def vip(self, exposure: str, name: str = "acme", ns: str = "tenant-acme") -> str:
        for e in self.plan(name, ns).nat.exposures:
            if e.name == exposure:
                return str(e.virtual_ip)
        raise AssertionError(f"no exposure {exposure!r} in the plan")

    def pod(self, name: str = "acme", ns: str = "tenant-acme") -> PodWorker | None:
        """The gateway's pod (in the operator's gateway namespace)."""
        home, home_ns = home_of(name, ns)
        return self.k.pod_of(home_ns, home)

    def pod_object(self, name: str = "acme", ns: str = "tenant-acme") -> dict[str, Any] | None:
        w = self.pod(name, ns)
        return self.c.get("v1", "Pod", w.name, w.namespace) if w else None

    def wait(self, cond: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05) -> T:
        try:
            return wait_for(cond, timeout, what, interval)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnostics()}") from None

    def established(self, names: Sequence[str], gateway: str = "acme", ns: str = "tenant-acme") -> bool:
        t = self.tunnels(gateway, ns)
        return all(t.get(n, {}).get("state") == "Established" for n in names)

    def diagnostics(self) -> str:
        """What a failing test prints: the gateway's status, the pod's status, container log tails."""
        out = []
        with contextlib.suppress(Exception):
            for gw in self.c.kube.list(VPN, "VPNGateway"):
                out.append(f"gateway {gw['metadata']['name']}: {json.dumps(gw.get('status'))[:3000]}")
        with contextlib.suppress(Exception):
            for w in [w for k in self.kubelets.values() for w in list(k.kubelet.workers.values())]:
                out.append(
                    f"pod {w.name}: {json.dumps(self.c.get('v1', 'Pod', w.name, w.namespace) or {})[-3000:]}"
                )
                for log in sorted((w.dir / "logs").glob("*.log")):
                    out.append(
                        f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:])
                    )
        if self.controller is not None:
            out.append("--- controller\n" + "\n".join(self.controller.log().splitlines()[-25:]))
        return "\n".join(out)

    # --- remote sites, configured independently ---------------------------------------------------------

    def add_ipsec_site(self, lans: list[str]) -> Host:
        site = self.lab.add_site(lans=lans)
        self.lab.start_charon(site)
        return site

    def configure_ipsec_site(
        self,
        site: Host,
        *,
        psk: str,
        site_id: str,
        gateway_id: str = "gw.lab.example",
        gateway_addr: str = GW_NIC2_ADDR,
        initiate: bool = False,
    ) -> None:
        configure_ipsec_site(
            site,
            psk=psk,
            site_id=site_id,
            gateway_id=gateway_id,
            gateway_addr=gateway_addr,
            initiate=initiate,
        )

    def site_sas(self, site: Host) -> dict[str, Any]:
        assert site.charon is not None

        async def go() -> dict[str, Any]:
            async with await ViciSession.connect(site.charon.vici_socket) as v:  # type: ignore[union-attr]
                sas, _ = await v.stream("list-sas", {}, "list-sa")
            return {k: ike for sa in sas for k, ike in sa.items()}

        return asyncio.run(go())

    def gateway_sas(self, name: str = "acme", ns: str = "tenant-acme") -> dict[str, Any]:
        """The gateway charon's IKE_SAs, over its VICI socket on the pod's emptyDir (as root)."""
        w = self.pod(name, ns)
        assert w is not None, "no gateway pod"
        sock = w.volume_path("vici") / "charon.vici"

        async def go() -> dict[str, Any]:
            async with await ViciSession.connect(sock) as v:
                sas, _ = await v.stream("list-sas", {}, "list-sa")
            return {k: ike for sa in sas for k, ike in sa.items()}

        return asyncio.run(go())
