"""monitoring/: alerting rules checked and unit-tested with Prometheus' own promtool (real binary), and
the Grafana dashboard (valid JSON) referencing only metrics the exporter actually emits."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter.collector import families
from exporter.family import Renderer
from tests.unit.test_exporter_collector import ipsec_snapshot, wg_snapshot

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"
METRIC = re.compile(r"\b((?:strongswan|wireguard)_[a-z_]+)\b")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("promtool")
    assert exe, "promtool (Debian's prometheus package) is required"
    return subprocess.run(
        [exe, *args], cwd=MONITORING, capture_output=True, text=True, timeout=60, check=False
    )


def emitted() -> set[str]:
    names: set[str] = set()
    for snap in (ipsec_snapshot(), wg_snapshot()):
        text = Renderer().render(families(snap)).decode()
        for fam in text_string_to_metric_families(text):
            names |= {s.name for s in fam.samples}
    return names


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
    have = emitted()
    used: set[str] = set()
    for expr in exprs:
        found = set(METRIC.findall(expr))
        assert found, f"panel expression without an exporter metric: {expr}"
        used |= found
    assert used <= have, f"dashboard queries metrics the exporter does not emit: {sorted(used - have)}"
    # The core of the issue's contract is on the dashboard.
    for name in (
        "strongswan_tunnel_up",
        "strongswan_tunnel_bytes_total",
        "wireguard_peer_receive_bytes_total",
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
