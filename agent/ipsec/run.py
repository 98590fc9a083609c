"""Entry point of the IPsec backend (``runtime.Backend``); being built: see issue 4."""

from __future__ import annotations

from agent.runtime import Health, PlanSource, Secrets, Settings, StatusSink


async def run(
    settings: Settings, plans: PlanSource, secrets: Secrets, sink: StatusSink, health: Health
) -> None:
    raise RuntimeError("the IPsec backend is not built yet")
