"""The commands the project runs, declared once (tests/component/test_install_drift.py checks that the
install files bring each; tests/conftest.py records what a test session starts and fails the session on a
command that is not declared here)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from lab.daemons import CHARON

IMAGE_COMMANDS = frozenset(
    {
        CHARON,
        "swanctl",  # debugging charon inside the pod (docs/debugging)
        "iptables-legacy-save",
        "iptables-legacy-restore",
        "iptables-nft-save",
        "iptables-nft-restore",
        "ip6tables-legacy-save",
        "ip6tables-legacy-restore",
        "ip6tables-nft-save",
        "ip6tables-nft-restore",
        "wireguard-go",
        "wg",
        "ip",
        "conntrack",
        "python3",
    }
)
"""The gateway image: charon and wireguard-go as containers run them, init-nat's iptables variants, the
tools a user debugging inside a gateway pod is told to use (docs), and the image's Python."""

HOST_COMMANDS = frozenset(
    {
        "sysctl",
        "nstat",
        "ping",
        "unshare",
        "setpriv",  # a test runs the exporter as the pod does: 65532, no capabilities
        "mount",
        "umount",
        "sh",
        "cat",
        "kill",
        "sleep",
        "timeout",
        "env",
        "id",
        "echo",
        "uname",  # pytest-xdist's workers (``make test`` runs them) ask platform.processor()
        "iptables",
        "iptables-save",
        "iptables-restore",
        "iptables-legacy",
        "iptables-nft",
        "nsenter",
        "socat",
        "curl",
        "promtool",
        "openssl",
        "make",
        "bash",
        "dpkg-query",
        "tar",
        "unzip",
        "mariadbd",
        "mariadb-install-db",
        "podman",
        "buildah",
        "skopeo",
        "qemu-system-x86_64",  # the kernel tier's VM (lab/vm, scripts/setup_vm.sh)
    }
)
"""What the lab, tests, demo and benchmarks run besides the image's commands (setup.sh must install it)."""

NOT_DEBIAN = frozenset(
    {
        "helm",
        "kubectl",
        "hadolint",
        "uwsgi",
        "neutron-db-manage",
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "celcost",
    }
)
"""Brought by setup.sh from other registries (.tools/bin from npm, .venv and .venv-neutron from PyPI), not by
apt; etcd, kube-apiserver and kube-controller-manager are compiled into .tools/bin from the Go module proxy
(scripts/setup_controlplane.sh)."""

MACHINE_COMMANDS = frozenset({"npm", "python3"})
"""Every machine of this kind has CPython and Node.js with npm (setup.sh installs Debian's npm only where
there is none); the gateway image installs Debian's python3 itself."""


def declared() -> frozenset[str]:
    names = IMAGE_COMMANDS | HOST_COMMANDS | NOT_DEBIAN | MACHINE_COMMANDS
    return frozenset(os.path.basename(n) for n in names) | {"python"}


_VALUE_OPTIONS = {
    "--propagation",
    "-n",
    "--net",
    "-t",
    "--target",
    "--setgroups",
    "--map-user",
    "--map-group",
}


def started(argv: Sequence[str]) -> list[str]:
    """The commands an argv starts: its first word, and what a wrapper it is execs (``ip netns exec NS
    cmd``, ``unshare [options] cmd``, ``timeout N cmd``, ``env K=V cmd``, ``nsenter ... cmd``)."""
    out: list[str] = []
    rest = list(argv)
    while rest:
        name = os.path.basename(rest[0])
        out.append(name)
        if name == "ip" and rest[1:3] == ["netns", "exec"] and len(rest) > 4:
            rest = rest[4:]
        elif name in ("unshare", "nsenter", "setsid", "setpriv"):
            i = 1
            while i < len(rest) and rest[i].startswith("-"):
                i += 2 if rest[i] in _VALUE_OPTIONS else 1
            rest = rest[i:]
        elif name == "timeout" and len(rest) > 2:
            rest = rest[2:]
        elif name == "env":
            i = 1
            while i < len(rest) and ("=" in rest[i] or rest[i].startswith("-")):
                i += 1
            rest = rest[i:]
        else:
            break
    return out
