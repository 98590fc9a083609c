"""initnat.__main__.Gateway, the apply sequence, in a throwaway namespace with the real iptables and
netlink; the conntrack flusher is the FakeFlusher (real flushing is covered in test_initnat_iptables.py
and the traffic acceptance) so that the ORDER of rule swap and flush, and what our chain holds at the
moment of the flush, can be recorded and a flush failure injected."""

from __future__ import annotations

import dataclasses
import json
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from ipaddress import IPv4Address
from pathlib import Path

import pytest
from pyroute2 import IPRoute

from gwplan import Exposure, GatewayRef, Grant, Nat, Nic, Plan, Port, dumps, plan_hash
from initnat import rules
from initnat.__main__ import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, Gateway, outcome, run_once, watch
from initnat.conntrack import ConntrackError, FakeFlusher
from initnat.iptables import Completed, Iptables, IptablesError, run_process
from initnat.rules import NatConfigError
from initnat.statusfile import StatusFile
from lab import netns
from lab.wait import wait_for

pytestmark = [pytest.mark.lab]

MAC = "fa:16:3e:aa:bb:02"
GA = Grant("s1", "web", "exposure", ("203.0.113.0/28",), 0x10000)
GB = Grant("s2", "web", "exposure", ("203.0.113.16/28",), 0x20000)


def plan(*grants: Grant, host: str | None = None, cidr: str | None = None, vip: str = "198.18.0.10") -> Plan:
    target = {"target_host": host} if host else {"target_address": "192.0.2.66"}
    return Plan(
        gateway=GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "t", "gw"),
        type="ipsec",
        nic=Nic(mac=MAC, gateway="192.0.2.1"),
        nat=Nat(service_cidr=cidr, exposures=(Exposure("web", vip, (Port(80),), **target),), grants=grants),
    )


@pytest.fixture
def ns() -> Iterator[str]:
    with netns.nic2_ns("gwy", MAC) as name:
        yield name


TOMBSTONE_A = "-A VPNGW-FORWARD -m connmark --mark 0x10000/0xfff0000"
ADMIT_A = "--set-xmark 0x10000/0xfff0000"
TOMBSTONE_B = "-A VPNGW-FORWARD -m connmark --mark 0x20000/0xfff0000"
ADMIT_B = "--set-xmark 0x20000/0xfff0000"


class Recorder(FakeFlusher):
    """Records each flush and what our chain held in the kernel at that moment."""

    def __init__(self, events: list[str], ns: str) -> None:
        super().__init__()
        self.events, self.ns = events, ns
        self.kernel_at_flush: list[str] = []
        self.before_flush: Callable[[], None] = lambda: None
        self.fail_restores = False
        """Set: every iptables-restore (not the save) is refused, as if the kernel said no."""

    def flush_mark(self, mark: int, mask: int) -> None:
        self.before_flush()
        self.events.append(f"flush {mark:#x}")
        self.kernel_at_flush.append(our_chain(self.ns))
        super().flush_mark(mark, mask)


def our_chain(ns: str) -> str:
    return run_process(netns.ns_exec(ns, "iptables-nft", "-S", "VPNGW-FORWARD")).stdout


@pytest.fixture
def gateway(ns: str) -> Iterator[tuple[Gateway, list[str]]]:
    events: list[str] = []
    recorder = Recorder(events, ns)

    def run(argv: Sequence[str], input: str | None = None) -> Completed:
        if argv[0].endswith("restore"):
            if recorder.fail_restores:
                return Completed(1, "", "iptables-restore: injected refusal")
            if "--test" not in argv:
                events.append("restore")
        return run_process(netns.ns_exec(ns, *argv), input)

    with IPRoute(netns=ns, flags=0) as ipr:
        yield (
            Gateway(
                Iptables("nft", run),
                ipr,
                recorder,
                resolver=lambda h: IPv4Address("192.0.2.70"),
                sysctls=netns.NsSysctls(ns),
            ),
            events,
        )


def test_revocation_flushes_only_after_the_rules_stopped_admitting(
    gateway: tuple[Gateway, list[str]],
) -> None:
    gw, events = gateway
    assert isinstance(gw.flusher, Recorder)
    gw.apply(plan(GA, GB))
    assert events == ["restore"], "first apply: nothing to revoke"
    gw.apply(plan(GB))
    assert events == ["restore", "restore", "flush 0x10000", "restore"], "withdraw + tombstone, flush, lift"
    (at_flush,) = gw.flusher.kernel_at_flush
    assert ADMIT_A not in at_flush, "the admission was withdrawn before the flush"
    assert f"{TOMBSTONE_A} " in at_flush and at_flush.index(TOMBSTONE_A) < at_flush.index("! --mark"), (
        "the revoked mark's packets are dropped in front of the shared established-flows rule"
    )
    assert "0x10000" not in our_chain(gw.flusher.ns), "flushed: the tombstone is lifted"
    gw.apply(plan(GB))
    assert events == ["restore", "restore", "flush 0x10000", "restore"], "same plan: no restore, no flush"


def test_failed_flush_keeps_dropping_the_revoked_mark_until_a_retry_succeeds(
    gateway: tuple[Gateway, list[str]],
) -> None:
    gw, events = gateway
    assert isinstance(gw.flusher, Recorder)
    gw.apply(plan(GA, GB))
    gw.flusher.fail = ConntrackError("ctnetlink unavailable")
    with pytest.raises(ConntrackError):
        gw.apply(plan(GB))
    assert TOMBSTONE_A in our_chain(gw.flusher.ns), "fail-closed: iptables drops the revoked grant's flows"
    assert ADMIT_A not in our_chain(gw.flusher.ns)
    with pytest.raises(ConntrackError):  # still failing: the tombstone stays, nothing is rewritten
        gw.apply(plan(GB))
    assert events.count("restore") == 2 and TOMBSTONE_A in our_chain(gw.flusher.ns)
    gw.flusher.fail = None
    gw.apply(plan(GB))
    assert events[-2:] == ["flush 0x10000", "restore"] and gw.flusher.flushed == [(0x10000, 0x0FFF0000)]
    assert "0x10000" not in our_chain(gw.flusher.ns), "lifted once the flush succeeded"


def test_a_restart_owes_the_flush_of_tombstones_left_in_the_kernel(
    gateway: tuple[Gateway, list[str]], ns: str
) -> None:
    """The process that revoked 0x10000 stopped before its flush succeeded: a new one (nothing in memory)
    finds the tombstone in the kernel, flushes that mark (with the tombstone's mask) and lifts it."""
    gw, _ = gateway
    assert isinstance(gw.flusher, Recorder)
    gw.apply(plan(GA, GB))
    gw.flusher.fail = ConntrackError("ctnetlink unavailable")
    with pytest.raises(ConntrackError):
        gw.apply(plan(GB))
    fresh = Gateway(gw.iptables, gw.netlink, Recorder([], ns), resolver=gw.resolver, sysctls=gw.sysctls)
    fresh.apply(plan(GB))
    assert isinstance(fresh.flusher, Recorder) and fresh.flusher.flushed == [(0x10000, 0x0FFF0000)]
    assert "0x10000" not in our_chain(ns)


def test_target_hosts_are_resolved_and_invalid_ones_never_resolved(
    gateway: tuple[Gateway, list[str]],
) -> None:
    gw, _ = gateway
    asked: list[str] = []
    gw.resolver = lambda h: asked.append(h) or IPv4Address("192.0.2.70")  # type: ignore[func-returns-value]
    gw.apply(plan(GA, host="API.Fabric.example."))
    assert asked == ["api.fabric.example"]
    with pytest.raises(NatConfigError, match=r"nat\.exposures\[0\]\.targetHost"):
        gw.apply(plan(GA, host="x; rm -rf /"))
    assert asked == ["api.fabric.example"]


def test_lifting_falls_back_to_a_full_apply_when_the_tombstone_is_not_there(
    gateway: tuple[Gateway, list[str]], ns: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Someone deletes our tombstone between the transaction and the lift (here: during the flush): the
    small ``-D`` payload is refused and the full apply leaves the chain exactly as rendered."""
    gw, events = gateway
    assert isinstance(gw.flusher, Recorder)
    gw.apply(plan(GA, GB))

    def meddle() -> None:
        spec = next(line for line in our_chain(ns).splitlines() if line.startswith(TOMBSTONE_A))
        res = run_process(netns.ns_exec(ns, "iptables-nft", "-D", *shlex.split(spec)[1:]))
        assert res.returncode == 0, res.stderr

    gw.flusher.before_flush = meddle
    with caplog.at_level("WARNING", logger="initnat"):
        gw.apply(plan(GB))
    assert "initnat.lift_fallback" in caplog.text and "nothing changed" in caplog.text
    # the refused -D payload; the full apply then finds the chain already right and writes nothing
    assert events[-2:] == ["flush 0x10000", "restore"]
    assert TOMBSTONE_A not in our_chain(ns)
    assert gw.last is not None and not gw.iptables.apply(rules.render(gw.last)).changed


def test_a_grant_admitted_by_an_apply_whose_flush_failed_is_revoked_by_the_next_plan(
    gateway: tuple[Gateway, list[str]], ns: str
) -> None:
    """{A} -> {B} with A's flush failing: the kernel holds {B}'s admission (B's flows get marked) even
    though the apply raised. {B} -> {} must then tombstone and flush B as well as A (still owed), or B's
    established flows keep passing the shared established rule."""
    gw, events = gateway
    assert isinstance(gw.flusher, Recorder)
    gw.apply(plan(GA))
    gw.flusher.fail = ConntrackError("ctnetlink unavailable")
    with pytest.raises(ConntrackError):
        gw.apply(plan(GB))
    assert ADMIT_B in our_chain(ns), "the new plan is in the kernel although the apply raised"
    gw.flusher.fail = None
    gw.apply(plan())
    assert sorted(gw.flusher.flushed) == [(0x10000, 0x0FFF0000), (0x20000, 0x0FFF0000)]
    assert events[-4:] == ["restore", "flush 0x10000", "flush 0x20000", "restore"], "swap, flushes, lift"
    at_flush = gw.flusher.kernel_at_flush[-1]
    assert ADMIT_B not in at_flush and f"{TOMBSTONE_B} " in at_flush, "B tombstoned during its flush"
    assert "0x20000" not in our_chain(ns) and "0x10000" not in our_chain(ns), "both lifted"


def test_a_tombstone_comes_before_the_service_cidr_gate(gateway: tuple[Gateway, list[str]], ns: str) -> None:
    """serviceCidr moves: every virtual IP changes, so A is revoked. Its flows' original destination is
    the OLD virtual IP, outside the new CIDR: a tombstone behind the gate would never see them."""
    gw, _ = gateway
    assert isinstance(gw.flusher, Recorder)
    gw.apply(plan(GA, cidr="198.18.0.0/24"))
    gw.apply(plan(GA, cidr="198.19.0.0/24", vip="198.19.0.10"))
    (at_flush,) = gw.flusher.kernel_at_flush
    ours = [line for line in at_flush.splitlines() if line.startswith("-A VPNGW-FORWARD ")]
    gate = next(i for i, line in enumerate(ours) if "! --ctorigdst 198.19.0.0/24" in line)
    assert ours[0].startswith(f"{TOMBSTONE_A} ") and gate > 0, ours
    assert "0x10000/0xfff0000 -m comment" not in our_chain(ns), "lifted after the flush"


def test_a_failed_flush_says_the_new_rules_are_applied(
    gateway: tuple[Gateway, list[str]], ns: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Exit 1, but not "previous rules kept": the new ruleset and the tombstone are in the kernel."""
    gw, _ = gateway
    assert isinstance(gw.flusher, Recorder)
    path = tmp_path / "plan.json"
    path.write_bytes(dumps(plan(GA, GB)))
    assert run_once(gw, path) == EXIT_OK
    gw.flusher.fail = ConntrackError("ctnetlink unavailable")
    path.write_bytes(dumps(plan(GB)))
    with caplog.at_level("INFO", logger="initnat"):
        assert run_once(gw, path) == EXIT_FAILED
    (line,) = [r.getMessage() for r in caplog.records if "initnat.failed" in r.getMessage()]
    assert "applied=new flush=failed" in line and "kept=last-good" not in line, line
    assert ADMIT_A not in our_chain(ns) and TOMBSTONE_A in our_chain(ns), "what the line says is so"


def test_a_failed_lift_says_applied_and_flushed(
    gateway: tuple[Gateway, list[str]], ns: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The -D payload and the full-apply fallback both refused after a successful flush: exit 1 (the
    tombstone still drops that mark's packets), and the line says the plan and the flush went through."""
    gw, _ = gateway
    assert isinstance(gw.flusher, Recorder)
    recorder = gw.flusher
    path = tmp_path / "plan.json"
    path.write_bytes(dumps(plan(GA, GB)))
    assert run_once(gw, path) == EXIT_OK

    def break_iptables() -> None:
        recorder.fail_restores = True

    recorder.before_flush = break_iptables
    path.write_bytes(dumps(plan(GB)))
    with caplog.at_level("INFO", logger="initnat"):
        assert run_once(gw, path) == EXIT_FAILED
    (line,) = [r.getMessage() for r in caplog.records if "initnat.failed" in r.getMessage()]
    assert "applied=new flush=done lift=failed" in line and "kept=last-good" not in line, line
    assert recorder.flushed == [(0x10000, 0x0FFF0000)] and TOMBSTONE_A in our_chain(ns)
    recorder.fail_restores, recorder.before_flush = False, lambda: None
    assert run_once(gw, path) == EXIT_OK, "the next apply finds the tombstone, flushes again and lifts"
    assert "0x10000" not in our_chain(ns)


def watch_until(gw: Gateway, path: Path, done: Callable[[], bool], **options: float) -> None:
    """Run init-nat's --watch loop on ``path`` in a thread until ``done()`` (at most 10 s), then stop it."""
    stop = threading.Event()
    t = threading.Thread(target=watch, args=(gw, path, stop), kwargs={"poll": 0.05, **options})
    t.start()
    try:
        wait_for(done, 10, "the --watch loop's outcome", interval=0.05)
    finally:
        stop.set()
        t.join(10)


def test_watch_reports_a_failed_flush_as_applied(
    gateway: tuple[Gateway, list[str]], ns: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gw, _ = gateway
    assert isinstance(gw.flusher, Recorder)
    path = tmp_path / "plan.json"
    path.write_bytes(dumps(plan(GA, GB)))
    gw.apply(plan(GA, GB))
    gw.flusher.fail = ConntrackError("ctnetlink unavailable")
    path.write_bytes(dumps(plan(GB)))
    with caplog.at_level("INFO", logger="initnat"):
        watch_until(gw, path, lambda: "initnat.failed" in caplog.text)
    (line, *_) = [r.getMessage() for r in caplog.records if "initnat.failed" in r.getMessage()]
    assert "applied=new flush=failed" in line and "kept=last-good" not in line, line


def test_a_restart_revokes_a_grant_whose_exposure_target_moved(
    gateway: tuple[Gateway, list[str]], ns: str
) -> None:
    """The kernel's admission rules carry the target (in their comment), so a restarted init-nat, which
    only has them, revokes like --watch does: GA's flows were DNATed to 192.0.2.66, the exposure now
    points at 192.0.2.70."""
    gw, _ = gateway
    gw.apply(plan(GA))
    assert "to=192.0.2.66" in our_chain(ns)
    fresh = Gateway(gw.iptables, gw.netlink, Recorder([], ns), resolver=gw.resolver, sysctls=gw.sysctls)
    fresh.apply(plan(GA, host="api.fabric.example"))
    assert isinstance(fresh.flusher, Recorder) and fresh.flusher.flushed == [(0x10000, 0x0FFF0000)]
    again = Gateway(gw.iptables, gw.netlink, Recorder([], ns), resolver=gw.resolver, sysctls=gw.sysctls)
    again.apply(plan(GA, host="api.fabric.example"))
    assert isinstance(again.flusher, Recorder) and again.flusher.flushed == [], "same target: nothing"


def test_watch_looks_again_when_dns_resolved_a_target_to_a_virtual_ip(
    gateway: tuple[Gateway, list[str]], ns: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The verdict on a resolved targetHost depends on DNS, not on the plan's bytes: DNS answering a
    virtual IP leaves that exposure out (and says why) until a resync finds a real address."""
    gw, _ = gateway
    answers = [IPv4Address("198.18.0.10"), IPv4Address("192.0.2.70")]  # first the VIP, then a real host
    gw.resolver = lambda host: answers[0] if len(answers) == 1 else answers.pop(0)
    path = tmp_path / "plan.json"
    path.write_bytes(dumps(plan(GA, host="api.fabric.example")))
    with caplog.at_level("INFO", logger="initnat"):
        watch_until(gw, path, lambda: "to=192.0.2.70" in our_chain(ns), resync=0.3)
    assert "to=192.0.2.70" in our_chain(ns), "applied at the resync once DNS answered a real address"
    (left_out,) = [r.getMessage() for r in caplog.records if "initnat.left_out" in r.getMessage()]
    assert "the virtual IP of nat.exposures[0]" in left_out and "grants=s1/0x10000" in left_out, left_out
    assert not [r for r in caplog.records if "initnat.rejected" in r.getMessage()], "the plan is not rejected"


def test_a_hanging_resolver_holds_up_an_apply_only_until_the_deadline_and_the_status_file_says_why(
    gateway: tuple[Gateway, list[str]], ns: str, tmp_path: Path
) -> None:
    """{A, B} -> {B} plus an exposure whose name never answers: A's revocation goes through after the
    resolve deadline (it waited for nothing more), the other exposure stays, and the status file next to
    the plan names what was left out."""
    gw, events = gateway
    never = threading.Event()

    def resolver(host: str) -> IPv4Address:
        if host == "hangs.example":
            never.wait(30)
        return IPv4Address("192.0.2.70")

    gw.resolver, gw.resolve_timeout = resolver, 0.5
    two = plan(GA, GB)
    path = tmp_path / "plan.json"
    status = StatusFile(tmp_path / "initnat-status.json")
    path.write_bytes(dumps(two))
    assert run_once(gw, path, status) == EXIT_OK
    ghost = Exposure("ghost", "198.18.0.12", (Port(443),), target_host="hangs.example")
    g3 = Grant("s3", "ghost", "exposure", ("203.0.113.32/28",), 0x30000)
    nxt = dataclasses.replace(
        two, nat=dataclasses.replace(two.nat, exposures=(*two.nat.exposures, ghost), grants=(GB, g3))
    )
    path.write_bytes(dumps(nxt))
    started = time.monotonic()
    try:
        assert run_once(gw, path, status) == EXIT_OK
    finally:
        never.set()
    assert time.monotonic() - started < 3.0
    assert events[-3:] == ["restore", "flush 0x10000", "restore"], "A revoked: swap, flush, lift"
    chain = our_chain(ns)
    assert ADMIT_A not in chain and ADMIT_B in chain and "0x30000" not in chain
    assert '--ctorigdst 198.18.0.12 -m comment --comment "vpngw not granted" -j DROP' in chain
    doc = json.loads(status.path.read_text())
    assert doc["planHash"] == plan_hash(nxt) and doc["lastError"] is None
    assert doc["leftOut"] == [
        {
            "exposure": "ghost",
            "field": "nat.exposures[1].targetHost",
            "virtualIp": "198.18.0.12",
            "host": "hangs.example",
            "reason": "hangs.example does not resolve: no answer within 0.5 s",
            "grants": [{"peer": "s3", "mark": "0x30000"}],
        }
    ]
    path.write_text("{")
    assert run_once(gw, path, status) == EXIT_BAD_INPUT
    doc = json.loads(status.path.read_text())
    assert doc["planHash"] == plan_hash(nxt) and doc["lastError"].startswith("rejected: "), (
        "what is in force, and that the newer plan was rejected"
    )


def test_a_failed_save_before_any_change_is_reported_as_last_good_kept(
    gateway: tuple[Gateway, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The apply reads the kernel's rules before changing anything: if that read fails, nothing changed,
    and the failure line must say so (it said applied=unknown)."""
    gw, events = gateway
    gw.apply(plan(GA))

    def broken() -> str:
        raise IptablesError("iptables-nft-save failed: injected", rolled_back=False)

    monkeypatch.setattr(gw.iptables, "saved", broken)
    with pytest.raises(IptablesError) as info:
        gw.apply(plan(GA, GB))
    assert outcome(info.value) == "kept=last-good" and events == ["restore"]
