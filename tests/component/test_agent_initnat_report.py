"""What init-nat left out reaches the CR's status (``status.initNat``) through the status-agent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from agent.sink import FileStatusSink, WithInitNat, init_nat_report

LEFT = {
    "version": "initnat-status/v1",
    "planHash": "sha256:x",
    "leftOut": [
        {"exposure": "db", "field": "nat.exposures[0].targetHost", "virtualIp": "198.18.0.7",
         "host": "db.invalid", "reason": "db.invalid does not resolve", "grants": [{"peer": "s1", "mark": 1}]}
    ],
    "keptTargets": [],
    "lastError": None,
}  # fmt: skip


@pytest.mark.parametrize(
    ("doc", "report"),
    [
        pytest.param(
            LEFT, {"leftOut": [{"exposure": "db", "reason": "db.invalid does not resolve"}]}, id="left-out"
        ),
        pytest.param({**LEFT, "leftOut": []}, None, id="nothing-to-say"),
        pytest.param(
            {"leftOut": [], "lastError": "rejected: bad"},
            {"leftOut": [], "lastError": "rejected: bad"},
            id="error",
        ),
        pytest.param("not an object", None, id="garbage"),
        pytest.param(
            {"leftOut": [{"exposure": "p", "kind": "reverse", "reason": "virtual IP taken"}]},
            {"leftOut": [{"exposure": "p", "reason": "virtual IP taken", "kind": "reverse"}]},
            id="reverse",
        ),
        pytest.param(
            {"leftOut": [], "ipv6": {"state": "unguarded", "reason": "no ip6tables"}},
            {"leftOut": [], "ipv6": {"state": "unguarded", "reason": "no ip6tables"}},
            id="ipv6-unguarded",
        ),
        pytest.param({"leftOut": [], "ipv6": {"state": "guarded"}}, None, id="ipv6-guarded"),
    ],
)
def test_the_report_says_only_what_a_tenant_needs(doc: Any, report: dict[str, Any] | None) -> None:
    assert init_nat_report(doc) == report


def test_the_status_carries_init_nats_report_and_survives_its_absence(tmp_path: Path) -> None:
    out = tmp_path / "status.json"
    initnat = tmp_path / "initnat-status.json"
    sink = WithInitNat(FileStatusSink(out), initnat)

    async def publish() -> dict[str, Any]:
        await sink.publish({"tunnels": []})
        return dict(json.loads(out.read_text()))

    assert anyio.run(publish) == {"tunnels": [], "initNat": None}, "no file yet: nothing to report"
    initnat.write_text(json.dumps(LEFT))
    assert anyio.run(publish)["initNat"]["leftOut"][0]["exposure"] == "db"
    initnat.write_text("{broken")
    # null, not absent: the CR's status is merge-patched, so only a null takes the old report off it
    assert anyio.run(publish)["initNat"] is None
