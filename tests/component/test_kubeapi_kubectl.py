"""Acceptance of the Kubernetes API emulator by the real kubectl 1.35 (and helm template | kubectl apply).

One emulator per module (each test works in its own namespace); kubectl runs as a process with the written
admin kubeconfig and a private discovery cache, exactly as a user would run it. kubectl is installed by
scripts/setup.sh into .tools/bin (a missing binary fails these tests, it never skips them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.api.crds import crds
from lab.kubeapi import KubeAPIThread
from lab.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = shutil.which("kubectl", path=str(ROOT / ".tools" / "bin"))
HELM = shutil.which("helm", path=str(ROOT / ".tools" / "bin"))
WG = {
    "listenPort": 51820,
    "address": "10.99.0.1/24",
    "privateKeySecretRef": {"name": "gw-wg", "key": "privateKey"},
}
FIXTURES = Path(__file__).parent / "kubeapi_fixtures"
PROTOBUF = "application/vnd.kubernetes.protobuf"


class Kubectl:
    def __init__(self, api: KubeAPIThread, cache: Path) -> None:
        if KUBECTL is None:
            pytest.fail("kubectl is missing: run scripts/setup.sh (it installs kubectl into .tools/bin)")
        self.api = api
        self.base = [KUBECTL, "--kubeconfig", str(api.kubeconfig), "--cache-dir", str(cache)]

    def run(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        env: dict[str, str] | None = None,
        timeout: float = 30,
    ) -> subprocess.CompletedProcess[str]:
        p = subprocess.run(
            [*self.base, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
            check=False,
        )
        if check and p.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({p.returncode}): {p.stderr}")
        return p

    def out(self, *args: str, **kw: Any) -> str:
        return self.run(*args, **kw).stdout

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*self.base, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeAPIThread]:
    with KubeAPIThread(kubeconfig=tmp_path_factory.mktemp("kubeapi") / "kubeconfig") as a:
        yield a


@pytest.fixture(scope="module")
def kubectl(api: KubeAPIThread, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    k = Kubectl(api, tmp_path_factory.mktemp("kubectl-cache"))
    crd_file = tmp_path_factory.mktemp("crds") / "crds.yaml"
    crd_file.write_text(yaml.safe_dump_all(list(crds())))
    out = k.out("apply", "-f", str(crd_file))
    assert out.count("created") == 4
    k.run(
        "wait",
        "--for=condition=Established",
        "crd/vpngateways.vpn.bnerd.net",
        "crd/vpnpeers.vpn.bnerd.net",
        "--timeout=20s",
    )
    assert "unchanged" in k.out("apply", "-f", str(crd_file))
    return k


def _ns(kubectl: Kubectl, name: str) -> str:
    assert kubectl.out("create", "namespace", name).strip() == f"namespace/{name} created"
    return name


def _gateway(ns: str, name: str = "gw", **labels: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "vpn.bnerd.net/v1alpha1",
            "kind": "VPNGateway",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"type": "wireguard", "serviceCIDR": "198.18.0.0/24", "wireguard": WG},
        }
    )


def test_apply_custom_resources_create_and_reapply(kubectl: Kubectl) -> None:
    ns = _ns(kubectl, "apply")
    examples = (ROOT / "docs" / "examples" / "wireguard.yaml").read_text().replace("tenant-acme", ns)
    out = kubectl.out("apply", "-f", "-", input=examples)
    assert out.splitlines() == [
        "vpngateway.vpn.bnerd.net/acme-wg created",
        "vpnpeer.vpn.bnerd.net/s1 created",
        "vpnpeer.vpn.bnerd.net/laptop created",
    ]
    rv = kubectl.out("get", "vpngw", "acme-wg", "-n", ns, "-o", "jsonpath={.metadata.resourceVersion}")
    out = kubectl.out("apply", "-f", "-", input=examples)
    assert "vpnpeer.vpn.bnerd.net/s1 unchanged" in out and "vpnpeer.vpn.bnerd.net/laptop unchanged" in out
    # exposures[].ports[].protocol was defaulted by the schema inside a list: kubectl's three-way JSON merge
    # patch then resends the list (as against a real server) and the server finds nothing to change
    assert "vpngateway.vpn.bnerd.net/acme-wg configured" in out
    assert (
        kubectl.out("get", "vpngw", "acme-wg", "-n", ns, "-o", "jsonpath={.metadata.resourceVersion}") == rv
    )
    changed = examples.replace("serviceCIDR: 198.18.0.0/24", "serviceCIDR: 198.18.4.0/24")
    assert "vpngateway.vpn.bnerd.net/acme-wg configured" in kubectl.out("apply", "-f", "-", input=changed)
    assert (
        kubectl.out(
            "get", "vpngw", "acme-wg", "-n", ns, "-o", "jsonpath={.spec.serviceCIDR} {.metadata.generation}"
        )
        == "198.18.4.0/24 2"
    )


def test_get_shows_printer_columns_with_values_from_status(kubectl: Kubectl) -> None:
    ns = _ns(kubectl, "columns")
    kubectl.run("apply", "-f", "-", input=_gateway(ns))
    ready = {
        "type": "Ready",
        "status": "True",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "reason": "Up",
        "message": "up",
    }
    status = json.dumps(
        {
            "status": {
                "nodeName": "node-1",
                "publicIP": "203.0.113.9",
                "conditions": [ready, {**ready, "type": "StandbyReady", "reason": "StandbyReady"}],
                "tunnelsSummary": "1/2 up",
            }
        }
    )
    assert (
        kubectl.out(
            "patch", "vpngateway", "gw", "-n", ns, "--subresource=status", "--type", "merge", "-p", status
        ).strip()
        == "vpngateway.vpn.bnerd.net/gw patched"
    )
    header, row = kubectl.out("get", "vpngateways", "-n", ns).splitlines()
    assert header.split() == ["NAME", "TYPE", "NODE", "PUBLIC", "IP", "READY", "TUNNELS", "AGE"]
    assert row.split()[:7] == ["gw", "wireguard", "node-1", "203.0.113.9", "True", "1/2", "up"]
    header, row = kubectl.out("get", "vpngateways", "-n", ns, "-o", "wide").splitlines()
    assert header.split()[-3:] == ["AGE", "REASON", "STANDBY"] and row.split()[-2:] == ["Up", "True"]


def test_get_all_namespaces_with_a_label_selector(kubectl: Kubectl) -> None:
    a, b = _ns(kubectl, "sel-a"), _ns(kubectl, "sel-b")
    kubectl.run("apply", "-f", "-", input=_gateway(a, "one", tier="edge"))
    kubectl.run("apply", "-f", "-", input=_gateway(b, "two", tier="edge"))
    kubectl.run("apply", "-f", "-", input=_gateway(b, "three", tier="core"))
    rows = kubectl.out("get", "vpngw", "-A", "-l", "tier=edge", "--no-headers").splitlines()
    assert [(r.split()[0], r.split()[1]) for r in rows] == [(a, "one"), (b, "two")]
    rows = kubectl.out("get", "vpngw", "-A", "-l", "tier,tier notin (edge)", "--no-headers").splitlines()
    assert [r.split()[1] for r in rows] == ["three"]


def test_get_watch_prints_a_change(kubectl: Kubectl) -> None:
    """The listing's row first, then, only after the patch, a second row with the change: the watch's."""
    ns = _ns(kubectl, "watch")
    kubectl.run("apply", "-f", "-", input=_gateway(ns))
    proc = kubectl.popen("get", "vpngw", "-n", ns, "-w", "--request-timeout=15s")
    assert proc.stdout is not None
    try:
        header, first = proc.stdout.readline(), proc.stdout.readline()
        kubectl.run(
            "patch",
            "vpngw",
            "gw",
            "-n",
            ns,
            "--subresource=status",
            "--type",
            "merge",
            "-p",
            '{"status":{"nodeName":"watched-node"}}',
        )
        second = proc.stdout.readline()  # empty when the watch ends (the request timeout) without an event
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert header.split()[:2] == ["NAME", "TYPE"], header
    assert first.split()[:2] == ["gw", "wireguard"] and "watched-node" not in first, first
    assert second.split()[:3] == ["gw", "wireguard", "watched-node"], (
        second,
        proc.stderr and proc.stderr.read(),
    )


def test_patch_merge_edit_and_delete_waiting_for_finalizers(kubectl: Kubectl, tmp_path: Path) -> None:
    ns = _ns(kubectl, "edit")
    kubectl.run("apply", "-f", "-", input=_gateway(ns))
    kubectl.run(
        "patch",
        "vpngw",
        "gw",
        "-n",
        ns,
        "--type",
        "merge",
        "-p",
        '{"metadata":{"finalizers":["test.io/hold"]}}',
    )
    editor = tmp_path / "editor.sh"
    editor.write_text("#!/bin/sh\nsed -i 's#serviceCIDR: .*#serviceCIDR: 198.18.9.0/24#' \"$1\"\n")
    editor.chmod(0o755)
    out = kubectl.out(
        "edit", "vpngw", "gw", "-n", ns, env={"EDITOR": str(editor), "KUBE_EDITOR": str(editor)}
    )
    assert out.strip() == "vpngateway.vpn.bnerd.net/gw edited"
    assert (
        kubectl.out("get", "vpngw", "gw", "-n", ns, "-o", "jsonpath={.spec.serviceCIDR}") == "198.18.9.0/24"
    )
    proc = kubectl.popen("delete", "vpngw", "gw", "-n", ns, "--timeout=20s")
    try:
        wait_for(
            lambda: kubectl.out(
                "get", "vpngw", "gw", "-n", ns, "-o", "jsonpath={.metadata.deletionTimestamp}"
            ),
            10,
            "the deletionTimestamp set by kubectl delete",
        )
        assert proc.poll() is None  # kubectl delete waits while the finalizer holds the object
        kubectl.run(
            "patch",
            "vpngw",
            "gw",
            "-n",
            ns,
            "--type",
            "json",
            "-p",
            '[{"op":"remove","path":"/metadata/finalizers"}]',
        )
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert out.strip() == f'vpngateway.vpn.bnerd.net "gw" deleted from {ns} namespace'
    assert "NotFound" in kubectl.run("get", "vpngw", "gw", "-n", ns, check=False).stderr


def test_create_namespace_configmap_and_secret_send_protobuf_which_the_emulator_decodes(
    kubectl: Kubectl, api: KubeAPIThread
) -> None:
    since = api.reset_requests()
    ns = _ns(kubectl, "proto")
    assert (
        kubectl.out(
            "create", "configmap", "cfg", "-n", ns, "--from-literal=mode=lab", "--from-literal=n=1"
        ).strip()
        == "configmap/cfg created"
    )
    assert (
        kubectl.out("create", "secret", "generic", "psk", "-n", ns, "--from-literal=psk=s3cret").strip()
        == "secret/psk created"
    )
    creates = api.requests(verb="create", since=since)
    assert [(r.resource, r.content_type, r.code) for r in creates] == [
        ("namespaces", PROTOBUF, 201),
        ("configmaps", PROTOBUF, 201),
        ("secrets", PROTOBUF, 201),
    ]
    cm = api.get("v1", "ConfigMap", "cfg", ns)
    assert cm is not None and cm["data"] == {"mode": "lab", "n": "1"}
    secret = api.get("v1", "Secret", "psk", ns)
    assert secret is not None and secret["data"] == {"psk": "czNjcmV0"} and secret["type"] == "Opaque"
    # client-go never falls back to JSON for built-in kinds: a kind the emulator cannot decode is a 415
    since = api.reset_requests()
    p = kubectl.run("create", "deployment", "d", "-n", ns, "--image=registry.example/x:1", check=False)
    assert p.returncode != 0 and "the body of the request was in an unknown format" in p.stderr
    assert [(r.content_type, r.code) for r in api.requests(verb="create", since=since)] == [(PROTOBUF, 415)]


def test_get_several_kinds_at_once(kubectl: Kubectl, api: KubeAPIThread) -> None:
    ns = _ns(kubectl, "kinds")
    kubectl.run("create", "configmap", "c1", "-n", ns)
    api.create(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "leader", "namespace": ns},
            "spec": {"holderIdentity": "pod-a"},
        }
    )
    api.create(
        {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": "e1", "namespace": ns},
            "regarding": {"kind": "VPNGateway", "name": "gw"},
            "reason": "Programmed",
            "note": "plan applied",
            "type": "Normal",
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "vpngw",
            "reportingInstance": "vpngw-0",
            "action": "Apply",
        }
    )
    out = kubectl.out("get", "configmaps,secrets,deployments,leases,events", "-n", ns)
    assert "configmap/c1" in out and "lease.coordination.k8s.io/leader" in out and "pod-a" in out
    assert "vpngateway/gw" in out and "plan applied" in out


def test_helm_template_of_a_chart_applies_and_reapplies(kubectl: Kubectl, api: KubeAPIThread) -> None:
    if HELM is None:
        pytest.fail("helm is missing: run scripts/setup.sh")
    ns = _ns(kubectl, "chart")

    def render(*sets: str) -> str:
        args = [
            HELM,
            "template",
            "fx",
            str(FIXTURES / "chart"),
            "--namespace",
            ns,
            *(a for s in sets for a in ("--set", s)),
        ]
        return subprocess.run(args, capture_output=True, text=True, check=True, timeout=30).stdout

    out = kubectl.out("apply", "-f", "-", input=render())
    assert sorted(line.rsplit(" ", 1)[1] for line in out.splitlines()) == ["created"] * 6
    out = kubectl.out("apply", "-f", "-", input=render())
    assert "deployment.apps/fx unchanged" in out and "serviceaccount/fx unchanged" in out
    out = kubectl.out("apply", "-f", "-", input=render("replicas=3", "image=registry.example/fixture:0.2.0"))
    assert "deployment.apps/fx configured" in out
    deploy = api.get("apps/v1", "Deployment", "fx", ns)
    assert deploy is not None and deploy["spec"]["replicas"] == 3 and deploy["metadata"]["generation"] == 2
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example/fixture:0.2.0" and container["env"] == [
        {"name": "MODE", "value": "lab"}
    ]
    assert container["ports"] == [{"containerPort": 8080, "name": "http", "protocol": "TCP"}]
    out = kubectl.out("get", "deploy,netpol,pdb,sa", "-n", ns, "--no-headers")
    assert "networkpolicy.networking.k8s.io/fx" in out and "poddisruptionbudget.policy/fx" in out


def test_apply_server_side_and_dry_run(kubectl: Kubectl, api: KubeAPIThread) -> None:
    ns = _ns(kubectl, "ssa")
    out = kubectl.out("apply", "--server-side", "-f", "-", input=_gateway(ns, tier="edge"))
    assert out.strip() == "vpngateway.vpn.bnerd.net/gw serverside-applied"
    out = kubectl.out("apply", "--server-side", "-f", "-", input=_gateway(ns))
    gw = api.get("vpn.bnerd.net/v1alpha1", "VPNGateway", "gw", ns)
    assert gw is not None and "tier" not in (gw["metadata"].get("labels") or {})  # the manager dropped it
    out = kubectl.out("apply", "--dry-run=server", "-f", "-", input=_gateway(ns, "dry"))
    assert "(server dry run)" in out and api.get("vpn.bnerd.net/v1alpha1", "VPNGateway", "dry", ns) is None


def test_tokens_rbac_and_impersonation_through_kubectl(kubectl: Kubectl, api: KubeAPIThread) -> None:
    ns = _ns(kubectl, "rbac")
    kubectl.run("create", "serviceaccount", "agent", "-n", ns)
    kubectl.run(
        "create",
        "clusterrole",
        "agent-status",
        "--verb=get,patch",
        "--resource=vpngateways.vpn.bnerd.net/status",
    )
    kubectl.run(
        "create",
        "rolebinding",
        "agent",
        "-n",
        ns,
        "--clusterrole=agent-status",
        f"--serviceaccount={ns}:agent",
    )
    kubectl.run("apply", "-f", "-", input=_gateway(ns))
    who = f"system:serviceaccount:{ns}:agent"
    assert (
        kubectl.out(
            "auth",
            "can-i",
            "patch",
            "vpngateways.vpn.bnerd.net",
            "--subresource=status",
            "-n",
            ns,
            f"--as={who}",
        ).strip()
        == "yes"
    )
    assert (
        kubectl.run(
            "auth", "can-i", "delete", "vpngateways.vpn.bnerd.net", "-n", ns, f"--as={who}", check=False
        ).stdout.strip()
        == "no"
    )
    token = kubectl.out("create", "token", "agent", "-n", ns).strip()
    p = kubectl.run("--token", token, "get", "vpngw", "-n", ns, check=False)
    assert (
        p.returncode != 0
        and (
            f'Error from server (Forbidden): vpngateways.vpn.bnerd.net is forbidden: User "{who}" '
            "cannot list resource "
            f'"vpngateways" in API group "vpn.bnerd.net" in the namespace "{ns}"'
        )
        in p.stderr
    )
    out = kubectl.out(
        "--token",
        token,
        "patch",
        "vpngw",
        "gw",
        "-n",
        ns,
        "--subresource=status",
        "--type",
        "merge",
        "-p",
        '{"status":{"nodeName":"n"}}',
    )
    assert out.strip() == "vpngateway.vpn.bnerd.net/gw patched"
    assert "Unauthorized" in kubectl.run("--token", "not-a-token", "get", "ns", check=False).stderr
    assert "Username    kubernetes-admin" in kubectl.out("auth", "whoami")
