"""The OpenStack lab's daemons and their ports (lab.ports): mariadbd and uWSGI are told a port picked free
just before their start; when another process takes it first, the daemon exits with EADDRINUSE and the
lab starts it again on a new port. A restart keeps its port, and says so when another process took it.

A Neutron of its own per test (not the session's: these tests take its ports away)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from lab import ports
from lab.openstack import neutron as neutron_mod
from lab.openstack.neutron import Neutron, start_neutron
from lab.openstack.process import LabOpenStackError
from lab.wait import WaitTimeout, wait_for

pytestmark = [pytest.mark.lab]


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port another process holds, listening, for the whole test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_mariadb_and_uwsgi_that_lost_their_port_start_again_on_a_new_one(
    taken: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ports.free_port
    picked: list[int] = []

    def rigged(host: str = "127.0.0.1") -> int:
        # every first pick of a daemon is the taken port: mariadbd's first, then uWSGI's first
        port = taken if len(picked) in (0, 2) else real(host)
        picked.append(port)
        return port

    monkeypatch.setattr(ports, "free_port", rigged)
    n = start_neutron()
    try:
        assert picked[0] == picked[2] == taken and len(picked) == 4
        assert (n.db.port, n.port) == (picked[1], picked[3])
        assert "Address already in use" in (n.db.dir / "mysqld.err").read_text(errors="replace")
        assert "Address already in use" in (n.conf_dir / "uwsgi.log").read_text(errors="replace")
        assert isinstance(n.api("GET", "/v2.0/networks")["networks"], list)  # it answers
    finally:
        n.close()


def squat(port: int) -> socket.socket | None:
    """A listener of ours on ``port``, or None when another process holds it (a listener that stays)."""

    def bound() -> socket.socket | None:
        s = socket.socket()
        # SO_REUSEADDR: the old server's TIME_WAIT connections on the port do not stop a new listener
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
            return s
        except OSError as exc:
            s.close()
            if ports.is_address_in_use(exc):
                return None  # another process's momentary bind (a free-port probe) goes away: again
            raise

    try:
        return wait_for(bound, 5, f"port {port} free to listen on")
    except WaitTimeout:
        return None


def test_a_restart_whose_port_was_taken_meanwhile_fails_saying_so_and_succeeds_once_it_is_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(neutron_mod, "SAME_PORT_TRIES", 3)
    n: Neutron = start_neutron()
    try:
        port = n.port
        n.stop()
        # The port is anyone's now: a random-order run saw another process listen on it before our
        # squatter could (the very race this lab guards against). Then that process is the squatter.
        squatter = squat(port)
        try:
            with pytest.raises(LabOpenStackError, match=rf"its port {port} was taken by another process"):
                n.start()
            assert not n.running
        finally:
            if squatter is not None:
                squatter.close()
        if squatter is not None:  # freed by us: the restart goes through on the same port
            n.start()
            assert n.port == port and n.running
            assert isinstance(n.api("GET", "/v2.0/networks")["networks"], list)  # it answers
    finally:
        n.close()
