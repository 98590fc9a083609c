"""Network namespaces, veth links and addresses for the lab, driven through iproute2.

Every name carries the run's prefix ``vg<pid>x<rand>`` so that two runs never collide and a later run
can tell a dead run's leftovers (its pid is gone) from a live one's.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import signal
import subprocess
from collections.abc import Iterator, Sequence

log = logging.getLogger(__name__)

PREFIX = "vg"
_NAME = re.compile(rf"^{PREFIX}(\d+)x[0-9a-f]+-")


class LabError(RuntimeError):
    """The lab could not be built or torn down; the message carries the failing command."""


def run(
    cmd: Sequence[str], *, check: bool = True, input: bytes | None = None, timeout: float = 30.0
) -> subprocess.CompletedProcess[bytes]:
    res = subprocess.run(list(cmd), input=input, capture_output=True, timeout=timeout, check=False)
    if check and res.returncode != 0:
        raise LabError(
            f"{' '.join(cmd)}: exit {res.returncode}: {res.stderr.decode(errors='replace').strip()}"
        )
    return res


def ns_exec(ns: str, *cmd: str) -> list[str]:
    """The argv that runs ``cmd`` inside namespace ``ns`` (with its own mount namespace)."""
    return ["ip", "netns", "exec", ns, *cmd]


def list_namespaces() -> list[str]:
    out = run(["ip", "netns", "list"]).stdout.decode()
    return [line.split()[0] for line in out.splitlines() if line.strip()]


ROUTER_SYSCTLS = {
    "net.ipv4.ip_forward": 1,
    "net.ipv4.conf.all.rp_filter": 0,
    "net.ipv4.conf.default.rp_filter": 0,
}
"""The lab's routers, sites and services forward, and accept asymmetric paths (they stand in for a cloud)."""
POD_SYSCTLS = {
    "net.ipv4.ip_forward": 0,
    "net.ipv4.conf.all.rp_filter": 1,
    "net.ipv4.conf.default.rp_filter": 1,
}
"""A gateway pod's namespace as the worst host leaves it: no forwarding, strict reverse-path filtering
(a new namespace inherits the host's settings; a fresh Debian host has ip_forward 0). init-nat must make
it forward (initnat/sysctl.py); the lab must not do it for init-nat."""


def add_ns(name: str, sysctls: dict[str, int] | None = None) -> None:
    """A namespace with ``lo`` up and ``sysctls`` set, whatever the host's are (default: a router's)."""
    run(["ip", "netns", "add", name])
    run(["ip", "-n", name, "link", "set", "lo", "up"])
    for key, value in (ROUTER_SYSCTLS if sysctls is None else sysctls).items():
        run(ns_exec(name, "sysctl", "-q", "-w", f"{key}={value}"))


class NsSysctls:
    """``initnat.sysctl.Sysctls`` inside namespace ``ns``, for tests that drive init-nat's ``Gateway``
    from outside it (a process's /proc/sys shows the namespace the process runs in, so this one's own
    would be the host's)."""

    def __init__(self, ns: str) -> None:
        self.ns = ns

    def _path(self, name: str) -> str:
        return "/proc/sys/" + name.replace(".", "/")

    def read(self, name: str) -> int:
        res = run(ns_exec(self.ns, "cat", self._path(name)), check=False)
        if res.returncode != 0:
            raise OSError(errno.EIO, res.stderr.decode(errors="replace").strip())
        return int(res.stdout.split()[0])

    def write(self, name: str, value: int) -> None:
        res = run(
            ns_exec(self.ns, "sh", "-c", f'echo {int(value)} > "$1"', "sh", self._path(name)), check=False
        )
        if res.returncode != 0:
            err = res.stderr.decode(errors="replace")
            raise OSError(errno.EROFS if "Read-only" in err else errno.EIO, err.strip())


def del_ns(name: str) -> None:
    # Deleting a namespace destroys the veth ends inside it, and their peers with them.
    run(["ip", "netns", "del", name], check=False)


def destroy_ns(name: str) -> None:
    """Kill whatever still runs inside ``name`` (a test's helper process), then delete the namespace."""
    for pid in pids_in(name):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    del_ns(name)


def veth(ns_a: str, if_a: str, ns_b: str, if_b: str, *, mac_a: str | None = None) -> None:
    """A veth pair created directly inside the two namespaces (no name ever exists in the root ns)."""
    cmd = ["ip", "-n", ns_a, "link", "add", if_a]
    if mac_a:
        cmd += ["address", mac_a]
    cmd += ["type", "veth", "peer", "name", if_b, "netns", ns_b]
    run(cmd)
    run(["ip", "-n", ns_a, "link", "set", if_a, "up"])
    run(["ip", "-n", ns_b, "link", "set", if_b, "up"])


def addr(ns: str, dev: str, cidr: str) -> None:
    run(["ip", "-n", ns, "addr", "add", cidr, "dev", dev])


def route(ns: str, *args: str) -> None:
    run(["ip", "-n", ns, "route", "replace", *args])


def owner_pid(ns_name: str) -> int | None:
    m = _NAME.match(ns_name)
    return int(m.group(1)) if m else None


def stale_namespaces() -> list[str]:
    """Lab namespaces whose owning process is gone (a crashed or SIGKILLed run)."""
    stale = []
    for ns in list_namespaces():
        pid = owner_pid(ns)
        if pid is not None and not os.path.exists(f"/proc/{pid}"):
            stale.append(ns)
    return stale


def pids_in(ns: str) -> list[int]:
    res = run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in res.stdout.split()]


@contextlib.contextmanager
def nic2_ns(
    tag: str, mac: str, dev: str = "n2", peer: str = "p2", cidr: str = "192.0.2.2/26"
) -> Iterator[str]:
    """A throwaway namespace holding a NIC2 stand-in: veth ``dev`` (with ``mac`` and ``cidr``) to ``peer``,
    both up; destroyed on exit, whatever happened inside."""
    name = f"{PREFIX}{os.getpid()}x{secrets.token_hex(3)}-{tag}"
    add_ns(name, POD_SYSCTLS)
    try:
        run(["ip", "-n", name, "link", "add", dev, "address", mac, "type", "veth", "peer", "name", peer])
        for d in (dev, peer):
            run(["ip", "-n", name, "link", "set", d, "up"])
        addr(name, dev, cidr)
        yield name
    finally:
        destroy_ns(name)
