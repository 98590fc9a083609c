"""The agent's HA elector (docs/ha.md): the plan's ``ha`` section turned into a ``runtime.RoleSource``
(``active``/``standby``) by contending for the gateway's ``coordination.k8s.io/v1`` Lease in the pod's
namespace. The decisions are ``agent.election``'s (pure; its docstring has the rules and the margins);
this is the loop around them: read the Lease, decide, write it, sleep, and tell the backends and init-nat.

* **One loop, bounded requests.** Each round GETs the Lease, asks ``election.decide`` and, for a take or a
  renewal, PUTs it with the resourceVersion read (``election.lease_update``). Every request runs under
  ``election.request_budget``: below the renew deadline, and for the holder never past its fence
  instant, so a request hanging in a partition cannot keep the loop from fencing; the sleep between rounds
  ends at the fence instant too (``election.next_wait``). The role is re-judged by the clock at the top
  of every round, so a holder cut off from the API turns standby on time by itself.
* **The role.** ``current`` and ``async for role in elector`` (the current role, then each change, never
  the same twice in a row). Each change is also written to ``<live dir>/ha-role`` (``active`` or
  ``standby``, atomically: temp file + rename), which init-nat reads (absent: standby when init-nat's plan
  has ``ha``, active without); it is written once at start too, so a restarted container never leaves an
  old word behind, and a pod serving without HA has said ``active`` there since its start, before its
  live plan (which init-nat reads as well) can gain ``ha``. A write that fails (ENOSPC on a full
  emptyDir) is logged (``ha.role_file_failed``) and retried every round (every ``ROLE_FILE_RETRY``
  seconds without ``ha``); a standby whose write failed truncates the file to empty (init-nat reads that
  as standby), so an old ``active`` never outlives the role.
* **Following the plan.** ``follow(ha)`` (``FollowHa`` calls it for every plan the backend gets): ``ha``
  appearing on a serving pod keeps it active while it takes the free Lease (``Memory.serving``); changed
  timings apply at the next round; another Lease name releases the old one first; ``ha`` gone releases the
  Lease and makes the role ``active``. The controller's duties that follow: it drops ``ha`` only from the
  surviving slot, after the other slot's pod is gone, or two pods would serve; and enabling HA it gives
  slot a's plan ``ha`` (a takes the free Lease) before slot b's pod starts, or b may take the free Lease
  while a still serves without HA (until a's plan has ``ha`` and a reads the Lease: standby at once).
* **Stopping.** Cancelled (SIGTERM), the holder turns standby, writes the role file, then releases the
  Lease (holder emptied, duration 1 s, as client-go's ReleaseOnCancel does), so the standby takes over at
  its next read instead of after the duration. ``release_on_stop = False`` skips that (what a kill does;
  the tests use it).
* **Never created.** An absent Lease is standby, logged (``ha.lease_absent``) and read again every
  ``renewSeconds``: the controller creates it with no holder, and the pod's Role grants only ``get`` and
  ``update`` on that name (RBAC cannot limit ``create`` to a name). For the pod that serves a 404 is a
  failed read (read again at half the period): it stays active until its fence deadline, so a Lease
  deleted under its holder (HA turned off, or by hand) does not terminate every tunnel at once; a Lease
  re-created free meanwhile is taken back by that pod at once and by no other before a whole duration
  (``agent.election``).

Logs: ``ha.promoted``, ``ha.fenced`` (with why), ``ha.standby``, ``ha.released``, ``ha.lease_absent``,
``ha.read_failed``/``ha.write_failed`` (once per reason). The identity and the Lease are named; no token is
ever logged (the client holds it).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from agent import election
from agent.election import Action, Memory, Outcome
from agent.runtime import PlanSource, Role
from gwkit.kube import Conflict, KubeClient, KubeError, NotFound
from gwkit.kube.client import LEASES
from gwplan import Ha, Plan

log = logging.getLogger(__name__)

ROLE_FILE = "ha-role"
"""The role file's name in the live directory (init-nat reads it)."""
ROLE_FILE_RETRY = 1.0
"""Seconds between two tries to write a role file whose write failed, while the plan has no ``ha`` (with
``ha`` every round tries)."""


@dataclass(frozen=True)
class Api:
    """Where the Lease is: the client and the pod's namespace."""

    kube: KubeClient
    namespace: str


Connect = Callable[[], Awaitable[Api]]
"""Gives the API client (built when first needed: a pod without HA may have none)."""


class LeaseElector:
    """The ``RoleSource`` of an HA gateway's pod; ``run()`` until cancelled."""

    def __init__(
        self,
        connect: Connect,
        identity: str,
        ha: Ha | None,
        *,
        role_file: Path | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._connect = connect
        self.identity = identity
        self._mono = monotonic
        self._wall = wall
        self.role_file = role_file
        self.release_on_stop = True
        """False: stop as a killed pod would, keeping the Lease until it expires (tests)."""
        self._ha = ha
        self._role: Role = "standby" if ha is not None else "active"
        self._mem = Memory()
        self._changed = anyio.Event()
        self._configured = anyio.Event()
        self._errors: dict[str, str] = {}
        self._role_file_ok = True
        """The role file says :attr:`current` (False: the last write failed; retried every round and, without
        ``ha``, every ``ROLE_FILE_RETRY`` seconds)."""
        self.changes: deque[tuple[float, Role]] = deque(maxlen=64)
        """Each role change, with its monotonic instant (tests and bench compare them)."""
        self._write_role_file()

    # --- RoleSource ---------------------------------------------------------------------------------

    @property
    def current(self) -> Role:
        return self._role

    async def _iterate(self) -> AsyncIterator[Role]:
        last: Role | None = None
        while True:
            changed = self._changed  # taken before the role is read: a change in between wakes us
            now = self._role
            if now != last:
                last = now
                yield now
                continue
            await changed.wait()

    def __aiter__(self) -> AsyncIterator[Role]:
        return self._iterate()

    # --- the plan -------------------------------------------------------------------------------------

    @property
    def ha(self) -> Ha | None:
        return self._ha

    @property
    def lease_absent(self) -> bool:
        """The last read found no Lease (standby until the controller creates it)."""
        return "absent" in self._errors

    @property
    def memory(self) -> Memory:
        """What the elector remembers now (``renewed_at``: its last successful renewal sent)."""
        return self._mem

    def follow(self, ha: Ha | None) -> None:
        """The plan's ``ha`` now (the loop acts on a change at once)."""
        if ha == self._ha:
            return
        self._ha = ha
        old, self._configured = self._configured, anyio.Event()
        old.set()

    # --- the loop -----------------------------------------------------------------------------------

    async def run(self) -> None:
        api: Api | None = None
        current: Ha | None = None  # the ha the loop works with (follow() changes self._ha)
        try:
            while True:
                wanted = self._ha
                moved = current is not None and (wanted is None or wanted.lease != current.lease)
                if moved and api is not None and current is not None:
                    # ha gone: this pod is the one left (the controller's duty), it serves on. Another
                    # Lease: stand down first, the other pod may take the old one at once.
                    await self._release(api, current, step_down=wanted is not None)
                if wanted is None:
                    if current is not None:
                        log.info("ha.disabled identity=%s lease=%s", self.identity, current.lease)
                    current = None
                    self._mem = Memory()
                    self._set("active", "the plan has no ha")
                    self._retry_role_file()
                    with anyio.move_on_after(math.inf if self._role_file_ok else ROLE_FILE_RETRY):
                        await self._configured.wait()
                    continue
                if current is None or wanted.lease != current.lease:
                    # A pod serving without HA (or another Lease) keeps serving while it takes the new one.
                    self._mem = Memory.serving(self._mono()) if self._role == "active" else Memory()
                    log.info(
                        "ha.following identity=%s lease=%s duration=%ds renew=%gs deadline=%gs",
                        self.identity, wanted.lease, wanted.lease_duration_seconds, wanted.renew_seconds,
                        election.renew_deadline(wanted),
                    )  # fmt: skip
                current = wanted
                if api is None:
                    try:
                        api = await self._connect()
                    except Exception as exc:  # no client (a bad kubeconfig): never the agent's end
                        self._error("connect", _why(exc))
                        self._judge(current)  # a pod serving without HA is fenced at its deadline
                        with anyio.move_on_after(
                            election.next_wait(self._mem, current, self._mono(), "failed")
                        ):
                            await self._configured.wait()
                        continue
                    self._ok("connect")
                wait = await self._round(api, current)
                with anyio.move_on_after(wait):
                    await self._configured.wait()
        finally:
            if api is not None and current is not None and self.release_on_stop:
                with anyio.CancelScope(shield=True):
                    await self._release(api, current)

    def _judge(self, ha: Ha) -> None:
        """Re-judge the role by the clock alone (fencing needs no answer from the API)."""
        now = self._mono()
        self._set(election.role(self._mem, ha, now), election.role_why(self._mem, ha, now))

    async def _round(self, api: Api, ha: Ha) -> float:
        """One read (and maybe one write); returns the seconds until the next."""
        self._judge(ha)
        self._retry_role_file()
        try:
            with anyio.fail_after(election.request_budget(self._mem, ha, self._mono())):
                lease: dict[str, Any] | None = await api.kube.get(LEASES, ha.lease, api.namespace)
        except NotFound:
            lease = None
        except (KubeError, TimeoutError) as exc:
            self._error("read", _why(exc))
            self._judge(ha)
            return election.next_wait(self._mem, ha, self._mono(), "failed")
        self._ok("read")
        if lease is None and "absent" not in self._errors:
            log.warning(
                "ha.lease_absent identity=%s lease=%s/%s role=%s: %s (the agent never creates it); "
                "reading again every %gs",
                self.identity, api.namespace, ha.lease, self._role,
                "serving until its deadline, as after a failed read" if self._role == "active"
                else "standby until the controller creates it",
                ha.renew_seconds,
            )  # fmt: skip
            self._errors["absent"] = "absent"
        elif lease is not None:
            self._errors.pop("absent", None)
        step = election.decide(
            self._mem, None if lease is None else election.view(lease), self.identity, ha, self._mono()
        )
        self._mem = step.memory
        self._set(step.role, step.why)
        if lease is None:  # for a holder a failed read: tried again at half the period
            return election.next_wait(self._mem, ha, self._mono(), "failed")
        if step.action not in ("take", "renew"):
            return election.next_wait(self._mem, ha, self._mono())
        outcome = await self._write(api, ha, lease, step.action)
        return election.next_wait(self._mem, ha, self._mono(), outcome)

    async def _write(self, api: Api, ha: Ha, lease: dict[str, Any], action: Action) -> Outcome:
        body = election.lease_update(lease, action, self.identity, ha, self._wall())
        sent = self._mono()
        outcome: Outcome
        try:
            with anyio.fail_after(election.request_budget(self._mem, ha, sent)):
                await api.kube.replace(LEASES, body, api.namespace)
            outcome = "ok"
            self._ok("write")
        except Conflict:
            outcome = "conflict"
        except (KubeError, TimeoutError) as exc:
            outcome = "failed"
            self._error("write", _why(exc))
        step = election.settle(self._mem, action, outcome, sent, ha, self._mono())
        self._mem = step.memory
        self._set(step.role, step.why)
        return outcome

    async def _release(self, api: Api, ha: Ha, *, step_down: bool = True) -> None:
        """Standby first (the backends stop serving), then the Lease given up: never the other order.
        ``step_down`` False: the plan dropped ``ha`` and this pod serves on without it."""
        if step_down:
            self._set("standby", "stopping")
        self._mem = Memory()
        try:
            with anyio.fail_after(election.renew_deadline(ha)):
                lease = await api.kube.get(LEASES, ha.lease, api.namespace)
                if election.release(election.view(lease), self.identity) != "release":
                    return
                body = election.lease_update(lease, "release", self.identity, ha, self._wall())
                await api.kube.replace(LEASES, body, api.namespace)
        except (KubeError, TimeoutError) as exc:
            # The standby then waits for the Lease to expire instead: slower, never unsafe.
            log.warning("ha.release_failed identity=%s lease=%s error=%r", self.identity, ha.lease, _why(exc))
            return
        log.info("ha.released identity=%s lease=%s/%s", self.identity, api.namespace, ha.lease)

    # --- telling -------------------------------------------------------------------------------------

    def _set(self, role: Role, why: str) -> None:
        if role == self._role:
            return
        was, self._role = self._role, role
        self.changes.append((self._mono(), role))
        lease = self._ha.lease if self._ha is not None else "-"
        if role == "active":
            log.info("ha.promoted identity=%s lease=%s why=%r", self.identity, lease, why)
        elif was == "active" and why.startswith("not renewed"):
            log.warning("ha.fenced identity=%s lease=%s why=%r", self.identity, lease, why)
        else:
            log.info("ha.standby identity=%s lease=%s why=%r", self.identity, lease, why)
        self._write_role_file()
        old, self._changed = self._changed, anyio.Event()
        old.set()

    def _write_role_file(self) -> None:
        """The role to the role file, atomically (temp file + rename). When that fails (ENOSPC on a full
        emptyDir, EROFS, ...) a standby never leaves an old ``active`` behind: the file is truncated to
        empty (created empty if absent), which init-nat reads as standby (fail closed), and the write is
        retried (:meth:`_retry_role_file`). An active pod whose write failed leaves the file as it is and
        retries: init-nat may stand by meanwhile, which is safe."""
        if self.role_file is None:
            return
        tmp = self.role_file.with_name(f".{self.role_file.name}.tmp")
        try:
            self.role_file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(self._role + "\n")
            tmp.chmod(0o644)
            tmp.replace(self.role_file)
        except OSError as exc:
            self._role_file_ok = False
            with contextlib.suppress(OSError):  # a half-written temp file holds the space that was missing
                tmp.unlink(missing_ok=True)
            reason = _why(exc)
            if self._role == "standby":
                try:
                    fd = os.open(self.role_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.close(fd)
                except OSError as again:
                    reason += f"; emptying it failed too: {_why(again)}"
                else:
                    reason += "; emptied it (init-nat stands by)"
            self._error("role_file", f"role={self._role}: {reason}")
            return
        self._role_file_ok = True
        self._ok("role_file")

    def _retry_role_file(self) -> None:
        if not self._role_file_ok:
            self._write_role_file()

    def _error(self, what: str, reason: str) -> None:
        if self._errors.get(what) != reason:
            self._errors[what] = reason
            log.warning("ha.%s_failed identity=%s error=%r", what, self.identity, reason)

    def _ok(self, what: str) -> None:
        if self._errors.pop(what, None) is not None:
            log.info("ha.%s_ok identity=%s", what, self.identity)


def _why(exc: BaseException) -> str:
    """An error for the log (a timeout's message is empty); never a credential: the client's errors name
    the method, path and status only."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class FollowHa:
    """Passes plans through and tells the elector each one's ``ha`` before the backend sees the plan (the
    plan stream is the backend's: this tees it)."""

    def __init__(self, inner: PlanSource, elector: LeaseElector) -> None:
        self._inner = inner
        self._elector = elector

    @property
    def last_error(self) -> str | None:
        return self._inner.last_error

    async def _iterate(self) -> AsyncIterator[Plan]:
        async for plan in self._inner:
            self._elector.follow(plan.ha)
            yield plan

    def __aiter__(self) -> AsyncIterator[Plan]:
        return self._iterate()
