"""``python -m exporter``: Prometheus metrics for a gateway's charon (VICI) and WireGuard interfaces.

Exit codes: 0 stopped by SIGINT/SIGTERM, 1 runtime failure (e.g. cannot bind), 2 bad usage (the command
line only). A missing or invalid ``--plan`` is not an exit: in a pod the plan is a ConfigMap volume that
may appear or be fixed later, and exiting would hide the reason in a crash loop. The exporter serves on,
``/readyz`` 503 with the path and the reason, the log repeating them every few seconds
(``exporter.plan.waiting``), until the plan is valid (``exporter.service``).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import logging
import signal
import sys
from pathlib import Path
from typing import Literal

import anyio

from exporter.app import MetricsApp
from exporter.http import serve
from exporter.service import (
    DEFAULT_VICI_SOCKET,
    REMIND_EVERY,
    ROLE_FILE,
    Exporter,
    PlanFile,
    RoleFile,
    follow_charon_events,
    watch_plan,
)
from exporter.sources import StrongswanSource, WireGuardSource
from gwkit.logs import LEVELS, add_log_format_flag, setup_logging
from gwkit.version import add_version_flag
from gwplan.model import DEVICE_NAME_RULE, is_device_name

log = logging.getLogger("exporter")

EPILOG = f"""\
what is watched: charon when --vici-socket names it, when the plan is an IPsec plan, or when neither
--plan nor --wireguard-interface is given (then at the gateway image's socket, {DEFAULT_VICI_SOCKET});
every --wireguard-interface and the plan's interface. A watched daemon's *_up is in every scrape (0 when
it does not answer).

metrics: strongswan_up, strongswan_tunnel_up{{tunnel}}, strongswan_tunnel_bytes_total{{tunnel,direction}}
(monotonic across CHILD_SA rekeys), wireguard_up{{interface}}, wireguard_peer_*{{interface,peer}},
vpngw_exporter_plan_valid, vpngw_ha_standby (1 while the pod is the HA standby), ... (see
docs/exporter.md). The scrape deadline (--scrape-timeout) stays below Prometheus' default 10 s.

endpoints: /metrics, /healthz (200 while serving), /readyz (503 until the --plan file was valid once).
A missing or invalid --plan at start is waited for, not an exit: the exporter serves, /readyz says
'not ready: no valid plan at PATH: REASON', the log repeats that every {REMIND_EVERY:.0f} s
(exporter.plan.waiting), and the file is re-checked every second; a later invalid plan is rejected and
the last good one keeps naming tunnels and peers.

exit codes: 0 stopped by SIGINT/SIGTERM, 1 runtime failure (e.g. cannot bind), 2 bad usage (command line).
log lines: 'RFC3339-UTC LEVEL logger event.name key=value ...' on stderr.
"""


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with a port 0-65535, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


# argparse prefixes each of these messages with "argument --flag: ".
def _interface(value: str) -> str:
    if not is_device_name(value):  # it also names the UAPI socket file: no path may sneak in
        raise argparse.ArgumentTypeError(f"{value!r} is not an interface name ({DEVICE_NAME_RULE})")
    return value


def _timeout(value: str) -> float:
    try:
        t = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not 0 < t < 10:
        raise argparse.ArgumentTypeError("must be > 0 and < 10 (Prometheus' default timeout)")
    return t


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m exporter",
        description="Serve Prometheus metrics for strongSwan charon (over VICI) and WireGuard interfaces.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--listen", type=_listen, required=True, metavar="HOST:PORT", help="address to serve on")
    p.add_argument(
        "--vici-socket",
        type=Path,
        metavar="PATH",
        help=f"charon's VICI socket: always watch charon there (default: {DEFAULT_VICI_SOCKET}, watched "
        "for an IPsec plan, or when nothing else is named)",
    )
    p.add_argument(
        "--wireguard-interface",
        type=_interface,
        action="append",
        default=[],
        metavar="IF",
        help="WireGuard interface to watch (repeatable; the plan's interface is added automatically)",
    )
    p.add_argument(
        "--wireguard-uapi-dir",
        type=Path,
        metavar="DIR",
        help="directory of wireguard-go's UAPI sockets (default /var/run/wireguard; else kernel netlink)",
    )
    p.add_argument(
        "--plan",
        type=Path,
        metavar="PLAN",
        help="gateway plan JSON: names tunnels and peers; configured-but-absent ones appear with 0",
    )
    p.add_argument(
        "--ha-role",
        type=Path,
        metavar="PATH",
        help=f"the agent's copy of the pod's HA role (active/standby; absent = active), reported as "
        f"vpngw_ha_standby (default: {ROLE_FILE} beside --plan; without either, not reported)",
    )
    p.add_argument(
        "--scrape-timeout",
        type=_timeout,
        default=8.0,
        metavar="SECONDS",
        help="deadline of one scrape's daemon queries, below Prometheus' scrape timeout (default 8)",
    )
    p.add_argument("--log-level", default="INFO", choices=LEVELS, help="(default: %(default)s)")
    add_log_format_flag(p)
    add_version_flag(p)
    return p


def charon_mode(args: argparse.Namespace) -> Literal["always", "ipsec-plan"]:
    """``always`` when the command line names charon's socket, or names nothing else to watch; else
    ``ipsec-plan``: charon is watched while the plan is an IPsec plan (pure)."""
    if args.vici_socket is not None or (args.plan is None and not args.wireguard_interface):
        return "always"
    return "ipsec-plan"


def role_file(args: argparse.Namespace) -> RoleFile | None:
    """``--ha-role``, else the role file beside ``--plan`` (the agent's read-only directory); None without
    either."""
    path = args.ha_role or (args.plan.parent / ROLE_FILE if args.plan is not None else None)
    return RoleFile(path) if path is not None else None


async def run(args: argparse.Namespace, plan: PlanFile) -> None:
    socket = args.vici_socket or DEFAULT_VICI_SOCKET
    strongswan = StrongswanSource(socket)
    wants_wg = bool(args.wireguard_interface) or plan.path is not None
    wireguard = WireGuardSource(args.wireguard_uapi_dir) if wants_wg else None
    exporter = Exporter(
        strongswan=strongswan,
        wireguard=wireguard,
        interfaces=tuple(args.wireguard_interface),
        plan=plan,
        scrape_timeout=args.scrape_timeout,
        charon=charon_mode(args),
        role=role_file(args),
    )
    host, port = args.listen
    async with anyio.create_task_group() as tg:
        await tg.start(serve, host, port, MetricsApp(exporter))
        if plan.path is not None:
            tg.start_soon(watch_plan, plan)
        tg.start_soon(follow_charon_events, exporter, socket)
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                log.info("exporter.stopping signal=%s", signal.Signals(signum).name)
                break
        tg.cancel_scope.cancel()
    await strongswan.aclose()
    if wireguard is not None:
        await wireguard.aclose()


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h>
MMAP_THRESHOLD = 32 << 20  # glibc's maximum on 64-bit
TRIM_THRESHOLD = 64 << 20
GC_THRESHOLD = 50_000


def keep_heap() -> bool:
    """Serve the per-scrape megabyte buffers (the UAPI reply, the joined body, its encoding) from a heap
    that stays mapped, instead of fresh ``mmap``s the kernel must fault in page by page: at 10,000
    WireGuard peers that was ~2,000 minor faults and ~5 ms of CPU per scrape on this kind of VM, and 0
    faults after. The cost: up to ``TRIM_THRESHOLD`` of freed memory stays in the process (RSS holds near
    its peak, measured in bench/bench_exporter.py). False where the C library has no glibc ``mallopt``."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)  # exits 2 with a message on bad usage
    setup_logging(args.log_level, fmt=args.log_format)
    plan = PlanFile(args.plan, remind_every=REMIND_EVERY)
    log.info(
        "exporter.starting listen=%s:%d vici=%s charon=%s wireguard=%s plan=%s",
        *args.listen,
        args.vici_socket or DEFAULT_VICI_SOCKET,
        charon_mode(args),
        ",".join(args.wireguard_interface) or "-",
        args.plan or "-",
    )
    plan.current()  # a missing or invalid plan is logged here, then waited for
    # Everything imported so far lives as long as the process: keep it out of the cyclic GC's full
    # collections, which at 10,000 peers otherwise walk the whole heap a few times per scrape.
    gc.freeze()
    # A scrape allocates ~100,000 short-lived objects (decoded VICI sections, label tuples) and makes no
    # reference cycles: with the default threshold (700) the collector ran ~12 times a scrape and took
    # ~3.6 ms of the 36 ms of CPU a 1,000-CHILD_SA scrape costs; at 50,000 it runs about twice.
    gc.set_threshold(GC_THRESHOLD, 10, 10)
    if not keep_heap():
        log.info("exporter.malloc.untuned reason=no-glibc-mallopt")
    try:
        anyio.run(run, args, plan, backend="asyncio")
    except OSError as exc:
        log.error("exporter.failed error=%r", str(exc))
        return 1
    except BaseExceptionGroup as group:  # from the task group, e.g. the listener cannot bind
        failed = group.subgroup(lambda e: isinstance(e, OSError))
        if failed is None:
            raise
        log.error("exporter.failed error=%r", str(failed.exceptions[0]))
        return 1
    log.info("exporter.stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
