"""Entry point of the IPsec backend (``runtime.Backend``): a ``Keeper`` on the settings' VICI socket, and
with ``readonly_dir`` the exporter's read-only VICI relay (``relay``) beside it."""

from __future__ import annotations

import anyio

from agent.ipsec import relay
from agent.ipsec.keeper import Keeper, Timing
from agent.runtime import (
    ALWAYS_ACTIVE,
    Backend,
    Health,
    PlanSource,
    RoleSource,
    Secrets,
    Settings,
    StatusSink,
)


async def run(
    settings: Settings,
    plans: PlanSource,
    secrets: Secrets,
    sink: StatusSink,
    health: Health,
    role: RoleSource = ALWAYS_ACTIVE,
) -> None:
    timing = Timing(poll_interval=settings.poll_interval, resync_seconds=settings.resync_seconds)
    keeper = Keeper(
        settings.vici_socket, plans, secrets, sink, health, timing=timing, plan_path=settings.plan, role=role
    )
    if settings.readonly_dir is None:
        await keeper.run()
        return
    async with anyio.create_task_group() as tg:
        tg.start_soon(relay.serve, settings.readonly_dir / relay.SOCKET_NAME, settings.vici_socket)
        await keeper.run()
        tg.cancel_scope.cancel()


_conforms: Backend = run
