"""The exporter's view of the pod's HA role (``exporter.service.is_standby``, pure) and the gauge it makes
(``vpngw_ha_standby``, ``exporter.collector.families``)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from exporter.collector import Snapshot, SnapshotCollector, families
from exporter.family import Renderer
from exporter.service import is_standby


@pytest.mark.parametrize(
    "data, standby, complaint",
    [
        pytest.param(None, False, None, id="absent-is-active"),
        pytest.param(b"active\n", False, None, id="active"),
        pytest.param(b"standby\n", True, None, id="standby"),
        pytest.param(b" standby", True, None, id="standby-blanks"),
        pytest.param(b"", False, "neither active nor standby: ''", id="empty-counts-active"),
        pytest.param(b"Standby\n", False, "neither active nor standby: 'Standby'", id="case-matters"),
        pytest.param(b"passive", False, "neither active nor standby: 'passive'", id="garbage-counts-active"),
        pytest.param(b"x" * 40, False, f"neither active nor standby: {'x' * 32!r}...", id="long-cut"),
        pytest.param(b"\xff\xfe", False, "neither active nor standby: '\ufffd\ufffd'", id="binary"),
    ],
)
def test_what_the_role_file_says(data: bytes | None, standby: bool, complaint: str | None) -> None:
    assert is_standby(data) == (standby, complaint)


@pytest.mark.parametrize("standby, value", [(True, 1.0), (False, 0.0)])
def test_the_gauge(standby: bool, value: float) -> None:
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: Snapshot(ha_standby=standby)))
    assert registry.get_sample_value("vpngw_ha_standby") == value
    text = Renderer().render(families(Snapshot(ha_standby=standby))).decode()
    assert f"# TYPE vpngw_ha_standby gauge\nvpngw_ha_standby {value:g}\n" in text


def test_no_role_file_no_gauge() -> None:
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: Snapshot()))
    assert registry.get_sample_value("vpngw_ha_standby") is None
