"""Fakes of the runtime seams (``agent.runtime``), next to the Protocols they stand in for, so mypy keeps
them in step. Used by the backends' component tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from agent.runtime import PlanSource, StatusSink
from gwplan import Plan


class StaticPlans:
    """A PlanSource that yields the given plans, then waits forever (a plan file nobody changes)."""

    def __init__(self, *plans: Plan) -> None:
        self.plans = plans
        self.last_error: str | None = None

    async def _it(self) -> AsyncIterator[Plan]:
        for p in self.plans:
            yield p
        await anyio.sleep_forever()

    def __aiter__(self) -> AsyncIterator[Plan]:
        return self._it()


@dataclass
class ListSink:
    """A StatusSink that records every status published to it."""

    published: list[dict[str, Any]] = field(default_factory=list)

    async def publish(self, status: Mapping[str, Any]) -> None:
        self.published.append(dict(status))


_plans: PlanSource = StaticPlans()
_sink: StatusSink = ListSink()
