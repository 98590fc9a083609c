"""``python -m agent``: the gateway pod's status-agent. Wiring only: parse the command line into
``Settings``, build the plan source, secrets, status sink and health server, read the first plan and hand
everything to the backend its ``type`` names (IPsec over VICI, or WireGuard).

Exit codes: 0 stopped by SIGTERM/SIGINT, 1 runtime failure, 2 bad usage (the command line only).

A missing or invalid plan file is not bad usage: in a pod the plan is a ConfigMap volume that may appear
or be fixed later, and exiting would turn the reason into a crash loop. The agent waits for a valid plan,
live (``/healthz`` 200) but not ready (``/readyz`` 503 ``no valid plan at PATH: REASON``), and repeats
that reason in its log every few seconds (``health.not_ready``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from agent.follow import PlanFollower
from agent.ha import ROLE_FILE, Api, FollowHa, LeaseElector
from agent.health import HealthState, serve, split_listen
from agent.runtime import Backend, PlanSource, Settings, StatusSink
from agent.sink import (
    CopiedRole,
    FileStatusSink,
    KubeStatusApi,
    KubeStatusSink,
    StatusGate,
    WithInitNat,
    WithPeerStatus,
)
from agent.sources import CopiedPlans, FilePlanSource, FileSecrets
from gwkit.kube import ClusterConfig, ConfigError, KubeClient, load
from gwkit.logs import LEVELS, add_log_format_flag, setup_logging
from gwkit.version import add_version_flag
from gwplan import Plan

log = logging.getLogger("agent")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad command line or input: exit 2."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m agent",
        description=(
            "Gateway-pod status-agent: applies the rendered gateway plan to charon (over VICI) or to "
            "wireguard-go, keeps tunnels up (reconnect-and-re-push, watchdog), and writes status.tunnels / "
            "status.peers. Plan and secret files are watched; changes apply within 2 s without a restart. "
            "A missing or invalid plan at start is waited for, not fatal: the agent stays live but not "
            "ready (/readyz 503 'no valid plan at PATH: REASON') and logs that reason every 5 s "
            "(health.not_ready) until a valid plan appears; an invalid later plan is rejected and the last "
            "good one keeps running."
        ),
        epilog="Exit codes: 0 stopped by SIGTERM/SIGINT, 1 runtime failure, 2 bad usage (command line; a "
        "bad plan file is waited for, never an exit).",
    )
    p.add_argument("--plan", required=True, type=Path, help="the rendered plan file (ConfigMap volume)")
    p.add_argument(
        "--secrets-dir",
        required=True,
        type=Path,
        help="Secret volumes: a value is read from DIR/<name>/<key>",
    )
    p.add_argument(
        "--vici-socket",
        type=Path,
        default=Path("/var/run/charon/charon.vici"),
        help="charon's VICI socket (default: %(default)s)",
    )
    p.add_argument("--status-file", type=Path, help="write the status JSON here (atomically, on change)")
    p.add_argument(
        "--initnat-status",
        type=Path,
        help="init-nat's status file (another container's): what it left out goes into status.initNat",
    )
    p.add_argument(
        "--follow-configmap",
        metavar="NAME",
        help="watch this plan ConfigMap and the Secrets its plan references through the API, and write them "
        "to --live-dir (plan.json, secrets/<name>/<key>) for the pod's containers; the namespace is "
        "$POD_NAMESPACE, else the service account's",
    )
    p.add_argument("--live-dir", type=Path, help="where --follow-configmap writes (a memory emptyDir)")
    p.add_argument(
        "--plan-fallback",
        type=Path,
        metavar="PLAN",
        help="the mounted plan ConfigMap: copied to --live-dir at boot, until the API has answered once",
    )
    p.add_argument("--kubeconfig", type=Path, help="outside a pod: the kubeconfig (default: in-cluster)")
    p.add_argument("--context", help="the kubeconfig context to use (unset: its current-context)")
    p.add_argument("--health-listen", metavar="HOST:PORT", help="serve /healthz and /readyz here")
    p.add_argument(
        "--kube-status",
        action="store_true",
        help="patch the owning CR's status subresource (in-cluster config, else kubeconfig)",
    )
    p.add_argument(
        "--wireguard-uapi-dir", type=Path, help="wireguard-go's UAPI sockets (default /var/run/wireguard)"
    )
    p.add_argument(
        "--readonly-dir",
        type=Path,
        metavar="DIR",
        help="serve the exporter's read-only view here (an emptyDir the exporter mounts read-only): "
        "plan.json, a copy of every accepted plan, ha-role, the pod's HA role (active/standby), and a "
        "socket that can only read the daemon: charon.vici "
        "(a VICI relay passing queries only; control commands get 'unknown command') or <interface>.sock "
        "(a UAPI socket answering get=1 without private or preshared keys; set=1 gets errno=1)",
    )
    p.add_argument(
        "--poll-interval",
        type=float,
        default=0.5,
        help="seconds between plan/secret checks (default: %(default)s)",
    )
    p.add_argument(
        "--resync-seconds",
        type=float,
        default=30.0,
        help="full status resync period even without events (default: %(default)s)",
    )
    p.add_argument(
        "--ha-identity",
        metavar="NAME",
        help="this pod's holderIdentity in the HA Lease when the plan has ha (default: $POD_NAME, else the "
        "hostname); the role is written to --live-dir/ha-role",
    )
    p.add_argument(
        "--log-level",
        default="INFO",
        choices=LEVELS,
        help="(default: %(default)s; lines are 'RFC3339-UTC LEVEL logger event.name key=value ...')",
    )
    add_log_format_flag(p)
    add_version_flag(p)
    return p


def parse_settings(argv: Sequence[str]) -> tuple[Settings, str, str]:
    """Settings, log level and log format; raises UsageError naming the option and the rule."""
    parser = build_parser()
    try:
        ns = parser.parse_args(argv)
    except SystemExit as exc:  # argparse printed usage (or --help)
        raise _ArgparseExit(int(exc.code or 0)) from None
    if ns.health_listen is not None:
        try:
            split_listen(ns.health_listen)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if not 0.05 <= ns.poll_interval <= 10:
        raise UsageError("--poll-interval: must be between 0.05 and 10 seconds")
    if not 1 <= ns.resync_seconds <= 86400:  # also refuses nan and inf
        raise UsageError("--resync-seconds: must be between 1 and 86400 seconds")
    if ns.follow_configmap is not None and ns.live_dir is None:
        raise UsageError("--follow-configmap: needs --live-dir (where to write what it follows)")
    settings = Settings(
        follow_configmap=ns.follow_configmap,
        live_dir=ns.live_dir,
        plan_fallback=ns.plan_fallback,
        kubeconfig=ns.kubeconfig,
        kube_context=ns.context,
        plan=ns.plan,
        secrets_dir=ns.secrets_dir,
        vici_socket=ns.vici_socket,
        status_file=ns.status_file,
        initnat_status=ns.initnat_status,
        kube_status=ns.kube_status,
        health_listen=ns.health_listen,
        wireguard_uapi_dir=ns.wireguard_uapi_dir,
        readonly_dir=ns.readonly_dir,
        poll_interval=ns.poll_interval,
        resync_seconds=ns.resync_seconds,
        ha_identity=ns.ha_identity,
    )
    return settings, str(ns.log_level), str(ns.log_format)


class _ArgparseExit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class SameTypePlans:
    """Passes plans of the first plan's type only: switching a running gateway between IPsec and WireGuard
    needs a new pod, so such a plan is rejected and the last good one stays (``last_error`` says why)."""

    def __init__(self, inner: PlanSource, gateway_type: str) -> None:
        self._inner = inner
        self._type = gateway_type
        self._error: str | None = None

    @property
    def last_error(self) -> str | None:
        return self._error or self._inner.last_error

    async def _iterate(self) -> AsyncIterator[Plan]:
        async for plan in self._inner:
            if plan.type != self._type:
                self._error = f"type: {plan.type!r} differs from the running {self._type!r}; restart the pod"
                log.error("plan.rejected reason=%r", self._error)
                continue
            self._error = None
            yield plan

    def __aiter__(self) -> AsyncIterator[Plan]:
        return self._iterate()


def load_backend(gateway_type: str) -> Backend:
    if gateway_type == "ipsec":
        from agent.ipsec.run import run as ipsec_run

        ipsec: Backend = ipsec_run
        return ipsec
    if gateway_type == "wireguard":
        try:
            from agent.wireguard.run import run as wg_run  # type: ignore[import-not-found,unused-ignore]
        except ImportError as exc:
            raise RuntimeError(f"the WireGuard backend is not available: {exc}") from exc
        backend: Backend = wg_run
        return backend
    raise UsageError(f"type: {gateway_type!r} is not ipsec or wireguard")


async def first_plan(plans: FilePlanSource) -> Plan:
    async for plan in plans:
        return plan
    raise RuntimeError("plan source ended")  # pragma: no cover - FilePlanSource never ends


async def _heartbeat_until_first_plan(plans: FilePlanSource, health: HealthState) -> Plan:
    """Wait for the first good plan; the agent is live (but not ready) while it waits, and ``health``
    repeats the reason in the log every few seconds."""
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as tg:

            async def beat() -> None:
                while True:
                    health.beat()
                    if plans.last_error:
                        health.set_ready(False, f"no valid plan at {plans.path}: {plans.last_error}")
                    await anyio.sleep(1)

            tg.start_soon(beat)
            plan = await first_plan(plans)
            scope.cancel()
    return plan


async def main_async(settings: Settings) -> int:
    health = HealthState(stale_after=max(60.0, 3 * settings.resync_seconds))
    plans = FilePlanSource(settings.plan, settings.poll_interval)
    secrets = FileSecrets(settings.secrets_dir)
    role_copy = CopiedRole(settings.readonly_dir / ROLE_FILE) if settings.readonly_dir is not None else None
    elector: LeaseElector | None = None
    async with anyio.create_task_group() as tg:

        async def stop_on_signal(
            *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
        ) -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                task_status.started()
                async for signum in signals:
                    log.info("agent.stopping signal=%s", signal.Signals(signum).name)
                    tg.cancel_scope.cancel()
                    return

        # Started, not only scheduled: the handler is in place before anything the agent does can be seen
        # from outside (a SIGTERM right after the first log line killed the process: exit -15, a rehearsal).
        await tg.start(stop_on_signal)
        if settings.health_listen:
            await tg.start(serve, settings.health_listen, health)
        client: KubeClient | None = None
        config: ClusterConfig | None = None

        async def connect() -> KubeClient:
            """The API client, built when first needed (an HA plan may come later than the start)."""
            nonlocal client, config
            if client is None:
                try:
                    config = await anyio.to_thread.run_sync(
                        lambda: load(settings.kubeconfig, context=settings.kube_context)
                    )
                except ConfigError as exc:
                    raise UsageError(str(exc)) from exc
                client = KubeClient(config, user_agent="vpngw-agent")
            return client

        async def ha_api() -> Api:
            kube = await connect()
            return Api(kube, os.environ.get("POD_NAMESPACE") or kube.config.namespace)

        if settings.kube_status or settings.follow_configmap:
            client = await connect()
            assert config is not None
            if settings.follow_configmap and settings.live_dir:
                namespace = os.environ.get("POD_NAMESPACE") or config.namespace
                follower = PlanFollower(
                    client, namespace, settings.follow_configmap, settings.live_dir, settings.plan_fallback
                )
                tg.start_soon(follower.run)
                log.info(
                    "follow.started configmap=%s/%s live=%s",
                    namespace,
                    settings.follow_configmap,
                    settings.live_dir,
                )
        plan = await _heartbeat_until_first_plan(plans, health)
        backend = load_backend(plan.type)
        # The HA role (agent.ha): active forever while the plan has no ha; follows every later plan.
        identity = settings.ha_identity or os.environ.get("POD_NAME") or socket.gethostname()
        role = elector = LeaseElector(
            ha_api,
            identity,
            plan.ha,
            role_file=settings.live_dir / ROLE_FILE if settings.live_dir is not None else None,
        )
        sink: StatusSink
        if settings.kube_status:
            assert client is not None
            # Both pods of an HA pair write the same CR and VPNPeers: only the active one may (agent.sink).
            gate = StatusGate(role)
            tg.start_soon(gate.follow)
            kube = KubeStatusSink(plan.gateway, KubeStatusApi(client), gate=gate)
            tg.start_soon(kube.run)
            sink = kube
            if settings.status_file:
                sink = _Both(FileStatusSink(settings.status_file), kube)
            # Each planned VPNPeer's status too (its gateway's Role grants patch on exactly those).
            sink = WithPeerStatus(sink, plan.gateway, KubeStatusApi(client), tg, gate=gate)
        elif settings.status_file:
            sink = FileStatusSink(settings.status_file)
        else:
            sink = _LogOnly()
        if settings.initnat_status is not None:
            sink = WithInitNat(sink, settings.initnat_status)
        log.info(
            "agent.started type=%s gateway=%s/%s plan=%s",
            plan.type,
            plan.gateway.namespace,
            plan.gateway.name,
            settings.plan,
        )
        same: PlanSource = SameTypePlans(plans, plan.type)
        if settings.readonly_dir is not None:  # the exporter's copy (it mounts nothing else of ours)
            same = CopiedPlans(same, settings.readonly_dir / "plan.json")
        if role_copy is not None:  # the exporter's copy of the role (its tunnel alerts follow it)
            tg.start_soon(role_copy.follow, role)
        tg.start_soon(role.run)
        same = FollowHa(same, role)
        await backend(settings, same, secrets, sink, health, role=role)
        tg.cancel_scope.cancel()
    if role_copy is not None and elector is not None:
        role_copy.write(elector.current)  # stopping, the elector went standby after the copier's end
    return EXIT_OK


class _Both:
    def __init__(self, *sinks: StatusSink) -> None:
        self._sinks = sinks

    async def publish(self, status: Any) -> None:
        for s in self._sinks:
            await s.publish(status)


class _LogOnly:
    """No status destination configured: log a one-line summary when it changes."""

    def __init__(self) -> None:
        self._last: str | None = None

    async def publish(self, status: Any) -> None:
        items = status.get("tunnels") or status.get("peers") or []
        summary = " ".join(f"{t.get('name')}={t.get('state')}" for t in items)
        if summary != self._last:
            self._last = summary
            log.info("status.changed %s", summary or "none")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings, level, fmt = parse_settings(sys.argv[1:] if argv is None else argv)
    except _ArgparseExit as exc:
        return EXIT_USAGE if exc.code else EXIT_OK
    except UsageError as exc:
        print(f"python -m agent: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    setup_logging(level, fmt=fmt)
    try:
        return anyio.run(main_async, settings)
    except KeyboardInterrupt:
        return EXIT_OK
    except Exception as exc:
        leaf = _leaf(exc)
        if isinstance(leaf, UsageError):
            log.error("agent.bad_input error=%r", str(leaf))
            return EXIT_USAGE
        log.error("agent.failed error=%r", f"{type(leaf).__name__}: {leaf}", exc_info=leaf)
        return EXIT_FAILURE


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups from task groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


if __name__ == "__main__":
    sys.exit(main())
