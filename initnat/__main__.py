"""``python -m initnat --plan PLAN [--nic-mac MAC] [--watch]``: the gateway pod's data plane.

Wires the pieces together, nothing else: read the plan -> resolve the exposures' target hosts with a
deadline (dns.py) -> validate NIC and NAT sections (rules.py, pure) -> find NIC2 by MAC and ensure its
policy routing (routing.py) -> apply our chains in one ``iptables-restore`` transaction that also drops
the revoked marks' packets (iptables.py) -> the IPv6 ruleset (``ip6tables-restore``, rules.ipv6_rules:
where it cannot be applied that is reported, never a failure) -> delete the conntrack entries of revoked
grants (conntrack.py) -> lift those drops again, strictly in that order. Everything is validated before
anything is changed. An exposure whose target DNS or the pod refuses is left out with its grants
(rules.LeftOut), the rest is applied; what is in force and what was left out is written to the status
file (report.py, statusfile.py) for the status-agent.

Exit codes: 0 applied (or, with --watch, stopped by SIGTERM/SIGINT); 1 a kernel step failed, and the
``initnat.failed`` line says what the kernel holds (see :func:`outcome`); 2 bad input (unreadable or
invalid plan, NIC2 absent, bad --nic-mac). With --watch a bad plan is logged and the last good ruleset
stays; a failed step is retried; the loop keeps going. An exposure left out is not a failure (exit 0):
it is logged (``initnat.left_out``) and reported in the status file.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from ipaddress import IPv4Address
from pathlib import Path
from types import FrameType

from gwkit.logs import LEVELS, add_log_format_flag, setup_logging
from gwkit.version import add_version_flag
from gwplan import Plan, PlanError, loads, plan_hash
from initnat import dns, report, rules, sysctl, tables
from initnat.conntrack import ConntrackError, Flusher, NetlinkFlusher, flush_marks
from initnat.iptables import Iptables, IptablesError, detect_variant
from initnat.routing import Netlink, NicError, RoutingError, ensure, find_nic, local_addresses, open_netlink
from initnat.rules import NatConfigError, Policy
from initnat.statusfile import StatusFile
from initnat.sysctl import SysctlError

log = logging.getLogger("initnat")

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
BAD_INPUT = (PlanError, NatConfigError, NicError)
FAILED = (IptablesError, RoutingError, ConntrackError, SysctlError, OSError)

Resolver = dns.Lookup
IPV6_PRESENT = "net.ipv6.conf.all.disable_ipv6"
"""Read (never written) to tell a kernel without IPv6 in this namespace: the file is then missing."""
ROLE_POLL = 0.05
"""Seconds between two reads of the role file in --watch (a tiny file: ~20 reads a second cost nothing)."""
STATUS_FILE = "initnat-status.json"
"""The status file's name next to the plan, when --status-file is not given (report.py)."""


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


@dataclass(frozen=True)
class InForce:
    """What the kernel holds since the last transaction that went in: for the status file."""

    plan_hash: str
    left_out: tuple[rules.LeftOut, ...] = ()
    kept: tuple[rules.Kept, ...] = ()
    role: rules.Role = "active"
    """The HA role whose rules went in (rules.standby_rules)."""


@dataclass
class Gateway:
    """The state between applies: the last policy applied (to compute revocations)."""

    iptables: Iptables
    netlink: Netlink
    flusher: Flusher
    nic_mac: str | None = None
    """--nic-mac, or the MAC from Multus' network-status; the plan's ``nic.mac`` is the fallback."""
    resolver: Resolver = dns.lookup
    """Looks up one targetHost (dns.lookup: getaddrinfo); called in threads, with a deadline."""
    resolve_timeout: float = 2.0
    """Seconds an apply waits for all targetHost lookups together (dns.py)."""
    sysctls: sysctl.Sysctls = field(default_factory=sysctl.ProcSys)
    """The namespace's sysctls (this process's /proc/sys; tests that drive a namespace from outside
    pass one that reads and writes inside it)."""
    last: Policy | None = field(default=None)
    pending_flush: set[rules.Flush] = field(default_factory=set)
    """Marks (with the mask they were set under) whose conntrack flush failed: retried by every apply
    until it succeeds, whatever the kernel shows by then (the rules that set them are already gone)."""
    lookups: dns.Lookups = field(default_factory=dns.Lookups)
    addresses: dict[str, IPv4Address] = field(default_factory=dict)
    """targetHost -> the address in force, kept when DNS cannot answer for a moment (rules.keep_last)."""
    in_force: InForce | None = None
    applied: Plan | None = None
    """The plan whose rules are in the kernel: a role change is applied to it, even while a newer plan is
    refused (the last good ruleset stays, with the new role)."""
    ip6tables: Iptables | None = None
    """ip6tables (family ipv6) for rules.ipv6_rules; None: IPv6 is left alone (main always gives one)."""
    ipv6: report.Ipv6 | None = None
    """What the last apply could do about IPv6 (None: not tried)."""
    reported: frozenset[tuple[str, str]] = frozenset()
    """(field, reason) of the exposures left out that were logged already (logged once, not per resync)."""
    role: rules.Role = "active"
    """The HA role the next apply puts in force (the role file's, :func:`read_role`); ``in_force.role`` is
    the one the kernel holds."""
    answers: dict[str, rules.Answer] | None = None
    """The target hosts' answers the last apply used (after rules.keep_last), with its kept names: a
    role-only apply (``resolve=False``) reuses them instead of waiting on DNS."""
    kept: tuple[rules.Kept, ...] = ()
    role_absent: bool = False
    """The role file is missing and the plan has ``ha``: standby (logged once per time)."""

    def apply(self, plan: Plan, *, resolve: bool = True) -> None:
        """Apply ``plan`` with :attr:`role`. ``resolve`` False: a role change alone, applied with the target
        hosts' last answers (no DNS round: its deadline would delay the role's rules) when it has them."""
        started = time.monotonic()
        nic_cfg = rules.validate_nic(plan.nic)
        hosts = rules.target_hosts(plan.nat)  # a bad name is refused before DNS is asked about it
        mac = self.nic_mac or nic_cfg.mac
        if mac is None:
            raise NatConfigError(
                "nic.mac: not in the plan, and neither --nic-mac nor --network-status gave one"
            )
        nic = find_nic(self.netlink, nic_cfg, mac)
        tunnels = (("wireguard.interface", plan.wireguard.interface),) if plan.wireguard else ()
        cached = self.answers
        if not resolve and cached is not None and all(h in cached for h in hosts):
            answers, kept = {h: cached[h] for h in hosts}, self.kept
        else:
            answers = self.lookups.resolve(hosts, self.resolver, self.resolve_timeout) if hosts else {}
            answers, kept = rules.keep_last(answers, self.addresses)
        wg = plan.wireguard if plan.type == "wireguard" else None
        policy = rules.validate(
            plan.nat,
            nic2_address=nic.address.ip,
            resolved=answers,
            tunnel_interfaces=tunnels,
            reply=rules.Reply(nic.name, nic_cfg.reply_mark),
            own_addresses=local_addresses(self.netlink),
            guard=rules.Guard(
                nic=nic.name,
                ipsec=plan.type == "ipsec",
                wireguard=None if wg is None else (wg.interface, wg.listen_port),
                standby=self.role == "standby",
            ),
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
        self.addresses = rules.remember(answers, policy)
        self.answers, self.kept = answers, kept
        self.in_force = InForce(plan_hash(plan), policy.left_out, kept, self.role)
        self.applied = plan
        self._report_left_out(policy.left_out, kept)
        ipv6_changed = self._guard_ipv6(policy.guard)  # never raises: reported, not failed
        # Revocation strictly AFTER the rules stopped admitting (LAB-FACTS: else flows get re-tracked).
        flushed = flush_marks(self.flusher, gone)
        self.pending_flush = set()
        seconds, changed, count = applied.seconds, applied.changed, applied.rules
        if gone:  # flushed: lift the tombstones, deleting just those rules
            seconds, changed, count = seconds + self._lift(policy, gone), True, count - len(gone)
        log.info(
            "initnat.applied nic=%s mac=%s address=%s rules=%d changed=%s routing_changed=%s "
            "revoked_marks=%s left_out=%s restore_s=%.3f total_s=%.3f ipv6=%s ipv6_changed=%s role=%s",
            nic.name,
            mac,
            nic.address,
            count,
            changed,
            routed.changed,
            ",".join(str(f) for f in flushed) or "-",
            ",".join(x.exposure for x in policy.left_out) or "-",
            seconds,
            time.monotonic() - started,
            "-" if self.ipv6 is None else self.ipv6.state,
            ipv6_changed,
            self.role,
        )

    def _guard_ipv6(self, guard: rules.Guard | None) -> bool:
        """Apply rules.ipv6_rules; sets :attr:`ipv6` and returns whether the kernel changed. A kernel
        without IPv6 here has nothing to guard; ip6tables that cannot be used (not installed, no
        ip6_tables support) is reported (a warning once per distinct reason, the status file), never a
        failure of the apply: the IPv4 data plane, revocations included, is in force either way."""
        if self.ip6tables is None or guard is None:
            return False
        before = self.ipv6
        try:
            self.sysctls.read(IPV6_PRESENT)
        except OSError as exc:
            self.ipv6 = report.Ipv6("absent", f"{IPV6_PRESENT}: {exc.strerror or exc}")
            if before != self.ipv6:
                log.info("initnat.ipv6_absent reason=%r", self.ipv6.reason)
            return False
        try:
            changed = self.ip6tables.apply(rules.ipv6_rules(guard)).changed
        except (IptablesError, OSError, subprocess.SubprocessError) as exc:
            self.ipv6 = report.Ipv6("unguarded", _describe(exc))
            if before != self.ipv6:
                log.warning(
                    "initnat.ipv6_unguarded error=%r hint=%r",
                    self.ipv6.reason,
                    "NIC2 and the tunnels take IPv6 unfiltered: install ip6tables (the image's iptables "
                    "package has it) or boot the node with ipv6.disable=1",
                )
            return False
        self.ipv6 = report.Ipv6("guarded")
        return changed

    def _report_left_out(self, left_out: Sequence[rules.LeftOut], kept: Sequence[rules.Kept]) -> None:
        """One line per exposure left out (and per name kept at its last address) when it is new, not at
        every resync: the status file carries the state; the log says when it changed."""
        now = frozenset((x.field, x.reason) for x in left_out) | frozenset(
            (k.host, f"kept {k.address}: {k.reason}") for k in kept
        )
        for x in left_out:
            if (x.field, x.reason) not in self.reported:
                log.warning(
                    "initnat.left_out exposure=%s field=%s vip=%s grants=%s reason=%r",
                    rules.comment(x.exposure),
                    x.field,
                    x.vip,
                    ",".join(f"{rules.comment(g.peer)}/{g.mark:#x}" for g in x.grants) or "-",
                    x.reason,
                )
        for k in kept:
            if (k.host, f"kept {k.address}: {k.reason}") not in self.reported:
                log.warning("initnat.target_kept host=%s address=%s reason=%r", k.host, k.address, k.reason)
        self.reported = now

    def status(self, last_error: str | None = None) -> dict[str, object]:
        """The status file's document (report.py): what is in force, and the last failure if any."""
        f = self.in_force
        if f is None:
            return report.document(plan_hash=None, last_error=last_error, ipv6=self.ipv6)
        return report.document(
            plan_hash=f.plan_hash,
            left_out=f.left_out,
            kept=f.kept,
            last_error=last_error,
            ipv6=self.ipv6,
            role=f.role,
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


def _write(status: StatusFile | None, gw: Gateway, last_error: str | None = None) -> None:
    if status is not None:
        status.write(gw.status(last_error))


def read_role(path: Path | None, *, ha: bool) -> rules.RoleReading:
    """The role file's verdict (rules.role_of) for a plan with (``ha``) or without an ``ha`` section: no
    file (or no ``path``: not given) is ``standby`` with ``ha`` and ``active`` without; a file that cannot
    be read stands by, with the reason (fail closed)."""
    if path is None:
        return rules.role_of(None, ha=ha)
    try:
        return rules.role_of(path.read_bytes(), ha=ha)
    except FileNotFoundError:
        return rules.role_of(None, ha=ha)
    except OSError as exc:
        return rules.RoleReading("standby", f"{path}: cannot read: {exc.strerror or exc}: standing by")


def has_ha(plan: Plan | None) -> bool:
    return plan is not None and plan.ha is not None


def _take_role(gw: Gateway, reading: rules.RoleReading, noted: list[str | None]) -> None:
    """Set the role the next apply puts in force; log an unreadable role file once per distinct reason, and
    a missing one under ``ha`` (standby) once per time it goes missing."""
    gw.role = reading.role
    if reading.error != noted[0]:
        noted[0] = reading.error
        if reading.error:
            log.error("initnat.role_unreadable error=%r role=standby", reading.error)
    absent_standby = reading.absent and reading.role == "standby"
    if absent_standby != gw.role_absent:
        gw.role_absent = absent_standby
        if absent_standby:
            log.info("initnat.role_absent role=standby why='the plan has ha and there is no role file (yet)'")


def run_once(gw: Gateway, path: Path, status: StatusFile | None = None, role_file: Path | None = None) -> int:
    try:
        _, plan = read_plan(path)
        _take_role(gw, read_role(role_file, ha=has_ha(plan)), [None])
        gw.apply(plan)
    except BAD_INPUT as exc:
        log.error("initnat.rejected plan=%s error=%r", path, _describe(exc))
        _write(status, gw, f"rejected: {_describe(exc)}")
        return EXIT_BAD_INPUT
    except FAILED as exc:
        log.error("initnat.failed plan=%s error=%r %s", path, _describe(exc), outcome(exc))
        _write(status, gw, f"failed: {_describe(exc)} ({outcome(exc)})")
        return EXIT_FAILED
    except Exception as exc:  # a bug, not an input or kernel verdict: still one log line and exit 1
        log.exception("initnat.failed plan=%s error=unexpected %s: %s", path, type(exc).__name__, exc)
        _write(status, gw, f"failed: unexpected {type(exc).__name__}")
        return EXIT_FAILED
    _write(status, gw)
    return EXIT_OK


def watch(
    gw: Gateway,
    path: Path,
    stop: threading.Event,
    *,
    poll: float = 0.25,
    resync: float = 30.0,
    status: StatusFile | None = None,
    role_file: Path | None = None,
    role_poll: float = ROLE_POLL,
) -> int:
    """Apply now, then whenever the plan's bytes change (atomic rename and kubelet's ``..data`` symlink
    swap alike: the path is re-read each poll), and every ``resync`` seconds to repair drift and to ask
    DNS again about target hosts (a name that did not resolve is applied once it does). A bad plan is
    reported once per distinct content and the last good ruleset stays; a failed apply is retried. After
    each attempt the status file says what is in force (``status``).

    ``role_file`` (the HA role, docs/ha.md) is read every ``role_poll`` seconds, also between two plan
    polls: a change ends the pause at once and is applied with the hosts' last answers (no DNS round), so
    the standby's drops (rules.standby_rules) go in or out within ``role_poll`` plus one apply."""
    seen: str | None = None
    next_sync = 0.0
    noted: list[str | None] = [None]
    role_retry = 0.0
    while not stop.is_set():
        now = time.monotonic()
        # The role for the plan in force (a role-only apply reapplies it); a new plan's apply below takes
        # the role again for that plan (a missing file is standby with ha, active without).
        _take_role(gw, read_role(role_file, ha=has_ha(gw.applied)), noted)
        try:
            data = path.read_bytes()
            digest = hashlib.sha256(data).hexdigest()[:16]
        except OSError as exc:
            if seen != "unreadable":
                log.error("initnat.rejected plan=%s error=cannot read: %s", path, exc.strerror or exc)
                _write(status, gw, f"rejected: plan: cannot read {path}: {exc.strerror or exc}")
            seen, next_sync = "unreadable", 0.0
            _pause(stop, poll, role_poll, gw, role_file)
            continue
        in_force = gw.in_force
        role_due = in_force is not None and in_force.role != gw.role and now >= role_retry
        if digest != seen or now >= next_sync or role_due:
            first_look = digest != seen
            full = first_look or now >= next_sync
            seen = digest
            if full:
                next_sync = now + resync
            try:
                if full or gw.applied is None:
                    plan = loads(data)
                    _take_role(gw, read_role(role_file, ha=has_ha(plan)), noted)
                    gw.apply(plan)
                else:  # the role alone changed: the plan in force, with the hosts' last answers
                    gw.apply(gw.applied, resolve=False)
            except NicError as exc:  # NIC2 may still be on its way (a slow attachment): look again
                next_sync = now + min(resync, 2.0)
                if first_look:
                    log.error("initnat.rejected plan=%s digest=%s error=%r", path, digest, _describe(exc))
                _write(status, gw, f"rejected: {_describe(exc)}")
            except BAD_INPUT as exc:
                next_sync = float("inf")  # same bytes, same verdict: wait for a change
                if first_look:
                    log.error(
                        "initnat.rejected plan=%s digest=%s error=%r kept=last-good",
                        path,
                        digest,
                        _describe(exc),
                    )
                _write(status, gw, f"rejected: {_describe(exc)}")
            except FAILED as exc:
                next_sync = now + min(resync, 2.0)
                role_retry = now + min(resync, 2.0)
                log.error(
                    "initnat.failed plan=%s digest=%s error=%r %s", path, digest, _describe(exc), outcome(exc)
                )
                _write(status, gw, f"failed: {_describe(exc)} ({outcome(exc)})")
            except Exception as exc:  # a bug: keep the last good ruleset and the loop alive, say so loudly
                next_sync = now + min(resync, 2.0)
                role_retry = now + min(resync, 2.0)
                log.exception("initnat.failed plan=%s digest=%s error=unexpected %s", path, digest, exc)
                _write(status, gw, f"failed: unexpected {type(exc).__name__}")
            else:
                _write(status, gw, noted[0] and f"role: {noted[0]}")
        _pause(stop, poll, role_poll, gw, role_file)
    log.info("initnat.stopped plan=%s", path)
    return EXIT_OK


def _pause(stop: threading.Event, poll: float, role_poll: float, gw: Gateway, role_file: Path | None) -> None:
    """Wait ``poll`` seconds, or less: until ``stop``, or until the role file says another role than the
    one last read (a new change: one whose apply failed waits for its retry, it does not spin)."""
    deadline = time.monotonic() + poll
    while not stop.wait(max(0.0, min(role_poll, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            return
        if role_file is not None and read_role(role_file, ha=has_ha(gw.applied)).role != gw.role:
            return


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
IPv6: ip6tables (the same variant) drops IPv6 through NIC2 and the tunnels, no sysctl
needed; a kernel without IPv6, or ip6tables missing, is reported (status file "ipv6"),
never a failure.

examples:
  python -m initnat --plan /etc/vpngw/plan.json                 # init container: apply once
  python -m initnat --plan /etc/vpngw/plan.json --watch         # sidecar: follow plan changes
  ip netns exec gw python -m initnat --plan plan.json --nic-mac fa:16:3e:01:02:03
"""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def build_parser() -> argparse.ArgumentParser:
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
        "--status-file",
        type=Path,
        help=f"where to write init-nat's status (JSON: the plan in force, exposures left out and why, the "
        f"last error); default: {STATUS_FILE} next to --plan",
    )
    p.add_argument(
        "--role-file",
        type=Path,
        help=f"the HA role file (docs/ha.md: 'active' or 'standby', written by the status-agent; absent: "
        f"standby when the plan has ha, else active); 'standby' drops IKE, ESP and the WireGuard port on "
        f"NIC2. Default: {rules.ROLE_FILE} "
        "next to the status file (in the pod: the live directory)",
    )
    p.add_argument(
        "--resolve-timeout",
        type=_seconds(0.1, 30),
        default=2.0,
        help="seconds an apply waits for all targetHost lookups together; a name with no answer by then "
        "is left out (or keeps its last address) for this apply (0.1-30)",
    )
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
    p.add_argument("--log-level", default="INFO", choices=LEVELS, help="(default: %(default)s)")
    add_log_format_flag(p)
    add_version_flag(p)
    return p


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
    setup_logging(args.log_level, fmt=args.log_format)
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
    status_path = args.status_file or args.plan.parent / STATUS_FILE
    status = StatusFile(status_path)
    role_file = args.role_file or status_path.parent / rules.ROLE_FILE
    with open_netlink() as ipr:
        gw = Gateway(
            iptables=Iptables(variant),
            ip6tables=Iptables(variant, family="ipv6"),
            netlink=ipr,
            flusher=flusher,
            nic_mac=nic_mac,
            resolve_timeout=args.resolve_timeout,
        )
        if not args.watch:
            return run_once(gw, args.plan, status, role_file)
        stop = threading.Event()

        def _stop(signum: int, frame: FrameType | None) -> None:
            log.info("initnat.signal signal=%s", signal.Signals(signum).name)
            stop.set()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        try:
            return watch(
                gw,
                args.plan,
                stop,
                poll=args.poll_interval,
                resync=args.resync,
                status=status,
                role_file=role_file,
            )
        finally:
            flusher.close()


if __name__ == "__main__":
    sys.exit(main())
