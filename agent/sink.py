"""Where the agent's status goes: a JSON file, or the owning CR's status subresource (both backends).

``FileStatusSink`` writes the status atomically (temp file in the same directory + rename) and only when
its content changed. ``KubeStatusSink`` never blocks its caller: ``publish`` only records the latest status
and wakes a writer task (``run``), which merge-patches ``.../<plural>/<name>/status`` through the
project's Kubernetes client (``gwkit.kube``). Statuses published while a write is in flight are coalesced
(latest wins); conflicts and transient errors (409, 429, 5xx, connection errors) are retried with
backoff, always with the newest status. The Kubernetes call itself sits behind the small ``StatusApi``
Protocol: ``KubeStatusApi`` is the real one, ``FakeStatusApi`` (next to it) is an in-memory fake that
scripts conflicts and failures in zero time (the real one is tested against the API emulator).

Warm-standby HA (docs/ha.md): both pods of a pair write the same CR and the same VPNPeers, so the API
writers follow the pod's role through one ``StatusGate``: they write only while the role is ``active``.
While standby they keep the latest status (``due`` says ``hold``) and write it the moment the pod is
promoted, whether or not it changed since (another pod wrote the CR in between). The role is read at the
instant a write starts (``RoleSource.current``: no write starts after the elector went standby), and a
fence cancels the writes in flight (``StatusGate.follow`` hears of it at the next turn of the event
loop). What a cancel cannot undo: bytes the API server already received (it may still apply them). Such
a write was sent while this pod was active, which by the elector's rules (``agent.election``) is at
least its margin (0.5 s or more) before any other pod may turn active, so it lands before the new
active's first write unless the network holds it longer than that. Without HA (``ALWAYS_ACTIVE``) the
gate is always open and nothing changes. The status file and the logs are not gated.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import anyio
import anyio.abc

from agent.peerstatus import peer_statuses
from agent.runtime import ALWAYS_ACTIVE, Role, RoleSource, StatusSink
from gwkit.backoff import backoff as _backoff
from gwkit.kube import ApiError, KubeClient, KubeError, Resource
from gwplan import GatewayRef

log = logging.getLogger(__name__)
PERSISTENT = 10
"""Consecutive failed status writes (about 3 minutes of backoff) after which each one is an ERROR."""

Sleep = Callable[[float], Awaitable[None]]


def render(status: Mapping[str, Any]) -> bytes:
    """Canonical JSON of a status (pure): equal statuses give equal bytes."""
    return json.dumps(status, sort_keys=True, indent=2, ensure_ascii=False).encode() + b"\n"


class FileStatusSink:
    """Writes the status as JSON to ``path``: temp file + rename, and only when it changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._last: bytes | None = None
        self.writes = 0
        self.error: str | None = None
        """The last write failure (full disk, read-only volume...); None once a write succeeds."""

    async def publish(self, status: Mapping[str, Any]) -> None:
        """Never raises: a status that cannot be written must not take the tunnels down with it. The
        failure is logged once per distinct error and the write retried on the next publish."""
        data = render(status)
        if data == self._last:
            return
        try:
            await anyio.to_thread.run_sync(_atomic_write, self.path, data)
        except OSError as exc:
            error = f"{exc.strerror or exc} ({self.path})"
            if error != self.error:
                log.error("status.write_failed path=%s error=%r", self.path, exc.strerror or str(exc))
            self.error = error
            return
        if self.error is not None:
            log.info("status.write_recovered path=%s", self.path)
        self.error = None
        self._last = data
        self.writes += 1


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# --- Kubernetes ---------------------------------------------------------------------------------------


class StatusWriteError(Exception):
    """Writing the status failed. ``retry``: whether the same write can succeed later."""

    def __init__(self, message: str, *, retry: bool, conflict: bool = False) -> None:
        super().__init__(message)
        self.retry = retry
        self.conflict = conflict


class StatusApi(Protocol):
    async def patch_status(self, gateway: GatewayRef, status: Mapping[str, Any]) -> None:
        """Merge-patch ``{"status": status}`` into the CR's status subresource (raises StatusWriteError)."""
        ...


class KubeStatusApi:
    """``StatusApi`` over the project's Kubernetes client (``gwkit.kube``, async, in-cluster config)."""

    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube

    async def patch_status(self, gateway: GatewayRef, status: Mapping[str, Any]) -> None:
        group, _, version = gateway.api_version.partition("/")
        if not version:
            raise StatusWriteError(
                f"gateway.apiVersion {gateway.api_version!r}: expected group/version", retry=False
            )
        res = Resource(group, version, plural(gateway.kind), gateway.kind)
        try:
            await self._kube.patch(
                res, gateway.name, {"status": dict(status)}, gateway.namespace, subresource="status"
            )
        except ApiError as exc:
            # A 403 is retried as soon as a failed write is: the gateway's Role and binding are written
            # with its pod, and kube-apiserver's RBAC authorizer sees them only once its informers have
            # (a moment, longer under load); the 10 s of a write that cannot succeed would hold the first
            # status back that long (tests/component/test_rbac_propagation.py).
            raise StatusWriteError(
                f"HTTP {exc.code} {exc.reason}",
                retry=exc.retryable or exc.code == 403,
                conflict=exc.code == 409,
            ) from None
        except KubeError as exc:  # no answer: the API server may come back
            raise StatusWriteError(str(exc), retry=True) from None


def plural(kind: str) -> str:
    """``VPNGateway`` -> ``vpngateways`` (our CRDs use the default lower-case plural)."""
    return kind.lower() + "s"


@dataclass
class FakeStatusApi:
    """In-memory ``StatusApi`` that scripts resourceVersion conflicts and failures (a FAKE, for unit tests).

    Each write reads the object's resourceVersion and writes it back incremented; ``conflicts`` writes
    by "someone else" (e.g. the controller updating conditions) land in between and make that many
    patches fail with 409, as the API server's optimistic concurrency would. ``failures`` are other
    errors raised first (e.g. a 503).
    """

    conflicts: int = 0
    failures: list[StatusWriteError] = field(default_factory=list)
    resource_version: int = 1
    status: dict[str, Any] = field(default_factory=dict)
    writes: list[dict[str, Any]] = field(default_factory=list)
    attempts: int = 0

    async def patch_status(self, gateway: GatewayRef, status: Mapping[str, Any]) -> None:
        self.attempts += 1
        if self.failures:
            raise self.failures.pop(0)
        seen = self.resource_version
        if self.conflicts:
            self.conflicts -= 1
            self.resource_version += 1  # another writer got in first
        if seen != self.resource_version:
            raise StatusWriteError("HTTP 409 Conflict", retry=True, conflict=True)
        self.resource_version += 1
        self.status = {**self.status, **json.loads(json.dumps(status))}
        self.writes.append(dict(self.status))


_conforms_api: StatusApi = FakeStatusApi()


def backoff(failures: int, base: float = 0.2, cap: float = 30.0) -> float:
    """Seconds to wait after ``failures`` consecutive failed writes (pure): 0.2 s doubling to 30 s."""
    return _backoff(failures, base=base, cap=cap)


Due = Literal["idle", "hold", "write"]


def due(latest: bytes | None, written: bytes | None, role: Role) -> Due:
    """What a status writer does now (pure). ``written``: what it wrote in the role's current active term
    (None after a fence: what the CR holds since is not ours to know). Nothing new: ``idle``; something new
    while standby: ``hold`` it (written on promotion); while active: ``write``."""
    if latest is None or latest == written:
        return "idle"
    return "write" if role == "active" else "hold"


class StatusGate:
    """The pod's role as the API status writers see it: one per agent, shared by the gateway's writer and
    every VPNPeer's. ``follow()`` runs in a task; ``role.current`` is read when a write starts."""

    def __init__(self, role: RoleSource = ALWAYS_ACTIVE) -> None:
        self.role = role
        self.term = 0
        """Counts the fences seen: what a writer wrote before the last one is not what the CR holds now
        (the other pod wrote it meanwhile). A fence and a promotion both come through ``follow`` long
        before another pod can have written: a takeover takes the Lease's duration."""
        self._seen: Role = role.current
        self.waiting: set[anyio.Event] = set()
        """Writers waiting for news: set at every role change (a promotion may make them write)."""
        self._writing: set[anyio.CancelScope] = set()

    @property
    def open(self) -> bool:
        return self.role.current == "active"

    @property
    def in_flight(self) -> int:
        """Writes running now (each cancelled by a fence)."""
        return len(self._writing)

    def changed(self, role: Role) -> None:
        """The role is now ``role``: a fence cancels the writes in flight; every waiting writer looks
        again."""
        if role == self._seen:
            return
        self._seen = role
        if role != "active":
            self.term += 1
            for scope in list(self._writing):
                scope.cancel()
        waiting, self.waiting = self.waiting, set()
        for event in waiting:
            event.set()

    async def follow(self) -> None:
        async for role in self.role:
            self.changed(role)

    @contextmanager
    def writing(self) -> Iterator[anyio.CancelScope]:
        """A scope for one write, cancelled if the pod is fenced while it runs."""
        with anyio.CancelScope() as scope:
            self._writing.add(scope)
            try:
                yield scope
            finally:
                self._writing.discard(scope)


class KubeStatusSink:
    """``runtime.StatusSink`` for the CR's status subresource; start ``run()`` in a task group."""

    def __init__(
        self,
        gateway: GatewayRef,
        api: StatusApi,
        *,
        sleep: Sleep = anyio.sleep,
        min_interval: float = 2.0,
        gate: StatusGate | None = None,
    ) -> None:
        self.gateway = gateway
        self._api = api
        self._sleep = sleep
        self.gate = gate or StatusGate()
        """Writes only while the pod is active (warm-standby HA); without HA always open."""
        self.min_interval = min_interval
        """Seconds between two successful writes: a tunnel flapping or counters moving every poll must
        not turn into a PATCH (and a watch event for every controller) twice a second. Latest wins."""
        self._latest: bytes | None = None
        self._written: bytes | None = None
        self._written_term = -1
        self._wake: anyio.Event | None = None  # created in the running loop
        self.failures = 0
        self.last_error: str | None = None
        self.held = False
        """A status is held back because the pod is standby."""

    async def publish(self, status: Mapping[str, Any]) -> None:
        data = render(status)
        if data == self._latest:
            return
        self._latest = data
        if self._wake is not None:
            self._wake.set()

    def _due(self) -> Due:
        written = self._written if self._written_term == self.gate.term else None
        return due(self._latest, written, "active" if self.gate.open else "standby")

    @property
    def pending(self) -> bool:
        return self._due() != "idle"

    async def run(self) -> None:
        """The writer: runs until cancelled."""
        while True:
            step = self._due()
            if step != "write":
                self.held = step == "hold"
                wake = self._wake = anyio.Event()  # set by publish() and by a role change
                self.gate.waiting.add(wake)
                try:
                    await wake.wait()
                finally:
                    self.gate.waiting.discard(wake)
                continue
            data = self._latest
            assert data is not None
            term, promoted = self.gate.term, self.held
            error: StatusWriteError | None = None
            with self.gate.writing() as scope:
                try:
                    await self._api.patch_status(self.gateway, json.loads(data))
                except StatusWriteError as exc:
                    error = exc
            if scope.cancelled_caught:  # fenced mid-write: held from now on (the server may have it or not)
                continue
            if error is not None:
                await self._failed(error)
                continue
            self._written, self._written_term, self.held = data, term, False
            if self.failures:
                log.info("status.write_recovered failures=%d", self.failures)
            self.failures = 0
            self.last_error = None
            # A promotion's first write (what was held, maybe still Standby) is followed at once by
            # the backend's first status as active.
            if self.min_interval > 0 and not promoted:
                await self._sleep(self.min_interval)

    async def _failed(self, exc: StatusWriteError) -> None:
        self.failures += 1
        self.last_error = str(exc)
        delay = backoff(self.failures) if exc.retry else max(backoff(self.failures), 10.0)
        # A conflict is routine; a write still failing after PERSISTENT tries (minutes: a 403 that never
        # clears is a Role that does not grant it) is an error an SRE must see.
        level = (
            logging.INFO
            if exc.conflict
            else logging.ERROR
            if self.failures >= PERSISTENT
            else logging.WARNING
        )
        log.log(
            level,
            "status.write_failed gateway=%s/%s error=%r retry_in=%.1f failures=%d",
            self.gateway.namespace,
            self.gateway.name,
            str(exc),
            delay,
            self.failures,
        )
        await self._sleep(delay)


_conforms_file: StatusSink = FileStatusSink(Path("/nonexistent"))


class CopiedRole:
    """The pod's HA role for the exporter (which mounts only the read-only directory): ``path`` holds
    ``active`` or ``standby`` (atomic rename, mode 0644, as ``agent.sources.CopiedPlans`` copies the plan),
    written at start and at every change; its tunnel alerts stay silent while it says standby. A failed
    write is logged once per reason and never holds anything up."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.error: str | None = None

    def write(self, role: Role) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            tmp.write_text(role + "\n")
            tmp.chmod(0o644)
            tmp.replace(self.path)
        except OSError as exc:
            if str(exc) != self.error:
                log.error("ha.role_copy_failed path=%s error=%r", self.path, str(exc))
            self.error = str(exc)
            return
        if self.error is not None:
            log.info("ha.role_copy_written path=%s after_error=yes", self.path)
        self.error = None

    async def follow(self, roles: RoleSource) -> None:
        """The current role, then each change, until cancelled."""
        async for role in roles:
            self.write(role)


def init_nat_report(doc: Any) -> dict[str, Any] | None:
    """What init-nat reports that a tenant should see (pure): the exposures (``kind`` reverse for a reverse
    exposure) it left out of the data plane and why (a host that does not resolve, or resolves to an
    address no target may have, a virtual IP claimed twice), IPv6 it could not guard, and its last error;
    None when it has nothing to say."""
    if not isinstance(doc, Mapping):
        return None
    left = [
        {
            "exposure": str(e.get("exposure")),
            "reason": str(e.get("reason")),
            **({"kind": str(e["kind"])} if e.get("kind") else {}),
        }
        for e in doc.get("leftOut") or []
        if isinstance(e, Mapping)
    ]
    error = doc.get("lastError")
    ipv6 = doc.get("ipv6")
    unguarded = isinstance(ipv6, Mapping) and ipv6.get("state") == "unguarded"
    if not left and not error and not unguarded:
        return None
    out: dict[str, Any] = {"leftOut": left}
    if error:
        out["lastError"] = str(error)
    if unguarded and isinstance(ipv6, Mapping):
        out["ipv6"] = {"state": "unguarded", "reason": str(ipv6.get("reason") or "")}
    return out


class WithInitNat:
    """``status.initNat`` beside what the agent publishes: read from init-nat's status file (it runs in
    another container of the pod) at each publish, so a left-out exposure is on the CR within a resync."""

    def __init__(self, sink: StatusSink, path: Path) -> None:
        self.sink = sink
        self.path = path

    async def publish(self, status: Mapping[str, Any]) -> None:
        try:
            doc = json.loads(await anyio.Path(self.path).read_bytes())
        except (OSError, ValueError):
            doc = None
        # None when there is nothing to report: the status is merge-patched, so only an explicit null
        # takes an earlier report off the CR (found by review: it stayed there forever).
        await self.sink.publish({**status, "initNat": init_nat_report(doc)})


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


class WithPeerStatus:
    """Each planned VPNPeer's own status beside the VPNGateway's: ``agent.peerstatus.peer_statuses`` of
    every gateway status published, each patched into ``vpnpeers/<name>/status`` (the gateway's
    namespace) by a ``KubeStatusSink`` of its own: the same coalescing, retry and backoff as the gateway's
    status, and a write only when that peer's status changed.

    Cadence: a peer's status changes when its gateway status does, and the backends publish that at once
    on a state change but for counters alone at most once a resync (30 s; ``ipsec.status.publish_due``,
    ``WireGuardAgent._publish``), so bytesIn/bytesOut on a VPNPeer trail by up to a resync (the exporter's
    metrics have them live); an idle peer is never written again. Each writer also waits ``min_interval``
    (2 s) after a write. A peer that leaves the plan loses its writer (the controller writes its
    ``Admitted`` False); legacy IPsecGateway tunnels are not VPNPeers and get none.

    Counters alone (bytesIn, bytesOut, latestHandshake) are written at most every ``counters_every``
    seconds per peer, and no faster than ``counters_rate`` peers a second over the gateway (found by
    review: with every busy peer patched each resync, a gateway of thousands of peers kept the API
    server and the cluster-wide VPNPeer watchers busy). A change of state, reason or condition is
    written at once."""

    COUNTERS = ("bytesIn", "bytesOut", "latestHandshake")

    def __init__(
        self,
        sink: StatusSink,
        gateway: GatewayRef,
        api: StatusApi,
        tg: anyio.abc.TaskGroup,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Sleep = anyio.sleep,
        counters_every: float = 300.0,
        counters_rate: float = 2.0,
        gate: StatusGate | None = None,
    ) -> None:
        self.sink = sink
        self.gate = gate or StatusGate()
        self.gateway = gateway
        self._api = api
        self._tg = tg
        self._clock = clock
        self._sleep = sleep
        self._counters_every = counters_every
        self._counters_rate = counters_rate
        self.writers: dict[str, tuple[KubeStatusSink, anyio.CancelScope]] = {}
        self._last: dict[str, dict[str, Any]] = {}
        self._sent_at: dict[str, float] = {}

    def _counters_only(self, name: str, doc: Mapping[str, Any], now: float, peers: int) -> bool:
        """Whether ``doc`` differs from the last written only in its counters, and they are not due."""
        last = self._last.get(name)
        if last is None:
            return False
        if {k: v for k, v in last.items() if k not in self.COUNTERS} != {
            k: v for k, v in doc.items() if k not in self.COUNTERS
        }:
            return False
        every = max(self._counters_every, peers / self._counters_rate)
        return now - self._sent_at.get(name, now) < every

    async def publish(self, status: Mapping[str, Any]) -> None:
        await self.sink.publish(status)
        if self.gateway.kind != "VPNGateway" or ("tunnels" not in status and "peers" not in status):
            return
        now = self._clock()
        docs = peer_statuses(status, previous=self._last, now=_rfc3339(now))
        for name in set(self.writers) - set(docs):
            self.writers.pop(name)[1].cancel()
            self._last.pop(name, None)
            self._sent_at.pop(name, None)
        for name, doc in docs.items():
            if self._counters_only(name, doc, now, len(docs)):
                continue
            if name not in self.writers:
                ref = GatewayRef("VPNPeer", self.gateway.api_version, self.gateway.namespace, name)
                writer = KubeStatusSink(ref, self._api, sleep=self._sleep, gate=self.gate)
                self.writers[name] = (writer, await self._tg.start(_serve, writer))
            await self.writers[name][0].publish(doc)
            if self._last.get(name) != doc:
                self._sent_at[name] = now
            self._last[name] = doc


async def _serve(writer: KubeStatusSink, *, task_status: anyio.abc.TaskStatus[anyio.CancelScope]) -> None:
    with anyio.CancelScope() as scope:
        task_status.started(scope)
        await writer.run()
