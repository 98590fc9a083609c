"""``python -m initnat`` as a user runs it, inside a throwaway network namespace (``ip netns exec``):
exit codes, structured logs, --watch following atomic renames and kubelet's ``..data`` symlink swap, a
bad plan keeping the last good ruleset."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gwplan import Exposure, GatewayRef, Grant, Nat, Nic, Plan, Port, dumps
from lab import netns
from lab.kubelet.volumes import write_atomic
from lab.wait import wait_for

pytestmark = [pytest.mark.lab]

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
MAC = "fa:16:3e:aa:bb:01"


@pytest.fixture
def ns() -> Iterator[str]:
    with netns.nic2_ns("cli", MAC, dev="eth7", peer="p7") as name:
        yield name


def make_plan(*grants: Grant, vip: str = "198.18.0.10") -> Plan:
    return Plan(
        gateway=GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "t", "gw"),
        type="ipsec",
        nic=Nic(mac=MAC, gateway="192.0.2.1"),
        nat=Nat(
            service_cidr="198.18.0.0/24",
            exposures=(Exposure("web", vip, (Port(80),), target_address="192.0.2.66"),),
            grants=grants,
        ),
    )


GA = Grant("s1", "web", "exposure", ("203.0.113.0/28",), 0x10000)
GB = Grant("s2", "web", "exposure", ("203.0.113.16/28",), 0x20000)


def initnat(ns: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        netns.ns_exec(ns, PY, "-m", "initnat", *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )


def our_rules(ns: str) -> str:
    save = netns.run(netns.ns_exec(ns, "iptables-save")).stdout.decode()
    return "\n".join(line for line in save.splitlines() if "VPNGW" in line and line.startswith("-A"))


def test_help_documents_the_command_and_its_exit_codes() -> None:
    res = subprocess.run(
        [PY, "-m", "initnat", "--help"], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert res.returncode == 0
    for word in (
        "--plan",
        "--nic-mac",
        "--watch",
        "--network-status",
        "exit codes:",
        "1  a kernel step failed",
        "applied=new flush=failed",
        "2  bad input",
    ):
        assert word in res.stdout


def test_one_shot_apply_exit_0_and_a_canonical_log_line(ns: str, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_bytes(dumps(make_plan(GA)))
    res = initnat(ns, "--plan", str(plan))
    assert res.returncode == 0, res.stderr
    assert "initnat.applied nic=eth7 mac=fa:16:3e:aa:bb:01 address=192.0.2.2/26" in res.stderr
    assert "changed=True" in res.stderr and "--set-xmark 0x10000/0xfff0000" in our_rules(ns)
    assert "from 192.0.2.2 lookup 100" in netns.run(["ip", "-n", ns, "rule"]).stdout.decode()


def sysctl_of(ns: str, name: str) -> int:
    return netns.NsSysctls(ns).read(name)


def test_apply_makes_a_namespace_that_inherited_no_forwarding_forward(ns: str, tmp_path: Path) -> None:
    """The namespace starts as a fresh host leaves a pod's (lab.netns.POD_SYSCTLS: ip_forward 0, strict
    rp_filter); the apply turns forwarding on and NIC2's reverse-path filter loose, and says so."""
    assert sysctl_of(ns, "net.ipv4.ip_forward") == 0
    assert sysctl_of(ns, "net.ipv4.conf.all.rp_filter") == 1
    plan = tmp_path / "plan.json"
    plan.write_bytes(dumps(make_plan(GA)))
    res = initnat(ns, "--plan", str(plan))
    assert res.returncode == 0, res.stderr
    assert sysctl_of(ns, "net.ipv4.ip_forward") == 1
    assert sysctl_of(ns, "net.ipv4.conf.eth7.rp_filter") == 2
    assert sysctl_of(ns, "net.ipv4.conf.all.rp_filter") == 1, "the namespace-wide setting is left alone"
    assert "initnat.sysctl_set name=net.ipv4.ip_forward value=1" in res.stderr
    assert "initnat.sysctl_set name=net.ipv4.conf.eth7.rp_filter value=2" in res.stderr
    again = initnat(ns, "--plan", str(plan))
    assert again.returncode == 0 and "sysctl_set" not in again.stderr, "nothing to set the second time"


def initnat_read_only_proc_sys(ns: str, *args: str) -> subprocess.CompletedProcess[str]:
    """init-nat where /proc/sys is read-only, as a container runtime mounts it for a container that is not
    privileged (even one with NET_ADMIN)."""
    script = 'mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec "$@"'
    return subprocess.run(
        netns.ns_exec(ns, "unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                      PY, "-m", "initnat", *args),
        capture_output=True, text=True, timeout=30, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False,
    )  # fmt: skip


def test_read_only_proc_sys_with_forwarding_off_is_exit_1_naming_the_sysctl(ns: str, tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_bytes(dumps(make_plan(GA)))
    res = initnat_read_only_proc_sys(ns, "--plan", str(plan))
    assert res.returncode == 1, res.stderr
    assert "initnat.failed" in res.stderr and "kept=last-good" in res.stderr
    for words in (
        "net.ipv4.ip_forward is 0, must be 1",
        "privileged init container",
        "securityContext.sysctls",
        "--allowed-unsafe-sysctls=net.ipv4.conf.all.rp_filter,net.ipv4.ip_forward",
    ):
        assert words in res.stderr
    assert our_rules(ns) == "", "nothing was applied over a data plane that cannot forward"
    assert sysctl_of(ns, "net.ipv4.ip_forward") == 0


def test_read_only_proc_sys_is_fine_when_the_pod_already_forwards(ns: str, tmp_path: Path) -> None:
    """What the pod's securityContext.sysctls would have set: init-nat needs to write nothing."""
    netns.NsSysctls(ns).write("net.ipv4.ip_forward", 1)
    netns.NsSysctls(ns).write("net.ipv4.conf.all.rp_filter", 2)
    plan = tmp_path / "plan.json"
    plan.write_bytes(dumps(make_plan(GA)))
    res = initnat_read_only_proc_sys(ns, "--plan", str(plan))
    assert res.returncode == 0, res.stderr
    assert "sysctl_set" not in res.stderr and "initnat.applied" in res.stderr


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        pytest.param(b"{not json", (), "plan: not JSON", id="not-json"),
        pytest.param(
            dumps(make_plan(GA, vip="10.0.0.1")),
            (),
            "nat.exposures[0].virtualIp: 10.0.0.1 is outside",
            id="vip",
        ),
        pytest.param(
            dumps(make_plan(GA)), ("--nic-mac", "fa:16:3e:00:00:00"), "no interface with MAC", id="no-nic"
        ),
        pytest.param(
            dumps(make_plan(GA)), ("--nic-mac", "eth7"), "--nic-mac: 'eth7' is not a MAC", id="bad-mac"
        ),
        pytest.param(None, (), "cannot read", id="missing-file"),
    ],
)
def test_bad_input_exits_2_naming_the_problem_and_changes_nothing(
    ns: str, tmp_path: Path, content: bytes | None, extra: tuple[str, ...], message: str
) -> None:
    plan = tmp_path / "plan.json"
    if content is not None:
        plan.write_bytes(content)
    res = initnat(ns, "--plan", str(plan), *extra)
    assert res.returncode == 2, res.stderr
    assert "initnat.rejected" in res.stderr and message in res.stderr
    assert our_rules(ns) == "" and "lookup 100" not in netns.run(["ip", "-n", ns, "rule"]).stdout.decode()


def test_runtime_failure_exits_1(ns: str, tmp_path: Path) -> None:
    """No iptables binaries on PATH: the kernel side cannot be changed (exit 1, not 2)."""
    plan = tmp_path / "plan.json"
    plan.write_bytes(dumps(make_plan(GA)))
    res = subprocess.run(
        netns.ns_exec(ns, "env", "PATH=/nonexistent", PY, "-m", "initnat", "--plan", str(plan)),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
        timeout=30,
    )
    assert res.returncode == 1, res.stderr
    assert "initnat.failed" in res.stderr


def test_watch_follows_kubelet_swaps_and_keeps_the_last_good_ruleset(ns: str, tmp_path: Path) -> None:
    volume = tmp_path / "vol"
    volume.mkdir()
    write_atomic(volume, {"plan.json": (dumps(make_plan(GA, GB)), 0o644)})
    log = tmp_path / "initnat.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            netns.ns_exec(ns, PY, "-m", "initnat", "--plan", str(volume / "plan.json"), "--watch"),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    try:
        wait_for(lambda: "0x20000/" in our_rules(ns), 10, "the first apply")
        write_atomic(volume, {"plan.json": (dumps(make_plan(GA)), 0o644)})
        swapped = time.monotonic()
        wait_for(lambda: "0x20000/" not in our_rules(ns), 5, "the re-apply after a ..data swap")
        took = time.monotonic() - swapped
        assert took < 2.0, f"re-applied {took:.2f} s after the change"
        good = our_rules(ns)

        write_atomic(volume, {"plan.json": (dumps(make_plan(GA, vip="10.0.0.1")), 0o644)})
        wait_for(lambda: "initnat.rejected" in log.read_text(), 5, "the bad plan to be reported")
        assert our_rules(ns) == good, "a bad plan leaves the last good ruleset in place"
        assert proc.poll() is None, "the watcher survives a bad plan"

        tmp = volume / "next.json"
        tmp.write_bytes(dumps(make_plan(GB)))
        os.replace(tmp, volume / "plan.json")  # an atomic rename over the path works as well
        wait_for(
            lambda: "0x20000/" in our_rules(ns) and "0x10000/" not in our_rules(ns), 5, "rename re-apply"
        )
    finally:
        proc.terminate()
        try:
            rc = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
            raise
    assert rc == 0, "SIGTERM is a clean stop"
    text = log.read_text()
    assert "initnat.rejected" in text and "nat.exposures[0].virtualIp" in text and "kept=last-good" in text
    assert text.count("initnat.applied") == 3 and "initnat.stopped" in text


def test_a_restarted_init_nat_flushes_grants_revoked_while_it_was_not_running(
    ns: str, tmp_path: Path
) -> None:
    """No previous plan in memory: the marks our chain set in the kernel tell which grants went away."""
    plan = tmp_path / "plan.json"
    plan.write_bytes(dumps(make_plan(GA, GB)))
    assert initnat(ns, "--plan", str(plan)).returncode == 0
    for i, mark in enumerate((0x10000, 0x10000, 0x20000)):
        netns.run(
            netns.ns_exec(ns, "conntrack", "-I", "-s", f"203.0.113.{i + 1}", "-d", "198.18.0.10", "-p", "tcp",
                          "--sport", str(3000 + i), "--dport", "80", "--state", "ESTABLISHED", "-t", "300",
                          "-u", "ASSURED", "-m", str(mark))
        )  # fmt: skip
    plan.write_bytes(dumps(make_plan(GB)))
    res = initnat(ns, "--plan", str(plan))
    assert res.returncode == 0, res.stderr
    assert "revoked_marks=0x10000/0xfff0000 " in res.stderr
    listed = netns.run(netns.ns_exec(ns, "conntrack", "-L")).stdout.decode()
    assert "mark=65536" not in listed and listed.count("mark=131072") == 1


def _insert_marked(ns: str, marks: tuple[int, ...]) -> None:
    for i, mark in enumerate(marks):
        netns.run(
            netns.ns_exec(ns, "conntrack", "-I", "-s", f"203.0.113.{i + 1}", "-d", "198.18.0.10", "-p", "tcp",
                          "--sport", str(4000 + i), "--dport", "80", "--state", "ESTABLISHED", "-t", "300",
                          "-u", "ASSURED", "-m", str(mark))
        )  # fmt: skip


def _marks_left(ns: str) -> list[int]:
    listed = netns.run(netns.ns_exec(ns, "conntrack", "-L")).stdout.decode()
    return sorted(int(w.split("=")[1]) for line in listed.splitlines() for w in line.split() if "mark=" in w)


@pytest.mark.parametrize("mode", ["watch", "restart"])
def test_a_mark_mask_change_flushes_revoked_grants_with_the_old_mask(
    ns: str, tmp_path: Path, mode: str
) -> None:
    """markMask 0x0fff0000 -> 0x00ff0000 while grant 0x1010000 is revoked: its entries were marked under
    the old mask, and ``ctmark & 0xff0000`` can never equal 0x1010000, so only a flush with the OLD mask
    finds them. Real conntrack entries (one with a foreign bit outside both masks); the surviving grant's
    entries stay. ``watch``: the previous plan is in memory; ``restart``: read back from the kernel."""
    old_a = Grant("s1", "web", "exposure", ("203.0.113.0/28",), 0x01010000)
    v1, v2 = make_plan(old_a, GB), make_plan(GB)
    v1 = dataclasses.replace(v1, nat=dataclasses.replace(v1.nat, mark_mask=0x0FFF0000))
    v2 = dataclasses.replace(v2, nat=dataclasses.replace(v2.nat, mark_mask=0x00FF0000))
    plan = tmp_path / "plan.json"
    plan.write_bytes(dumps(v1))
    marks = (0x01010000, 0x01010001, 0x20000, 0x20001)
    if mode == "restart":
        assert initnat(ns, "--plan", str(plan)).returncode == 0
        _insert_marked(ns, marks)
        plan.write_bytes(dumps(v2))
        res = initnat(ns, "--plan", str(plan))
        assert res.returncode == 0, res.stderr
        text = res.stderr
    else:
        log = tmp_path / "watch.log"
        with open(log, "w") as out:
            argv = ["--plan", str(plan), "--watch", "--poll-interval", "0.1"]
            proc = subprocess.Popen(
                netns.ns_exec(ns, PY, "-m", "initnat", *argv),
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip
        try:
            wait_for(lambda: "initnat.applied" in log.read_text(), 10, "the first apply")
            _insert_marked(ns, marks)
            tmp = tmp_path / "next.json"
            tmp.write_bytes(dumps(v2))
            os.replace(tmp, plan)
            wait_for(lambda: log.read_text().count("initnat.applied") == 2, 10, "the re-apply")
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        text = log.read_text()
    assert "revoked_marks=0x1010000/0xfff0000 " in text, text
    assert _marks_left(ns) == [0x20000, 0x20001], "the revoked grant's entries are gone, the other's stay"
