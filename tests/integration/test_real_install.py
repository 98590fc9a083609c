"""The chart and the controller against the REAL control plane (kube-apiserver and kube-controller-manager
v1.35, lab.controlplane), the way a platform engineer installs it and a tenant uses it:

* ``helm install`` of the chart (static cloud values) into the real API server: the real schema checks,
  RBAC objects, the gateway namespace with its Pod Security labels;
* the controller runs as a process from the Deployment that landed (``pod_process``) with a TokenRequest
  token of the chart's ServiceAccount, so the real authoriser judges every request and RBAC's escalation
  check the gateway pods' Roles it writes (in the gateway namespace and in the tenant's);
* a tenant applies docs/examples/ipsec.yaml in a namespace enforcing Pod Security ``restricted``: the
  gateway reconciles; the real ReplicaSet controller makes the gateway pod from the controller's
  Deployment in the gateway namespace (PodSecurity admits it there: ``privileged``), pinned to the one
  VPN node (a ``NodeAgent`` heart-beats it);
* deleting the CR removes its objects (the finalizer); ``helm uninstall`` removes the release.

No kubelet runs the pod (it stays Pending): what this tier adds over the emulator's is the real server's
verdict on every object and request (docs/controlplane.md).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.api.crds import crds
from lab.cluster import MANIFESTS, ROOT, Controller, secrets_for
from lab.controlplane import ControlPlane
from lab.controlplane.nodeagent import NodeAgent
from lab.wait import wait_for
from tests.component.test_helm_chart import (
    CHART,
    NAMESPACE,
    chart_with_values,
    defaults_of_0_1_0,
    helm,
    run_helm,
)
from tests.component.test_helm_install import GATEWAYS, STATIC_VALUES, spawn_controller
from tests.helpers import condition, tenant_namespace

__all__ = ["helm"]  # the fixture

pytestmark = pytest.mark.lab

TENANT = "tenant-acme"  # the example's namespace, with a static NIC in STATIC_VALUES
NODE = "vpn-a"
EXAMPLE = ROOT / "docs" / "examples" / "ipsec.yaml"
INSTALL_DOC = ROOT / "docs" / "install.md"
VALUES = ("-f", str(STATIC_VALUES), "--set", f"tenants.namespaces={{{TENANT}}}")
GATEWAY_CRD = "vpngateways.vpn.bnerd.net"


def get(cp: ControlPlane, *args: str) -> Any:
    res = cp.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(res.stdout) if res.returncode == 0 else None


@pytest.fixture
def node(controlplane: ControlPlane) -> Iterator[NodeAgent]:
    agent = NodeAgent(controlplane, NODE, interval=0.5)
    agent.register()
    # Not the kubelet's to set (NodeRestriction refuses node-role labels from a node): the admin's.
    controlplane.kubectl("label", "node", NODE, "node-role.kubernetes.io/vpn=")
    yield agent
    agent.silence()
    controlplane.kubectl("delete", "node", NODE, "--wait=false", check=False)


@pytest.fixture
def installed(controlplane: ControlPlane, helm: str, node: NodeAgent, tmp_path: Path) -> Iterator[Path]:
    """The release installed as docs/install.md says (the tenant namespace opted in and restricted
    first, Multus' NAD CRD served); yields the chart ServiceAccount's kubeconfig. Removes everything it
    made, the CRDs included, on every exit path."""
    cp = controlplane
    admin = str(cp.kubeconfig)
    tenant_namespace(cp, TENANT)
    try:
        # The CRDs exist already, made by kubectl apply: as an older release's crds/ left them, and as
        # other tests on this session's control plane do. docs/install.md's adoption hands them over.
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(crds()))
        adopt_crds_as_documented(cp)
        res = run_helm(
            helm,
            "install",
            "vpngw",
            str(CHART),
            "--kubeconfig",
            admin,
            "-n",
            NAMESPACE,
            "--create-namespace",
            *VALUES,
        )
        assert res.returncode == 0, res.stderr
        yield cp.service_account_kubeconfig(NAMESPACE, "vpngw-controller", path=tmp_path / "sa.kubeconfig")
    finally:
        run_helm(helm, "uninstall", "vpngw", "--kubeconfig", admin, "-n", NAMESPACE, "--wait")
        # No kubelet confirms a gateway pod's deletion: what one would do, so that the namespaces go
        # before the next test installs into them again (the control plane lives for the session).
        cp.kubectl("delete", "pods", "--all", "-n", GATEWAYS, "--grace-period=0", "--force", check=False)
        for ns in (TENANT, GATEWAYS, NAMESPACE):
            cp.kubectl("delete", "namespace", ns, "--ignore-not-found", "--timeout=90s", check=False)
        for crd in crds():  # helm uninstall keeps them (helm.sh/resource-policy: keep)
            name = crd["metadata"]["name"]
            cp.kubectl("delete", "crd", name, "--timeout=30s", "--ignore-not-found", check=False)
        cp.kubectl(
            "delete", "-f", str(MANIFESTS / "network-attachment-definition.yaml"), "--wait=false", check=False
        )


def adopt_crds_as_documented(cp: ControlPlane) -> None:
    """Runs docs/install.md's loop that hands CRDs made outside Helm to the release (the one shell
    block with ``kubectl label crd``), with this control plane's kubectl and admin kubeconfig."""
    text = INSTALL_DOC.read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```sh\n")[1:]]
    (block,) = [b for b in blocks if "kubectl label crd" in b]
    loop = block[block.index("for crd in") : block.index("done") + len("done")]
    assert {c["metadata"]["name"] for c in crds()} <= set(loop.replace(";", " ").split()), (
        "the docs' loop misses a CRD"
    )
    env = {
        **os.environ,
        "PATH": f"{cp.kubectl_path.parent}:{os.environ['PATH']}",
        "KUBECONFIG": str(cp.kubeconfig),
    }
    res = subprocess.run(
        ["bash", "-euc", loop], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert res.returncode == 0, res.stderr


def start_controller(cp: ControlPlane, kubeconfig: Path, root: Path) -> Controller:
    """``python -m controller`` with the args and env of the Deployment the chart made, as its pod would
    run it, against the real API server with the ServiceAccount's token."""
    deployment = get(cp, "deployment", "vpngw-controller", "-n", NAMESPACE)
    assert deployment is not None

    def source(kind: str, name: str) -> Mapping[str, Any] | None:
        return get(cp, kind.lower(), name, "-n", NAMESPACE)  # type: ignore[no-any-return]

    return spawn_controller(deployment, source, kubeconfig, root, "controller")


def waiting(ctl: Controller, cp: ControlPlane, cond: Any, timeout: float, what: str) -> Any:
    """``wait_for``, failing with the controller's log and the CR as they are at the deadline."""
    try:
        return wait_for(cond, timeout, what)
    except AssertionError as exc:
        gw = get(cp, "vpngateway", "acme", "-n", TENANT)
        status = json.dumps((gw or {}).get("status"), indent=1)
        raise AssertionError(f"{exc}\nCR status: {status}\ncontroller log:\n{ctl.log()[-6000:]}") from None


def owned(cp: ControlPlane, kind: str, namespace: str) -> list[dict[str, Any]]:
    doc = get(cp, kind, "-n", namespace, "-l", "vpn.bnerd.net/gateway=acme")
    return list(doc["items"]) if doc else []


def test_the_chart_and_the_controller_on_the_real_control_plane(
    controlplane: ControlPlane, helm: str, installed: Path, tmp_path: Path
) -> None:
    cp = controlplane
    gw_ns = get(cp, "namespace", GATEWAYS)
    assert gw_ns is not None, "the chart makes the gateway namespace"
    assert gw_ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"

    ctl = start_controller(cp, installed, tmp_path)
    try:
        wait_for(lambda: ctl.ready() or ctl.proc.poll() is not None, 60, "the controller to be ready")
        assert ctl.proc.poll() is None, ctl.log()

        docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(secrets_for(docs)))
        applied = cp.kubectl("apply", "-f", str(EXAMPLE), check=False)
        assert applied.returncode == 0, applied.stderr

        def reconciled() -> dict[str, Any] | None:
            gw = get(cp, "vpngateway", "acme", "-n", TENANT) or {}
            ok = all(condition(gw, t).get("status") == "True" for t in ("ConfigRendered", "CloudReady"))
            return gw if ok and owned(cp, "deployments", GATEWAYS) else None

        gw = waiting(ctl, cp, reconciled, 60, "the gateway reconciled")
        assert gw["status"]["nodeName"] == NODE and gw["status"]["publicIP"] == "203.0.113.10"
        assert gw["metadata"]["finalizers"], "the controller's finalizer"

        # Everything the controller wrote, accepted by the real server: RBAC's escalation check passed
        # for the pod's Roles (they grant get on the tenant's Secrets and the plan ConfigMap).
        for kind in ("configmaps", "serviceaccounts", "roles", "rolebindings", "networkpolicies"):
            assert owned(cp, kind, GATEWAYS), f"no {kind} in {GATEWAYS}"
        assert owned(cp, "network-attachment-definitions.k8s.cni.cncf.io", GATEWAYS)
        tenant_roles = owned(cp, "roles", TENANT)
        assert tenant_roles and owned(cp, "rolebindings", TENANT)
        granted = {
            (r, n)
            for role in tenant_roles
            for rule in role["rules"]
            for r in rule["resources"]
            for n in rule.get("resourceNames") or ["*"]
        }
        assert ("secrets", "*") not in granted, "the pod may read only the Secrets its plan names"
        assert any(r == "secrets" for r, _ in granted)

        # The real ReplicaSet controller made the gateway pod; PodSecurity (privileged in the gateway
        # namespace) admitted it; it is pinned to the VPN node. No kubelet runs it: Pending.
        def pod() -> dict[str, Any] | None:
            pods = owned(cp, "pods", GATEWAYS)
            return pods[0] if pods else None

        def failed_create() -> str:
            rs = get(cp, "replicasets", "-n", GATEWAYS) or {"items": []}
            return json.dumps([c for r in rs["items"] for c in r.get("status", {}).get("conditions", [])])

        try:
            p = waiting(ctl, cp, pod, 60, "the ReplicaSet controller's gateway pod")
        except AssertionError as exc:
            raise AssertionError(f"ReplicaSets' conditions: {failed_create()}\n{exc}") from None
        assert p["spec"]["nodeName"] == NODE
        assert p["spec"]["automountServiceAccountToken"] is False
        assert not owned(cp, "pods", TENANT), "nothing of the gateway runs in the tenant's namespace"
        assert condition(get(cp, "vpngateway", "acme", "-n", TENANT), "PodReady").get("status") == "False"

        # Deleting the CR: the finalizer removes its objects in both namespaces, then the CR goes.
        cp.kubectl("delete", "vpngateway", "acme", "-n", TENANT, "--wait=false")
        waiting(ctl, cp, lambda: get(cp, "vpngateway", "acme", "-n", TENANT) is None, 60, "the CR deleted")
        for kind in ("deployments", "configmaps", "roles", "networkpolicies"):
            waiting(ctl, cp, lambda k=kind: not owned(cp, k, GATEWAYS), 30, f"{kind} in {GATEWAYS} removed")
        # The tenant's Role and RoleBinding go with the CR through their ownerReference: the garbage
        # collector's work, once its discovery (resynced every 30 s) knows the CR's kind.
        for kind in ("roles", "rolebindings"):
            waiting(ctl, cp, lambda k=kind: not owned(cp, k, TENANT), 90, f"{kind} in {TENANT} removed")
        assert ctl.proc.poll() is None, ctl.log()
    finally:
        code = ctl.stop(signal.SIGTERM)
        assert code == 0, f"the controller exited {code} on SIGTERM:\n{ctl.log()[-4000:]}"

    upgrade_changes_the_crds_and_uninstall_keeps_them(cp, helm, tmp_path)


def upgrade_changes_the_crds_and_uninstall_keeps_them(cp: ControlPlane, helm: str, tmp_path: Path) -> None:
    """The CRDs are templates: ``helm upgrade`` to a chart whose VPNGateway CRD changed serves the change
    (Helm never upgrades a chart's crds/); ``helm uninstall`` keeps every CRD (helm.sh/resource-policy).
    That upgrade is ``--reuse-values`` from a release whose values lack every key added since chart 0.1.0
    (``crds``, ``logFormat``, ...): it renders them with their defaults, the CRDs included."""
    admin = str(cp.kubeconfig)
    older = chart_with_values(tmp_path, defaults_of_0_1_0())
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    crds_template = chart / "templates" / "crds.yaml"
    old, new = "description: An IPsec or WireGuard VPN gateway.\n", "description: A VPN gateway, upgraded.\n"
    text = crds_template.read_text()
    assert text.count(old) == 1, "the test's CRD edit no longer applies: pick another"
    crds_template.write_text(text.replace(old, new))
    # The release as chart 0.1.0's defaults would have it (no crds, logFormat, ... in its values).
    to_older = ("upgrade", "vpngw", str(older), "--kubeconfig", admin, "-n", NAMESPACE, *VALUES)
    res = run_helm(helm, *to_older)
    assert res.returncode == 0, res.stderr
    upgrade = ("upgrade", "vpngw", str(chart), "--kubeconfig", admin, "-n", NAMESPACE, "--reuse-values")
    # The CRDs were kubectl-applied, then adopted (the fixture): the first upgrade that changes them forces
    # the fields kubectl's field manager held, as docs/install.md says. Without it the real server refuses.
    refused = run_helm(helm, *upgrade)
    assert refused.returncode != 0 and "conflict" in refused.stderr, refused.stderr
    res = run_helm(helm, *upgrade, "--force-conflicts")
    assert res.returncode == 0, res.stderr
    container = get(cp, "deployment", "vpngw-controller", "-n", NAMESPACE)["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert "--log-format=text" in container["args"]
    crd = get(cp, "crd", GATEWAY_CRD)
    assert (
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] == "A VPN gateway, upgraded."
    )
    assert crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == "vpngw"  # the release owns it
    explained = cp.kubectl("explain", "vpngateways", check=False)  # what the API server publishes (OpenAPI)
    wait_for(
        lambda: "A VPN gateway, upgraded." in cp.kubectl("explain", "vpngateways", check=False).stdout,
        30,
        f"the upgraded description served by kubectl explain (first: {explained.stdout[:200]!r})",
    )

    res = run_helm(helm, "uninstall", "vpngw", "--kubeconfig", admin, "-n", NAMESPACE, "--wait")
    assert res.returncode == 0, res.stderr
    kept = {c["metadata"]["name"] for c in crds() if get(cp, "crd", c["metadata"]["name"]) is not None}
    assert kept == {c["metadata"]["name"] for c in crds()}, "helm uninstall deleted a CRD"
