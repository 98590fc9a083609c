"""Loopback TCP ports for the lab's servers, without the bind-close-reuse race.

Picking a port by binding port 0, closing the socket and handing the number on is a race: between the
close and the server's own bind, any process on the machine (another test run, an outgoing connection
given that ephemeral port) can take it, and the server fails with EADDRINUSE. So:

* Our own Python servers (the controller, the agent's health listener, the exporter, the Kubernetes API
  emulator) listen on port 0 and announce the port they got in their log (``operator.listening ...
  port=N``, ``health.listening ... port=N``, ``exporter.http.listening ... port=N``): ``announced_port``
  and ``wait_announced_port`` read it back. No race.
* A child that must be told its port (uWSGI, mariadbd, a server started with a fixed log level that hides
  the announcement) gets one from ``free_port`` just before its start, and the start is retried on a new
  port when the child reports EADDRINUSE (``start_on_free_port``: its ``start`` raises ``PortTaken``,
  ``address_in_use`` recognises the children's messages), up to ``ATTEMPTS`` times, then
  ``PortsExhausted`` says so.
"""

from __future__ import annotations

import errno
import logging
import re
import socket
from collections.abc import Callable
from typing import TypeVar

from lab.wait import WaitTimeout, wait_for

log = logging.getLogger(__name__)

T = TypeVar("T")
ATTEMPTS = 5
"""Starts on fresh ports before giving up: one lost race is rare, five in a row means something holds
ports on purpose (or the child fails for another reason that reads like EADDRINUSE)."""

_IN_USE = re.compile(
    r"address already in use"  # strerror(EADDRINUSE): Python, uWSGI, Go, mariadbd ("Got error: 98: ...")
    r"|\bEADDRINUSE\b"
    r"|\[errno 98\]",
    re.IGNORECASE,
)


class PortTaken(Exception):
    """Raised by a ``start`` function given to ``start_on_free_port``: the child could not bind its port."""


class PortsExhausted(RuntimeError):
    """``start_on_free_port`` lost the race for a free port ``ATTEMPTS`` times in a row."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nobody is bound to right now. Free NOW only: give it to a child that
    must be told its port, inside ``start_on_free_port``; a server of our own listens on port 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def address_in_use(text: str) -> bool:
    """Whether a child's output (its log since the start) says that its port was taken."""
    return bool(_IN_USE.search(text))


def is_address_in_use(exc: BaseException) -> bool:
    """Whether ``exc`` is an OSError for EADDRINUSE (our own bind, in-process)."""
    return isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE


def start_on_free_port(
    start: Callable[[int], T],
    *,
    what: str,
    attempts: int = ATTEMPTS,
    pick: Callable[[], int] | None = None,
) -> T:
    """``start(port)`` on a fresh ``pick()``-ed port (default ``free_port``), again on another one each
    time it raises ``PortTaken``; after ``attempts`` lost races, ``PortsExhausted`` naming ``what`` and
    the last failure. ``start`` must clean up after a failed start (the child gone) before it raises."""
    last: PortTaken | None = None
    tried: list[int] = []
    for _ in range(attempts):
        port = (pick or free_port)()  # looked up now: a test may replace ``free_port``
        tried.append(port)
        try:
            return start(port)
        except PortTaken as exc:
            last = exc
            log.info("lab.ports.taken what=%s port=%d error=%r", what, port, str(exc))
    raise PortsExhausted(
        f"{what}: the port was taken before it could bind, {attempts} times in a row (ports {tried}); "
        f"last: {last}"
    ) from last


_ANNOUNCED = "{event} [^\n]*?\\bport=(\\d+)"


def announced_port(text: str, event: str) -> int | None:
    """The port of the first ``<event> ... port=N`` line in ``text`` (a server's log), or None."""
    m = re.search(_ANNOUNCED.format(event=re.escape(event)), text)
    return int(m.group(1)) if m else None


def wait_announced_port(
    read: Callable[[], str],
    event: str,
    *,
    alive: Callable[[], bool],
    timeout: float,
    what: str,
) -> int:
    """The port a server listening on port 0 announced in its log (``read()`` returns the log so far):
    waits until the ``<event> ... port=N`` line is there. Raises ``RuntimeError`` with the log's tail
    when the server exits first or ``timeout`` seconds pass."""
    last = ""

    def announced() -> int | None:
        nonlocal last
        last = read()
        port = announced_port(last, event)
        if port is not None:
            return port
        if not alive():  # exiting first fails at once
            port = announced_port(read(), event)  # the line may have been written just before exit
            if port is not None:
                return port
            raise RuntimeError(f"{what} exited before it announced its port ({event}):\n{last[-2000:]}")
        return None

    try:
        return wait_for(announced, timeout, f"{what} to announce its port ({event})", interval=0.02)
    except WaitTimeout as exc:
        msg = f"{what} did not announce its port ({event}) in {timeout:g} s:\n{last[-2000:]}"
        raise RuntimeError(msg) from exc
