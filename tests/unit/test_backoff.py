"""gwkit.backoff (pure): the one capped exponential backoff, and every caller's constants through it."""

from __future__ import annotations

import pytest

from agent.ipsec.link import initiate_backoff, reconnect_backoff
from agent.sink import backoff as sink_backoff
from exporter.sources import backoff as exporter_backoff
from gwkit.backoff import backoff


@pytest.mark.parametrize(
    "failures, base, cap, delay",
    [
        pytest.param(0, 0.25, 5.0, 0.0, id="no-failure-no-wait"),
        pytest.param(-3, 0.25, 5.0, 0.0, id="negative-is-none"),
        pytest.param(1, 0.25, 5.0, 0.25, id="first-is-base"),
        pytest.param(2, 0.25, 5.0, 0.5, id="doubles"),
        pytest.param(5, 0.25, 5.0, 4.0, id="below-cap"),
        pytest.param(6, 0.25, 5.0, 5.0, id="capped"),
        pytest.param(8, 0.2, 30.0, 25.6, id="not-a-power-of-two-cap"),
        pytest.param(9, 0.2, 30.0, 30.0, id="then-capped"),
        pytest.param(1, 1.0, 1.0, 1.0, id="base-equals-cap"),
        pytest.param(1_025, 0.02, 0.25, 0.25, id="past-float-range-of-2**n"),
        pytest.param(10**9, 0.25, 5.0, 5.0, id="a-billion-failures"),
    ],
)
def test_backoff(failures: int, base: float, cap: float, delay: float) -> None:
    assert backoff(failures, base=base, cap=cap) == delay


@pytest.mark.parametrize(
    "base, cap",
    [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0), (1.0, float("inf")), (float("nan"), 1.0)],
    ids=["zero-base", "negative-base", "cap-below-base", "infinite-cap", "nan-base"],
)
def test_nonsense_parameters_are_refused(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match="need 0 < base <= cap"):
        backoff(1, base=base, cap=cap)


def test_it_never_decreases_and_never_exceeds_the_cap() -> None:
    delays = [backoff(n, base=0.02, cap=0.25) for n in range(3000)]
    assert delays == sorted(delays) and max(delays) == 0.25


@pytest.mark.parametrize(
    "delay, first, cap",
    [
        pytest.param(reconnect_backoff, 0.02, 0.25, id="agent-vici-reconnect"),
        pytest.param(initiate_backoff, 1.0, 30.0, id="agent-tunnel-initiate"),
        pytest.param(sink_backoff, 0.2, 30.0, id="agent-kube-status-writer"),
        pytest.param(exporter_backoff, 0.25, 5.0, id="exporter-vici-reconnect"),
    ],
)
def test_every_caller_keeps_its_constants_and_survives_a_long_outage(
    delay: object, first: float, cap: float
) -> None:
    """Each of these grew ``base * 2 ** failures`` by hand: past 1,024 failures in a row (the agent's VICI
    reconnect gets there after ~4 min of charon being down) that raised OverflowError."""
    assert callable(delay)
    assert delay(1) == first
    assert delay(2) == min(cap, 2 * first)
    assert delay(2_000) == cap
