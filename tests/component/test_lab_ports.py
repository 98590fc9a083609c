"""lab.ports: a child told a port that another process took is started again on a new port; a server on
port 0 is found by the port it announces."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from lab import ports

BIND = """
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("bound", flush=True)
"""


@pytest.fixture
def busy() -> Iterator[int]:
    """A port some other party holds (bound and listening) for the whole test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def start_child(port: int) -> int:
    res = subprocess.run([sys.executable, "-c", BIND, str(port)], capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        if ports.address_in_use(res.stderr):
            raise ports.PortTaken(res.stderr.strip().splitlines()[-1])
        raise AssertionError(res.stderr)
    assert res.stdout == "bound\n"
    return port


def test_a_child_that_lost_its_port_is_started_again_on_a_new_one(busy: int) -> None:
    picks = iter([busy, ports.free_port()])
    tried: list[int] = []

    def start(port: int) -> int:
        tried.append(port)
        return start_child(port)

    got = ports.start_on_free_port(start, what="the child", pick=lambda: next(picks))
    assert tried == [busy, got] and got != busy


def test_a_port_lost_every_time_is_a_clear_error_after_the_attempts(busy: int) -> None:
    with pytest.raises(ports.PortsExhausted, match=r"the child: the port was taken .* 3 times") as err:
        ports.start_on_free_port(start_child, what="the child", attempts=3, pick=lambda: busy)
    assert "Address already in use" in str(err.value)


def test_another_failure_is_not_retried() -> None:
    calls: list[int] = []

    def start(port: int) -> int:
        calls.append(port)
        raise ValueError("bad config")

    with pytest.raises(ValueError, match="bad config"):
        ports.start_on_free_port(start, what="the child")
    assert len(calls) == 1


@pytest.mark.parametrize(
    ("text", "taken"),
    [
        ("bind(): Address already in use [core/socket.c line 769]", True),  # uWSGI
        ("[ERROR] Can't start server: Bind on TCP/IP port. Got error: 98: Address already in use", True),
        (
            "exporter.failed error=\"[Errno 98] error while attempting to bind on address ('127.0.0.1', 1)\"",
            True,
        ),
        ("listen tcp 127.0.0.1:2379: bind: address already in use", True),  # Go
        ("[Errno 13] Permission denied", False),
        ("operator.listening address=127.0.0.1 port=98", False),
    ],
)
def test_address_in_use_reads_the_childrens_messages(text: str, taken: bool) -> None:
    assert ports.address_in_use(text) is taken


def test_the_announced_port_is_read_back_from_the_log() -> None:
    log = "t INFO x operator.starting port=1\nt INFO x operator.listening address=127.0.0.1 port=40123\n"
    assert ports.announced_port(log, "operator.listening") == 40123
    assert ports.announced_port(log, "health.listening") is None
    assert (
        ports.wait_announced_port(lambda: log, "operator.listening", alive=lambda: True, timeout=1, what="x")
        == 40123
    )


def test_a_server_that_exits_without_announcing_is_an_error_with_its_log() -> None:
    with pytest.raises(RuntimeError, match=r"the server exited before it announced its port(.|\n)*boom"):
        ports.wait_announced_port(
            lambda: "boom\n", "operator.listening", alive=lambda: False, timeout=5, what="the server"
        )
