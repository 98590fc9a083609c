"""The IPsec backend's I/O shell: keeps charon configured and the tunnels up, and reports their status.

One *cycle* per charon connection (``link.step``: DOWN -> PUSHING -> READY, ``lost`` -> DOWN)::

    connect control session ─ daemon_info (start time) ─ connect event session (ike-updown, child-updown,
    child-rekey, log) ─ push: what charon has (get-conns, get-shared) vs the plan, via plan.diff ─ serve:
        every tick (poll_interval): heartbeat; re-read secret versions and apply plan/secret changes;
        on an event, an initiation ending, a change, or every resync: list-sas (queries.list_sas, which
        survives charon's 512 KiB drop) -> status (pure) -> sink; watchdog (pure) -> initiations, each on
        its own short-lived session with a deadline; otherwise a cheap ``stats`` probe, which notices a
        hung charon (deadline).

Any VICI failure ends the cycle: EOF/ECONNREFUSED (charon died or restarted: a restart always closes our
sessions), or a deadline (SIGSTOP; the timed-out session is discarded). charon's start time (``stats``
``uptime.since``) is NOT a restart signal while connected: it is wall time minus uptime, so a wall-clock
step moves it although nothing restarted. It only decides, after a reconnect that followed a deadline
(the daemon may have been restarted while we could not see it), whether the daemon is new, with the step
taken out (``queries.restarted_between``). The keeper then reports every tunnel Down with the reason, stays
live (``health.beat``) but not ready, and reconnects with a short bounded backoff. A new cycle starts from
what charon reports having loaded, so a restarted charon gets secrets and connections re-pushed and the
watchdog re-initiates the site tunnels at once (backoffs are reset for a new daemon).

Secrets: values go from the Secret file straight into ``load-shared`` (field ``data``); only their versions
(salted digests) are kept, logged or compared.

HA role (``runtime.RoleSource``, docs/ha.md), followed by its own task so a change acts at once, whatever
VICI call or initiation is in flight:

* standby: connections and credentials loaded as for an active pod (children with ``start_action none``,
  ``plan.for_role``), no watchdog, no initiation; every refresh terminates whatever IKE_SA charon has
  (``link.standby_sweep``); tunnels without an SA are reported ``Standby``.
* active -> standby (fenced: the pod could not renew its Lease): initiations in flight are cancelled and
  every IKE_SA of every connection is terminated at once (``force``, no wait for the peer), on a session
  of its own; configurations stay loaded.
* standby -> active: initiation backoffs are forgotten and the loop is woken without its debounce: the
  watchdog initiates every site tunnel at once (``Timing.max_initiating`` at a time).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from agent.ipsec import link
from agent.ipsec.link import Attempt, Conn, Initiate, standby_sweep
from agent.ipsec.plan import (
    UNKNOWN,
    Cut,
    Desired,
    Loaded,
    PlanRejected,
    SecretState,
    conn_digest,
    cuts,
    desired,
    diff,
    for_role,
    stale_children,
    with_cacerts,
)
from agent.ipsec.status import (
    Carry,
    TunnelStatus,
    publish_due,
    reason_from_log,
    tunnels_status,
    tunnels_summary,
)
from agent.runtime import (
    ALWAYS_ACTIVE,
    Health,
    PlanSource,
    Role,
    RoleSource,
    SecretError,
    Secrets,
    StatusSink,
)
from gwkit.vici import ViciCommandFailed, ViciError, ViciSession, ViciTimeout, ViciUnavailable
from gwkit.vici.queries import (
    START_WOBBLE,
    IkeSas,
    StartSighting,
    list_sas,
    restarted_between,
    settle_start,
    sighting,
    start_drift,
    start_time,
)
from gwplan import IkeCertificate, IkePrivateKey, IkeSecret, Plan, SecretRef, plan_hash

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
Connect = Callable[[Path, float], Awaitable[ViciSession]]
EVENTS = ("ike-updown", "child-updown", "child-rekey", "ike-rekey", "log")


def public_here(plan: Plan | None) -> bool:
    """The gateway's public address reaches this pod (``gwplan.Ha.public_here``; always without HA)."""
    return plan is None or plan.ha is None or plan.ha.public_here


async def _connect(path: Path, timeout: float) -> ViciSession:
    return await ViciSession.connect(path, timeout=timeout)


@dataclass(frozen=True)
class Timing:
    poll_interval: float = 0.5
    """Tick: heartbeat, secret/plan check, liveness probe of charon."""
    resync_seconds: float = 30.0
    """Full list-sas + status even without events."""
    call_timeout: float = 3.0
    """Deadline of every control call (a SIGSTOPped charon is noticed after this)."""
    initiate_timeout: float = 10.0
    """charon-side timeout of one ``initiate``; the session's deadline is a little longer."""
    terminate_timeout: float = 2.0
    list_timeout: float = 60.0
    """Budget of one full ``list_sas``: an IKE_SA with thousands of children is listed child by child
    (charon drops messages over 512 KiB); each single call still has ``call_timeout``."""
    bulk_children: int = 8
    """A tunnel initiating more children than this queues them without waiting (``timeout -1``): each
    waiting ``initiate`` would hold a charon worker thread."""
    debounce: float = 0.05
    """After an event, wait this long for its siblings before listing SAs (an up/down storm = one list)."""
    reload_lanes: int = 4
    """VICI sessions loading shared keys at once after a ``clear-creds``: charon then holds none until the
    last is back (the window measured in docs/agent.md). One session waits out each call's round trip,
    which a registered ``log`` listener (ours) makes ~0.85 ms per key on charon 5.9.8; several overlap
    them (1,000 keys: 1 session ~0.69 s, 4 ~0.47 s, 8 ~0.31 s but more of charon's 16 worker threads)."""
    reload_lane_min: int = 32
    """Fewer keys than this are loaded on the control session alone (connecting the lanes costs more)."""
    max_initiating: int = 4
    """Initiations at once. A waiting VICI ``initiate`` holds charon's worker threads until it completes;
    measured on charon 5.9.8 (default 16 threads): 6 at once fine, 8 or 10 at once starved the pool for
    the whole initiate timeout (no VICI answer, every initiation failed); 4 bring 20 tunnels up in
    ~0.3 s."""


class Keeper:
    def __init__(
        self,
        socket: Path,
        plans: PlanSource,
        secrets: Secrets,
        sink: StatusSink,
        health: Health,
        *,
        timing: Timing = Timing(),
        connect: Connect = _connect,
        sleep: Sleep = anyio.sleep,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        since: Callable[[dict[str, Any]], float | None] = start_time,
        plan_path: Path | None = None,
        role: RoleSource = ALWAYS_ACTIVE,
    ) -> None:
        """``clock``: monotonic seconds; ``wall``: the wall clock (status timestamps, and with ``clock``
        to take wall-clock steps out of charon's start time); ``since``: charon's start time from a
        ``stats`` reply (a seam: tests shift it to play a wall-clock step against a live charon);
        ``plan_path``: the plan file, named in the not-ready reason while no plan is usable; ``role``: the
        pod's HA role (serve only while ``active``)."""
        self.socket = socket
        self.plans = plans
        self.secrets = secrets
        self.sink = sink
        self.health = health
        self.timing = timing
        self._connect = connect
        self._sleep = sleep
        self._clock = clock
        self._wall = wall
        self._since = since
        self.plan_path = plan_path
        self.roles = role
        self.role: Role = role.current
        """The role acted on: set by ``_watch_role`` before anything else is done about a change."""
        self.fenced = 0
        """IKE_SAs terminated because the pod went standby (the fence and the sweeps)."""
        self._initiating: dict[str, anyio.CancelScope] = {}
        self._urgent = False

        self.plan: Plan | None = None
        self.want: Desired | None = None
        self.applied: Desired | None = None
        """The plan state last pushed to this charon: the watchdog and stale-child cleanup act on it, never
        on a newer plan whose connections are not loaded yet (it can change at any await)."""
        self.plan_error: str | None = None
        self.secret_errors: dict[str, str] = {}
        """Secret id -> why its file cannot be read (the loaded key, if any, stays)."""
        self.secret_rejected: dict[str, str] = {}
        """Secret id -> why charon refused it."""
        self.loaded = Loaded()
        self.conn = Conn()
        self.daemon: str | None = None
        self.daemon_started: float | None = None
        """charon's start time, settled across its one-second wobble (logs only)."""
        self.daemon_seen: StartSighting | None = None
        """The last start-time sighting (with our clocks), for the restart check after a reconnect."""
        self.clock_steps = 0
        """Start-time moves seen while connected (wall-clock steps: counted and logged, nothing else)."""
        self.daemon_error: str | None = "not connected yet"
        self.errors: dict[str, str] = {}
        self.attempts: dict[str, Attempt] = {}
        self.in_flight: set[str] = set()
        self.carry: dict[str, Carry] = {}
        self.statuses: list[TunnelStatus] = []
        self.sas: IkeSas | None = None
        self.cycles = 0
        self._maybe_same_daemon = False
        self._published: dict[str, Any] | None = None
        self._published_at = 0.0
        self._published_problems: list[str] = []
        self._refresh = True
        self._wake: anyio.Event | None = None
        self._slots: anyio.Semaphore | None = None

    # --- the backend ------------------------------------------------------------------------------------

    async def run(self) -> None:
        self._wake = anyio.Event()
        self._slots = anyio.Semaphore(self.timing.max_initiating)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch_plans)
            tg.start_soon(self._watch_role)
            await self._keep_session()

    def _poke(self, refresh: bool = True) -> None:
        self._refresh = self._refresh or refresh
        if self._wake is not None:
            self._wake.set()

    async def _watch_plans(self) -> None:
        async for plan in self.plans:
            try:
                want = desired(plan)
            except PlanRejected as exc:
                self.plan_error = str(exc)
                log.error("plan.rejected reason=%r kept=%s", str(exc), "yes" if self.want else "none")
                continue
            self.plan, self.want, self.plan_error = plan, want, None
            log.info(
                "ipsec.plan tunnels=%d secrets=%d hash=%s",
                len(want.tunnels),
                len(want.secrets),
                plan_hash(plan)[:19],
            )
            self._poke()

    @property
    def standby(self) -> bool:
        return self.role == "standby"

    async def _watch_role(self) -> None:
        async for role in self.roles:
            if role == self.role:
                continue
            before, self.role = self.role, role
            log.info("ha.role from=%s to=%s", before, role)
            if role == "standby":
                for scope in list(self._initiating.values()):
                    scope.cancel()
                await self._fence()
            else:
                self.attempts.clear()  # every site tunnel at once, not after the backoffs of before
            self._urgent = True
            self._poke()

    async def _fence(self) -> None:
        """Terminate every IKE_SA of every connection at once, on a session of our own (the control
        session may be in the middle of a call). A failure is logged: the next refresh's sweep (standby)
        terminates what is left, on whatever charon answers next."""
        want = self.want
        names = sorted(set(self.loaded.conns) | set(want.conns if want else ()))
        started = self._clock()
        terminated = 0
        try:
            async with await self._connect(self.socket, self.timing.call_timeout) as s:
                s.max_call_timeout = self.timing.call_timeout
                for name in names:
                    terminated += await self._terminate_ike(s, name)
        except ViciError as exc:
            log.warning("ha.fence_failed error=%r then=sweep", str(exc))
        self.fenced += terminated
        log.info(
            "ha.fenced conns=%d ike_sas=%d ms=%.1f", len(names), terminated, (self._clock() - started) * 1000
        )

    async def _keep_session(self) -> None:
        while True:
            if self.want is None:
                self.health.beat()
                where = f" in {self.plan_path}" if self.plan_path else ""
                why = self.plan_error or self.plans.last_error or "waiting"
                self.health.set_ready(False, f"no usable plan{where}: {why}")
                await self._wait(self.timing.poll_interval)
                continue
            try:
                await self._cycle()
            except* ViciError as group:
                cause = _leaf(group)
            except* Exception as group:  # a bug must not kill the pod's tunnels: log it, start over
                cause = _leaf(group)
                log.error("keeper.bug error=%r", f"{type(cause).__name__}: {cause}", exc_info=cause)
            reason = str(cause) or type(cause).__name__
            # Only a hung charon (deadline) can still be the same daemon; EOF/refused means it died.
            self._maybe_same_daemon = isinstance(cause, ViciTimeout)
            self.conn = link.step(self.conn, "lost")
            self.daemon_error = f"charon unreachable: {reason}"
            log.warning("vici.lost failures=%d error=%r", self.conn.failures, reason)
            self.health.set_ready(False, self.daemon_error)
            self.in_flight.clear()
            self.sas = None
            await self._publish()
            self.health.beat()
            await self._sleep(link.reconnect_backoff(self.conn.failures))

    # --- one connection -----------------------------------------------------------------------------------

    async def _cycle(self) -> None:
        t = self.timing
        control = await self._connect(self.socket, t.call_timeout)
        control.max_call_timeout = t.call_timeout
        async with control:
            version = await control.call("version")
            stats = await control.call("stats")
            seen = self._sighting(stats)
            # EOF/refused: the old daemon is gone. After a deadline it may be the same one (SIGSTOP) or one
            # restarted meanwhile: its start time decides, with any wall-clock step taken out.
            fresh = (
                not self._maybe_same_daemon
                or seen is None
                or self.daemon_seen is None
                or restarted_between(self.daemon_seen, seen)
            )
            started = seen.since if seen else None
            self.daemon_started = started if fresh else settle_start(self.daemon_started, started)
            self.daemon_seen = seen
            self.daemon = f"{version.get('daemon', 'charon')} {version.get('version', '')}".strip()
            self.conn = link.step(self.conn, "connected")
            self.cycles += 1
            self.attempts.clear()  # (re)connected: initiate what is down now, not after old backoffs
            if fresh:
                self.carry.clear()  # a new daemon's SAs and unique ids have nothing to do with the old ones
            log.info(
                "vici.connected daemon=%r started=%s fresh=%s cycle=%d",
                self.daemon,
                started,
                fresh,
                self.cycles,
            )
            events = await self._connect(self.socket, t.call_timeout)
            async with events, anyio.create_task_group() as tg:
                registered = anyio.Event()
                tg.start_soon(self._listen, events, registered)
                with anyio.move_on_after(t.call_timeout + 1):
                    await registered.wait()
                if not registered.is_set():
                    raise ViciTimeout("event registration: no answer from charon")
                await self._push(control, same_daemon=not fresh)
                self.conn = link.step(self.conn, "pushed")
                self.daemon_error = None
                assert self.plan is not None
                self.health.set_ready(
                    True, f"{self.daemon} connected; plan {plan_hash(self.plan)[:19]} pushed"
                )
                await self._serve(control, tg)

    async def _listen(self, events: ViciSession, registered: anyio.Event) -> None:
        async for frame in events.listen(EVENTS, on_registered=registered.set):
            if frame.name == "log":
                self._note_log(frame.body)
                continue
            log.debug("vici.event name=%s", frame.name)
            self._poke()
        raise ViciUnavailable("event session ended")

    def _note_log(self, body: dict[str, Any]) -> None:
        name = body.get("ikesa-name")
        if not name or self.want is None or name not in self.want.conns:
            return
        reason = reason_from_log([str(body.get("msg", ""))])
        if reason and self.errors.get(name) != reason:
            self.errors[name] = reason
            log.warning("tunnel.error name=%s reason=%r", name, reason)
            self._poke()

    async def _push(self, control: ViciSession, *, same_daemon: bool = False) -> None:
        """Start from what charon says it has (nothing, if it restarted) and converge on the plan.

        ``same_daemon``: reconnected to the charon we loaded (a hang, not a restart: its SAs are still
        there), so what we know we loaded into it stands for what it still reports (creds too, which VICI
        lists without our ids and versions). A change made meanwhile is then applied as a change, and
        cut when it must be; starting from ``unknown`` would load it without the cut. The rest is
        ``unknown``: loaded again, cutting nothing. A daemon we did not fill ourselves may hold
        certificates and keys we never knew about (an earlier agent process's CA that the plan has since
        dropped: a CA vouches while charon holds it): when it lists any, every credential is cleared and
        loaded again (``creds_unknown``). A fresh charon holds none, and a PSK-only gateway's keys are
        listed by id (and unloaded one by one): no clear for them."""
        conns = [str(n) for n in (await control.call("get-conns")).get("conns") or []]
        keys = [str(i) for i in (await control.call("get-shared")).get("keys") or []]
        known = self.loaded
        if not same_daemon:
            certs, _ = await control.stream("list-certs", {}, "list-cert")
            private = (await control.call("get-keys")).get("keys") or []
            known = Loaded(creds_unknown=bool(certs or private))
        self.loaded = Loaded(
            conns={n: known.conns.get(n, UNKNOWN) for n in conns},
            secrets={i: known.secrets.get(i, SecretState((), UNKNOWN)) for i in keys},
            creds=dict(known.creds),
            bodies={n: b for n, b in known.bodies.items() if n in conns},
            creds_unknown=known.creds_unknown,
        )
        await self._apply(control, force_log=True)

    def _read(self, key: str, ref: SecretRef) -> tuple[bytes, str] | None:
        """A credential's or secret's value and version, or None (the reason kept in ``secret_errors``)."""
        try:
            return self.secrets.read(ref), self.secrets.version(ref)
        except SecretError as exc:
            self.secret_errors[key] = str(exc)
            return None

    async def _load_cred(
        self, control: ViciSession, key: str, cred: IkeCertificate | IkePrivateKey, pem: bytes, version: str
    ) -> bool:
        """``load-cert`` (X.509 PEM; flag CA for a trust anchor) or ``load-key`` (any type). A failure is
        logged and reported by id; the PEM never reaches a log or an exception."""
        if isinstance(cred, IkeCertificate):
            command, message = "load-cert", {"type": "X509", "flag": "CA" if cred.ca else "NONE", "data": pem}
        else:
            command, message = "load-key", {"type": "any", "data": pem}
        try:
            await control.call(command, message)
        except ViciCommandFailed as exc:
            self.secret_rejected[key] = f"{command} {key}: {exc.message}"
            log.error("credential.rejected id=%s error=%r", key, exc.message)
            return False
        self.secret_rejected.pop(key, None)
        log.info("credential.loaded id=%s version=%s", key, version)
        return True

    async def _load_secret(
        self,
        session: ViciSession,
        s: IkeSecret,
        value: bytes,
        version: str,
        cut: tuple[Cut, ...],
        cleared: bool,
    ) -> bool:
        """``load-shared`` one PSK; False when charon refused it (reported; a key the plan withdrew is then
        unloaded, unless the clear dropped it already). The value never reaches a log: charon's message
        does not echo it."""
        try:
            await session.call(
                "load-shared", {"id": s.id, "type": "IKE", "data": value, "owners": list(s.owners)}
            )
        except ViciCommandFailed as exc:
            self.secret_rejected[s.id] = f"load-shared {s.id}: {exc.message}"
            # A key the plan withdrew (rotated, moved) must not stay in force because its successor was
            # refused: the tunnels it keys are cut and must not come back with it.
            withdrawn = any(w.endswith(f":{s.id}") for c in cut for w in c.why)
            if withdrawn and not cleared:
                await session.call("unload-shared", {"id": s.id}, check=False)
            log.error(
                "secret.rejected id=%s error=%r old=%s",
                s.id,
                exc.message,
                "unloaded" if withdrawn or cleared else "kept",
            )
            return False
        self.secret_rejected.pop(s.id, None)
        return True

    def _payload(
        self, want: Desired, name: str, pems: dict[str, tuple[bytes, str]]
    ) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
        """Conn ``name``'s ``load-conn`` payload and its compared form (``plan.compared_conn``): its pinned
        CAs' PEM in ``cacerts``, and their keys with the versions of that PEM. None when one cannot be
        read (the conn is then left as it is: loaded without its CAs it would trust every CA)."""
        pins = want.pins.get(name, ())
        read = {k: pems.get(k) or self._read(k, want.creds[k].ref) for k in pins}
        if any(v is None for v in read.values()):
            return None
        got = {k: v for k, v in read.items() if v is not None}
        conn = want.conns[name]
        if not pins:
            return conn, conn
        return (
            with_cacerts(conn, [got[k][0] for k in pins]),
            with_cacerts(conn, [f"{k}@{got[k][1]}" for k in pins]),
        )

    async def _apply(self, control: ViciSession, *, force_log: bool = False) -> bool:
        """Apply plan and secret changes (as the role loads them: ``plan.for_role``); True when something
        was sent."""
        if self.want is None:
            return False
        want = for_role(self.want, standby=self.standby)
        versions: dict[str, str] = {}
        for gone in set(self.secret_errors) - set(want.secrets) - set(want.creds):
            self.secret_errors.pop(gone)
        for gone in set(self.secret_rejected) - set(want.secrets) - set(want.creds):
            self.secret_rejected.pop(gone)
        for sid, s in want.secrets.items():
            try:
                versions[sid] = self.secrets.version(s.ref)
            except SecretError as exc:
                if self.secret_errors.get(sid) != str(exc):
                    log.error(
                        "secret.unavailable id=%s error=%r kept=%s",
                        sid,
                        str(exc),
                        "yes" if sid in self.loaded.secrets else "no",
                    )
                self.secret_errors[sid] = str(exc)
            else:
                self.secret_errors.pop(sid, None)
        cred_versions: dict[str, str] = {}
        for key, cred in want.creds.items():
            try:
                cred_versions[key] = self.secrets.version(cred.ref)
            except SecretError as exc:
                if self.secret_errors.get(key) != str(exc):
                    log.error("credential.unavailable id=%s error=%r", key, str(exc))
                self.secret_errors[key] = str(exc)
            else:
                self.secret_errors.pop(key, None)
        changes = diff(self.loaded, want, versions, cred_versions)
        if changes.empty:
            self.applied = want
            return False
        # Decided before anything is loaded: what the tunnels' SAs were set up under is self.loaded.
        cut = cuts(self.loaded, want, versions, cred_versions)
        cut_names = {c.tunnel for c in cut}
        conns = dict(self.loaded.conns)
        bodies = dict(self.loaded.bodies)
        secrets = dict(self.loaded.secrets)
        creds = dict(self.loaded.creds)
        # Every value is read before the first call: no file is read while charon holds no credentials.
        pems = {k: v for k in changes.load_creds if (v := self._read(k, want.creds[k].ref)) is not None}
        values = {
            sid: v
            for sid in changes.load_secrets
            if (v := self._read(sid, want.secrets[sid].ref)) is not None
        }
        cleared = bool(changes.clear_creds)
        notes: list[tuple[str, str, int, bool]] = []
        async with contextlib.AsyncExitStack() as stack:
            lanes = [control]
            if cleared and len(values) >= self.timing.reload_lane_min:
                for _ in range(self.timing.reload_lanes - 1):  # connected before the clear, not in its window
                    lane = await self._connect(self.socket, self.timing.call_timeout)
                    lane.max_call_timeout = self.timing.call_timeout
                    lanes.append(await stack.enter_async_context(lane))
            cleared_at = self._clock()
            if cleared:
                # Until everything is loaded again, self.loaded must not claim it: a session lost half-way
                # through makes the next push clear and load again, even on the same daemon.
                self.loaded = dataclasses.replace(self.loaded, creds_unknown=True)
                await control.call("clear-creds")
                secrets, creds = {}, {}  # forgotten: only what is loaded below is there
            for key, (pem, version) in pems.items():
                await self._load_cred(control, key, want.creds[key], pem, version)
                creds[key] = version  # refused too: the same input would fail again (waits for a new version)
            creds_back = self._clock() - cleared_at

            async def load_secrets(session: ViciSession, sids: list[str]) -> None:
                for sid in sids:
                    s, (value, version) = want.secrets[sid], values[sid]
                    if await self._load_secret(session, s, value, version, cut, cleared):
                        before = self.loaded.secrets.get(sid)
                        was = before.version if before is not None else UNKNOWN
                        # A key loaded again only because of the clear is no rotation.
                        notes.append(
                            (sid, version, len(s.owners), was != UNKNOWN and not (cleared and was == version))
                        )
                    secrets[sid] = SecretState(s.owners, version, s.ref)  # refused too: it would fail again

            sids = list(values)
            if len(lanes) == 1:
                await load_secrets(control, sids)
            else:
                async with anyio.create_task_group() as tg:
                    for i, session in enumerate(lanes):
                        tg.start_soon(load_secrets, session, sids[i :: len(lanes)])
            window = self._clock() - cleared_at
        for sid, version, owners, rotated in notes:  # logged after the window, not in it
            log.info(
                "secret.loaded id=%s version=%s owners=%d rotated=%s",
                sid,
                version,
                owners,
                "yes" if rotated else "no",
            )
        if cleared:
            lost = sorted({*want.secrets, *want.creds} - {*secrets, *creds})
            log.info(
                "credentials.cleared why=%s certs=%d keys=%d secrets=%d unreadable=%s lanes=%d "
                "creds_ms=%.1f window_ms=%.1f",
                ",".join(changes.clear_creds),
                sum(k.startswith("cert/") for k in creds),
                sum(k.startswith("key/") for k in creds),
                len(secrets),
                ",".join(lost) or "none",
                len(lanes),
                creds_back * 1000,
                window * 1000,
            )
        for sid in changes.unload_secrets:
            if not cleared:
                await control.call("unload-shared", {"id": sid}, check=False)
            secrets.pop(sid, None)
            self.secret_rejected.pop(sid, None)
            self.secret_errors.pop(sid, None)
            log.info("secret.unloaded id=%s", sid)
        for name in changes.load_conns:
            payload = self._payload(want, name, pems)
            if payload is None:
                log.error("conn.held name=%s why=ca-unreadable", name)
                continue
            load, compared = payload
            digest = conn_digest(compared)
            try:
                await control.call("load-conn", dict(load))
            except ViciCommandFailed as exc:
                self.errors[name] = f"load-conn: {exc.message}"
                # The old config is what the plan withdrew (e.g. a removed proposal): refused its successor,
                # it must not stay loaded, or the cut tunnel would come back (or be accepted) under it.
                if name in cut_names:
                    await control.call("unload-conn", {"name": name}, check=False)
                log.error(
                    "conn.rejected name=%s error=%r old=%s",
                    name,
                    exc.message,
                    "unloaded" if name in cut_names else "kept",
                )
                conns[name] = digest  # the same payload would fail again: wait for the next plan
                bodies[name] = compared[name]
                continue
            was = self.loaded.conns.get(name)
            conns[name] = digest
            bodies[name] = compared[name]
            if self.errors.get(name, "").startswith("load-conn:"):
                self.errors.pop(name)
            log.info(
                "conn.loaded name=%s digest=%s change=%s", name, digest, "new" if was is None else "changed"
            )
        for name in changes.unload_conns:
            await control.call("unload-conn", {"name": name}, check=False)
            # unload-conn leaves established SAs running (LAB-FACTS): terminate them too, at once.
            await self._terminate_ike(control, name)
            conns.pop(name, None)
            bodies.pop(name, None)
            self.errors.pop(name, None)
            self.attempts.pop(name, None)
            self.carry.pop(name, None)
            log.info("conn.removed name=%s", name)
        # Only now, with the new config and key loaded: a site the watchdog brings back uses them.
        for c in cut:
            await self._cut(control, c, want)
        self.loaded = Loaded(conns, secrets, creds, bodies)
        self.applied = want
        if changes.load_secrets or changes.load_conns or changes.load_creds or changes.clear_creds:
            self.attempts.clear()  # new keys or config: retry failed tunnels now, not after their backoff
        if force_log or changes.load_conns or changes.unload_conns or cut:
            log.info(
                "ipsec.applied conns_loaded=%d conns_removed=%d secrets_loaded=%d secrets_removed=%d "
                "tunnels_cut=%d",
                len(changes.load_conns),
                len(changes.unload_conns),
                len(changes.load_secrets),
                len(changes.unload_secrets),
                len(cut),
            )
        return True

    async def _cut(self, control: ViciSession, cut: Cut, want: Desired) -> None:
        """Terminate a tunnel's IKE_SA(s): they were set up under a config or key the plan withdrew, and
        charon keeps them across a reload (plan.cuts). A site comes back through the watchdog with what is
        loaded now (its backoff reset); a road warrior dials again."""
        terminated = await self._terminate_ike(control, cut.tunnel)
        self.attempts.pop(cut.tunnel, None)
        self.carry.pop(cut.tunnel, None)  # a new SA: its counters start from 0, as after any tunnel down
        site = any(t.initiate for t in want.tunnels if t.name == cut.tunnel)
        log.info(
            "tunnel.cut name=%s why=%s ike_sas=%d then=%s",
            cut.tunnel,
            ",".join(cut.why),
            terminated,
            "initiate" if site else "await-peer",
        )

    async def _terminate_ike(self, control: ViciSession, name: str) -> int:
        """Terminate every IKE_SA of conn ``name`` at once: ``force`` with ``timeout -1`` makes charon send
        the DELETE and destroy the SA, its CHILD_SAs with it, within the call (controller.c terminate_ike
        forces only without a wait; with one it first waits for the peer's answer). A peer that does not
        answer cannot hold it: measured on charon 5.9.8, a plain terminate left the IKE_SA DELETING with
        its CHILD_SA still INSTALLED until the retransmissions ran out (7.2 s in the lab, ~165 s with
        charon's defaults), and ``force`` with a 2 s timeout held this call for the 2 s. Returns how many
        IKE_SAs charon terminated."""
        _, reply = await control.stream(
            "terminate",
            {"ike": name, "force": "yes", "timeout": "-1"},
            "control-log",
            check=False,
            timeout=self.timing.terminate_timeout + self.timing.call_timeout,
        )
        try:
            return int(reply.get("terminated", 0))
        except (TypeError, ValueError):
            return 0

    async def _serve(self, control: ViciSession, tg: anyio.abc.TaskGroup) -> None:
        next_resync = 0.0
        while True:
            self.health.beat()
            if await self._apply(control):
                self._refresh = True
            if self._problems() != self._published_problems:
                self._refresh = True  # e.g. a rejected plan file: report it in status.agent
            now = self._clock()
            if self._refresh or now >= next_resync:
                self._refresh = False
                await self._refresh_status(control, tg, started=now)
                next_resync = now + self.timing.resync_seconds
                initiating = {t.name for t in self.want.tunnels if t.initiate} if self.want else set()
                if self.standby:
                    initiating = set()
                if self.in_flight or any(
                    s.state != "Established" and s.name in initiating for s in self.statuses
                ):
                    self._refresh = True  # poll while a site tunnel is coming up or backing off
                if self.standby and self.sas:
                    self._refresh = True  # a standby lists until its sweep has left charon no SA
            else:
                stats = await control.call("stats")  # a hung charon shows up as this call's deadline
                self._check_daemon(stats)
            await self._wait(self.timing.poll_interval)

    async def _wait(self, seconds: float) -> None:
        assert self._wake is not None
        with anyio.move_on_after(seconds):
            await self._wake.wait()
            if not self._urgent:  # a role change does not wait for sibling events
                await self._sleep(self.timing.debounce)
        self._urgent = False
        self._wake = anyio.Event()

    def _sighting(self, stats: dict[str, Any]) -> StartSighting | None:
        return sighting(self._since(stats), wall=self._wall().timestamp(), mono=self._clock())

    def _check_daemon(self, stats: dict[str, Any]) -> None:
        """Note charon's start time while connected. Never a restart: a restarted charon closes our
        sessions (EOF ends the cycle), so a move here is a wall-clock step (NTP) or charon's wobble. The
        sighting is kept as the baseline for the check after a reconnect."""
        seen = self._sighting(stats)
        if seen is None:
            return
        previous = self.daemon_seen
        if previous is not None and abs(seen.since - previous.since) > START_WOBBLE:
            self.clock_steps += 1
            log.info(
                "vici.start_time_moved from=%s to=%s unexplained=%.1f action=none",
                previous.since,
                seen.since,
                start_drift(previous, seen),
            )
        self.daemon_started = settle_start(self.daemon_started, seen.since)
        self.daemon_seen = seen

    async def _refresh_status(
        self, control: ViciSession, tg: anyio.abc.TaskGroup, *, started: float | None = None
    ) -> None:
        """``started``: when this refresh began on the keeper's clock (the point the next resync is
        measured from); the counters' publish spacing counts from it too, not from after the listing."""
        started = self._clock() if started is None else started
        applied = self.applied
        if applied is None:
            return
        # Tunnels being initiated when the snapshot was taken: one that completes during the awaits below
        # has left in_flight but is missing from this (older) snapshot; initiating it again would give
        # charon a duplicate CHILD_SA.
        pending = frozenset(self.in_flight)
        sas = await list_sas(control, timeout=self.timing.list_timeout)
        stats = await control.call("stats")
        self._check_daemon(stats)
        self.sas = sas
        for name, uid in stale_children(applied.tunnels, sas):
            log.info("child.stale name=%s child_uniqueid=%s action=terminate", name, uid)
            await control.stream(
                "terminate",
                {"child-id": uid, "timeout": str(int(self.timing.terminate_timeout * 1000))},
                "control-log",
                check=False,
                timeout=self.timing.terminate_timeout + self.timing.call_timeout,
            )
        if self.standby:
            await self._sweep(control, sas)
        await self._publish(at=started)
        for s in self.statuses:
            if s.state == "Established" and s.name in self.errors:
                self.errors.pop(s.name)
        if self.standby:  # checked with no await before the start below: a fence cannot slip between
            return
        if not public_here(self.plan):
            # Active, but the public address is not on our NIC2 yet (the controller moves it, then says so
            # in the plan): an initiation now would leave with the wrong source and the router would keep
            # that translation for every retransmit. Answering stays possible; initiating waits.
            return
        for action in link.watchdog(
            applied.tunnels,
            sas,
            in_flight=pending | self.in_flight,
            attempts=self.attempts,
            now=self._clock(),
        ):
            self.in_flight.add(action.tunnel)
            tg.start_soon(self._initiate, action)

    async def _sweep(self, control: ViciSession, sas: IkeSas) -> None:
        """A standby's IKE_SAs, terminated at once (``link.standby_sweep``)."""
        for uid in standby_sweep(sas):
            _, reply = await control.stream(
                "terminate",
                {"ike-id": uid, "force": "yes", "timeout": "-1"},
                "control-log",
                check=False,
                timeout=self.timing.terminate_timeout + self.timing.call_timeout,
            )
            self.fenced += 1
            log.info(
                "ha.standby_sweep name=%s ike_uniqueid=%s state=%s terminated=%s",
                sas[uid].get("name"),
                uid,
                sas[uid].get("state"),
                reply.get("terminated", 0),
            )

    async def _initiate(self, action: Initiate) -> None:
        """Initiate one tunnel's missing children; cancelled (``_initiating``) when the pod goes standby,
        also while it waits for a slot."""
        with anyio.CancelScope() as scope:
            self._initiating[action.tunnel] = scope
            try:
                await self._initiate_children(action)
            finally:
                self._initiating.pop(action.tunnel, None)
        if scope.cancelled_caught:
            log.info("tunnel.initiate_cancelled name=%s why=standby", action.tunnel)

    async def _initiate_children(self, action: Initiate) -> None:
        t = self.timing
        ok = False
        queued = 0
        assert self._slots is not None
        try:
            async with self._slots, await self._connect(self.socket, t.call_timeout) as s:
                bulk = len(action.children) > t.bulk_children
                for i, child in enumerate(action.children):
                    if self.standby:
                        break
                    # The first child creates the IKE_SA (if none): always wait for it, so the rest reuse it.
                    wait = i == 0 or not bulk
                    if wait:
                        log.info("tunnel.initiate name=%s child=%s", action.tunnel, child)
                    await s.stream(
                        "initiate",
                        {
                            "child": child,
                            "ike": action.tunnel,
                            "timeout": str(int(t.initiate_timeout * 1000)) if wait else "-1",
                        },
                        "control-log",
                        timeout=t.initiate_timeout + t.call_timeout,
                        check=wait,
                    )
                    queued += not wait
            if queued:
                log.info("tunnel.initiate_queued name=%s children=%d", action.tunnel, queued)
            ok = True
            self.errors.pop(action.tunnel, None)
        except ViciCommandFailed as exc:
            reason = reason_from_log(exc.log) or exc.message
            self.errors[action.tunnel] = reason
            log.warning("tunnel.initiate_failed name=%s reason=%r", action.tunnel, reason)
        except ViciTimeout as exc:
            self.errors[action.tunnel] = f"initiate: {exc}"
            log.warning("tunnel.initiate_timeout name=%s error=%r", action.tunnel, str(exc))
        except ViciUnavailable as exc:
            log.info("tunnel.initiate_interrupted name=%s error=%r", action.tunnel, str(exc))
        finally:
            now = self._clock()
            if action.tunnel in self.loaded.conns:  # not removed by a reload while it was initiating
                self.attempts[action.tunnel] = link.after_attempt(
                    self.attempts.get(action.tunnel, Attempt()), ok, now, queued=queued
                )
            self.in_flight.discard(action.tunnel)
            self._poke()

    # --- status -------------------------------------------------------------------------------------------

    def status_document(self) -> dict[str, Any]:
        agent: dict[str, Any] = {"connected": self.daemon_error is None, "daemon": self.daemon}
        if self.plan is not None:
            agent["planHash"] = plan_hash(self.plan)
        problems = self._problems()
        agent["lastError"] = "; ".join(problems) if problems else None
        return {
            "tunnels": [s.to_dict() for s in self.statuses],
            "tunnelsSummary": tunnels_summary(self.statuses),
            "agent": agent,
        }

    def _problems(self) -> list[str]:
        plan_file = self.plans.last_error
        candidates = (self.daemon_error, self.plan_error, plan_file and f"plan rejected: {plan_file}")
        secrets = (*self.secret_errors.values(), *self.secret_rejected.values())
        return [p for p in (*candidates, *secrets) if p]

    async def _publish(self, *, at: float | None = None) -> None:
        """``at``: the clock point the status stands for (a refresh's start; default now)."""
        if self.want is None:
            return
        self.statuses, self.carry = tunnels_status(
            self.want.tunnels,
            self.sas,
            now=self._wall(),
            errors=self.errors,
            in_flight=frozenset(self.in_flight),
            carry=self.carry,
            daemon_error=self.daemon_error,
            standby=self.standby,
        )
        doc = self.status_document()
        self._published_problems = self._problems()
        # The refresh's start, the same point the next resync is measured from: taken after the listing,
        # a listing 0.5 s faster than the previous one would hold that resync's counters back a whole period.
        now = self._clock() if at is None else at
        # Counters alone at most once per resync (less one tick, so the periodic resync's counters are not
        # held back by the few milliseconds between ticks); states, errors, tunnels: at once.
        interval = max(0.0, self.timing.resync_seconds - self.timing.poll_interval)
        if publish_due(self._published, doc, now=now, last=self._published_at, interval=interval):
            await self.sink.publish(doc)
            self._published = doc
            self._published_at = now


def _leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc
