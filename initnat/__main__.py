"""``python -m initnat --plan PLAN [--nic-mac MAC] [--watch]``: the gateway pod's data plane.

Wires the pieces together, nothing else: read the plan -> validate NIC and NAT sections (rules.py, pure)
-> find NIC2 by MAC and ensure its policy routing (routing.py) -> apply our chains in one
``iptables-restore`` transaction that also drops the revoked marks' packets (iptables.py) -> delete the
conntrack entries of revoked grants (conntrack.py) -> lift those drops again, strictly in that order.
Everything is validated before anything is changed.

Exit codes: 0 applied (or, with --watch, stopped by SIGTERM/SIGINT); 1 a kernel step failed, and the
``initnat.failed`` line says what the kernel holds (see :func:`outcome`); 2 bad input (unreadable or
invalid plan, NIC2 absent, bad --nic-mac). With --watch a bad plan is logged and the last good ruleset
stays; a failed step is retried; the loop keeps going.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from pathlib import Path
from types import FrameType

from gwkit.logs import LEVELS, setup_logging
from gwplan import Plan, PlanError, loads
from initnat import rules, sysctl, tables
from initnat.conntrack import ConntrackError, Flusher, NetlinkFlusher, flush_marks
from initnat.iptables import Iptables, IptablesError, detect_variant
from initnat.routing import Netlink, NicError, RoutingError, ensure, find_nic, open_netlink
from initnat.rules import NatConfigError, Policy, ResolvedTargetError
from initnat.sysctl import SysctlError

log = logging.getLogger("initnat")

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
BAD_INPUT = (PlanError, NatConfigError, NicError)
FAILED = (IptablesError, RoutingError, ConntrackError, SysctlError, OSError)

Resolver = Callable[[str], IPv4Address]


class LiftFailed(IptablesError):
    """The new rules are applied and the revoked marks flushed; only deleting their tombstones failed
    (the ``-D`` payload and the full apply both refused). The tombstones keep dropping those marks'
    packets (for a narrowed grant also its remaining sources' new flows) until an apply lifts them."""

    def __init__(self, message: str) -> None:
        super().__init__(message, rolled_back=False)


def outcome(exc: BaseException) -> str:
    """What the kernel holds after ``Gateway.apply`` raised ``exc``, as log fields. A ConntrackError is
    only raised by the flush, which follows a successful transaction."""
    if isinstance(exc, ConntrackError):
        return "applied=new flush=failed tombstones=kept"
    if isinstance(exc, LiftFailed):
        return "applied=new flush=done lift=failed tombstones=kept"
    if isinstance(exc, IptablesError) and not exc.rolled_back:
        return "applied=unknown"
    return "kept=last-good"


def resolve(host: str) -> IPv4Address:
    """The lowest IPv4 address of ``host`` (deterministic when a name has several)."""
    infos = socket.getaddrinfo(host, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
    return min(IPv4Address(i[4][0]) for i in infos)


def resolve_targets(plan: Plan, resolver: Resolver) -> dict[str, IPv4Address]:
    out: dict[str, IPv4Address] = {}
    for i, e in enumerate(plan.nat.exposures):
        if e.target_address is None and e.target_host is not None:
            host = rules.hostname(e.target_host, f"nat.exposures[{i}].targetHost")
            if host not in out:
                try:
                    out[host] = resolver(host)
                except (OSError, ValueError) as exc:
                    raise OSError(f"nat.exposures[{i}].targetHost: cannot resolve {host}: {exc}") from exc
    return out


@dataclass
class Gateway:
    """The state between applies: the last policy applied (to compute revocations)."""

    iptables: Iptables
    netlink: Netlink
    flusher: Flusher
    nic_mac: str | None = None
    """--nic-mac, or the MAC from Multus' network-status; the plan's ``nic.mac`` is the fallback."""
    resolver: Resolver = resolve
    sysctls: sysctl.Sysctls = field(default_factory=sysctl.ProcSys)
    """The namespace's sysctls (this process's /proc/sys; tests that drive a namespace from outside
    pass one that reads and writes inside it)."""
    last: Policy | None = field(default=None)
    pending_flush: set[rules.Flush] = field(default_factory=set)
    """Marks (with the mask they were set under) whose conntrack flush failed: retried by every apply
    until it succeeds, whatever the kernel shows by then (the rules that set them are already gone)."""

    def apply(self, plan: Plan) -> None:
        started = time.monotonic()
        nic_cfg = rules.validate_nic(plan.nic)
        mac = self.nic_mac or nic_cfg.mac
        if mac is None:
            raise NatConfigError(
                "nic.mac: not in the plan, and neither --nic-mac nor --network-status gave one"
            )
        nic = find_nic(self.netlink, nic_cfg, mac)
        tunnels = (("wireguard.interface", plan.wireguard.interface),) if plan.wireguard else ()
        policy = rules.validate(
            plan.nat,
            nic2_address=nic.address.ip,
            resolved=resolve_targets(plan, self.resolver),
            tunnel_interfaces=tunnels,
            reply=rules.Reply(nic.name, nic_cfg.reply_mark),
        )
        # What to revoke, each mark with the mask it was SET under: what the previous plan admitted and
        # this one does not, and, whatever memory says, what the kernel's admission rules admit and this
        # plan does not (after a restart they stand in for the unknown previous plan; in --watch they
        # catch a kernel that holds more than ``last``, e.g. after a failed rollback), tombstones left in
        # the kernel (a flush still owed), and flushes that failed before.
        try:
            saved = self.iptables.saved()
        except IptablesError as exc:  # nothing has been changed yet: the last good ruleset stands
            raise IptablesError(f"{exc}; nothing changed", rolled_back=True) from exc
        # Lines of our chains that are the kernel's print of lines we rendered are read as ours: a newer
        # iptables printing our rules otherwise must not make them look revoked (tables.Printed).
        view = tables.as_rendered(saved, self.iptables.printed)
        wanted = rules.render(policy)
        in_kernel = tables.revoked_in_kernel(tables.admissions_in(view), wanted)
        if in_kernel and not self.iptables.print_known:
            # A restart, a failed read-back or restore: learn how the kernel prints this ruleset before
            # taking the kernel's lines that differ for revoked (a copy in unjumped chains).
            self.iptables.learn_print(wanted)
            view = tables.as_rendered(saved, self.iptables.printed)
            in_kernel = tables.revoked_in_kernel(tables.admissions_in(view), wanted)
        gone = set(rules.flushes(self.last, policy)) | in_kernel
        gone |= tables.tombstones_in(view)
        gone |= self.pending_flush
        # Validation is complete: from here on the kernel is changed. Forwarding first (whatever the
        # namespace inherited; sysctl.py), then routing (IKE replies need it), then the rules.
        for s in sysctl.ensure(nic.name, self.sysctls):
            log.info("initnat.sysctl_set name=%s value=%d why=%r", s.name, s.value, s.why)
        routed = ensure(self.netlink, nic, nic_cfg, policy.exposure_targets)
        # One transaction withdraws the revoked admissions AND drops the revoked marks' packets.
        applied = self.iptables.apply(rules.with_tombstones(wanted, gone), saved=saved)
        # The kernel holds this policy now, whatever follows: the next plan's revocations are computed
        # against it (its admissions may already have marked flows), and the flushes are owed until done.
        self.last = policy
        self.pending_flush = gone
        # Revocation strictly AFTER the rules stopped admitting (LAB-FACTS: else flows get re-tracked).
        flushed = flush_marks(self.flusher, gone)
        self.pending_flush = set()
        seconds, changed, count = applied.seconds, applied.changed, applied.rules
        if gone:  # flushed: lift the tombstones, deleting just those rules
            seconds, changed, count = seconds + self._lift(policy, gone), True, count - len(gone)
        log.info(
            "initnat.applied nic=%s mac=%s address=%s rules=%d changed=%s routing_changed=%s "
            "revoked_marks=%s restore_s=%.3f total_s=%.3f",
            nic.name,
            mac,
            nic.address,
            count,
            changed,
            routed.changed,
            ",".join(str(f) for f in flushed) or "-",
            seconds,
            time.monotonic() - started,
        )

    def _lift(self, policy: Policy, gone: set[rules.Flush]) -> float:
        """Delete the tombstones just written; if that fails (someone changed our chain meanwhile), the
        full apply puts the chain right. A failure of both leaves them (LiftFailed): the next apply
        finds them in the kernel, flushes again and lifts them."""
        try:
            return self.iptables.delete("filter", rules.tombstone_rules(gone))
        except IptablesError as exc:
            log.warning("initnat.lift_fallback error=%r", _describe(exc))
            try:
                return self.iptables.apply(rules.render(policy)).seconds
            except IptablesError as again:
                raise LiftFailed(
                    f"lifting the tombstone(s) of {','.join(str(f) for f in sorted(gone))} failed: "
                    f"{_describe(exc)}; the full apply too: {_describe(again)}"
                ) from again


def read_plan(path: Path) -> tuple[bytes, Plan]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PlanError(f"plan: cannot read {path}: {exc.strerror or exc}") from exc
    return data, loads(data)


def _describe(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def run_once(gw: Gateway, path: Path) -> int:
    try:
        _, plan = read_plan(path)
        gw.apply(plan)
    except BAD_INPUT as exc:
        log.error("initnat.rejected plan=%s error=%r", path, _describe(exc))
        return EXIT_BAD_INPUT
    except FAILED as exc:
        log.error("initnat.failed plan=%s error=%r %s", path, _describe(exc), outcome(exc))
        return EXIT_FAILED
    except Exception as exc:  # a bug, not an input or kernel verdict: still one log line and exit 1
        log.exception("initnat.failed plan=%s error=unexpected %s: %s", path, type(exc).__name__, exc)
        return EXIT_FAILED
    return EXIT_OK


def watch(gw: Gateway, path: Path, stop: threading.Event, *, poll: float = 0.25, resync: float = 30.0) -> int:
    """Apply now, then whenever the plan's bytes change (atomic rename and kubelet's ``..data`` symlink
    swap alike: the path is re-read each poll), and every ``resync`` seconds to repair drift. A bad plan
    is reported once per distinct content and the last good ruleset stays; a failed apply is retried."""
    seen: str | None = None
    next_sync = 0.0
    while not stop.is_set():
        now = time.monotonic()
        try:
            data = path.read_bytes()
            digest = hashlib.sha256(data).hexdigest()[:16]
        except OSError as exc:
            if seen != "unreadable":
                log.error("initnat.rejected plan=%s error=cannot read: %s", path, exc.strerror or exc)
            seen, next_sync = "unreadable", 0.0
            stop.wait(poll)
            continue
        if digest != seen or now >= next_sync:
            first_look = digest != seen
            seen = digest
            next_sync = now + resync
            try:
                gw.apply(loads(data))
            except NicError as exc:  # NIC2 may still be on its way (a slow attachment): look again
                next_sync = now + min(resync, 2.0)
                if first_look:
                    log.error("initnat.rejected plan=%s digest=%s error=%r", path, digest, _describe(exc))
            except ResolvedTargetError as exc:  # DNS may answer otherwise: look again at the resync
                if first_look:
                    log.error(
                        "initnat.rejected plan=%s digest=%s error=%r kept=last-good retry=resync",
                        path,
                        digest,
                        _describe(exc),
                    )
            except BAD_INPUT as exc:
                next_sync = float("inf")  # same bytes, same verdict: wait for a change
                if first_look:
                    log.error(
                        "initnat.rejected plan=%s digest=%s error=%r kept=last-good",
                        path,
                        digest,
                        _describe(exc),
                    )
            except FAILED as exc:
                next_sync = now + min(resync, 2.0)
                log.error(
                    "initnat.failed plan=%s digest=%s error=%r %s", path, digest, _describe(exc), outcome(exc)
                )
            except Exception as exc:  # a bug: keep the last good ruleset and the loop alive, say so loudly
                next_sync = now + min(resync, 2.0)
                log.exception("initnat.failed plan=%s digest=%s error=unexpected %s", path, digest, exc)
        stop.wait(poll)
    log.info("initnat.stopped plan=%s", path)
    return EXIT_OK


EPILOG = """\
exit codes:
  0  applied (with --watch: stopped by SIGTERM/SIGINT)
  1  a kernel step failed; the log says what the kernel holds: kept=last-good (refused,
     nothing changed), applied=new flush=failed (new rules and the revoked grants' drops
     in place, their conntrack flush failed), applied=new flush=done lift=failed; or a
     sysctl the data plane needs (net.ipv4.ip_forward=1, NIC2's rp_filter not strict) is
     wrong and /proc/sys is read-only: the error names it and how to allow it
  2  bad input: unreadable or invalid plan, NIC2 absent, bad --nic-mac or interval

privileges: root with NET_ADMIN and NET_RAW (iptables-legacy-save cannot read the tables
without NET_RAW, and auto-detection would then see no legacy rules: logged as
iptables.save_failed). It sets net.ipv4.ip_forward=1 and, if strict, NIC2's rp_filter=2 in
its namespace: that needs a writable /proc/sys (a privileged container), unless the pod's
securityContext.sysctls already set them (net.ipv4.ip_forward=1,
net.ipv4.conf.all.rp_filter=2; unsafe sysctls: kubelet --allowed-unsafe-sysctls).

examples:
  python -m initnat --plan /etc/vpngw/plan.json                 # init container: apply once
  python -m initnat --plan /etc/vpngw/plan.json --watch         # sidecar: follow plan changes
  ip netns exec gw python -m initnat --plan plan.json --nic-mac fa:16:3e:01:02:03
"""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m initnat",
        description=(
            "The gateway pod's data plane: find NIC2 by MAC, source-policy routing on it, the plan's\n"
            "NAT/authorisation rules as one atomic iptables-restore transaction on the VPNGW-* chains,\n"
            "and deletion of revoked grants' conntrack entries. Acts on the network namespace it runs in."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--plan", type=Path, required=True, help="the gateway plan JSON (the mounted ConfigMap file)"
    )
    p.add_argument("--nic-mac", help="NIC2's MAC address (overrides the plan's nic.mac)")
    p.add_argument(
        "--network-status",
        type=Path,
        help="a downward-API file holding Multus' network-status annotation; NIC2's MAC is taken from it "
        "when --nic-mac is not given",
    )
    p.add_argument("--watch", action="store_true", help="keep running; re-apply within 2 s of a plan change")
    p.add_argument(
        "--poll-interval",
        type=_seconds(0.05, 10),
        default=0.25,
        help="seconds between plan checks (--watch; 0.05-10)",
    )
    p.add_argument(
        "--resync",
        type=_seconds(1, 86400),
        default=30.0,
        help="seconds between drift repairs (--watch; 1-86400)",
    )
    p.add_argument(
        "--iptables",
        choices=("auto", "legacy", "nft"),
        default="auto",
        help="iptables variant; auto decides like kube-proxy (the variant holding the rules)",
    )
    p.add_argument("--log-level", default="INFO", choices=LEVELS)
    return p.parse_args(argv)


def _seconds(low: float, high: float) -> Callable[[str], float]:
    """An argparse type (argparse prefixes its message with "argument --flag: ")."""

    def parse(value: str) -> float:
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
        if not low <= seconds <= high:  # also refuses nan and inf
            raise argparse.ArgumentTypeError(f"{value!r} must be between {low:g} and {high:g} seconds")
        return seconds

    return parse


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.log_level)
    try:
        nic_mac = None
        if args.nic_mac is not None:
            nic_mac = rules.mac(args.nic_mac, "--nic-mac")
        elif args.network_status is not None:
            nic_mac = rules.mac_from_network_status(args.network_status.read_text())
    except (NatConfigError, OSError) as exc:
        log.error("initnat.rejected error=%r", _describe(exc))
        return EXIT_BAD_INPUT
    variant = detect_variant() if args.iptables == "auto" else args.iptables
    flusher = NetlinkFlusher()
    with open_netlink() as ipr:
        gw = Gateway(iptables=Iptables(variant), netlink=ipr, flusher=flusher, nic_mac=nic_mac)
        if not args.watch:
            return run_once(gw, args.plan)
        stop = threading.Event()

        def _stop(signum: int, frame: FrameType | None) -> None:
            log.info("initnat.signal signal=%s", signal.Signals(signum).name)
            stop.set()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        try:
            return watch(gw, args.plan, stop, poll=args.poll_interval, resync=args.resync)
        finally:
            flusher.close()


if __name__ == "__main__":
    sys.exit(main())
