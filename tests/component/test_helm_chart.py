"""The Helm chart, checked with the real helm binary (installed by scripts/setup.sh into .tools/bin).

Its CRDs and monitoring files are generated copies; these tests fail on drift, so the chart a platform
engineer installs always carries the admission rules the controller validates with.
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

from agent.sink import plural

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "vpngw"
HELM = shutil.which("helm", path=str(ROOT / ".tools" / "bin")) or shutil.which("helm")


@pytest.fixture(scope="module")
def helm() -> str:
    if HELM is None:
        pytest.fail("helm is missing: run scripts/setup.sh (it installs helm into .tools/bin)")
    return HELM


def _template(helm: str, *args: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [helm, "template", "t", str(CHART), "--include-crds", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_chart_lints_strictly(helm: str) -> None:
    res = subprocess.run([helm, "lint", "--strict", str(CHART)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


def test_chart_crds_are_the_generated_ones() -> None:
    generated = subprocess.run(
        [sys.executable, "-m", "controller", "crds"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    shipped = (CHART / "crds" / "vpngw-crds.yaml").read_text()
    assert list(yaml.safe_load_all(shipped)) == list(yaml.safe_load_all(generated)), (
        "helm/vpngw/crds drifted from `python -m controller crds`: run `make chart`"
    )


@pytest.mark.parametrize("name", ["alerts.yml", "grafana-dashboard.json"])
def test_chart_monitoring_files_are_copies_of_monitoring(name: str) -> None:
    assert (CHART / "files" / name).read_bytes() == (ROOT / "monitoring" / name).read_bytes(), (
        f"helm/vpngw/files/{name} drifted from monitoring/{name}: run `make chart`"
    )


PROMETHEUS_OPERATOR = ("--api-versions", "monitoring.coreos.com/v1/PrometheusRule")
"""What a cluster with the Prometheus Operator's CRDs tells helm (``helm template`` knows no cluster)."""


def test_rendered_chart_carries_crds_rules_and_dashboard_verbatim(helm: str) -> None:
    docs = _template(helm, *PROMETHEUS_OPERATOR)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("CustomResourceDefinition") == 4
    crd_names = {d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"}
    assert {"vpngateways.vpn.bnerd.net", "vpnpeers.vpn.bnerd.net"} <= crd_names
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["spec"] == yaml.safe_load((ROOT / "monitoring" / "alerts.yml").read_text())
    # Prometheus' own templates must reach Prometheus untouched by Helm.
    descriptions = [r["annotations"]["description"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert any("{{ $labels." in d for d in descriptions)
    (dash,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert json.loads(dash["data"]["vpngw.json"]) == json.loads(
        (ROOT / "monitoring" / "grafana-dashboard.json").read_text()
    )
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_monitoring_objects_can_be_switched_off(helm: str) -> None:
    docs = _template(
        helm,
        "--set",
        "monitoring.prometheusRule.enabled=false",
        "--set",
        "monitoring.grafanaDashboard.enabled=false",
    )
    assert sorted({d["kind"] for d in docs}) == ["ClusterRole", "CustomResourceDefinition"]


def test_without_the_prometheus_operator_the_rule_is_left_out_and_the_notes_say_so(helm: str) -> None:
    """On a cluster that does not serve PrometheusRule, rendering one would fail the whole install."""
    docs = _template(helm)
    assert "PrometheusRule" not in {d["kind"] for d in docs}
    assert "ConfigMap" in {d["kind"] for d in docs}
    res = subprocess.run(
        [helm, "install", "t", str(CHART), "--dry-run=client"], capture_output=True, text=True, check=True
    )
    notes = res.stdout.split("NOTES:", 1)[1]
    assert "Alerting rules: NOT installed" in notes and "PrometheusRule" in notes


def test_the_chart_refuses_a_kubernetes_without_cel_reason_and_field_path(helm: str) -> None:
    old = subprocess.run(
        [helm, "template", "t", str(CHART), "--kube-version", "1.27.9"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert old.returncode != 0 and "kubeVersion" in old.stderr
    assert _template(helm, "--kube-version", "1.28.0")


def test_the_gateway_status_role_grants_exactly_the_agents_status_patch(helm: str) -> None:
    """``agent --kube-status`` patches ``<plural(kind)>/status`` of its gateway (agent/sink.py); the role
    must cover each gateway kind's CRD, and nothing more."""
    docs = _template(helm)
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}  # fmt: skip
    gateways = [
        d
        for d in docs
        if d["kind"] == "CustomResourceDefinition" and d["spec"]["names"]["kind"].endswith("Gateway")
    ]
    assert len(gateways) == 2
    wanted = set()
    for crd in gateways:
        kind = crd["spec"]["names"]["kind"]
        assert plural(kind) == crd["spec"]["names"]["plural"], (
            f"the agent would patch the wrong plural for {kind}"
        )
        wanted.add((crd["spec"]["group"], f"{plural(kind)}/status", "patch"))
    assert granted == wanted
    off = _template(helm, "--set", "gatewayStatusRole.enabled=false")
    assert "ClusterRole" not in {d["kind"] for d in off}
