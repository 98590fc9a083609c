"""init-nat's forwarding settings: the decision (pure) and ``ensure`` over a /proc/sys tree or a refusing
one (as a non-privileged container's read-only /proc/sys refuses)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from initnat import sysctl
from initnat.sysctl import IP_FORWARD, ProcSys, Setting, SysctlError

ALL, NIC = "net.ipv4.conf.all.rp_filter", "net.ipv4.conf.ens7.rp_filter"


@pytest.mark.parametrize(
    "current, wanted",
    [
        pytest.param({IP_FORWARD: 1, ALL: 0, NIC: 0}, [], id="forwarding-loose-nothing-to-do"),
        pytest.param({IP_FORWARD: 0, ALL: 0, NIC: 0}, [(IP_FORWARD, 1)], id="forwarding-off"),
        pytest.param({IP_FORWARD: 1, ALL: 0, NIC: 1}, [(NIC, 2)], id="nic-strict"),
        pytest.param({IP_FORWARD: 1, ALL: 1, NIC: 0}, [(NIC, 2)], id="all-strict-wins-over-nic-off"),
        pytest.param({IP_FORWARD: 1, ALL: 1, NIC: 2}, [], id="nic-loose-wins-over-all-strict"),
        pytest.param({IP_FORWARD: 1, ALL: 2, NIC: 1}, [], id="all-loose-wins-over-nic-strict"),
        pytest.param({IP_FORWARD: 0, ALL: 1, NIC: 1}, [(IP_FORWARD, 1), (NIC, 2)], id="both"),
    ],
)
def test_needed_makes_the_namespace_forward_and_nic2_loose(
    current: dict[str, int], wanted: list[tuple[str, int]]
) -> None:
    assert [(s.name, s.value) for s in sysctl.needed("ens7", current)] == wanted


def proc_sys(tmp_path: Path, forward: int, all_rp: int, nic_rp: int) -> Path:
    for name, value in ((IP_FORWARD, forward), (ALL, all_rp), (NIC, nic_rp)):
        path = tmp_path.joinpath(*name.split("."))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    return tmp_path


def test_ensure_writes_what_is_wrong_and_only_that(tmp_path: Path) -> None:
    root = proc_sys(tmp_path, forward=0, all_rp=1, nic_rp=1)
    written = sysctl.ensure("ens7", ProcSys(root))
    assert [s.name for s in written] == [IP_FORWARD, NIC]
    assert (root / "net/ipv4/ip_forward").read_text() == "1\n"
    assert (root / "net/ipv4/conf/ens7/rp_filter").read_text() == "2\n"
    assert (root / "net/ipv4/conf/all/rp_filter").read_text() == "1\n", "the namespace-wide one is not ours"
    assert sysctl.ensure("ens7", ProcSys(root)) == [], "a second apply writes nothing"


class ReadOnly:
    """/proc/sys as a non-privileged container sees it: readable, every write EROFS."""

    def __init__(self, values: dict[str, int]) -> None:
        self.values = values
        self.writes: list[str] = []

    def read(self, name: str) -> int:
        return self.values[name]

    def write(self, name: str, value: int) -> None:
        self.writes.append(name)
        raise OSError(errno.EROFS, "Read-only file system")


def test_read_only_proc_sys_is_fine_when_the_settings_already_hold() -> None:
    ro = ReadOnly({IP_FORWARD: 1, ALL: 2, NIC: 1})
    assert sysctl.ensure("ens7", ro) == []
    assert ro.writes == []


def test_read_only_proc_sys_with_forwarding_off_names_the_sysctl_and_the_ways_to_allow_it() -> None:
    ro = ReadOnly({IP_FORWARD: 0, ALL: 0, NIC: 1})
    with pytest.raises(SysctlError) as err:
        sysctl.ensure("ens7", ro)
    msg = str(err.value)
    assert "net.ipv4.ip_forward is 0, must be 1" in msg
    assert "net.ipv4.conf.ens7.rp_filter is 1, must be 2" in msg
    assert "privileged init container" in msg
    assert "securityContext.sysctls" in msg
    assert "net.ipv4.conf.all.rp_filter=2, net.ipv4.ip_forward=1" in msg
    assert "--allowed-unsafe-sysctls=net.ipv4.conf.all.rp_filter,net.ipv4.ip_forward" in msg


def test_other_write_failures_and_unreadable_settings_are_errors_too(tmp_path: Path) -> None:
    class Broken(ReadOnly):
        def write(self, name: str, value: int) -> None:
            raise OSError(errno.EINVAL, "Invalid argument")

    with pytest.raises(SysctlError, match=r"net\.ipv4\.ip_forward: writing 1 failed: Invalid argument"):
        sysctl.ensure("ens7", Broken({IP_FORWARD: 0, ALL: 0, NIC: 0}))
    with pytest.raises(SysctlError, match=r"net.ipv4.conf.nope.rp_filter: cannot read it"):
        sysctl.ensure("nope", ProcSys(proc_sys(tmp_path, 1, 0, 0)))


def test_a_pod_cannot_name_nic2_so_its_sysctl_is_the_namespace_wide_one() -> None:
    assert Setting(NIC, 2, "").pod_sysctl == ALL
    assert Setting(IP_FORWARD, 1, "").pod_sysctl == IP_FORWARD
