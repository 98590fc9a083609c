"""The real control plane (lab.controlplane): kube-apiserver v1.35 on etcd, kube-controller-manager, built
by scripts/setup_controlplane.sh. What a production cluster does, observed: controllers act, admission
refuses, a silent node is tainted and its pods evicted (docs/controlplane.md)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.controlplane import ControlPlane, cluster
from lab.controlplane.cli import read_state
from lab.controlplane.cluster import BIN_DIR, ROOT
from lab.controlplane.flags import (
    ADMISSION_PLUGINS,
    CONTROLLERS,
    Layout,
    NodeTimings,
    Ports,
    apiserver_argv,
    controller_manager_argv,
    etcd_argv,
)
from lab.controlplane.nodeagent import NodeAgent
from lab.wait import wait_for

pytestmark = pytest.mark.lab


def get_json(cp: ControlPlane, *args: str) -> Any:
    res = cp.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(res.stdout) if res.returncode == 0 else None


def apply(
    cp: ControlPlane, doc: dict[str, Any], kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return cp.kubectl("apply", "-f", "-", kubeconfig=kubeconfig, input=json.dumps(doc), check=False)


@pytest.fixture
def namespace(controlplane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    name = "t-" + re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:50].strip("-")
    controlplane.kubectl("create", "namespace", name)
    yield name
    controlplane.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def test_flags_are_the_binaries_flags(tmp_path: Path) -> None:
    """Every flag we pass exists in the built release (a pin change that drops one fails here, not in
    a log)."""
    lay = Layout(tmp_path, tmp_path / "data")
    ports = Ports(1, 2, 3, 4)
    for binary, argv in (
        ("etcd", etcd_argv(BIN_DIR / "etcd", lay, ports)),
        ("kube-apiserver", apiserver_argv(BIN_DIR / "kube-apiserver", lay, ports)),
        (
            "kube-controller-manager",
            controller_manager_argv(BIN_DIR / "kube-controller-manager", lay, ports, NodeTimings()),
        ),
    ):
        out = subprocess.run([str(BIN_DIR / binary), "--help"], capture_output=True, text=True, check=False)
        text = out.stdout + out.stderr
        for arg in argv[1:]:
            flag = arg.split("=", 1)[0]
            assert re.search(rf"(^|\s){re.escape(flag)}[\s=]", text), f"{binary} has no {flag}"
    help_text = subprocess.run(
        [str(BIN_DIR / "kube-controller-manager"), "--help"], capture_output=True, text=True, check=False
    ).stdout
    for name in CONTROLLERS:
        assert name in help_text, f"kube-controller-manager does not know controller {name}"
    api_help = subprocess.run(
        [str(BIN_DIR / "kube-apiserver"), "--help"], capture_output=True, text=True, check=False
    ).stdout
    for plugin in ADMISSION_PLUGINS:
        assert plugin in api_help, f"kube-apiserver has no admission plugin {plugin}"


def test_ready_versions_and_identities(controlplane: ControlPlane) -> None:
    version = json.loads(controlplane.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == "v1.35.4"  # the ldflags of setup_controlplane.sh
    assert controlplane.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    whoami = json.loads(controlplane.kubectl("auth", "whoami", "-o", "json").stdout)
    assert whoami["status"]["userInfo"]["username"] == "kubernetes-admin"
    assert "system:masters" in whoami["status"]["userInfo"]["groups"]
    # The root CA publisher and the ServiceAccount controller ran in every namespace.
    for ns in ("default", "kube-system", "kube-node-lease"):
        assert get_json(controlplane, "configmap", "kube-root-ca.crt", "-n", ns) is not None
        assert get_json(controlplane, "serviceaccount", "default", "-n", ns) is not None
    # Controllers run as their own ServiceAccounts (--use-service-account-credentials).
    assert get_json(controlplane, "serviceaccount", "replicaset-controller", "-n", "kube-system") is not None


def test_deployment_replicaset_pod_and_garbage_collection(controlplane: ControlPlane, namespace: str) -> None:
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "registry.invalid/web:1"}]},
            },
        },
    }
    assert apply(controlplane, deploy).returncode == 0

    def pods() -> list[dict[str, Any]]:
        doc = get_json(controlplane, "pods", "-n", namespace, "-l", "app=web")
        return doc["items"] if doc and len(doc["items"]) == 2 else []

    items = wait_for(pods, 30.0, "the ReplicaSet controller makes 2 pods", interval=0.2)
    rs = get_json(controlplane, "replicasets", "-n", namespace)["items"]
    assert len(rs) == 1 and rs[0]["metadata"]["ownerReferences"][0]["name"] == "web"
    for pod in items:
        owner = pod["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("ReplicaSet", rs[0]["metadata"]["name"])
        assert pod["status"]["phase"] == "Pending" and "nodeName" not in pod["spec"]  # no scheduler runs
        # Admission defaulted it as a cluster does: the SA token volume, the 300 s not-ready tolerations.
        assert pod["spec"]["serviceAccountName"] == "default"
        assert any(v["name"].startswith("kube-api-access-") for v in pod["spec"]["volumes"])
        tolerations = {(t["key"], t.get("tolerationSeconds")) for t in pod["spec"]["tolerations"]}
        assert ("node.kubernetes.io/unreachable", 300) in tolerations
    # The garbage collector: deleting the Deployment (background propagation) removes the ReplicaSet
    # and its pods.
    controlplane.kubectl("delete", "deployment", "web", "-n", namespace, "--wait=false")
    wait_for(
        lambda: not get_json(controlplane, "replicasets,pods", "-n", namespace)["items"],
        30.0,
        "the garbage collector removes the ReplicaSet and the pods",
        interval=0.2,
    )


def test_namespace_controller_removes_a_deleted_namespace(controlplane: ControlPlane) -> None:
    ns = "t-doomed"
    controlplane.kubectl("create", "namespace", ns)
    controlplane.kubectl("create", "configmap", "c", "-n", ns, "--from-literal=k=v")
    controlplane.kubectl("delete", "namespace", ns, "--wait=false")
    assert get_json(controlplane, "namespace", ns)["status"]["phase"] == "Terminating"
    wait_for(
        lambda: get_json(controlplane, "namespace", ns) is None,
        30.0,
        "the namespace controller deletes the namespace",
        interval=0.2,
    )


def test_pod_security_refuses_a_privileged_pod(controlplane: ControlPlane, namespace: str) -> None:
    controlplane.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "priv", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "x", "securityContext": {"privileged": True}}]},
    }
    res = apply(controlplane, pod)
    assert res.returncode != 0
    want = (
        'pods "priv" is forbidden: violates PodSecurity "restricted:latest": privileged (container "c" must '
        "not set securityContext.privileged=true)"
    )
    assert want in res.stderr, res.stderr


def test_owner_references_permission_enforcement(controlplane: ControlPlane, namespace: str) -> None:
    """blockOwnerDeletion needs `update` on the owner's finalizers (as on OpenShift), with a
    ServiceAccount's kubeconfig minted through the TokenRequest API."""
    cp = controlplane
    cp.kubectl("create", "serviceaccount", "writer", "-n", namespace)
    cp.kubectl(
        "create", "role", "writer", "-n", namespace, "--verb=get,create,delete", "--resource=configmaps"
    )
    cp.kubectl(
        "create",
        "rolebinding",
        "writer",
        "-n",
        namespace,
        "--role=writer",
        f"--serviceaccount={namespace}:writer",
    )
    cp.kubectl("create", "configmap", "owner", "-n", namespace)
    uid = get_json(cp, "configmap", "owner", "-n", namespace)["metadata"]["uid"]
    kubeconfig = cp.service_account_kubeconfig(namespace, "writer")
    whoami = json.loads(cp.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig).stdout)
    assert whoami["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:writer"

    def child(name: str, block: bool) -> dict[str, Any]:
        ref = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": "owner",
            "uid": uid,
            "blockOwnerDeletion": block,
        }
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "ownerReferences": [ref]},
        }

    refused = cp.kubectl(
        "create", "-f", "-", kubeconfig=kubeconfig, input=json.dumps(child("c1", True)), check=False
    )
    assert refused.returncode != 0
    assert (
        'configmaps "c1" is forbidden: cannot set blockOwnerDeletion if an ownerReference refers to a '
        "resource you can't set finalizers on" in refused.stderr
    ), refused.stderr
    # The same ownerReference without blockOwnerDeletion is allowed (the creator could have not made it).
    cp.kubectl("create", "-f", "-", kubeconfig=kubeconfig, input=json.dumps(child("c2", False)))
    # With `update` on configmaps/finalizers, blockOwnerDeletion is allowed.
    cp.kubectl(
        "create", "role", "finalizer", "-n", namespace, "--verb=update", "--resource=configmaps/finalizers"
    )
    cp.kubectl(
        "create",
        "rolebinding",
        "finalizer",
        "-n",
        namespace,
        "--role=finalizer",
        f"--serviceaccount={namespace}:writer",
    )
    wait_for(
        lambda: (
            cp.kubectl(
                "create", "-f", "-", kubeconfig=kubeconfig, input=json.dumps(child("c3", True)), check=False
            ).returncode
            == 0
        ),
        10,
        "the finalizers grant to take effect",
        interval=0.2,
    )


def test_silent_node_goes_not_ready_tainted_and_its_pods_evicted(
    controlplane: ControlPlane, namespace: str
) -> None:
    """Node lifecycle with taint-based eviction, grace periods shortened by flags (NodeTimings:
    --node-monitor-grace-period 4 s, --node-monitor-period 1 s). Two nodes: a zone whose every node is
    silent is "fully disrupted" and the controller then evicts nothing, as in production. Within 45 s
    (measured ~3.5-5 s): production's defaults (50 s grace) could not."""
    cp = controlplane
    # The live node beats twice a second: on a loaded machine a late beat would make both nodes silent,
    # the zone fully disrupted, and the controller would (rightly) hold the eviction back.
    live, dead = NodeAgent(cp, "cp-live", interval=0.5), NodeAgent(cp, "cp-dead")
    try:
        # cp-live registers and is seen before it posts Ready: for a moment every node is not ready and
        # the controller enters (then leaves) "master disruption mode", as with a new cluster's first
        # node. Tainting must work after that (see NodeTimings.eviction_rate for why it did not at 1/s).
        kcm = cp.log_path("kube-controller-manager")
        since = kcm.stat().st_size  # the session's control plane: only what this test made it say

        def said(*words: str) -> bool:
            with kcm.open("rb") as f:
                f.seek(since)
                return any(
                    all(w in line for w in words) for line in f.read().decode(errors="replace").splitlines()
                )

        live.register(ready=False)
        wait_for(
            lambda: (
                said('"Controller observed a new Node"', 'node="cp-live"')
                and said("Entering master disruption mode")
            ),
            30,
            "the node lifecycle controller to see cp-live not ready (master disruption mode)",
            interval=0.2,
        )
        live.start()
        dead.register()
        # NodeRestriction: a node may not touch another node.
        other = cp.kubectl("label", "node", "cp-live", "x=y", kubeconfig=dead.kubeconfig, check=False)
        assert other.returncode != 0 and "forbidden" in other.stderr, other.stderr
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "on-dead", "namespace": namespace},
            "spec": {
                "nodeName": "cp-dead",
                "containers": [{"name": "c", "image": "x"}],
                "tolerations": [
                    {
                        "key": "node.kubernetes.io/unreachable",
                        "operator": "Exists",
                        "effect": "NoExecute",
                        "tolerationSeconds": 2,
                    }
                ],
            },
        }
        assert apply(cp, pod).returncode == 0

        def both_ready() -> bool:
            with cp.client() as c:
                nodes = [c.get(f"/api/v1/nodes/{name}").json() for name in ("cp-live", "cp-dead")]
            return all(
                any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
                for n in nodes
            )

        # Both heartbeat and the controller has seen them Ready: it saw cp-dead and left the disruption
        # mode cp-live's first Ready ends.
        wait_for(
            lambda: (
                both_ready()
                and said('"Controller observed a new Node"', 'node="cp-dead"')
                and said("Exiting master disruption mode")
            ),
            30,
            "cp-live and cp-dead Ready, seen by the node lifecycle controller",
            interval=0.2,
        )
        silenced = time.monotonic()
        dead.silence()

        seen: dict[str, Any] = {}

        def tainted() -> dict[str, Any] | None:
            with cp.client() as c:  # polled over HTTP: a kubectl per poll is CPU a loaded machine lacks
                for name in ("cp-dead", "cp-live"):
                    seen[name] = c.get(f"/api/v1/nodes/{name}").json()
            taints = {(t["key"], t["effect"]) for t in seen["cp-dead"]["spec"].get("taints", [])}
            want = {
                ("node.kubernetes.io/unreachable", "NoSchedule"),
                ("node.kubernetes.io/unreachable", "NoExecute"),
            }
            return seen["cp-dead"] if want <= taints else None

        try:
            node = wait_for(
                tainted, 45, "cp-dead tainted unreachable (NoSchedule and NoExecute)", interval=0.5
            )
        except AssertionError as e:
            brief = {n: (d["spec"].get("taints"), d["status"].get("conditions")) for n, d in seen.items()}
            raise AssertionError(
                f"{e}; nodes: {json.dumps(brief)}; agent errors: {live.errors + dead.errors}"
            ) from None
        took = time.monotonic() - silenced
        print(f"cp-dead tainted {took:.1f} s after its last heartbeat")
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("Unknown", "NodeStatusUnknown")
        # The taint eviction controller deletes the pod once its 2 s toleration is over (no kubelet
        # confirms it, so it stays Terminating, as on a real unreachable node).
        wait_for(
            lambda: (
                get_json(cp, "pod", "on-dead", "-n", namespace) or {"metadata": {"deletionTimestamp": "gone"}}
            )["metadata"].get("deletionTimestamp"),
            20,
            "the pod on cp-dead evicted",
            interval=0.2,
        )
        live_node = get_json(cp, "node", "cp-live")
        assert not live_node["spec"].get("taints"), live_node["spec"]
        assert next(c for c in live_node["status"]["conditions"] if c["type"] == "Ready")["status"] == "True"
        assert not live.errors and not dead.errors, live.errors + dead.errors
    finally:
        live.silence()
        dead.silence()
        cp.kubectl("delete", "node", "cp-live", "cp-dead", "--ignore-not-found", "--wait=false", check=False)
        cp.kubectl(
            "delete",
            "pod",
            "on-dead",
            "-n",
            namespace,
            "--force",
            "--grace-period=0",
            "--ignore-not-found",
            check=False,
        )


def test_a_taken_port_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child cannot bind port 0: ports are picked free and a start that fails with EADDRINUSE is
    retried on new ones. Here the first port picked for the apiserver is one we listen on."""
    real = cluster.free_ports
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        calls: list[int] = []

        def rigged(n: int) -> list[int]:
            calls.append(n)
            ports = real(n)
            return [*ports[:2], port, *ports[3:]] if len(calls) == 1 else ports

        monkeypatch.setattr(cluster, "free_ports", rigged)
        with ControlPlane() as cp:
            assert cp.ports is not None and cp.ports.apiserver != port
            assert cp.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"  # its kubeconfig follows
        assert calls == [4, 1]


def test_up_and_down_from_another_process(tmp_path: Path) -> None:
    """`python -m lab controlplane up --detach` returns when ready; `down` from another process stops
    every process and removes the directories."""
    state = tmp_path / "cp.json"
    cmd = [sys.executable, "-m", "lab", "controlplane"]
    up = subprocess.run(
        [*cmd, "up", "--detach", f"--state={state}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    info = read_state(state)
    try:
        assert up.returncode == 0, up.stderr
        assert up.stdout.startswith("controlplane.up url=https://127.0.0.1:"), up.stdout
        assert info is not None and Path(info["kubeconfig"]).exists()
        doc = yaml.safe_load(Path(info["kubeconfig"]).read_text())
        assert doc["clusters"][0]["cluster"]["server"] == info["url"]
        again = subprocess.run(
            [*cmd, "up", f"--state={state}"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            check=False,
        )
        assert again.returncode == 2 and "already up" in again.stderr
    finally:
        down = subprocess.run(
            [*cmd, "down", f"--state={state}"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=120,
            check=False,
        )
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped" in down.stdout
    assert info is not None
    for pid in [info["pid"], *info["pids"].values()]:
        assert (
            not Path(f"/proc/{pid}").exists()
            or "Z" in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
        )
    assert not Path(info["run_dir"]).exists() and not Path(info["data_dir"]).exists()
    assert not state.exists()
    nothing = subprocess.run(
        [*cmd, "down", f"--state={state}"], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False
    )
    assert nothing.returncode == 0 and "running=none" in nothing.stdout
