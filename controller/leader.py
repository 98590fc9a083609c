"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection does it.

Only the leader reconciles; other replicas keep their caches warm and take over when the leader's
lease runs out. The rules:

* The holder renews every ``retry_period`` seconds (a PUT with the lease's resourceVersion: two
  candidates cannot both win one version).
* A candidate takes the lease only after it has seen the same lease record, unrenewed, for a whole
  ``lease_duration`` on its OWN monotonic clock (the other side's clock is never compared with ours).
* A leader that could not renew for ``renew_deadline`` (< lease_duration), counted from when its last
  successful renewal was SENT, stops leading at once, before anyone else may take over, even while a
  renewal is still in flight: two leaders never act at the same time. It stays a candidate and leads
  again when it can (an API server away for 30 s costs leadership for a while, never the process).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import anyio

from gwkit.kube import Conflict, KubeClient, KubeError, NotFound
from gwkit.kube.client import LEASES

log = logging.getLogger(__name__)


def micro_time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("leader election: need retry_period < renew_deadline < lease_duration")
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._mono = monotonic
        self._wall = wall
        self.leading = False
        self.changed = anyio.Event()
        """Set (and replaced) whenever ``leading`` flips."""
        self._renewed_at: float | None = None
        self._seen: tuple[Any, ...] | None = None
        self._seen_at = 0.0
        self.transitions = 0

    def leads(self) -> bool:
        """Leading, and within the renew deadline of the last renewal sent, by the clock now: never true
        longer than ``leading``, and safe to ask from any thread (the controller's writes and cloud steps
        ask before each one, so a deposed leader whose event loop has not yet noticed writes nothing)."""
        at = self._renewed_at
        return self.leading and at is not None and self._mono() - at < self.renew_deadline

    def _flip(self, leading: bool, why: str) -> None:
        if leading == self.leading:
            return
        self.leading = leading
        self.transitions += 1
        log.info("leader.%s lease=%s/%s identity=%s why=%s", "started" if leading else "stopped",
                 self.namespace, self.name, self.identity, why)  # fmt: skip
        old, self.changed = self.changed, anyio.Event()
        old.set()

    def _spec(self, transitions: int, acquire: str | None = None) -> dict[str, Any]:
        now = micro_time(self._wall())
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_duration),
            "acquireTime": acquire or now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    async def try_acquire_or_renew(self) -> bool:
        try:
            lease = await self.kube.get(LEASES, self.name, self.namespace)
        except NotFound:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(0),
            }
            try:
                await self.kube.create(LEASES, body, self.namespace)
            except Conflict:
                return False
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        record = (holder, spec.get("renewTime"), spec.get("leaseTransitions"))
        now = self._mono()
        if record != self._seen:
            self._seen, self._seen_at = record, now
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            lease["spec"] = self._spec(transitions, spec.get("acquireTime"))
        else:
            duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
            if holder and now - self._seen_at < duration:
                return False  # held, and renewed within its duration as far as we have watched
            lease["spec"] = self._spec(transitions + 1)
        try:
            await self.kube.replace(LEASES, lease, self.namespace)
        except Conflict:
            return False
        return True

    async def run(self) -> None:
        while True:
            ok = False
            started = self._mono()
            # A leader's attempt may not outlast its renew deadline (client-go bounds each renewal the
            # same way): a request hanging for the client's timeout would otherwise keep it leading
            # after a standby took over (found by review).
            budget = self.renew_deadline
            if self.leading and self._renewed_at is not None:
                budget = max(0.0, self._renewed_at + self.renew_deadline - started)
            try:
                with anyio.move_on_after(budget):
                    ok = await self.try_acquire_or_renew()
            except KubeError as exc:
                log.warning("leader.renew_failed lease=%s/%s error=%r", self.namespace, self.name, str(exc))
            now = self._mono()
            if ok:
                # From when the renewal was sent: what others saw of it is no older than that.
                self._renewed_at = started
                self._flip(True, "acquired" if not self.leading else "renewed")
            elif self.leading and (self._renewed_at is None or now - self._renewed_at >= self.renew_deadline):
                self._flip(False, f"not renewed for {self.renew_deadline:g} s")
            elif not ok and self.leading and self._seen and self._seen[0] not in (None, self.identity):
                self._flip(False, f"the lease is held by {self._seen[0]}")
            await anyio.sleep(self.retry_period)

    async def release(self) -> None:
        """Give the Lease up now if we hold it, as client-go's ReleaseOnCancel does (no holder, a duration
        of 1 s): a standby takes over at its next try instead of after the lease runs out (15 s), so a
        rolling update hands over in about a second. Call it only once this replica's work has stopped:
        nothing of ours may write after it. A failure only costs the standby the wait."""
        if not self.leading:
            return
        self._flip(False, "released")
        try:
            with anyio.fail_after(self.renew_deadline):
                lease = await self.kube.get(LEASES, self.name, self.namespace)
                spec = lease.get("spec") or {}
                if spec.get("holderIdentity") != self.identity:
                    return
                now = micro_time(self._wall())
                lease["spec"] = {
                    **spec,
                    "holderIdentity": "",
                    "leaseDurationSeconds": 1,
                    "acquireTime": now,
                    "renewTime": now,
                }
                await self.kube.replace(LEASES, lease, self.namespace)
        except (KubeError, TimeoutError) as exc:
            log.warning("leader.release_failed lease=%s/%s error=%r", self.namespace, self.name, str(exc))
            return
        log.info("leader.released lease=%s/%s identity=%s", self.namespace, self.name, self.identity)


class AlwaysLeader:
    """``--no-leader-elect``: one replica, leading from the start."""

    def __init__(self) -> None:
        self.leading = True
        self.changed = anyio.Event()
        self.identity = "single"

    def leads(self) -> bool:
        return True

    async def run(self) -> None:
        await anyio.sleep_forever()

    async def release(self) -> None:
        return None
