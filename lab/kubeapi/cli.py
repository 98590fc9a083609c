"""Command line: serve the Kubernetes API emulator until SIGTERM/SIGINT.

Prints one ready line on stdout (``kubeapi.ready url=... kubeconfig=...``); logs go to stderr.
Exit codes: 0 stopped by a signal, 1 runtime failure (e.g. the port is taken), 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import signal
from pathlib import Path

from gwkit.logs import LEVELS, add_log_format_flag, setup_logging
from gwkit.version import add_version_flag
from lab.kubeapi.emulator import KubeAPI
from lab.kubeapi.server import Settings

log = logging.getLogger("lab.kubeapi")


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    try:
        ipaddress.ip_address(host)
        p = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an IP address and a port, got {value!r}") from None
    if not 0 <= p <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range: {p}")
    return host, p


def _positive(value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number: {value!r}")
    return v


def _count(value: str) -> int:
    try:
        v = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value!r}")
    return v


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lab.kubeapi",
        description="A Kubernetes API server EMULATOR for tests and demos (not Kubernetes; see "
        "docs/kubeapi.md). Serves HTTPS with a CA made at start and writes an admin kubeconfig "
        "(bearer token, system:masters).",
    )
    p.add_argument(
        "--listen",
        type=_listen,
        default=("127.0.0.1", 0),
        metavar="HOST:PORT",
        help="HTTPS address (port 0 picks a free one; default 127.0.0.1:0)",
    )
    p.add_argument(
        "--http-listen",
        type=_listen,
        default=None,
        metavar="HOST:PORT",
        help="also serve plain HTTP here (same host as --listen)",
    )
    p.add_argument(
        "--kubeconfig",
        type=Path,
        required=True,
        metavar="PATH",
        help="where to write the admin kubeconfig (mode 0600)",
    )
    p.add_argument(
        "--san",
        action="append",
        default=[],
        metavar="IP_OR_DNS",
        help="extra certificate SAN, repeatable (e.g. 10.96.0.1, kubernetes.default.svc)",
    )
    p.add_argument(
        "--bookmark-interval",
        type=_positive,
        default=60.0,
        metavar="S",
        help="seconds between watch BOOKMARK events (default 60)",
    )
    p.add_argument(
        "--history",
        type=_count,
        default=10000,
        metavar="N",
        help="watch event history size; older resourceVersions get 410 (default 10000)",
    )
    p.add_argument(
        "--no-schema-validation",
        action="store_true",
        help="admit custom resources without checking their CRD schema",
    )
    p.add_argument(
        "--no-pod-security",
        action="store_true",
        help="admit every pod whatever its namespace's pod-security.kubernetes.io labels say",
    )
    p.add_argument(
        "--rbac-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="the authorizer sees a Role/RoleBinding change this long after it (default 0: at once)",
    )
    p.add_argument("--log-level", default="INFO", choices=LEVELS, help="(default: %(default)s)")
    add_log_format_flag(p)
    add_version_flag(p)
    return p


async def serve(args: argparse.Namespace) -> int:
    host, port = args.listen
    http_port = None
    if args.http_listen is not None:
        if args.http_listen[0] != host:
            log.error("kubeapi.bad_usage error=%r", "--http-listen must use the same host as --listen")
            return 2
        http_port = args.http_listen[1]
    settings = Settings(
        host=host,
        port=port,
        http_port=http_port,
        sans=tuple(args.san),
        bookmark_interval=args.bookmark_interval,
        history=args.history,
        validate_schemas=not args.no_schema_validation,
        pod_security=not args.no_pod_security,
        rbac_delay=args.rbac_delay,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    api = KubeAPI(settings, kubeconfig=args.kubeconfig)
    try:
        await api.start()
    except OSError as e:
        log.error("kubeapi.start_failed error=%r", str(e))
        return 1
    try:
        extra = f" http_url={api.http_url}" if api.http_url else ""
        print(f"kubeapi.ready url={api.url} kubeconfig={api.kubeconfig} ca={api.ca_file}{extra}", flush=True)
        await stop.wait()
        log.info("kubeapi.stopping reason=signal")
    finally:
        await api.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    setup_logging(args.log_level, fmt=args.log_format)
    try:
        return asyncio.run(serve(args))
    except KeyboardInterrupt:
        return 0
