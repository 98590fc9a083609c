"""initnat.report: the status document init-nat writes for the status-agent. Pure."""

from __future__ import annotations

import json
from ipaddress import IPv4Address

from gwplan import Grant
from initnat import report
from initnat.rules import Kept, LeftOut


def test_what_is_in_force_and_what_was_left_out_and_why() -> None:
    ghost = LeftOut(
        field="nat.exposures[2].targetHost",
        exposure="ghost",
        vip=IPv4Address("198.18.0.12"),
        reason="nonexistent.invalid does not resolve: [Errno -2] Name or service not known",
        host="nonexistent.invalid",
        grants=(
            Grant("s3", "ghost", "exposure", ("203.0.113.32/28",), 0x40000),
            Grant("s1", "ghost", "exposure", ("203.0.113.0/28",), 0x10000),
        ),
    )
    own = LeftOut(
        "nat.exposures[0].targetAddress",
        "web",
        IPv4Address("198.18.0.10"),
        "192.0.2.2 is the pod's own address",
    )
    doc = report.document(
        plan_hash="sha256:ab",
        left_out=[ghost, own],
        kept=[Kept("api.example", IPv4Address("192.0.2.70"), "no answer within 2 s")],
    )
    assert doc == {
        "version": "initnat-status/v1",
        "planHash": "sha256:ab",
        "leftOut": [
            {
                "exposure": "web",
                "field": "nat.exposures[0].targetAddress",
                "virtualIp": "198.18.0.10",
                "reason": "192.0.2.2 is the pod's own address",
                "grants": [],
            },
            {
                "exposure": "ghost",
                "field": "nat.exposures[2].targetHost",
                "virtualIp": "198.18.0.12",
                "host": "nonexistent.invalid",
                "reason": "nonexistent.invalid does not resolve: [Errno -2] Name or service not known",
                "grants": [{"peer": "s1", "mark": "0x10000"}, {"peer": "s3", "mark": "0x40000"}],
            },
        ],
        "keptTargets": [{"host": "api.example", "address": "192.0.2.70", "reason": "no answer within 2 s"}],
        "lastError": None,
    }
    assert json.loads(report.render(doc)) == doc
    assert report.render(doc) == report.render(
        report.document(
            plan_hash="sha256:ab",
            left_out=[own, ghost],
            kept=[Kept("api.example", IPv4Address("192.0.2.70"), "no answer within 2 s")],
        )
    ), "same state, same bytes"


def test_nothing_applied_yet_and_a_failure() -> None:
    doc = report.document(plan_hash=None, last_error="rejected: plan: cannot read /x: No such file")
    assert doc["planHash"] is None and doc["leftOut"] == [] and doc["lastError"].startswith("rejected: ")


def test_a_reverse_exposure_left_out_says_so() -> None:
    dup = LeftOut(
        "nat.reverseExposures[0].virtualIp",
        "db",
        IPv4Address("198.18.0.11"),
        "198.18.0.11 is already the virtual IP of nat.exposures[1]",
        kind="reverse",
    )
    (entry,) = report.document(plan_hash="sha256:ab", left_out=[dup])["leftOut"]
    assert entry["kind"] == "reverse" and entry["field"] == "nat.reverseExposures[0].virtualIp"


def test_what_init_nat_could_do_about_ipv6() -> None:
    assert "ipv6" not in report.document(plan_hash=None), "not tried: not said"
    assert report.document(plan_hash=None, ipv6=report.Ipv6("guarded"))["ipv6"] == {"state": "guarded"}
    unguarded = report.Ipv6("unguarded", "ip6tables-nft-save: No such file or directory")
    assert report.document(plan_hash=None, ipv6=unguarded)["ipv6"] == {
        "state": "unguarded",
        "reason": "ip6tables-nft-save: No such file or directory",
    }
