"""monitoring/: alerting rules checked and unit-tested with Prometheus' own promtool (real binary), every
alert's runbook section present in docs/runbooks.md, and the Grafana dashboard (valid JSON) referencing
only metrics the exporter and the controller actually emit."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controller import ha
from controller.names import GatewayKey
from controller.run import Metrics
from controller.workqueue import WorkQueue
from exporter.collector import Snapshot, families
from exporter.family import Renderer
from gwkit.kube.client import PODS
from tests.unit.test_exporter_collector import ipsec_snapshot, wg_snapshot

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "monitoring"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
METRIC = re.compile(r"\b((?:strongswan|wireguard|vpngw)_[a-z_]+)\b")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("promtool")
    assert exe, "promtool (Debian's prometheus package) is required"
    return subprocess.run(
        [exe, *args], cwd=MONITORING, capture_output=True, text=True, timeout=60, check=False
    )


def emitted() -> set[str]:
    names: set[str] = set()
    for snap in (ipsec_snapshot(), wg_snapshot(), Snapshot(ha_standby=True)):
        text = Renderer().render(families(snap)).decode()
        for fam in text_string_to_metric_families(text):
            names |= {s.name for s in fam.samples}
    return names


def controller_emitted() -> set[str]:
    """The sample names of the controller's /metrics, with every labelled family touched once."""
    m = Metrics(process=False)
    m.watch_queue(WorkQueue[GatewayKey]())
    m.reconciles.labels("error").inc()
    m.gateways.labels("False").set(1)
    m.writes.labels("patch").inc()
    m.api_error(PODS, RuntimeError())
    m.api_request("get", "pods", "200", 0.01)
    m.cloud_call("network.create_port", 0.1, RuntimeError())
    m.relisted(PODS)
    m.ha(
        [
            ha.Sample(ha.FAILOVERS_TOTAL, "inc", 1.0, (("reason", "LeaseExpired"),)),
            ha.Sample(ha.FAILOVER_SECONDS, "observe", 2.5),
        ]
    )
    text = generate_latest(m.registry).decode()
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


def alerts() -> list[dict[str, object]]:
    return [r for g in yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"] for r in g["rules"]]


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces to '-'."""
    out = set()
    for line in markdown.splitlines():
        if m := re.match(r"#{1,6}\s+(.*?)\s*$", line):
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-"))
    return out


def test_every_alert_has_a_runbook_section() -> None:
    have = anchors(RUNBOOKS.read_text())
    rules = alerts()
    assert len(rules) >= 13
    for r in rules:
        url = r["annotations"].get("runbook_url", "")  # type: ignore[attr-defined]
        path, _, anchor = str(url).partition("#")
        assert path == "docs/runbooks.md" and anchor, f"{r['alert']}: runbook_url {url!r}"
        assert anchor in have, f"{r['alert']}: docs/runbooks.md has no section #{anchor}"
    assert "vpncontrollernoleader" in have and "missing-section" not in have


def test_the_controller_alerts_cover_the_issue_and_use_emitted_metrics() -> None:
    (group,) = [g for g in yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"]
                if g["name"] == "vpngw-controller"]  # fmt: skip
    rules = {r["alert"]: r for r in group["rules"]}
    assert {
        "VpnControllerAbsent",
        "VpnControllerNoLeader",
        "VpnGatewaysNotReady",
        "VpnControllerReconcileErrors",
        "VpnControllerCloudErrors",
        "VpnGatewayRepeatedFailovers",
    } <= set(rules)
    assert rules["VpnControllerNoLeader"]["for"] == "1m"
    have = controller_emitted()
    for name, r in rules.items():
        used = set(METRIC.findall(r["expr"]))
        assert used and used <= have, f"{name}: {used - have} not emitted by the controller"


def test_promtool_checks_the_rules() -> None:
    res = promtool("check", "rules", "alerts.yml")
    assert res.returncode == 0, res.stdout + res.stderr
    ours = sum(len(g["rules"]) for g in yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"])
    assert ours >= 8 and f"SUCCESS: {ours} rules found" in res.stdout


def test_promtool_unit_tests_the_rules() -> None:
    res = promtool("test", "rules", "alerts_test.yml")
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_alert_covers_the_issue_and_uses_emitted_metrics() -> None:
    rules = yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"][0]["rules"]
    names = {r["alert"] for r in rules}
    assert {
        "VpnTunnelDown",
        "WireGuardHandshakeStale",
        "VpnTunnelRekeyOverdue",
        "VpnDaemonRestarted",
    } <= names
    assert {"VpnGatewayDaemonUnreachable", "VpnGatewayWireGuardUnreachable"} <= names
    have = emitted()
    for r in rules:
        used = set(METRIC.findall(r["expr"]))
        assert used and used <= have, f"{r['alert']}: {used - have} not emitted by the exporter"


def _exprs(dashboard: dict[str, object]) -> list[str]:
    out: list[str] = []
    for panel in dashboard["panels"]:  # type: ignore[attr-defined]
        out += [t["expr"] for t in panel.get("targets", [])]
    out += [a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a]  # type: ignore[index]
    return out


def test_dashboard_is_valid_json_and_queries_only_emitted_metrics() -> None:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    exprs = _exprs(dashboard)
    assert len(exprs) >= 25
    have = emitted() | controller_emitted()
    used: set[str] = set()
    for expr in exprs:
        found = set(METRIC.findall(expr))
        assert found, f"panel expression without an exporter or controller metric: {expr}"
        used |= found
    assert used <= have, f"dashboard queries metrics nobody emits: {sorted(used - have)}"
    # The core of the issue's contract is on the dashboard.
    for name in (
        "strongswan_tunnel_up",
        "strongswan_tunnel_bytes_total",
        "wireguard_peer_receive_bytes_total",
        "vpngw_controller_reconcile_total",
        "vpngw_controller_queue_depth",
        "vpngw_controller_api_request_duration_seconds_bucket",
        "vpngw_controller_openstack_errors_total",
    ):
        assert name in used


@pytest.mark.parametrize("bogus", ["strongswan_tunnel_bytes", "wireguard_peer_rx_bytes_total"])
def test_the_emitted_check_would_catch_a_wrong_name(bogus: str) -> None:
    assert bogus not in emitted()


def test_the_instance_picker_lists_wireguard_only_gateways_too() -> None:
    """A WireGuard gateway's exporter emits no strongswan_up: a picker built on it hid those gateways."""
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    (var,) = [v for v in dashboard["templating"]["list"] if v["name"] == "instance"]
    assert {"strongswan_up", "wireguard_up"} <= set(METRIC.findall(var["definition"]))
