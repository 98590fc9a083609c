"""charon's start time wobbles by a second between calls (``since`` = now - uptime in whole seconds,
measured on a live 5.9.8); only a larger jump is a restart. Both the agent and the exporter rely on this."""

from __future__ import annotations

import pytest

from agent.vici.queries import restarted, settle_start


@pytest.mark.parametrize(
    ("previous", "observed", "settled", "is_restart"),
    [
        pytest.param(None, 1000.0, 1000.0, False, id="first-sight"),
        pytest.param(1000.0, 1001.0, 1000.0, False, id="wobble-up"),
        pytest.param(1001.0, 1000.0, 1001.0, False, id="wobble-down"),
        pytest.param(1000.0, 1002.0, 1000.0, False, id="edge-of-wobble"),
        pytest.param(1000.0, 1060.0, 1060.0, True, id="restart"),
        pytest.param(1000.0, None, None, False, id="unparsable"),
    ],
)
def test_settle_start(
    previous: float | None, observed: float | None, settled: float | None, is_restart: bool
) -> None:
    assert settle_start(previous, observed) == settled
    assert restarted(previous, observed) is is_restart


def test_a_wobbling_series_never_looks_like_a_restart() -> None:
    started: float | None = None
    for observed in [1000.0, 1001.0, 1000.0, 1001.0, 1001.0, 1000.0]:
        assert not restarted(started, observed)
        started = settle_start(started, observed)
    assert started == 1000.0
