"""The lab kubelet as a node of the REAL control plane (kube-apiserver and kube-controller-manager v1.35,
lab.controlplane; the kubelet: lab/kubelet/realnode.py), running the gateway the controller renders:

* the chart installed with helm (static cloud, the lab's NIC2 as the gateway's static NIC), the controller
  as the chart's ServiceAccount (as test_real_install.py runs it);
* ``node-a`` is a lab kubelet: its Node and Lease heart-beaten with its own client certificate, the pods
  bound to it run in network namespaces; the REAL ReplicaSet controller makes the gateway pod, pinned
  there by the controller; the kubelet writes its status through the real API (phase, pod IP, container
  states), its status-agent reaches the real API server through the kubelet's relay with a token from the
  real TokenRequest API and the control plane's CA, and writes ``status.tunnels``;
* a remote site with its own charon (configured by hand, as a tenant's firewall): the tunnel Established,
  a TCP round trip through it to the exposure;
* a condition the kubelet does not own (``DisruptionTarget``, as the taint eviction controller or pod GC
  write it) survives the kubelet's status writes (a strategic merge by condition type, as a real
  kubelet's mergePodStatus keeps it);
* deleting the VPNGateway: the controller deletes the Deployment, the garbage collector the ReplicaSet and
  the pod (a graceful deletion: the real server keeps the pod until its kubelet confirms), the kubelet
  stops the containers, tears the pod down, writes the terminal phase (seen by a watch), then deletes it
  with grace 0: the pod leaves the API only after its processes and namespace are gone.

``RealWorld`` is shared with test_real_node_loss_e2e.py and bench/bench_node_loss.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from controller.api.crds import crds
from controller.desired import plan_of
from gwkit.vici import ViciSession
from lab import netns
from lab.cluster import MANIFESTS, Controller, gateway_secret, home_of, wait_for
from lab.controlplane import ControlPlane
from lab.kubelet import KubeletSettings
from lab.kubelet.pod import PodWorker
from lab.kubelet.realnode import RealNode
from lab.kubelet.sandbox import link_by_mac
from lab.kubelet.world import API_ADDRESS, DNS_ADDRESS, ECHO_SERVER, ONE_SHOT, configure_ipsec_site
from lab.world import GW_NIC2_ADDR, NIC2_PREFIX, RTR_NIC2_ADDR, SVC_ADDR, Host, Lab
from tests.component.test_helm_chart import CHART, HELM, NAMESPACE, run_helm
from tests.component.test_helm_install import GATEWAYS, STATIC_VALUES
from tests.examples import example_docs
from tests.helpers import tenant_namespace
from tests.integration.test_real_install import adopt_crds_as_documented, start_controller

pytestmark = [pytest.mark.lab, pytest.mark.timeout(420)]

TENANT = "tenant-acme"
GATEWAY = "acme"
HOME, HOME_NS = home_of(GATEWAY, TENANT)
GW_ID = "gw.lab.example"
LANS = {"s1": ["203.0.113.0/28", "198.19.1.16/28"], "s2": ["203.0.113.16/28"]}
POD_CIDRS = {"node-a": "10.244.1.0/24", "node-b": "10.244.2.0/24"}
T = TypeVar("T")


class RealWorld:
    """The lab (NIC2 on node-a's namespace, the router, exposure target ``web``, remote sites), the chart
    installed on the real control plane, lab-kubelet nodes and the controller. ``close()`` removes all of
    it on every exit path: the kubelets stop their pods, the release, namespaces and CRDs go, the Nodes
    are deleted, every namespace and process of the lab is removed."""

    def __init__(self, cp: ControlPlane, workdir: Path, nodes: Sequence[str] = ("node-a",)) -> None:
        self.cp = cp
        self.workdir = workdir
        self.node_names = list(nodes)
        self.psk = "real-" + os.urandom(12).hex()  # test-only values, never logged
        self.lab = Lab(nic2_name="ens7", workdir=workdir / "lab")
        self.nodes: dict[str, RealNode] = {}
        self.node_ns: dict[str, str] = {}
        self.controller: Controller | None = None
        self.sites: dict[str, Host] = {}
        self._procs: list[subprocess.Popen[bytes]] = []
        self._stack = contextlib.ExitStack()
        self._installed = False
        self.scripts = workdir / "scripts"

    # --- building ----------------------------------------------------------------------------------------

    def __enter__(self) -> RealWorld:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.scripts.mkdir(exist_ok=True)
        for name, body in (("echo", ECHO_SERVER), ("once", ONE_SHOT)):
            (self.scripts / f"{name}.py").write_text(body)
        self._stack.enter_context(self.lab)
        for name in self.node_names:
            if name == self.node_names[0]:
                self.node_ns[name] = self.lab.gw.ns  # holds NIC2 (the port, attached to its server)
            else:  # another server of the cloud, in the lab's namespace set (removed by its close)
                ns = f"{self.lab.prefix}-{name.replace('node-', 'n')}"
                netns.add_ns(ns, netns.POD_SYSCTLS)
                self.lab.hosts[name] = Host(role=name, ns=ns, dir=self.lab.dir / name)
                self.node_ns[name] = ns
        self.start(self.lab.svc, "echo", SVC_ADDR, "80", name="web")
        wait_for(lambda: "listening" in self.output("web"), 10, "the exposure target")
        self._install()
        for name in self.node_names:
            settings = KubeletSettings(
                node=name,
                node_ns=self.node_ns[name],
                pod_cidr=POD_CIDRS[name],
                api_address=API_ADDRESS,
                dns_address=DNS_ADDRESS,
                workdir=self.workdir / name,
                keep_logs=True,
            )
            node = RealNode(self.cp, settings)
            self._stack.callback(self._delete_node, name)
            self.nodes[name] = self._stack.enter_context(node)
            # Not the kubelet's to set (NodeRestriction refuses node-role labels from a node): the admin's.
            self.cp.kubectl("label", "node", name, "node-role.kubernetes.io/vpn=", "--overwrite")
        kubeconfig = self.cp.service_account_kubeconfig(
            NAMESPACE, "vpngw-controller", path=self.workdir / "sa.kubeconfig"
        )
        self.controller = start_controller(self.cp, kubeconfig, self.workdir)
        wait_for(
            lambda: (
                self.controller is not None
                and (self.controller.ready() or self.controller.proc.poll() is not None)
            ),
            60,
            "the controller to be ready",
        )
        assert self.controller.proc.poll() is None, self.controller.log()[-3000:]

    def static_nic(self) -> dict[str, str]:
        return {
            "mac": self.lab.nic2_mac,
            "address": f"{GW_NIC2_ADDR}/{NIC2_PREFIX}",
            "gateway": RTR_NIC2_ADDR,
            "publicIP": GW_NIC2_ADDR,
        }

    def _install(self) -> None:
        """As docs/install.md says (and test_real_install.py's fixture does): Multus' NAD CRD, the tenant
        namespace opted in and restricted, ``helm install`` with the static cloud, this lab's NIC2."""
        if HELM is None:
            raise AssertionError("helm is missing: run scripts/setup.sh (it installs helm into .tools/bin)")
        cp = self.cp
        values = self.workdir / "values.yaml"
        values.write_text(
            yaml.safe_dump({"cloud": {"static": {"nics": {f"{TENANT}/{GATEWAY}": self.static_nic()}}}})
        )
        self._installed = True
        tenant_namespace(cp, TENANT)
        # The CRDs may exist already, made by kubectl apply by another test on this session's control plane
        # (a shuffled run met it: "invalid ownership metadata"): made so here whatever ran before, then
        # handed to the release by docs/install.md's adoption loop, as test_real_install's fixture does.
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(crds()))
        adopt_crds_as_documented(cp)
        res = run_helm(
            HELM,
            "install",
            "vpngw",
            str(CHART),
            "--kubeconfig",
            str(cp.kubeconfig),
            "-n",
            NAMESPACE,
            "--create-namespace",
            "-f",
            str(STATIC_VALUES),
            "-f",
            str(values),
            "--set",
            f"tenants.namespaces={{{TENANT}}}",
        )
        assert res.returncode == 0, res.stderr

    def _uninstall(self) -> None:

        cp = self.cp
        left = self.get("vpngateways", "-n", TENANT) or {"items": []}
        for gw in left["items"]:  # no controller any more to release its finalizer
            name = gw["metadata"]["name"]
            patch = '{"metadata":{"finalizers":null}}'
            cp.kubectl("patch", "vpngateway", name, "-n", TENANT, "--type=merge", "-p", patch, check=False)
        cp.kubectl("delete", "vpngateways,vpnpeers", "--all", "-n", TENANT, "--wait=false", check=False)
        if HELM is not None:
            run_helm(
                HELM, "uninstall", "vpngw", "--kubeconfig", str(cp.kubeconfig), "-n", NAMESPACE, "--wait"
            )
        # The kubelets are gone by now: nobody confirms a pod's deletion any more.
        cp.kubectl("delete", "pods", "--all", "-n", GATEWAYS, "--grace-period=0", "--force", check=False)
        for ns in (TENANT, GATEWAYS, NAMESPACE):
            cp.kubectl("delete", "namespace", ns, "--ignore-not-found", "--timeout=90s", check=False)
        for crd in crds():
            name = crd["metadata"]["name"]
            cp.kubectl("delete", "crd", name, "--timeout=30s", "--ignore-not-found", check=False)
        cp.kubectl(
            "delete", "-f", str(MANIFESTS / "network-attachment-definition.yaml"), "--wait=false", check=False
        )

    def _delete_node(self, name: str) -> None:
        self.cp.kubectl("delete", "node", name, "--wait=false", "--ignore-not-found", check=False)

    def close(self) -> None:
        try:
            if self.controller is not None:
                if self.controller.proc.poll() is None:  # it releases the finalizers, the kubelets confirm
                    self.cp.kubectl(
                        "delete", "vpngateways", "--all", "-n", TENANT, "--wait=false", check=False
                    )
                    with contextlib.suppress(AssertionError):
                        wait_for(
                            lambda: not (self.get("vpngateways", "-n", TENANT) or {}).get("items"),
                            60,
                            "CRs gone",
                        )
                self.controller.stop(signal.SIGTERM)
            for p in self._procs:
                if p.poll() is None:
                    p.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=5)
            self._procs.clear()
        finally:
            try:
                self._stack.close()  # the kubelets (their pods), the Nodes, the lab
            finally:
                if self._installed:
                    self._uninstall()

    # --- processes in the lab ----------------------------------------------------------------------------

    def start(self, host: Host, script: str, *args: str, name: str) -> subprocess.Popen[bytes]:
        out = self.workdir / f"{name}.out"
        with out.open("wb") as f:
            p = subprocess.Popen(
                host.argv(sys.executable, str(self.scripts / f"{script}.py"), *args),
                stdout=f,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self._procs.append(p)
        return p

    def output(self, name: str) -> str:
        try:
            return (self.workdir / f"{name}.out").read_text()
        except FileNotFoundError:
            return ""

    def reaches(self, site: Host, dst: str, port: int) -> bool:
        """One TCP round trip from the site's LAN address, through its tunnel."""
        res = site.run(
            sys.executable,
            str(self.scripts / "once.py"),
            site.lan_host,
            dst,
            str(port),
            check=False,
            timeout=15,
        )
        return res.returncode == 0

    # --- the cluster -------------------------------------------------------------------------------------

    def get(self, *args: str) -> Any:
        res = self.cp.kubectl("get", *args, "-o", "json", check=False)
        return json.loads(res.stdout) if res.returncode == 0 else None

    def gateway(self) -> dict[str, Any]:
        return self.get("vpngateway", GATEWAY, "-n", TENANT) or {}

    def gateway_node(self) -> Any:
        return (self.gateway().get("status") or {}).get("nodeName")

    def tunnels(self) -> dict[str, dict[str, Any]]:
        return {t["name"]: t for t in (self.gateway().get("status") or {}).get("tunnels") or []}

    def established(self, names: Sequence[str]) -> bool:
        t = self.tunnels()
        return all(t.get(n, {}).get("state") == "Established" for n in names)

    def pods(self) -> list[dict[str, Any]]:
        doc = self.get("pods", "-n", HOME_NS, "-l", f"vpn.bnerd.net/gateway={GATEWAY}")
        return list(doc["items"]) if doc else []

    def worker(self, node: str, uid: str | None = None) -> PodWorker | None:
        """The gateway pod's running worker on ``node`` (of pod ``uid``, if given)."""
        for w in list(self.nodes[node].kubelet.kubelet.workers.values()):
            mine = w.namespace == HOME_NS and w.name.startswith(HOME + "-") and not w.deleting
            if mine and (uid is None or w.uid == uid):
                return w
        return None

    def vip(self, exposure: str = "web") -> str:
        doc = self.get("configmaps", "-n", HOME_NS, "-l", f"vpn.bnerd.net/gateway={GATEWAY}")
        cms = [cm for cm in (doc or {}).get("items", []) if cm["metadata"]["name"] == HOME]
        assert cms, "no plan ConfigMap"
        for e in plan_of(cms[0]).nat.exposures:
            if e.name == exposure:
                return str(e.virtual_ip)
        raise AssertionError(f"no exposure {exposure!r} in the plan")

    def wait(self, cond: Callable[[], T | None], timeout: float, what: str, interval: float = 0.1) -> T:
        try:
            return wait_for(cond, timeout, what, interval)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnostics()}") from None

    def diagnostics(self) -> str:
        out = []
        with contextlib.suppress(Exception):
            out.append(f"gateway: {json.dumps(self.gateway().get('status'))[:3000]}")
            for p in self.pods():
                md = p["metadata"]
                out.append(
                    f"pod {md['name']} node={p['spec'].get('nodeName')}"
                    f" deleting={md.get('deletionTimestamp')} status={json.dumps(p.get('status'))[:1500]}"
                )
            for name, node in self.nodes.items():
                for w in list(node.kubelet.kubelet.workers.values()):
                    out.append(f"--- {name}: pod {w.name} errors={w.errors}")
                    for log in sorted((w.dir / "logs").glob("*.log")):
                        tail = log.read_text(errors="replace").splitlines()[-20:]
                        out.append(f"--- {log.name}\n" + "\n".join(tail))
        if self.controller is not None:
            out.append("--- controller\n" + "\n".join(self.controller.log().splitlines()[-30:]))
        return "\n".join(out)

    # --- the gateway and its remote sites ----------------------------------------------------------------

    def add_site(self, name: str) -> Host:
        site = self.lab.add_site(lans=LANS[name])
        self.lab.start_charon(site)
        self.configure_site(site, psk=self.psk_of(name), site_id=f"{name}.lab.example")
        self.sites[name] = site
        return site

    def psk_of(self, peer: str) -> str:
        return self.psk + "-s1" if peer == "s1" else self.psk

    def configure_site(self, site: Host, *, psk: str, site_id: str) -> None:
        """The tenant's firewall, told by hand (``lab.kubelet.world.configure_ipsec_site``); it responds."""
        configure_ipsec_site(site, psk=psk, site_id=site_id, gateway_id=GW_ID, gateway_addr=GW_NIC2_ADDR)

    def apply_gateway(self) -> None:
        """The example gateway (docs/examples/ipsec.yaml) reduced to exposure ``web``, its peers pointed at
        this world's sites, and the Secrets its PSK references name."""
        docs = example_docs("ipsec.yaml")
        gw = docs[0]
        gw["spec"]["exposures"] = [e for e in gw["spec"]["exposures"] if e["name"] == "web"]
        gw["spec"].pop("reverseExposures", None)
        peers = [d for d in docs[1:] if d["metadata"]["name"] in self.sites]
        for p in peers:
            site = self.sites[p["metadata"]["name"]]
            p["spec"]["endpoint"] = site.addresses[0]
            p["spec"]["ipsec"]["remoteSubnets"] = site.lans
            p["spec"]["authorization"] = {"exposures": ["web"]}
        secrets = [
            gateway_secret(TENANT, "acme-psk", {"psk": self.psk}),
            gateway_secret(TENANT, "s1-psk", {"psk": self.psk + "-s1"}),
        ]
        # Secrets through stdin only: never on a command line or in the output.
        self.cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(secrets))
        self.cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([gw, *peers]))

    def site_sas(self, site: Host) -> list[tuple[str, dict[str, Any]]]:
        assert site.charon is not None
        return list_sas(site.charon.vici_socket)


def list_sas(sock: Path) -> list[tuple[str, dict[str, Any]]]:
    """Every IKE_SA of the charon behind ``sock``: (connection name, the SA), two of one connection too."""

    async def go() -> list[tuple[str, dict[str, Any]]]:
        async with await ViciSession.connect(sock) as v:
            sas, _ = await v.stream("list-sas", {}, "list-sa")
        return [(str(k), ike) for sa in sas for k, ike in sa.items()]

    return asyncio.run(go())


def pod_sas(w: PodWorker) -> list[tuple[str, dict[str, Any]]]:
    """The pod's charon's IKE_SAs, over its VICI socket on the pod's emptyDir (as root)."""
    return list_sas(w.volume_path("vici") / "charon.vici")


@pytest.fixture
def world_a(controlplane: ControlPlane) -> Iterator[RealWorld]:
    # Short paths: the pods' sockets must fit AF_UNIX's 108 bytes (the kubelet keeps them under /tmp).
    with tempfile.TemporaryDirectory(prefix="vg-real-") as d, RealWorld(controlplane, Path(d)) as w:
        run_ids = [n.kubelet.run_id for n in w.nodes.values()]
        yield w
    left = [n for n in netns.list_namespaces() if any(n.startswith(r) for r in run_ids)]
    assert left == [], f"namespaces left behind: {left}"


FOREIGN = {
    "type": "DisruptionTarget",
    "status": "True",
    "reason": "LabNotTheKubelets",
    "message": "written by the test, as the taint eviction controller does",
}
"""A pod condition the kubelet does not own (pkg/kubelet/types PodConditionsByKubelet). Written with its
``lastTransitionTime``: without one, the disruption controller takes it for stale at once (older than
its 2 minutes) and resets it to False."""


def now_rfc3339() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def watch_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """``kubectl get --watch --output-watch-events -o json``'s stream: (type, object) in order."""
    out: list[tuple[str, dict[str, Any]]] = []
    dec, i = json.JSONDecoder(), 0
    while (i := _skip_space(text, i)) < len(text):
        doc, i = dec.raw_decode(text, i)
        out.append((str(doc["type"]), doc["object"]))
    return out


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def running_status(pod: Mapping[str, Any], worker: PodWorker) -> bool:
    """What only the kubelet writes: phase Running, the pod IP of its sandbox, every container running."""
    st = pod.get("status") or {}
    containers = st.get("containerStatuses") or []
    return (
        st.get("phase") == "Running"
        and st.get("podIP") == worker.view.pod_ip != ""
        and bool(containers)
        and all("running" in (c.get("state") or {}) for c in containers)
    )


def test_the_lab_kubelet_runs_the_gateway_as_a_node_of_the_real_control_plane(world_a: RealWorld) -> None:
    w = world_a
    s1 = w.add_site("s1")
    t0 = time.monotonic()
    w.apply_gateway()

    # The REAL ReplicaSet controller's pod, pinned to node-a by the controller, run by the lab kubelet.
    pod = w.wait(lambda: next(iter(w.pods()), None), 60, "the ReplicaSet controller's gateway pod")
    assert pod["spec"]["nodeName"] == "node-a"
    assert [r["kind"] for r in pod["metadata"]["ownerReferences"]] == ["ReplicaSet"]
    assert not pod["metadata"].get("finalizers"), "no emulator finalizer on a real server's pod"
    uid = pod["metadata"]["uid"]
    worker = w.wait(lambda: w.worker("node-a", uid), 60, "the kubelet running the pod")

    # The status-agent in the pod writes the tunnels through the real API (relay, token, CA).
    w.wait(lambda: w.established(["s1"]), 90, "s1's tunnel Established on the CR")
    print(f"real_kubelet.measured what=apply_to_established seconds={time.monotonic() - t0:.2f}")
    tunnel = w.tunnels()["s1"]
    assert tunnel["state"] == "Established"
    # pods/status from the kubelet, through the real API.
    w.wait(
        lambda: (p := w.get("pod", pod["metadata"]["name"], "-n", HOME_NS)) and running_status(p, worker),
        30,
        "the pod's status (Running, its IP, every container running) written by the kubelet",
    )
    vip = w.vip()
    w.wait(lambda: w.reaches(s1, vip, 80), 30, "s1 reaching web through its tunnel")

    # A condition the kubelet does not own, as the taint eviction controller writes it: kept.
    name = pod["metadata"]["name"]
    w.cp.kubectl(
        "patch", "pod", name, "-n", HOME_NS, "--subresource=status", "--type=strategic", "-p",
        json.dumps({"status": {"conditions": [{**FOREIGN, "lastTransitionTime": now_rfc3339()}]}}),
    )  # fmt: skip

    # Deleting the gateway: a graceful deletion of the pod, confirmed by the kubelet after teardown. A
    # watch sees the last status the pod had: the kubelet's terminal one, before its grace-0 DELETE.
    netns_name = worker.netns
    events = w.workdir / "pod-watch.json"
    with events.open("wb") as out:
        watch = subprocess.Popen(
            [str(w.cp.kubectl_path), f"--kubeconfig={w.cp.kubeconfig}", "get", "pod", name, "-n", HOME_NS,
             "--watch", "--output-watch-events", "-o", "json"],
            stdout=out,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        w.wait(lambda: events.exists() and '"ADDED"' in events.read_text(), 30, "the pod watch started")
        w.cp.kubectl("delete", "vpngateway", GATEWAY, "-n", TENANT, "--wait=false")
        w.wait(lambda: worker.deleting, 60, "the pod's deletion reaching the kubelet")
        gone: list[bool] = []

        def pod_gone() -> bool:
            if w.get("pod", pod["metadata"]["name"], "-n", HOME_NS) is not None:
                return False
            # Confirmed only after teardown: at the moment the pod left the API its namespace was gone.
            gone.append(netns_name not in netns.list_namespaces())
            return True

        w.wait(pod_gone, 90, "the pod deleted (the kubelet's grace-0 confirmation)")
        w.wait(lambda: '"DELETED"' in events.read_text(), 30, "the pod's deletion seen by the watch")
    finally:
        watch.terminate()
        watch.wait(10)
    seen = watch_events(events.read_text())
    assert seen[-1][0] == "DELETED", [t for t, _ in seen]
    final = seen[-1][1]["status"]
    assert final["phase"] in ("Succeeded", "Failed"), final
    conds = {c["type"]: c for c in final["conditions"]}
    assert conds["Ready"]["status"] == "False", conds
    assert conds["DisruptionTarget"]["reason"] == FOREIGN["reason"], "the kubelet dropped a foreign condition"
    assert all("terminated" in c["state"] for c in final["containerStatuses"]), final["containerStatuses"]
    assert gone == [True], "the pod left the API while its namespace still existed"
    assert worker.errors == [], worker.errors
    assert netns_name not in netns.list_namespaces()
    assert w.nodes["node-a"].kubelet.kubelet.workers == {}, "nothing left running on node-a"
    assert link_by_mac(w.lab.gw.ns, w.lab.nic2_mac) is not None, "NIC2 back on the node"
    w.wait(lambda: w.get("vpngateway", GATEWAY, "-n", TENANT) is None, 60, "the CR deleted")
    assert w.controller is not None
    assert w.controller.proc.poll() is None, w.controller.log()[-3000:]
