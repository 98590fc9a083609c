"""The kernel settings the gateway's data plane needs in its network namespace, and their enforcement.

A new network namespace takes ``net.ipv4.ip_forward`` and the IPv4 ``conf/{all,default}`` settings from
the host's initial namespace (the kernel's default ``net.core.devconf_inherit_init_net=0``; 2 resets them
to the kernel defaults, 3 copies the creating namespace's), and a container runtime or CNI may change them
either way. So init-nat makes sure of them itself, whatever the pod inherited:

* ``net.ipv4.ip_forward = 1``: exposures DNAT tunnel traffic to fabric targets through NIC2, and reverse
  exposures forward fabric traffic into the tunnels. Off, every such packet is dropped without a word.
* NIC2's reverse-path filter must not be strict. Reverse-exposure traffic from the fabric arrives on NIC2
  from sources the main table routes elsewhere (the pod's default route leaves through eth0), so a strict
  ``rp_filter`` (1) drops it; loose (2) only asks that the source be routable at all. The kernel uses
  ``max(conf.all.rp_filter, conf.<dev>.rp_filter)``, so writing 2 on NIC2 gives loose whatever ``all`` is.
  Traffic to NIC2's own address (IKE, WireGuard) and exposure replies pass even strict mode: the
  source-policy rules send their reverse lookups to NIC2 (docs/initnat.md, measured).
* ``src_valid_mark`` is left as it is: with it on, the reverse-path check of a reply carrying the reply
  bit is a lookup with the mark, and routing.py's main-first reply rule gives it the same answer as
  without (measured for WireGuard, whose peer routes live in main; docs/initnat.md).

Where ``/proc/sys`` is read-only (a container that is not privileged: the runtime mounts it so even with
NET_ADMIN), a setting that already holds is fine and one that does not is an error naming the sysctl and
the ways to allow it; init-nat never reports success over a data plane that cannot forward.

``needed`` is the decision (pure); ``ensure`` reads and writes through a ``Sysctls`` (``ProcSys``: this
process's own ``/proc/sys``, which shows the network namespace the process runs in).
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

PROC_SYS = Path("/proc/sys")
IP_FORWARD = "net.ipv4.ip_forward"
RP_STRICT, RP_LOOSE = 1, 2

HOW_TO_ALLOW = (
    "/proc/sys is read-only here: run init-nat as a privileged init container (a writable /proc/sys), or "
    "set {settings} in the pod's securityContext.sysctls (unsafe sysctls: the kubelet must allow them with "
    "--allowed-unsafe-sysctls={names})"
)


class SysctlError(Exception):
    """A setting the data plane needs is wrong and cannot be changed here (or reading it failed)."""


@dataclass(frozen=True)
class Setting:
    name: str
    """The dotted sysctl name, e.g. ``net.ipv4.conf.ens7.rp_filter``."""
    value: int
    why: str

    @property
    def pod_sysctl(self) -> str:
        """What a pod's ``securityContext.sysctls`` would set to get the same effect (an interface's own
        setting cannot be set there: NIC2 appears with the CNI, so the ``all`` setting stands in)."""
        if self.name.endswith(".rp_filter"):
            return "net.ipv4.conf.all.rp_filter"
        return self.name


def rp_filter(nic: str) -> str:
    return f"net.ipv4.conf.{nic}.rp_filter"


def needed(nic: str, current: Mapping[str, int]) -> list[Setting]:
    """The writes that make ``current`` forward and accept NIC2's reply path (empty: all is well)."""
    out: list[Setting] = []
    if current.get(IP_FORWARD) != 1:
        out.append(Setting(IP_FORWARD, 1, "exposures and reverse exposures forward between NIC2 and tunnels"))
    effective = max(current.get("net.ipv4.conf.all.rp_filter", 0), current.get(rp_filter(nic), 0))
    if effective == RP_STRICT:
        out.append(
            Setting(
                rp_filter(nic),
                RP_LOOSE,
                "reverse-exposure traffic arrives on NIC2 from sources the main table routes via eth0",
            )
        )
    return out


def names(nic: str) -> tuple[str, ...]:
    return (IP_FORWARD, "net.ipv4.conf.all.rp_filter", rp_filter(nic))


class Sysctls(Protocol):
    def read(self, name: str) -> int:
        """The current value; raises OSError."""
        ...

    def write(self, name: str, value: int) -> None:
        """Raises OSError (``errno.EROFS`` where /proc/sys is mounted read-only)."""
        ...


@dataclass(frozen=True)
class ProcSys:
    """``Sysctls`` over a ``/proc/sys`` tree: this process's (its network namespace's) by default."""

    root: Path = PROC_SYS

    def _path(self, name: str) -> Path:
        return self.root.joinpath(*name.split("."))

    def read(self, name: str) -> int:
        text = self._path(name).read_text().split()
        if not text or not text[0].lstrip("-").isdigit():
            raise OSError(errno.EINVAL, f"not an integer: {' '.join(text)[:40]!r}")
        return int(text[0])

    def write(self, name: str, value: int) -> None:
        self._path(name).write_text(f"{value}\n")


def read(nic: str, access: Sysctls) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in names(nic):
        try:
            out[name] = access.read(name)
        except OSError as exc:
            raise SysctlError(f"{name}: cannot read it: {exc.strerror or exc}") from exc
    return out


def ensure(nic: str, access: Sysctls) -> list[Setting]:
    """Make the settings hold; returns what was written. Raises SysctlError naming every setting that is
    wrong and cannot be written, with the ways to allow it."""
    current = read(nic, access)
    wrong = needed(nic, current)
    refused: list[Setting] = []
    for s in wrong:
        try:
            access.write(s.name, s.value)
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise SysctlError(f"{s.name}: writing {s.value} failed: {exc.strerror or exc}") from exc
            refused.append(s)
    if refused:
        what = "; ".join(
            f"{s.name} is {current.get(s.name, 0)}, must be {s.value} ({s.why})" for s in refused
        )
        pod = sorted({(s.pod_sysctl, s.value) for s in refused})
        settings = ", ".join(f"{n}={v}" for n, v in pod)
        raise SysctlError(
            f"{what}: {HOW_TO_ALLOW.format(settings=settings, names=','.join(n for n, _ in pod))}"
        )
    return wrong
