"""``python -m controller diagnose`` as a process against the Kubernetes API emulator (``lab.kubeapi``,
with the CRDs and Multus' NAD CRD installed by ``lab.cluster``; no controller runs: the world is written
as the controller, the status-agent and the kubelet write it). A gateway whose peer's Secret is missing
exits 1 naming it, with no Secret value printed; a healthy-looking one exits 0; kubectl runs it as a
plugin (scripts/kubectl-vpngw)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.names import GatewayKey, selector_labels
from lab.cluster import GATEWAY_NAMESPACE, Cluster, gateway_secret
from tests.examples import example_docs
from tests.unit.test_controller_diagnose import T, cond

ROOT = Path(__file__).resolve().parents[2]
NS = "tenant-acme"
KEY = GatewayKey("VPNGateway", NS, "acme")
VALUE = "lab-only-secret-value"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(tmp_path) as c:
        c.add_node("node-a")
        yield c


def diagnose(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller", "diagnose", "--kubeconfig", str(cluster.kubeconfig), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def set_status(cluster: Cluster, status: dict[str, Any]) -> None:
    cluster.kube.patch(
        "vpn.bnerd.net/v1alpha1", "VPNGateway", "acme", {"status": status}, NS, subresource="status"
    )


def apply_example(cluster: Cluster, *, secrets: list[str]) -> None:
    cluster.apply([gateway_secret(NS, name, {"psk": VALUE}) for name in secrets])
    docs = example_docs("ipsec.yaml")
    s2 = next(d for d in docs if d["metadata"]["name"] == "s2")
    s2["spec"]["ipsec"]["pskSecretRef"] = {"name": "s2-psk", "key": "psk"}  # a key of its own
    cluster.apply(docs)


def test_a_missing_secret_is_named_with_its_fix_and_exits_1(cluster: Cluster) -> None:
    apply_example(cluster, secrets=["acme-psk", "s1-psk"])  # s2-psk is missing
    left_out = (
        "plan sha256:0123456789ab: 1 tunnel(s), 2 grant(s); left out (peer s2): VPNPeer/tenant-acme/s2: "
        "spec.ipsec.pskSecretRef.name: 's2-psk' names Secret s2-psk, which does not exist or is not opted "
        "in for gateways (its owner labels it vpn.bnerd.net/gateway-secret=true): a gateway is never given "
        "a Secret its owner did not mean for one"
    )
    set_status(
        cluster,
        {
            "observedGeneration": 1,
            "conditions": [
                cond("Ready", False, "PartlyRendered", f"ConfigRendered: {left_out}"),
                cond("ConfigRendered", False, "PartlyRendered", left_out),
            ],
        },
    )
    res = diagnose(cluster, "just-a-name")
    assert res.returncode == 2 and "NAMESPACE/NAME" in res.stderr, "usage: a malformed GATEWAY"
    res = diagnose(cluster, f"{NS}/acme")
    assert res.returncode == 1, res.stderr
    first = res.stdout.splitlines()[1]
    assert "SecretMissing" in first and "Secret tenant-acme/s2-psk does not exist" in first, res.stdout
    assert "VPNPeer/s2 spec.ipsec.pskSecretRef" in res.stdout
    assert VALUE not in res.stdout + res.stderr


def healthy_world(cluster: Cluster) -> None:
    apply_example(cluster, secrets=["acme-psk", "s1-psk", "s2-psk"])
    set_status(
        cluster,
        {
            "observedGeneration": 1,
            "nodeName": "node-a",
            "conditions": [
                cond("Ready", True, "Ready", "the gateway serves its plan"),
                cond("ConfigRendered", True, "Rendered", "plan sha256:0123456789ab: 2 tunnel(s), 3 grant(s)"),
                cond("CloudReady", True, "StaticNIC", "NIC2 fa:16:3e:00:00:01 192.0.2.2/26 via 192.0.2.1"),
                cond("PodReady", True, "PodReady", "pod p is ready on node-a"),
            ],
            "tunnels": [
                {"name": "s1", "state": "Established", "lastError": None, "children": []},
                {"name": "s2", "state": "Established", "lastError": None, "children": []},
            ],
            "tunnelsSummary": "2/2 up",
            "agent": {"connected": True, "daemon": "charon-5.9.8", "planHash": "sha256:0", "lastError": None},
        },
    )
    home = KEY.home_name
    cluster.apply(
        [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": home, "namespace": GATEWAY_NAMESPACE},
                "data": {"plan.json": "{}"},
            },
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{home}-7d9f-abcde",
                    "namespace": GATEWAY_NAMESPACE,
                    "labels": selector_labels(KEY),
                },
                "spec": {
                    "nodeName": "node-a",
                    "containers": [
                        {
                            "name": "status-agent",
                            "image": "localhost/vpngw-gateway:0.1.0",
                            "readinessProbe": {"httpGet": {"path": "/readyz", "port": 1}},
                        }
                    ],
                },
            },
        ]
    )
    cluster.kube.patch(
        "v1",
        "Pod",
        f"{home}-7d9f-abcde",
        {
            "status": {
                "phase": "Running",
                "podIP": "127.0.0.1",
                "conditions": [{"type": "Ready", "status": "True"}],
            }
        },
        GATEWAY_NAMESPACE,
        subresource="status",
    )


def test_a_healthy_gateway_exits_0(cluster: Cluster) -> None:
    healthy_world(cluster)
    res = diagnose(cluster, f"VPNGateway/{NS}/acme", "--output", "json")
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert doc["ready"] is True and doc["problems"] is False
    # The agent's /readyz is on 127.0.0.1:1: refused there, and the API server's pod proxy refuses a
    # loopback pod IP (400 "address not allowed"): only a note says so.
    assert [(f["severity"], f["code"]) for f in doc["findings"]] == [("info", "ReadyzUnreachable")]
    assert "address not allowed" in doc["findings"][0]["cause"]


def test_kubectl_runs_it_as_a_plugin(cluster: Cluster, tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl", path=f"{ROOT / '.tools' / 'bin'}:{os.environ.get('PATH', '')}")
    if kubectl is None:
        pytest.fail("kubectl is not installed (scripts/setup.sh puts it in .tools/bin)")
    healthy_world(cluster)
    env = {
        **os.environ,
        "PATH": f"{ROOT / 'scripts'}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "KUBECONFIG": str(cluster.kubeconfig),
        "VPNGW_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
    }
    # Run from a directory holding a package named controller (an unpacked support bundle, say): the
    # plugin must not import it (found by review: `python -m` put the current directory first).
    bundle = tmp_path / "bundle"
    (bundle / "controller").mkdir(parents=True)
    (bundle / "controller" / "__init__.py").write_text("")
    (bundle / "controller" / "__main__.py").write_text("print('HIJACKED')\n")
    res = subprocess.run(
        [kubectl, "vpngw", "diagnose", f"{NS}/acme"],
        capture_output=True, text=True, env=env, timeout=60, cwd=bundle,
    )  # fmt: skip
    assert "HIJACKED" not in res.stdout, "the plugin ran the current directory's controller package"
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no problems found" in res.stdout


def event(ns: str, name: str, about: dict[str, Any], reason: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": ns},
        "involvedObject": {"namespace": ns, **about},
        "reason": reason,
        "message": message,
        "type": "Warning",
        "firstTimestamp": T,
        "lastTimestamp": T,
        "count": 1,
    }


def test_only_events_about_the_gateway_and_its_own_objects_are_read(cluster: Cluster) -> None:
    healthy_world(cluster)
    # Another tenant's gateway, named so its objects' names in the gateway namespace start with this
    # gateway's home_name (vpngw-acme-<digest> -> vpngw-acme-<digest>-<digest>).
    evil = GatewayKey("VPNGateway", "tenant-evil", f"acme-{KEY.home_name.rsplit('-', 1)[1]}")
    assert evil.home_name.startswith(KEY.home_name + "-")
    refusal = (
        f'pods "{evil.home_name}-6b7c8d9f-x" is forbidden: violates PodSecurity "baseline:latest": '
        "non-default capabilities"
    )
    for attack in (
        # In the tenant's namespace: a Job named after the gateway, whose pods fail admission.
        event(NS, "acme.job", {"kind": "Job", "apiVersion": "batch/v1", "name": "acme", "uid": "u-job"},
              "FailedCreate", "Error creating: pods \"acme-x\" is forbidden: exceeded quota: tenant"),
        # In the gateway namespace: the other gateway's ReplicaSet.
        event(GATEWAY_NAMESPACE, "evil.rs",
              {"kind": "ReplicaSet", "apiVersion": "apps/v1", "name": f"{evil.home_name}-6b7c8d9f",
               "uid": "u-evil-rs"}, "FailedCreate", f"Error creating: {refusal}"),
    ):  # fmt: skip
        cluster.apply([attack])
        res = diagnose(cluster, f"{NS}/acme", "--output", "json")
        doc = json.loads(res.stdout)
        assert [f["code"] for f in doc["findings"]] == ["ReadyzUnreachable"], res.stdout
        assert res.returncode == 0, res.stdout + res.stderr

    # This gateway's own Events are still read: the controller's about the gateway (its kind and uid),
    # the kubelet's about its pod (its uid).
    gw = cluster.get("vpn.bnerd.net/v1alpha1", "VPNGateway", "acme", NS)
    home_pod = f"{KEY.home_name}-7d9f-abcde"
    pod = cluster.get("v1", "Pod", home_pod, GATEWAY_NAMESPACE)
    assert gw is not None and pod is not None
    cluster.kube.patch("v1", "Pod", home_pod, {"status": {"phase": "Pending", "conditions": []}},
                       GATEWAY_NAMESPACE, subresource="status")  # fmt: skip
    quota = f'pods "{home_pod}" is forbidden: exceeded quota: gateways'
    set_status(
        cluster,
        {
            "observedGeneration": 1,
            "conditions": [
                cond("Ready", False, "PodNotReady", f"PodReady: pod {home_pod} is Pending"),
                cond("PodReady", False, "PodNotReady", f"pod {home_pod} is Pending"),
            ],
        },
    )
    cluster.apply(
        [
            event(NS, "acme.ours", {"kind": "VPNGateway", "apiVersion": "vpn.bnerd.net/v1alpha1",
                                    "name": "acme", "uid": gw["metadata"]["uid"]},
                  "FailedCreate", f"PodReady: the gateway pod cannot be created: {quota}"),
            event(GATEWAY_NAMESPACE, "acme.pod", {"kind": "Pod", "apiVersion": "v1", "name": home_pod,
                                                  "uid": pod["metadata"]["uid"]},
                  "FailedCreatePodSandBox", "failed to find device with hardware address fa:16:3e:00:00:01"),
        ]
    )  # fmt: skip
    res = diagnose(cluster, f"{NS}/acme", "--output", "json")
    found = {f["code"]: f for f in json.loads(res.stdout)["findings"]}
    assert res.returncode == 1 and {"PodCreateFailed", "PodSandboxFailed"} <= set(found), res.stdout
    assert "exceeded quota: gateways" in found["PodCreateFailed"]["cause"], "the gateway's own Event"
    assert "PodSecurityForbidden" not in found, "the other gateway's ReplicaSet's Event"
    assert "hardware address" in found["PodSandboxFailed"]["cause"]


def test_the_cloud_is_read_with_the_clusters_identity_as_the_controller_tags_it(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--cloud openstack`` in-process, Neutron replaced by the read-only fake of the unit tests holding
    the gateway's port, floating IP and security group tagged as the controller tags them: with the
    cluster's identity (the kube-system namespace's uid, as ``run`` resolves it). Without it diagnose took
    them for another cluster's and said the port was deleted by hand (found by review)."""
    import controller.diagnosecli as cli
    from controller.__main__ import main
    from controller.cloudplan import cluster_tag, tags
    from tests.unit.test_controller_diagnose import ReadOnlyNetwork, inspecting

    healthy_world(cluster)
    kube_system = cluster.get("v1", "Namespace", "kube-system")
    assert kube_system is not None
    uid = kube_system["metadata"]["uid"]
    network = ReadOnlyNetwork([*tags(KEY, "vpngw"), cluster_tag(uid)])
    given: list[str | None] = []

    def openstack_cloud(
        args: Any, instance: str, guard: Any = None, cluster: str | None = None, **kw: Any
    ) -> Any:
        assert guard is not None and guard() is False, "the cloud is read with every write refused"
        given.append(cluster)
        return inspecting(network, cluster)

    monkeypatch.setattr(cli, "openstack_cloud", openstack_cloud)
    monkeypatch.delenv("VPNGW_CLUSTER_ID", raising=False)
    flags = ["--cloud", "openstack", "--os-cloud", "lab", "--gateway-network", "gw-net",
             "--external-network", "public", "--readyz-timeout", "0", "-o", "json"]  # fmt: skip
    argv = ["diagnose", "--kubeconfig", str(cluster.kubeconfig), f"{NS}/acme", *flags]
    assert main(argv) == 0, capsys.readouterr()
    assert given == [uid]
    assert json.loads(capsys.readouterr().out)["findings"] == []
    # --cluster-id, as the controller's, wins; another identity's resources are not this cluster's.
    assert main([*argv, "--cluster-id", "another-cluster"]) == 1
    assert given[-1] == "another-cluster"
    assert [f["code"] for f in json.loads(capsys.readouterr().out)["findings"]] == ["NoPort"]
    assert main([*argv, "--cluster-id", "no,comma"]) == 2, "not a tag: bad usage"


def test_words_from_the_status_are_printed_and_logged_inert(cluster: Cluster) -> None:
    # The status is written by the gateway pod too (its agent relays what peers send): a reason and a
    # message carrying a line of their own and an escape sequence.
    healthy_world(cluster)
    forged = "Forged\nERROR controller.compromised\x1b[2J"
    set_status(
        cluster,
        {
            "observedGeneration": 1,
            "conditions": [
                cond("Ready", False, forged, f"Tunnels: {forged}"),
                cond("Tunnels", False, forged, forged),
            ],
        },
    )
    res = diagnose(cluster, f"{NS}/acme", "--readyz-timeout", "0")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "\x1b" not in res.stdout + res.stderr
    assert not [ln for ln in (res.stdout + res.stderr).splitlines() if ln.startswith("ERROR controller")]
    assert r"1. [error] Forged\nERROR controller.compromised\x1b[2J: Tunnels=False" in res.stdout
    assert r"codes=Forged\nERROR controller.compromised\x1b[2J" in res.stderr
