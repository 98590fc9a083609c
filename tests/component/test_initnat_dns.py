"""initnat.dns: targetHost lookups in threads with one deadline per apply, against a fake lookup gated by
the test (no DNS server can be assumed here); the classification of getaddrinfo's real errors."""

from __future__ import annotations

import socket
import threading
import time
from ipaddress import IPv4Address

import pytest

from initnat import dns
from initnat.rules import Unresolved


class Gated:
    """A lookup that answers only when the test opens its gate; counts the lookups started per name."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started: list[str] = []

    def __call__(self, host: str) -> IPv4Address:
        self.started.append(host)
        if host.startswith("slow"):
            self.gate.wait(10)
        if host.startswith("gone"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return IPv4Address("192.0.2.70")


def test_one_deadline_for_all_names_and_a_hung_lookup_is_not_started_twice() -> None:
    lookup, lookups = Gated(), dns.Lookups()
    started = time.monotonic()
    got = lookups.resolve(["slow-a.example", "slow-b.example", "fast.example", "gone.example"], lookup, 0.3)
    took = time.monotonic() - started
    assert 0.3 <= took < 1.0, f"two hung names cost one deadline, not two ({took:.2f} s)"
    assert got == {
        "slow-a.example": Unresolved("no answer within 0.3 s", temporary=True),
        "slow-b.example": Unresolved("no answer within 0.3 s", temporary=True),
        "fast.example": IPv4Address("192.0.2.70"),
        "gone.example": Unresolved("[Errno -2] Name or service not known", temporary=False),
    }
    again = lookups.resolve(["slow-a.example", "fast.example"], lookup, 0.1)
    assert again["slow-a.example"] == Unresolved("no answer within 0.1 s", temporary=True)
    assert lookup.started.count("slow-a.example") == 1, "still in flight: waited for, not asked again"
    assert lookup.started.count("fast.example") == 2, "a finished lookup is asked again next time"
    lookup.gate.set()
    assert lookups.resolve(["slow-a.example"], lookup, 2.0) == {"slow-a.example": IPv4Address("192.0.2.70")}
    assert lookup.started.count("slow-a.example") == 1, "the late answer of the first lookup is used"


@pytest.mark.parametrize(
    ("exc", "temporary"),
    [
        pytest.param(
            socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"), True, id="again"
        ),
        pytest.param(socket.gaierror(socket.EAI_NONAME, "Name or service not known"), False, id="nxdomain"),
        pytest.param(
            socket.gaierror(socket.EAI_NODATA, "No address associated with hostname"), False, id="nodata"
        ),
        pytest.param(LookupError("x has no IPv4 address"), False, id="no-ipv4"),
        pytest.param(UnicodeError("label too long"), False, id="idna"),
        pytest.param(OSError(101, "Network is unreachable"), True, id="oserror"),
    ],
)
def test_only_an_answer_that_the_name_has_no_address_is_definite(exc: BaseException, temporary: bool) -> None:
    assert dns.answer_of("x.example", exc).temporary is temporary


def test_the_real_lookup_of_a_name_that_never_resolves_is_an_unresolved_answer() -> None:
    """RFC 6761: ``.invalid`` never resolves. Here DNS may be unreachable (a temporary failure) or answer
    NXDOMAIN (definite); either way the name is unresolved, never an exception out of resolve()."""
    got = dns.Lookups().resolve(["nonexistent.invalid"], dns.lookup, 5.0)
    assert isinstance(got["nonexistent.invalid"], Unresolved)
