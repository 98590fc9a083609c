"""Entry point of the IPsec backend (``runtime.Backend``): a ``Keeper`` on the settings' VICI socket."""

from __future__ import annotations

from agent.ipsec.keeper import Keeper, Timing
from agent.runtime import Backend, Health, PlanSource, Secrets, Settings, StatusSink


async def run(
    settings: Settings, plans: PlanSource, secrets: Secrets, sink: StatusSink, health: Health
) -> None:
    timing = Timing(poll_interval=settings.poll_interval, resync_seconds=settings.resync_seconds)
    keeper = Keeper(
        settings.vici_socket, plans, secrets, sink, health, timing=timing, plan_path=settings.plan
    )
    await keeper.run()


_conforms: Backend = run
