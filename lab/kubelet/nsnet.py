"""Sockets that live in a named network namespace, made without starting a process.

A socket belongs to the network namespace of the thread that created it, for its whole life. ``setns``
moves only the calling thread, so a short-lived thread enters the namespace, creates the socket and
ends; the socket can then be used from any thread or event loop of the lab kubelet (the API relay's
listener on the node, the probes that reach a pod's IP, the eth0 egress capture).
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
from collections.abc import Callable
from typing import TypeVar

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
T = TypeVar("T")

_libc = ctypes.CDLL(None, use_errno=True)


def in_netns(ns: str, fn: Callable[[], T]) -> T:
    """``fn()`` run on a fresh thread that has entered network namespace ``ns`` (``ip netns`` name)."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            fd = os.open(os.path.join(NETNS_DIR, ns), os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({ns}): {os.strerror(err)}")
            finally:
                os.close(fd)
            result.append(fn())
        except BaseException as exc:  # handed to the caller
            error.append(exc)

    t = threading.Thread(target=run, name=f"netns-{ns}", daemon=True)
    t.start()
    t.join()
    if error:
        raise error[0]
    return result[0]


def socket_in(
    ns: str, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM, proto: int = 0
) -> socket.socket:
    return in_netns(ns, lambda: socket.socket(family, kind, proto))


def listener_in(ns: str, host: str, port: int, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A bound (and, for TCP, listening) non-blocking socket in ``ns``."""

    def make() -> socket.socket:
        s = socket.socket(socket.AF_INET, kind)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
            if kind == socket.SOCK_STREAM:
                s.listen(128)
            s.setblocking(False)
        except BaseException:
            s.close()
            raise
        return s

    return in_netns(ns, make)
