"""Fakes of the runtime seams (``agent.runtime``), next to the Protocols they stand in for, so mypy keeps
them in step. Used by the backends' component tests."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from agent.runtime import PlanSource, Role, RoleSource, StatusSink
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


class ManualRole:
    """A hand-flipped ``RoleSource``: it stands in for ``agent.ha``'s elector (the Lease contender). Like
    the elector, it writes the role file init-nat follows (atomic rename), when given one, before the
    backend hears of the change."""

    def __init__(self, role: Role, role_file: Path | None = None) -> None:
        self._role: Role = role
        self._changed = anyio.Event()
        self.role_file = role_file
        self._write()

    def _write(self) -> None:
        if self.role_file is not None:
            tmp = self.role_file.with_name(f".{self.role_file.name}.tmp")
            tmp.write_text(f"{self._role}\n")
            os.replace(tmp, self.role_file)

    @property
    def current(self) -> Role:
        return self._role

    def set(self, role: Role) -> None:
        if role == self._role:
            return
        self._role = role
        self._write()
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def _iterate(self) -> AsyncIterator[Role]:
        seen = self._role
        yield seen
        while True:
            changed = self._changed
            if self._role != seen:
                seen = self._role
                yield seen
                continue
            await changed.wait()

    def __aiter__(self) -> AsyncIterator[Role]:
        return self._iterate()


_role: RoleSource = ManualRole("active")
