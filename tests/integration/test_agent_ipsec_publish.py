"""Counters-only status changes are published at most once per resync interval, against live charon.

One site is up with traffic through it (its counters move every poll); another site is offline (its
remote charon has no configuration, so every initiation fails), which makes the keeper list SAs every
poll to retry it. Before, each of those listings published the up tunnel's new counters (every poll,
only bounded by the Kubernetes writer's 2 s floor). The keeper runs in-process with a recording sink.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from agent.fakes import ListSink
from agent.ipsec.keeper import Timing
from agent.ipsec.status import significant_change
from lab.world import Lab
from tests.integration.test_agent_ipsec import start_ping
from tests.integration.test_agent_ipsec_clock import Step, running

pytestmark = [pytest.mark.lab, pytest.mark.anyio]


@dataclass
class TimedSink(ListSink):
    at: list[float] = field(default_factory=list)

    async def publish(self, status: Mapping[str, Any]) -> None:
        self.at.append(time.monotonic())
        await super().publish(status)


async def test_an_offline_site_does_not_make_every_poll_a_counters_write(lab: Lab, tmp_path: Path) -> None:
    timing = Timing(poll_interval=0.1, resync_seconds=2.0)
    sink = TimedSink()
    async with running(lab, tmp_path, Step(), timing, sites=2, offline=1, sink=sink) as r:
        up = next(iter(r.established()))
        site = next(h for h in lab.sites if h.role == up)
        ping = start_ping(lab, site.lan_host)
        try:
            first = len(sink.published)
            await anyio.sleep(7)  # ~70 polls, each one listing SAs while the offline site is retried
        finally:
            ping.terminate()
            ping.wait(timeout=5)
        docs, at = sink.published[first - 1 :], sink.at[first - 1 :]
        counters_only = [
            at[i] - at[i - 1] for i in range(1, len(docs)) if not significant_change(docs[i - 1], docs[i])
        ]
        bytes_out = [next(t for t in d["tunnels"] if t["name"] == up)["bytesOut"] for d in docs]
        assert bytes_out[-1] > bytes_out[0], "traffic moved the counters"
        assert counters_only, "the counters were published"
        interval = timing.resync_seconds - timing.poll_interval
        assert min(counters_only) >= interval - 0.05, counters_only
        assert len(counters_only) <= 7 / interval + 1, counters_only
        offline = next(t for t in docs[-1]["tunnels"] if t["name"] != up)
        assert offline["state"] != "Established" and r.keeper.cycles == 1
