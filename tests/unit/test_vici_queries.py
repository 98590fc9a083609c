"""Pure parts of gwkit.vici.queries: merging list-sa events, daemon info and counters parsing."""

from __future__ import annotations

import calendar
import time

import pytest

from gwkit.vici.queries import counters_from, daemon_info_from, merge, parse_since


def test_merge_keys_by_uniqueid_and_keeps_the_conn_name() -> None:
    a = {"uniqueid": "3", "state": "ESTABLISHED", "child-sas": {"c0-7": {"name": "c0"}}}
    b = {"uniqueid": "4", "state": "CONNECTING"}
    out = merge([("s1", a), ("s1", b)])
    assert set(out) == {"3", "4"}
    assert out["3"]["name"] == "s1" and out["3"]["child-sas"] == {"c0-7": {"name": "c0"}}
    assert out["4"]["child-sas"] == {}


def test_merge_joins_children_of_one_ike_sa_listed_in_parts() -> None:
    skeleton = {"uniqueid": "1", "state": "ESTABLISHED", "child-sas": {}}
    part1 = {"uniqueid": "1", "state": "ESTABLISHED", "child-sas": {"c0-1": {}, "c0-9": {}}}
    part2 = {"uniqueid": "1", "state": "ESTABLISHED", "child-sas": {"c1-2": {}}}
    out = merge([("s1", skeleton), ("s1", part1), ("s1", part2)])
    assert sorted(out["1"]["child-sas"]) == ["c0-1", "c0-9", "c1-2"]
    assert skeleton["child-sas"] == {}, "merge must not mutate its input"


def test_daemon_info_from_version_and_stats() -> None:
    version = {
        "daemon": "charon",
        "version": "5.9.8",
        "sysname": "Linux",
        "release": "6.1",
        "machine": "x86_64",
    }
    stats = {
        "uptime": {"running": "3 seconds", "since": "Nov 30 00:17:20 2026"},
        "workers": {"total": "16", "idle": "7"},
        "queues": {"critical": "0", "high": "1", "medium": "2", "low": "0"},
        "scheduled": "42",
        "ikesas": {"total": "5", "half-open": "1"},
        "plugins": ["charon", "vici", "counters"],
    }
    info = daemon_info_from(version, stats)
    assert (info.version, info.ikesas_total, info.ikesas_half_open) == ("5.9.8", 5, 1)
    assert (info.workers_total, info.workers_idle, info.queued_jobs, info.scheduled_jobs) == (16, 7, 3, 42)
    assert "counters" in info.plugins
    assert info.started == time.mktime(time.strptime("Nov 30 00:17:20 2026", "%b %d %H:%M:%S %Y"))


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("Nov 30 00:17:20 2026", calendar.timegm((2026, 11, 30, 0, 17, 20, 0, 0, 0)), id="ok"),
        pytest.param(
            "Feb  3 09:05:01 2025", calendar.timegm((2025, 2, 3, 9, 5, 1, 0, 0, 0)), id="padded-day"
        ),
        pytest.param("3 seconds", None, id="not-a-date"),
        pytest.param("", None, id="empty"),
    ],
)
def test_parse_since(text: str, expected: float | None) -> None:
    assert parse_since(text, utc=True) == expected


@pytest.mark.parametrize(
    "body, expected",
    [
        pytest.param(
            {"counters": {"": {"child-rekey": "3", "invalid": "1"}}},
            {"child-rekey": 3, "invalid": 1},
            id="5.9.8-nested",
        ),
        pytest.param({"counters": {"child-rekey": "2"}}, {"child-rekey": 2}, id="flat"),
        pytest.param({"counters": {}}, {}, id="empty"),
        pytest.param({}, {}, id="missing"),
    ],
)
def test_counters_from(body: dict[str, object], expected: dict[str, int]) -> None:
    assert counters_from(body) == expected
