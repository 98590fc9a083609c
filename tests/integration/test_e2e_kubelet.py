"""Contract tests of the lab kubelet (lab/kubelet: an EMULATOR of a node's kubelet, not one), with small
pods whose containers are shell and Python one-liners, run in process mode against the API emulator.

Each behaviour the e2e scenarios rely on, shown on its own: the Deployment -> Pod step (Recreate on a
template change), the environment (value, fieldRef, configMapKeyRef, secretKeyRef, $(VAR)), ConfigMap,
Secret (items, modes), downwardAPI and projected service-account volumes at the spec's paths and nowhere
on the host, a ConfigMap change reaching its volume by an atomic ``..data`` swap only after the delay,
memory emptyDirs, init containers first, restarts with backoff counted in the status, readiness and
liveness probes, the user and capabilities of process mode, forbidden sysctls, Multus' host-device
attachment and its return, and the leftovers of a killed kubelet removed by the next one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab import netns
from lab.cluster import Cluster
from lab.kubelet import KubeletSettings, LabKubeletThread, cleanup_stale, volumes
from lab.kubelet.pod import PodWorker
from lab.wait import wait_for
from lab.world import Lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
NODE = "node-a"
DELAY = 2.0
"""The volume refresh delay of this module's kubelet (a real one: 60 s)."""


@dataclass
class Node:
    lab: Lab
    cluster: Cluster
    kubelet: LabKubeletThread

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        ns = obj["metadata"].get("namespace")
        if ns:
            self.cluster.namespace(ns)
        return self.cluster.kube.create(obj)

    def pod(self, ns: str, deployment: str) -> PodWorker:
        return wait_for(lambda: self.kubelet.pod_of(ns, deployment), 20, f"a pod of {deployment}")

    def status(self, ns: str, deployment: str) -> dict[str, Any]:
        w = self.kubelet.pod_of(ns, deployment)
        pod = self.cluster.get("v1", "Pod", w.name, ns) if w else None
        return dict((pod or {}).get("status") or {})

    def container(self, ns: str, deployment: str, name: str) -> dict[str, Any]:
        st = self.status(ns, deployment)
        for c in [*(st.get("initContainerStatuses") or []), *(st.get("containerStatuses") or [])]:
            if c["name"] == name:
                return dict(c)
        return {}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("kubelet")
    with Lab(nic2_name="ens7") as lab, Cluster(tmp / "k8s", sans=("10.96.0.1",)) as c:
        c.add_node(NODE)
        port = int(c.kube.url.rsplit(":", 1)[1])
        settings = KubeletSettings(
            node=NODE,
            node_ns=lab.gw.ns,
            volume_refresh_delay=DELAY,
            backoff_initial=1.0,
            allowed_unsafe_sysctls=("net.ipv4.ip_forward",),
            workdir=tmp,
        )
        with LabKubeletThread(settings, c.kubeconfig, ("127.0.0.1", port), c.kube.ca_file) as k:
            run_id = k.run_id
            yield Node(lab, c, k)
        assert k.leftovers() == []
    assert [n for n in netns.list_namespaces() if n.startswith(run_id)] == []


def deployment(ns: str, name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    annotations = spec.pop("annotations", {})
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations},
                "spec": {"nodeName": NODE, "containers": containers, **spec},
            },
        },
    }


def sh(name: str, script: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "lab", "command": ["sh", "-c", textwrap.dedent(script)], **extra}


def report(worker: PodWorker, volume: str = "out", file: str = "report.json") -> dict[str, Any] | None:
    try:
        return dict(json.loads((worker.volume_path(volume) / file).read_text()))
    except (OSError, ValueError):
        return None


REPORTER = """
import json, os, stat, sys
def read(p):
    try:
        return open(p).read()
    except OSError as e:
        return f"error {e.errno}"
def mode(p):
    return oct(stat.S_IMODE(os.stat(p).st_mode))
WANTED = ("E_", "KUBERNETES_SERVICE", "HOSTNAME")
status = {k.split(':')[0]: k.split(':', 1)[1].strip() for k in open('/proc/self/status').read().splitlines()}
mounts = open('/proc/self/mounts').read()
out = {
    "env": {k: v for k, v in os.environ.items() if k.startswith(WANTED)},
    "settings": read("/etc/labtest/settings/app.conf"),
    "settings_mode": mode("/etc/labtest/settings/app.conf"),
    "secret": read("/etc/labtest/secret/pw"), "secret_mode": mode("/etc/labtest/secret/pw"),
    "podname": read("/etc/labtest/info/name"), "labels": read("/etc/labtest/info/labels"),
    "token": len(read("/var/run/secrets/kubernetes.io/serviceaccount/token")),
    "ca": read("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")[:27],
    "namespace": read("/var/run/secrets/kubernetes.io/serviceaccount/namespace"),
    "cache_tmpfs": any(l.split()[1] == "/run/cache" and l.split()[2] == "tmpfs" for l in mounts.splitlines()),
    "resolv": read("/etc/resolv.conf"), "hostname": read("/etc/hostname").strip(),
    "uid": status["Uid"].split()[0], "capbnd": status["CapBnd"], "nnp": status["NoNewPrivs"],
    "root_writable": os.access("/", os.W_OK),
    "ip_forward": read("/proc/sys/net/ipv4/ip_forward").strip(),
}
tmp = "/run/out/report.json.tmp"
open(tmp, "w").write(json.dumps(out)); os.replace(tmp, "/run/out/report.json")
"""


def test_environment_volumes_and_identity_are_what_the_spec_writes(node: Node, tmp_path: Path) -> None:
    ns = "kt-env"
    node.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    node.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": ns},
            "data": {"conf": "colour=blue\n", "level": "debug", "unused": "x"},
        }
    )
    node.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds", "namespace": ns},
            "stringData": {"password": "lab-only-pw"},
        }
    )
    node.create(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns}}
    )
    c = {
        "name": "app",
        "image": "lab",
        "command": ["python3", "-c", REPORTER],
        "env": [
            {"name": "E_PLAIN", "value": "plain"},
            {"name": "E_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "E_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "E_LEVEL", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "level"}}},
            {"name": "E_PW", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
            {"name": "E_REF", "value": "$(E_PLAIN)-$(E_LEVEL)-$(E_MISSING)"},
        ],
        "securityContext": {
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "settings", "mountPath": "/etc/labtest/settings"},
            {"name": "secret", "mountPath": "/etc/labtest/secret"},
            {"name": "info", "mountPath": "/etc/labtest/info"},
            {"name": "cache", "mountPath": "/run/cache"},
            {"name": "out", "mountPath": "/run/out"},
        ],
    }
    node.create(
        deployment(
            ns,
            "env",
            [c],
            restartPolicy="Always",
            securityContext={"sysctls": [{"name": "net.ipv4.ip_forward", "value": "1"}]},
            volumes=[
                {
                    "name": "settings",
                    "configMap": {
                        "name": "settings",
                        "items": [{"key": "conf", "path": "app.conf", "mode": 0o444}],
                    },
                },
                {
                    "name": "secret",
                    "secret": {
                        "secretName": "creds",
                        "items": [{"key": "password", "path": "pw", "mode": 0o404}],
                    },
                },
                {
                    "name": "info",
                    "downwardAPI": {
                        "items": [
                            {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                        ]
                    },
                },
                {"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                {"name": "out", "emptyDir": {}},
            ],
        )
    )
    w = node.pod(ns, "env")
    got = wait_for(lambda: report(w), 20, "the container's report")
    env = got["env"]
    assert env["E_PLAIN"] == "plain" and env["E_NS"] == ns and env["E_IP"] == str(w.sandbox.ip.ip)  # type: ignore[union-attr]
    assert env["E_LEVEL"] == "debug" and env["E_PW"] == "lab-only-pw"
    assert env["E_REF"] == "plain-debug-$(E_MISSING)", "defined references expanded, others kept"
    assert env["KUBERNETES_SERVICE_HOST"] == "10.96.0.1" and env["KUBERNETES_SERVICE_PORT"] == "443"
    assert env["HOSTNAME"] == w.name == got["hostname"] == got["podname"]
    assert got["settings"] == "colour=blue\n" and got["settings_mode"] == "0o444", "items and their mode"
    assert (got["secret"], got["secret_mode"]) == ("lab-only-pw", "0o404")
    assert 'app="env"' in got["labels"] and "pod-template-hash=" in got["labels"]
    assert got["token"] > 10 and got["ca"] == "-----BEGIN CERTIFICATE-----" and got["namespace"] == ns
    assert got["cache_tmpfs"], "a memory emptyDir is a tmpfs"
    assert f"search {ns}.svc.cluster.local" in got["resolv"] and "nameserver 10.96.0.10" in got["resolv"]
    assert (got["uid"], got["capbnd"], got["nnp"], got["root_writable"]) == (
        "65532",
        "0000000000000000",
        "1",
        False,
    )
    assert got["ip_forward"] == "1", "the pod's sysctl, written into its namespace (it starts at 0)"
    assert not Path("/etc/labtest").exists() and not Path("/run/cache").exists(), (
        "the host never sees the paths"
    )
    assert any(m.name == "cache" for m in volumes.mounts_under(w.dir)), (
        "the tmpfs is on the node, under the pod"
    )
    assert "lab-only-pw" not in (w.dir / "logs" / "app-0.log").read_text()


def test_a_configmap_change_reaches_its_volume_after_the_delay_by_an_atomic_swap(node: Node) -> None:
    ns = "kt-swap"
    node.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "cfg", "namespace": ns},
            "data": {"a": "one"},
        }
    )
    node.create(
        deployment(
            ns,
            "swap",
            [sh("app", "sleep 600", volumeMounts=[{"name": "cfg", "mountPath": "/cfg"}])],
            volumes=[{"name": "cfg", "configMap": {"name": "cfg"}}],
        )
    )
    w = node.pod(ns, "swap")
    vol = w.volume_path("cfg")
    wait_for(lambda: (vol / "a").exists(), 20, "the ConfigMap volume")
    assert os.readlink(vol / "a") == "..data/a" and (vol / "a").read_text() == "one"
    first = os.readlink(vol / "..data")
    node.cluster.kube.patch("v1", "ConfigMap", "cfg", {"data": {"a": "two", "b": "new"}}, ns)
    changed = time.monotonic()
    time.sleep(DELAY / 2)
    assert (vol / "a").read_text() == "one" and not (vol / "b").exists(), "not before the delay"
    wait_for(lambda: (vol / "b").exists(), DELAY + 5, "the refresh")
    waited = time.monotonic() - changed
    assert waited >= DELAY * 0.9, waited
    assert (vol / "a").read_text() == "two" and (vol / "b").read_text() == "new"
    assert os.readlink(vol / "..data") != first and not (vol / first).exists(), (
        "a new ..data, the old one gone"
    )


def test_init_containers_run_first_and_a_crashing_container_restarts_with_backoff(node: Node) -> None:
    ns = "kt-restart"
    init = sh(
        "prepare", "echo ready > /run/work/marker", volumeMounts=[{"name": "work", "mountPath": "/run/work"}]
    )
    main = sh(
        "main",
        "test -f /run/work/marker || exit 3; sleep 600",
        volumeMounts=[{"name": "work", "mountPath": "/run/work"}],
    )
    crash = sh("crash", "echo crashing; exit 1")
    node.create(
        deployment(
            ns, "restart", [main, crash], initContainers=[init], volumes=[{"name": "work", "emptyDir": {}}]
        )
    )
    node.pod(ns, "restart")
    wait_for(lambda: node.container(ns, "restart", "crash").get("restartCount", 0) >= 3, 30, "three restarts")
    seen_backoff = wait_for(
        lambda: (
            (c := node.container(ns, "restart", "crash")).get("state", {}).get("waiting", {}).get("reason")
            == "CrashLoopBackOff"
            and c
        ),
        10,
        "CrashLoopBackOff",
    )
    assert seen_backoff["lastState"]["terminated"]["exitCode"] == 1
    assert "back-off" in seen_backoff["state"]["waiting"]["message"]
    assert node.container(ns, "restart", "prepare")["state"]["terminated"]["exitCode"] == 0
    main_st = node.container(ns, "restart", "main")
    assert "running" in main_st["state"] and main_st["restartCount"] == 0, "the init container ran before it"
    assert node.status(ns, "restart")["phase"] == "Running"
    ready = {c["type"]: c["status"] for c in node.status(ns, "restart")["conditions"]}
    assert ready["Initialized"] == "True" and ready["Ready"] == "False", "crash is not ready"


PROBED = """
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/ready":
            code = 200 if os.path.exists("/run/ctl/ready") else 503
        else:
            code = 500 if os.path.exists("/run/ctl/sick") else 200
        self.send_response(code); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("0.0.0.0", 8080), H).serve_forever()
"""


def test_readiness_and_liveness_probes_decide_ready_and_restarts(node: Node) -> None:
    ns = "kt-probe"
    probe = {"periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 2}
    c = {
        "name": "web",
        "image": "lab",
        "command": ["python3", "-c", PROBED],
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, **probe},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, **probe},
        "volumeMounts": [{"name": "ctl", "mountPath": "/run/ctl"}],
    }
    node.create(deployment(ns, "probe", [c], volumes=[{"name": "ctl", "emptyDir": {}}]))
    w = node.pod(ns, "probe")
    wait_for(lambda: "running" in node.container(ns, "probe", "web").get("state", {}), 20, "running")
    time.sleep(3)
    assert node.container(ns, "probe", "web")["ready"] is False, "not ready while /ready answers 503"
    (w.volume_path("ctl") / "ready").touch()
    wait_for(lambda: node.container(ns, "probe", "web").get("ready"), 10, "ready once /ready answers 200")
    ready = {c["type"]: c["status"] for c in node.status(ns, "probe")["conditions"]}
    assert ready["Ready"] == "True"
    (w.volume_path("ctl") / "sick").touch()
    st = wait_for(
        lambda: (c := node.container(ns, "probe", "web")).get("restartCount") == 1 and c,
        20,
        "the liveness probe restarting the container",
    )
    assert st["lastState"]["terminated"]["exitCode"] in (143, 137), st
    (w.volume_path("ctl") / "sick").unlink()
    wait_for(lambda: node.container(ns, "probe", "web").get("ready"), 20, "ready again")


def test_a_pod_with_a_sysctl_the_kubelet_does_not_allow_fails_before_anything_is_made(node: Node) -> None:
    ns = "kt-sysctl"

    def ours() -> set[str]:
        """This process's namespaces (lab.netns names them vg<pid>x...): other pytest workers make theirs
        at the same time (a CI run saw another worker's router namespace appear here)."""
        mine = f"{netns.PREFIX}{os.getpid()}x"
        return {n for n in netns.list_namespaces() if n.startswith(mine)}

    before = ours()
    node.create(
        deployment(
            ns,
            "sysctl",
            [sh("app", "sleep 600")],
            securityContext={
                "sysctls": [
                    {"name": "net.ipv4.ip_forward", "value": "1"},
                    {"name": "net.ipv4.conf.all.rp_filter", "value": "2"},
                ]
            },
        )
    )
    st = wait_for(
        lambda: (s := node.status(ns, "sysctl")).get("phase") == "Failed" and s, 20, "the pod Failed"
    )
    assert st["reason"] == "SysctlForbidden" and "net.ipv4.conf.all.rp_filter" in st["message"], st
    assert "'net.ipv4.ip_forward'" not in st["message"], "the allowed one is not named"
    assert ours() - before == set(), "no sandbox was made"


def test_a_template_change_recreates_the_pod_and_host_device_moves_nic2_in_and_back(node: Node) -> None:
    ns = "kt-nic"
    mac = node.lab.nic2_mac
    node.create(
        {
            "apiVersion": "k8s.cni.cncf.io/v1",
            "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": "nic2", "namespace": ns},
            "spec": {"config": json.dumps({"cniVersion": "0.3.1", "type": "host-device", "hwaddr": mac})},
        }
    )
    networks = json.dumps([{"name": "nic2", "namespace": ns}])
    node.create(
        deployment(
            ns,
            "nic",
            [sh("app", "sleep 600", env=[{"name": "V", "value": "1"}])],
            annotations={"k8s.v1.cni.cncf.io/networks": networks},
        )
    )
    first = node.pod(ns, "nic")
    wait_for(lambda: first.sandbox.moved, 20, "NIC2 attached")
    inside = netns.run(["ip", "-n", first.netns, "-o", "link", "show", "net1"]).stdout.decode()
    assert mac in inside, "Multus' default name net1, the NAD's MAC"
    assert "ens7" not in netns.run(["ip", "-n", node.lab.gw.ns, "-o", "link"]).stdout.decode()
    pod = node.cluster.get("v1", "Pod", first.name, ns)
    status = json.loads(pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"])  # type: ignore[index]
    assert status[1] == {"name": f"{ns}/nic2", "interface": "net1", "mac": mac, "dns": {}}
    node.cluster.kube.patch(
        "apps/v1",
        "Deployment",
        "nic",
        {
            "spec": {
                "template": {
                    "spec": {"containers": [{**sh("app", "sleep 600"), "env": [{"name": "V", "value": "2"}]}]}
                }
            }
        },
        ns,
    )

    def replaced() -> PodWorker | None:
        p = node.kubelet.pod_of(ns, "nic")
        return p if p is not None and p.name != first.name else None

    second = wait_for(replaced, 30, "the new pod")
    assert first.netns not in netns.list_namespaces(), "Recreate: the old pod was gone first"
    wait_for(lambda: second.sandbox.moved, 20, "NIC2 attached to the new pod")
    node.cluster.kube.delete("apps/v1", "Deployment", "nic", ns)
    wait_for(
        lambda: node.kubelet.pod_of(ns, "nic") is None and second.netns not in netns.list_namespaces(),
        30,
        "the pod gone with its Deployment",
    )
    wait_for(lambda: not node.cluster.kube.list("v1", "Pod", ns), 20, "the pod's finalizer released")
    links = netns.run(["ip", "-n", node.lab.gw.ns, "-o", "link"]).stdout.decode()
    assert "ens7" in links and mac in links, "host-device DEL: back on the node under its own name"


CHILD = """
import sys, time
from pathlib import Path
from lab.kubelet import KubeletSettings, LabKubeletThread
node_ns, kubeconfig, port, ca, ns = sys.argv[1:6]
settings = KubeletSettings(node="node-b", node_ns=node_ns, pod_cidr="10.244.2.0/24", deployments=False,
                           api_address="10.96.1.1", dns_address="10.96.1.10")
with LabKubeletThread(settings, Path(kubeconfig), ("127.0.0.1", int(port)), Path(ca)) as k:
    print("run", k.run_id, flush=True)
    while True:
        time.sleep(1)
"""


def test_a_killed_kubelets_leftovers_are_removed_by_the_next_start(node: Node, tmp_path: Path) -> None:
    ns = "kt-killed"
    node.cluster.add_node("node-b")
    node.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "orphan", "namespace": ns},
            "spec": {
                "nodeName": "node-b",
                "containers": [sh("app", "sleep 600")],
                "volumes": [{"name": "m", "emptyDir": {"medium": "Memory"}}],
            },
        }
    )
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    port = node.cluster.kube.url.rsplit(":", 1)[1]
    out = tmp_path / "child.out"
    node_b = f"{netns.PREFIX}{os.getpid()}x{os.urandom(3).hex()}-nodeb"
    netns.add_ns(node_b)
    with out.open("wb") as f:
        child = subprocess.Popen(
            [
                sys.executable,
                str(script),
                node_b,
                str(node.cluster.kubeconfig),
                port,
                str(node.cluster.kube.ca_file),
                ns,
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    try:
        run_id = wait_for(
            lambda: next(
                (ln.split()[1] for ln in out.read_text().splitlines() if ln.startswith("run ")), None
            ),
            30,
            "the child kubelet",
        )
        wait_for(
            lambda: (
                (s := (node.cluster.get("v1", "Pod", "orphan", ns) or {}).get("status") or {}).get(
                    "containerStatuses"
                )
                and "running" in s["containerStatuses"][0]["state"]
            ),
            30,
            "its pod running",
        )
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    try:
        check_leftovers_removed(run_id)
    finally:
        netns.destroy_ns(node_b)


def check_leftovers_removed(run_id: str) -> None:
    left_ns = [n for n in netns.list_namespaces() if n.startswith(run_id)]
    left_mounts = [m for m in volumes.stale_mounts() if run_id in str(m)]
    assert left_ns and left_mounts, "a SIGKILLed kubelet leaves its pod's namespace and tmpfs behind"
    pids = [p for n in left_ns for p in netns.pids_in(n)]
    assert pids, "and the pod's processes"
    removed = cleanup_stale(containers=False)
    # Another sweep running at the same time (a pytest-xdist worker's start, the demo's) may take some of
    # them first; what matters is that none is left (below), and that this sweep did its part.
    assert removed or not [n for n in netns.list_namespaces() if n.startswith(run_id)], removed
    assert not [n for n in netns.list_namespaces() if n.startswith(run_id)]
    assert not [m for m in volumes.stale_mounts() if run_id in str(m)]
    assert not Path(f"/tmp/{run_id}-kubelet").exists()
    # SIGKILLed and reparented: PID 1 reaps them a little later (LAB-FACTS), zombies until then.
    wait_for(lambda: not any(alive(p) for p in pids), 15, "the killed pod's processes gone")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
