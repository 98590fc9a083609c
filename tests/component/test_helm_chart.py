"""The Helm chart, checked with the real helm binary (installed by scripts/setup.sh into .tools/bin).

Its CRDs, the controller's RBAC rules and the monitoring files are generated copies (controller.chartgen:
from controller.api.crds, controller.rbac and monitoring/); these tests fail on drift, so the chart a platform
engineer installs always carries the admission rules the controller validates with and exactly the rights
its code uses.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.chartgen import CLUSTER_ROLE_RULES, COPIES, LEADER_ELECTION_RULES, generated_files
from controller.rbac import cluster_role_rules, leader_election_rules

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "vpngw"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
HELM = shutil.which("helm", path=str(ROOT / ".tools" / "bin")) or shutil.which("helm")
NAMESPACE = "vpngw-system"

PROMETHEUS_OPERATOR = tuple(
    arg
    for kind in ("PrometheusRule", "ServiceMonitor", "PodMonitor")
    for arg in ("--api-versions", f"monitoring.coreos.com/v1/{kind}")
)
"""What a cluster with the Prometheus Operator's CRDs tells helm (``helm template`` knows no cluster)."""
MONITORING_KINDS = {"PrometheusRule", "ServiceMonitor", "PodMonitor"}
CONTROLLER_KINDS = [
    "ClusterRole",
    "ClusterRoleBinding",
    "ConfigMap",
    "Deployment",
    "NetworkPolicy",
    "Role",
    "RoleBinding",
    "Service",
    "ServiceAccount",
]


@pytest.fixture(scope="module")
def helm() -> str:
    if HELM is None:
        pytest.fail("helm is missing: run scripts/setup.sh (it installs helm into .tools/bin)")
    return HELM


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, check=False, cwd=ROOT)


def render(
    helm: str, *args: str, release: str = "vpngw", namespace: str = NAMESPACE, crds: bool = False
) -> list[dict[str, Any]]:
    """``helm template`` of the chart: its documents (the CRDs too with ``crds``)."""
    res = run_helm(
        helm, "template", release, str(CHART), "-n", namespace, *(["--include-crds"] if crds else []), *args
    )
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def _template(helm: str, *args: str) -> list[dict[str, Any]]:
    return render(helm, *args, release="t", namespace="default", crds=True)


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return doc


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: v.name if v else "no-file")
def test_chart_lints_strictly(helm: str, values: Path | None) -> None:
    res = run_helm(helm, "lint", "--strict", str(CHART), *(["-f", str(values)] if values else []))
    assert res.returncode == 0, res.stdout + res.stderr


def test_chart_crds_are_the_generated_ones() -> None:
    generated = subprocess.run(
        [sys.executable, "-m", "controller", "crds"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    shipped = (CHART / "crds" / "vpngw-crds.yaml").read_text()
    assert list(yaml.safe_load_all(shipped)) == list(yaml.safe_load_all(generated)), (
        "helm/vpngw/crds drifted from `python -m controller crds`: run `make chart`"
    )


@pytest.mark.parametrize("path", sorted(generated_files()))
def test_chart_generated_files_are_what_the_generator_writes(path: str) -> None:
    assert (CHART / path).read_text() == generated_files()[path], (
        f"helm/vpngw/{path} drifted from controller.chartgen (controller/rbac.py, controller/api/crds.py): "
        "run `make chart`"
    )


@pytest.mark.parametrize("name", sorted(COPIES))
def test_chart_monitoring_files_are_copies_of_monitoring(name: str) -> None:
    assert (CHART / name).read_bytes() == (ROOT / COPIES[name]).read_bytes(), (
        f"helm/vpngw/{name} drifted from {COPIES[name]}: run `make chart`"
    )


def test_the_rendered_rbac_is_exactly_the_declared_rights(helm: str) -> None:
    """The ClusterRole and the leader-election Role carry controller/rbac.py's rules and nothing else, bound
    to the controller's ServiceAccount; no other RBAC object is rendered (the gateway pods' Roles are the
    controller's to create, per gateway: the former status-agent ClusterRole is gone)."""
    docs = render(helm, *PROMETHEUS_OPERATOR)
    rbac = [d for d in docs if d["apiVersion"].startswith("rbac.authorization.k8s.io/")]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in rbac) == [
        ("ClusterRole", "vpngw-controller"),
        ("ClusterRoleBinding", "vpngw-controller"),
        ("Role", "vpngw-controller-leader-election"),
        ("RoleBinding", "vpngw-controller-leader-election"),
    ]
    assert one(docs, "ClusterRole")["rules"] == cluster_role_rules()
    role = one(docs, "Role")
    assert role["rules"] == leader_election_rules() and role["metadata"]["namespace"] == NAMESPACE
    sa = {"kind": "ServiceAccount", "name": "vpngw-controller", "namespace": NAMESPACE}
    for binding, role_kind, role_name in (
        (one(docs, "ClusterRoleBinding"), "ClusterRole", "vpngw-controller"),
        (one(docs, "RoleBinding"), "Role", "vpngw-controller-leader-election"),
    ):
        assert binding["subjects"] == [sa]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": role_name,
        }
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "vpngw-controller"
    # Each rule's reason travels with it into the rendered manifest.
    rendered = run_helm(helm, "template", "vpngw", str(CHART), "-s", "templates/controller-rbac.yaml").stdout
    assert "# controller.desired: the gateway pod" in rendered
    assert (CHART / CLUSTER_ROLE_RULES).exists() and (CHART / LEADER_ELECTION_RULES).exists()


def test_rendered_chart_carries_crds_rules_and_dashboard_verbatim(helm: str) -> None:
    docs = _template(helm, *PROMETHEUS_OPERATOR)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("CustomResourceDefinition") == 4
    crd_names = {d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"}
    assert {"vpngateways.vpn.bnerd.net", "vpnpeers.vpn.bnerd.net"} <= crd_names
    rule = one(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((ROOT / "monitoring" / "alerts.yml").read_text())
    # Prometheus' own templates must reach Prometheus untouched by Helm.
    descriptions = [r["annotations"]["description"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert any("{{ $labels." in d for d in descriptions)
    dash = one(docs, "ConfigMap", "t-vpngw-dashboard")
    assert json.loads(dash["data"]["vpngw.json"]) == json.loads(
        (ROOT / "monitoring" / "grafana-dashboard.json").read_text()
    )
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_monitoring_objects_can_be_switched_off(helm: str) -> None:
    on = render(helm, *PROMETHEUS_OPERATOR)
    assert {d["kind"] for d in on} >= MONITORING_KINDS
    off = render(
        helm,
        *PROMETHEUS_OPERATOR,
        *("--set", "monitoring.prometheusRule.enabled=false"),
        *("--set", "monitoring.grafanaDashboard.enabled=false"),
        *("--set", "monitoring.serviceMonitor.enabled=false"),
        *("--set", "monitoring.podMonitor.enabled=false"),
    )
    assert sorted({d["kind"] for d in off}) == CONTROLLER_KINDS
    assert [d["metadata"]["name"] for d in off if d["kind"] == "ConfigMap"] == ["vpngw-controller"]


def test_without_the_prometheus_operator_its_objects_are_left_out_and_the_notes_say_so(helm: str) -> None:
    """On a cluster that does not serve monitoring.coreos.com/v1, rendering one of its kinds would fail the
    whole install."""
    docs = _template(helm)
    assert not MONITORING_KINDS & {d["kind"] for d in docs}
    assert "ConfigMap" in {d["kind"] for d in docs}
    res = run_helm(helm, "install", "t", str(CHART), "--dry-run=client")
    assert res.returncode == 0, res.stderr
    notes = res.stdout.split("NOTES:", 1)[1]
    assert "Alerting rules: NOT installed" in notes and "PrometheusRule" in notes
    assert "ServiceMonitor: NOT installed" in notes and "PodMonitor: NOT installed" in notes


def test_the_chart_refuses_a_kubernetes_without_cel_reason_and_field_path(helm: str) -> None:
    old = run_helm(helm, "template", "t", str(CHART), "--kube-version", "1.27.9")
    assert old.returncode != 0 and "kubeVersion" in old.stderr
    assert _template(helm, "--kube-version", "1.28.0")
