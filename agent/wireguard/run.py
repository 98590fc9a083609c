"""The WireGuard backend of the status-agent: keep the device equal to the plan, and report status.peers.

One loop, one step per ``poll_interval`` (or at once when a new plan arrives)::

    plan + secrets + resolved endpoints --config.desired--> DesiredDevice       (pure; bad input: keep
    backend.get --------------------------------------------> DeviceState          the last good one)
    diff.diff(desired, state) -> DeviceUpdate --> backend.apply (only if not empty: an unchanged peer
                                                  is never touched, its handshake and counters survive)
    netdev.configure(address, link up, peer routes)          (when they change, after a device reset,
                                                              and every resync period)
    status.peers_status(plan, state, clock()) --> sink.publish (only on change; counters alone at most
                                                              once per resync period)

Hostname endpoints are resolved by a background task (``Endpoints.run``): a step uses the addresses
resolved so far and never waits on DNS; a newly resolved address wakes the loop and is applied like any
other change.

A peer whose preshared key cannot be read is left off the device (removed if it was there) and reported
``Failed`` in status.peers with the reason; the rest of the plan is applied. The gateway's own private key
is gateway-level: without it the last good configuration keeps running, and ``status.agent.lastError``
says why.

HA role (``runtime.RoleSource``, docs/ha.md): a standby keeps the device configured (key, listen port,
peers with their endpoints) but its link DOWN and every peer's persistent keepalive 0 (``diff.for_role``),
and reports its peers ``Standby``. So it sends nothing: no route leads into a down device, and no timer
of its own sends (wireguard-go 0.0.20220316 does not follow its TUN's link state: with the link alone it
kept sending keepalives; the kernel module closes its socket on down); and it receives nothing: init-nat
drops the listen port on NIC2 while the role file says standby. A role change wakes the loop at once.
Demotion (fenced): link down first, then every peer is removed and put back, which drops its sessions
(``diff.forget_sessions``: none is left for a peer to go on using). Promotion: link up, the routes back
(the kernel dropped them with the link), the planned keepalives back, and every site peer kicked
(``diff.handshake_kick``): a keepalive now, so the handshake starts at once, not at the first packet.

Reconnect needs no special state: a dead daemon makes ``get`` raise DeviceUnavailable (not ready, peers
not Connected); a restarted one reports an empty device, so the very same diff re-applies everything,
and a changed private key (device reset or rotation) also re-runs the address/route configuration.
Secrets are read through ``runtime.Secrets`` and live only in DesiredDevice/DeviceUpdate fields that are
excluded from repr; log lines carry counts and names, never values.
"""

from __future__ import annotations

import contextlib
import logging
import math
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from agent.runtime import (
    ALWAYS_ACTIVE,
    Backend,
    Health,
    PlanSource,
    Role,
    RoleSource,
    SecretError,
    Secrets,
    Settings,
    StatusSink,
)
from agent.wireguard import readonly
from agent.wireguard.config import ConfigError, Desired, desired, hostnames, secret_key
from agent.wireguard.diff import diff, for_role, forget_sessions, handshake_kick
from agent.wireguard.status import peers_status, peers_summary, without_counters
from gwkit.wireguard.backend import (
    ApplyRejected,
    BackendUnavailable,
    DeviceUnavailable,
    WireGuardBackend,
    detect,
)
from gwkit.wireguard.model import DesiredDevice, DeviceState
from gwkit.wireguard.netdev import IpRouteNetDev, NetDev, NetDevError, peer_routes
from gwplan import Plan, SecretRef, WireGuard, plan_hash

log = logging.getLogger(__name__)

Resolver = Callable[[str], Awaitable[str]]
Opener = Callable[[str, Path | None], Awaitable[WireGuardBackend]]
Clock = Callable[[], float]


async def resolve_ipv4(host: str) -> str:
    """The first IPv4 address of ``host`` (the lab and the tunnels are IPv4)."""
    infos = await anyio.getaddrinfo(host, None, family=socket.AF_INET, type=socket.SOCK_DGRAM)
    if not infos:
        raise OSError(f"{host}: no IPv4 address")
    return str(infos[0][4][0])


class Endpoints:
    """Hostname endpoints, resolved in the background (``run``) and re-resolved every ``interval``
    (``retry`` after a failure; the last good address stays in use meanwhile).

    The agent's step never waits on DNS: it names the hosts it wants (``want``) and uses ``addresses``
    as they are; a resolution that produces a new address calls ``on_change`` (the loop's wake-up), and
    the next step applies it. During a DNS outage only this task waits (one ``timeout`` per round, all
    due hosts concurrently); plan changes and status keep their poll cadence."""

    def __init__(
        self,
        resolver: Resolver,
        monotonic: Clock,
        interval: float = 60.0,
        retry: float = 5.0,
        timeout: float = 2.0,
    ) -> None:
        self.resolver = resolver
        self.monotonic = monotonic
        self.interval = interval
        self.retry = retry
        self.timeout = timeout
        self.addresses: dict[str, str] = {}
        self.hosts: frozenset[str] = frozenset()
        self._due: dict[str, float] = {}
        self._failing: set[str] = set()
        self._wanted = anyio.Event()

    def want(self, hosts: frozenset[str]) -> None:
        """The hosts the plan names (no I/O): new ones are resolved at once by ``run``, gone ones
        forgotten."""
        if hosts == self.hosts:
            return
        self.hosts = hosts
        for gone in (set(self._due) | set(self.addresses)) - hosts:
            self._due.pop(gone, None)
            self.addresses.pop(gone, None)
            self._failing.discard(gone)
        self._wanted.set()

    def next_due(self) -> float | None:
        """Monotonic time the next host is due (None: no hosts)."""
        return min((self._due.get(h, 0.0) for h in self.hosts), default=None)

    async def run(self, on_change: Callable[[], None]) -> None:
        """Resolve due hosts until cancelled; ``on_change`` after a round that changed an address."""
        while True:
            if await self.refresh():
                on_change()
            due = self.next_due()
            wait = None if due is None else max(0.0, due - self.monotonic())
            with anyio.move_on_after(wait if wait is not None else float("inf")):
                await self._wanted.wait()
            self._wanted = anyio.Event()

    async def refresh(self, hosts: frozenset[str] | None = None) -> bool:
        """One round: resolve the wanted hosts that are due (``hosts``: ``want`` them first); True if an
        address changed."""
        if hosts is not None:
            self.want(hosts)
        changed = False
        now = self.monotonic()
        due = [h for h in sorted(self.hosts) if self._due.get(h, 0.0) <= now]
        results: dict[str, str | BaseException] = {}

        async def resolve(host: str) -> None:
            try:
                with anyio.fail_after(self.timeout):
                    results[host] = await self.resolver(host)
            except Exception as exc:  # OSError, timeout, UnicodeError (idna): this task must not die
                results[host] = exc

        # Concurrently: during a DNS outage N unresolvable hosts cost one timeout per round, not N.
        async with anyio.create_task_group() as tg:
            for host in due:
                tg.start_soon(resolve, host)
        for host in due:
            if host not in self.hosts:  # left the plan while it was being resolved
                continue
            address = results[host]
            if isinstance(address, BaseException):
                self._due[host] = now + self.retry
                if host not in self._failing:
                    self._failing.add(host)
                    log.warning(
                        "wireguard.endpoint.unresolved host=%s error=%r", host, str(address) or "timeout"
                    )
                continue
            self._failing.discard(host)
            self._due[host] = now + self.interval
            if self.addresses.get(host) != address:
                log.info("wireguard.endpoint.resolved host=%s address=%s", host, address)
                self.addresses[host] = address
                changed = True
        return changed


class WireGuardAgent:
    """The loop's state and its single step (``step``), so tests can drive it one step at a time."""

    def __init__(
        self,
        settings: Settings,
        secrets: Secrets,
        sink: StatusSink,
        health: Health,
        *,
        open_backend: Opener = detect,
        netdev: NetDev | None = None,
        resolver: Resolver = resolve_ipv4,
        clock: Clock = time.time,
        monotonic: Clock = time.monotonic,
        resolve_interval: float = 60.0,
        role: RoleSource = ALWAYS_ACTIVE,
    ) -> None:
        self.settings = settings
        self.roles = role
        self.role: Role = role.current
        self._kick = False
        """A promotion's handshake kick is owed (done once the link is up again)."""
        self._fence = self.role == "standby"
        """A demotion's session reset is owed (done once the link is down); also at a start as standby: the
        device may hold sessions from before this process (an agent restarted in a fenced pod)."""
        self.secrets = secrets
        self.sink = sink
        self.health = health
        self.open_backend = open_backend
        self.netdev: NetDev = netdev or IpRouteNetDev()
        self.clock = clock
        self.monotonic = monotonic
        self.endpoints = Endpoints(resolver, monotonic, interval=resolve_interval)
        self.plan: Plan | None = None
        self.good: tuple[WireGuard, Desired] | None = None
        """The last configuration that passed validation: it keeps running while newer input is bad."""
        self.good_plan: str | None = None
        """The hash of the plan ``good`` came from (``status.agent.planHash``)."""
        self._left_out_logged: dict[str, str] = {}
        self.config_error: str | None = None
        self.backend: WireGuardBackend | None = None
        self.state: DeviceState | None = None
        self.available = False
        self._lost_reported: str | None = None
        self._apply_error: str | None = None
        self._net_applied: tuple[str, str, tuple[str, ...], bool] | None = None
        self._net_dirty = True
        self._net_at = 0.0
        self._published: list[dict[str, Any]] | None = None
        self._published_sig: list[dict[str, Any]] | None = None
        self._published_at = 0.0
        self.wake = anyio.Event()
        self._hosts: tuple[Plan, frozenset[str]] | None = None
        self._routes: tuple[WireGuard, frozenset[str], tuple[str, ...]] | None = None
        self._inputs: tuple[Plan, tuple[object, ...]] | None = None

    # --- the loop -----------------------------------------------------------------------------------

    async def run(self, plans: PlanSource) -> None:
        async with anyio.create_task_group() as tg:

            async def consume() -> None:
                async for plan in plans:
                    silent = self.standby
                    self.plan = plan
                    if silent != self.standby:  # the public address came here (or went): as a role change
                        self._kick = not self.standby
                        self._fence = self.standby
                        self._net_dirty = True
                        log.info("ha.public_here now=%s", "yes" if not self.standby else "no")
                    self.wake_up()

            tg.start_soon(consume)
            tg.start_soon(self.endpoints.run, self.wake_up)
            tg.start_soon(self._watch_role)
            try:
                while True:
                    try:
                        await self.step()
                    except Exception as exc:  # a bug must not take the data plane's keeper down
                        log.error(
                            "wireguard.step.failed error=%r", f"{type(exc).__name__}: {exc}", exc_info=True
                        )
                        self.health.set_ready(False, f"internal error: {type(exc).__name__}")
                    with anyio.move_on_after(self.settings.poll_interval):
                        await self.wake.wait()
                    self.wake = anyio.Event()
            finally:
                if self.backend is not None:
                    with anyio.CancelScope(shield=True):
                        await self.backend.aclose()

    def wake_up(self) -> None:
        """Run a step now (a new plan, a newly resolved endpoint, a role change)."""
        self.wake.set()

    async def _watch_role(self) -> None:
        async for role in self.roles:
            if role == self.role:
                continue
            log.info("ha.role from=%s to=%s", self.role, role)
            self.role = role
            self._kick = role == "active"
            self._fence = role == "standby"
            self._net_dirty = True
            self.wake_up()

    @property
    def standby(self) -> bool:
        """Silent towards the peers: the HA standby, or the active before the gateway's public address is
        on our NIC2 (``gwplan.Ha.public_here``: a handshake or keepalive sent before would leave with the
        wrong source, and the router would keep that translation while they keep coming)."""
        if self.role == "standby":
            return True
        ha = self.plan.ha if self.plan is not None else None
        return ha is not None and not ha.public_here

    async def step(self) -> None:
        self.health.beat()
        await self._accept_config()
        if self.good is None:
            self.health.set_ready(
                False, f"no valid WireGuard configuration: {self.config_error or 'waiting for the plan'}"
            )
            return
        wg, want = self.good
        await self._sync(wg, want.device, want.left_out)
        await self._publish(wg, want.left_out)

    # --- configuration (plan + secrets + the addresses resolved so far) -------------------------------

    def _read(self, ref: SecretRef) -> bytes:
        try:
            return self.secrets.read(ref)
        except SecretError as exc:
            raise ConfigError(str(exc)) from None

    async def _accept_config(self) -> None:
        """Rebuild the desired device when the plan, a secret value or a resolved address changed. Secret
        files are re-read every step (that is how a rotation is noticed); validation, key decoding and
        building run only on change, so an idle step stays cheap with thousands of peers."""
        plan = self.plan
        if plan is None:
            return
        try:
            if plan.wireguard is None:
                raise ConfigError("wireguard: required for a gateway of type wireguard")
            wg = plan.wireguard
            if self._hosts is None or self._hosts[0] is not plan:
                self._hosts = (plan, hostnames(wg))
            self.endpoints.want(self._hosts[1])  # resolved by the background task, never waited for here
            private = self._read(wg.private_key_ref)  # gateway-level: raises, the last good config runs
            # A peer's preshared key is per peer: a Secret that cannot be read leaves that peer out
            # (config.desired), not the whole configuration.
            values: dict[SecretRef, bytes | ConfigError] = {}
            for ref in (p.preshared_key_ref for p in wg.peers if p.preshared_key_ref):
                try:
                    values[ref] = self._read(ref)
                except ConfigError as exc:
                    values[ref] = exc
            inputs = (
                private,
                tuple(v if isinstance(v, bytes) else str(v) for v in values.values()),
                tuple(sorted(self.endpoints.addresses.items())),
            )
            if self._inputs is not None and self._inputs[0] is plan and self._inputs[1] == inputs:
                return  # nothing changed since the last attempt (good or rejected)
            self._inputs = (plan, inputs)

            def read_key(ref: SecretRef) -> str:
                value = private if ref == wg.private_key_ref else values[ref]
                if isinstance(value, ConfigError):
                    raise value
                return secret_key(value, ref)

            # In a gateway pod (the plan names NIC2) the device marks its packets with the NIC2 reply bit:
            # init-nat's fwmark rules then send handshakes and data to peers out through NIC2; without it
            # they followed the pod's default route (eth0), and a site that never initiates never connected.
            fwmark = plan.nic.effective_reply_mark if plan.nic.mac else 0
            want = desired(wg, read_key, self.endpoints.addresses, fwmark)
        except ConfigError as exc:
            if str(exc) != self.config_error:
                self.config_error = str(exc)
                log.error(
                    "wireguard.config.rejected error=%r running=%s",
                    self.config_error,
                    "last-good" if self.good else "nothing",
                )
            return
        if self.config_error is not None:
            log.info("wireguard.config.accepted peers=%d", len(want.device.peers))
            self.config_error = None
        self._log_left_out(want.left_out)
        self.good = (wg, want)
        self.good_plan = plan_hash(plan)

    def _log_left_out(self, left_out: Mapping[str, str]) -> None:
        """One line per peer when it is left out (or for another reason), and when it comes back."""
        for name, why in left_out.items():
            if self._left_out_logged.get(name) != why:
                log.error("wireguard.peer.left_out name=%s reason=%r action=not-on-device", name, why)
        for name in set(self._left_out_logged) - set(left_out):
            log.info("wireguard.peer.restored name=%s", name)
        self._left_out_logged = dict(left_out)

    # --- device ------------------------------------------------------------------------------------------

    async def _sync(self, wg: WireGuard, planned: DesiredDevice, left_out: Mapping[str, str]) -> None:
        want = for_role(planned, standby=self.standby)
        if self.backend is None:
            try:
                self.backend = await self.open_backend(wg.interface, self.settings.wireguard_uapi_dir)
            except BackendUnavailable as exc:
                self._lost(str(exc))
                return
        backend = self.backend
        iface = wg.interface
        try:
            try:
                state = await backend.get(iface)
            except DeviceUnavailable:
                await backend.ensure_device(iface)  # the kernel backend creates it; userspace re-raises
                state = await backend.get(iface)
                self._net_dirty = True
            if self.available and not state.has_private_key:
                log.warning("wireguard.device.reset interface=%s action=reapply", iface)
            if self._fence and self.standby:
                state = await self._fence_sessions(backend, wg, iface, state, left_out)
            update = diff(want, state)
            if not update.empty:
                started = self.monotonic()
                await backend.apply(iface, update)
                log.info(
                    "wireguard.applied backend=%s interface=%s %s ms=%.1f",
                    backend.name,
                    iface,
                    update.summary(),
                    (self.monotonic() - started) * 1000,
                )
                if update.private_key is not None:  # a fresh device (daemon restarted) or a rotated key
                    self._net_dirty = True
                state = await backend.get(iface)
            self._apply_error = None
            self.state = state
            await self._configure_net(wg, left_out)
            if self._kick and not self.standby:
                await self._kick_site_peers(backend, iface, planned)
        except DeviceUnavailable as exc:
            self._net_dirty = True
            self._lost(str(exc))
            return
        except ApplyRejected as exc:
            if str(exc) != self._apply_error:
                self._apply_error = str(exc)
                log.error("wireguard.apply.rejected interface=%s error=%r", iface, self._apply_error)
            self.health.set_ready(False, f"device rejected the configuration: {exc}")
            return
        except NetDevError as exc:
            self._net_dirty = True
            if str(exc) != self._apply_error:
                self._apply_error = str(exc)
                log.error("wireguard.netdev.failed interface=%s error=%r", iface, self._apply_error)
            self.health.set_ready(False, f"address/routes not configured: {exc}")
            return
        if not self.available:
            log.info(
                "wireguard.device.ready backend=%s interface=%s peers=%d",
                backend.name,
                iface,
                len(want.peers),
            )
        self.available = True
        self._lost_reported = None
        reason = f"{iface} configured with {len(want.peers)} peers ({backend.name})"
        if left_out:
            reason += f"; left out (key material missing): {', '.join(sorted(left_out))}"
        if self.config_error:
            reason += f"; newer input rejected, last good config running: {self.config_error}"
        self.health.set_ready(True, reason)

    async def _fence_sessions(
        self,
        backend: WireGuardBackend,
        wg: WireGuard,
        iface: str,
        state: DeviceState,
        left_out: Mapping[str, str],
    ) -> DeviceState:
        """Demotion: the link down first (nothing routed into the device any more), then every session
        dropped (diff.forget_sessions); the caller's diff puts the peers back. Returns the device's state."""
        started = self.monotonic()
        await self._configure_net(wg, left_out)
        await backend.apply(iface, forget_sessions(state))
        self._fence = False
        log.info(
            "ha.fenced interface=%s peers=%d ms=%.1f",
            iface,
            len(state.peers),
            (self.monotonic() - started) * 1000,
        )
        return await backend.get(iface)

    async def _kick_site_peers(self, backend: WireGuardBackend, iface: str, want: DesiredDevice) -> None:
        """Promotion: every site peer handshakes now (diff.handshake_kick). A peer whose planned keepalive
        is 0 keeps the kick's until the next step's diff puts 0 back: by then the device has sent it."""
        kick = handshake_kick(want)
        started = self.monotonic()
        if not kick.empty:
            await backend.apply(iface, kick)
        self._kick = False
        log.info(
            "ha.kicked interface=%s site_peers=%d ms=%.1f",
            iface,
            len(kick.peers) // 2,
            (self.monotonic() - started) * 1000,
        )

    async def _configure_net(self, wg: WireGuard, left_out: Mapping[str, str]) -> None:
        gone = frozenset(left_out)
        if self._routes is None or self._routes[0] is not wg or self._routes[1] != gone:  # once per plan
            ips = (ip for p in wg.peers if p.name not in gone for ip in p.allowed_ips)
            self._routes = (wg, gone, peer_routes(wg.address, ips))  # a left-out peer's LAN: no route
        routes = self._routes[2]
        up = not self.standby
        target = (wg.interface, wg.address, routes, up)
        now = self.monotonic()
        if (
            not self._net_dirty
            and target == self._net_applied
            and now - self._net_at < self.settings.resync_seconds
        ):
            return
        added, removed = await self.netdev.configure(wg.interface, wg.address, routes, up=up)
        if added or removed or target != self._net_applied:
            log.info(
                "wireguard.netdev.configured interface=%s address=%s routes=%d added=%d removed=%d link=%s",
                wg.interface,
                wg.address,
                len(routes) if up else 0,
                added,
                removed,
                "up" if up else "down",
            )
        self._net_applied, self._net_dirty, self._net_at = target, False, now

    def _lost(self, reason: str) -> None:
        self.available = False
        if reason != self._lost_reported:
            self._lost_reported = reason
            log.warning("wireguard.device.unavailable error=%r", reason)
        self.health.set_ready(False, f"WireGuard device unavailable: {reason}")

    # --- status -----------------------------------------------------------------------------------------

    def _agent_status(self) -> dict[str, Any]:
        """``status.agent``, as the IPsec agent has it: the plan in force and what keeps the device from
        following the newest input (a rejected configuration, the gateway's private key included; the
        device refusing or being unavailable)."""
        problems = [
            self.config_error
            and f"newer input rejected, last good configuration running: {self.config_error}",
            self._apply_error,
            None if self.available else self._lost_reported,
        ]
        return {"planHash": self.good_plan, "lastError": "; ".join(p for p in problems if p) or None}

    async def _publish(self, wg: WireGuard, left_out: Mapping[str, str]) -> None:
        peers = peers_status(
            wg.peers,
            self.state,
            self.clock(),
            available=self.available,
            left_out=left_out,
            standby=self.standby,
        )
        agent = self._agent_status()
        sig = [*without_counters(peers), agent]
        now = self.monotonic()
        if sig == self._published_sig and (
            peers == self._published or now - self._published_at < self.settings.resync_seconds
        ):
            return
        await self.sink.publish({"peers": peers, "tunnelsSummary": peers_summary(peers), "agent": agent})
        self._published, self._published_sig, self._published_at = peers, sig, now


class _Interfaces:
    """Passes plans through and tells the read-only server (``readonly.serve``) the interface each one
    names."""

    def __init__(self, inner: PlanSource, names: anyio.abc.ObjectSendStream[str]) -> None:
        self._inner = inner
        self._names = names

    @property
    def last_error(self) -> str | None:
        return self._inner.last_error

    async def _iterate(self) -> AsyncIterator[Plan]:
        async for plan in self._inner:
            if plan.wireguard is not None:
                # the read-only server gone (a bug) must not stop the device loop
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    await self._names.send(plan.wireguard.interface)
            yield plan

    def __aiter__(self) -> AsyncIterator[Plan]:
        return self._iterate()


async def run(
    settings: Settings,
    plans: PlanSource,
    secrets: Secrets,
    sink: StatusSink,
    health: Health,
    role: RoleSource = ALWAYS_ACTIVE,
) -> None:
    """``runtime.Backend`` for WireGuard gateways: runs until cancelled; with ``readonly_dir`` the
    exporter's read-only UAPI socket (``readonly``) beside it."""
    agent = WireGuardAgent(settings, secrets, sink, health, role=role)
    if settings.readonly_dir is None:
        await agent.run(plans)
        return
    send, receive = anyio.create_memory_object_stream[str](max_buffer_size=math.inf)
    async with anyio.create_task_group() as tg:
        opener = readonly.opener(settings.wireguard_uapi_dir)
        tg.start_soon(readonly.serve, settings.readonly_dir, receive, opener)
        await agent.run(_Interfaces(plans, send))
        tg.cancel_scope.cancel()


_conforms: Backend = run
