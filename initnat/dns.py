"""The exposures' ``targetHost`` names, resolved with a deadline (I/O: getaddrinfo in threads).

An apply waits for DNS at most ``timeout`` seconds in all, whatever the number of names: each name is
looked up in a thread of its own, and a name with no answer by then counts as unresolved for this apply
(``rules.Unresolved``, temporary). A slow or hostile resolver (a tenant's own zone, a name server that
never answers) must not hold up the rest of the plan, a revocation least of all. A lookup that is still
running when the next apply comes is waited for again, not started twice, so a name that never answers
costs one thread, not one per resync. The threads are daemons: a hung lookup never delays the exit of
the init container.

``getaddrinfo`` cannot be cancelled; a thread left behind ends when the C library gives up (glibc:
``timeout`` x ``attempts`` of resolv.conf, 10 s by default).

Every name is looked up as an ABSOLUTE name (``api.example.com.``, with the trailing dot): never under
the resolv.conf search list. The pod's search list is the gateway namespace's (an operator-owned
namespace, not the tenant's) with Kubernetes' ``ndots:5``, so ``db`` would be a Service of the
operator's namespace and ``api.fabric.example`` would first be tried as ``api.fabric.example.<ns>.svc...``,
``...svc.cluster.local`` (a pod ``api`` under a headless Service ``fabric`` in a namespace ``example``
answers that one: whoever owns that namespace would pick the target). Single-label names are never
asked about (rules.fully_qualified).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from ipaddress import IPv4Address

from initnat.rules import Answer, Unresolved

Lookup = Callable[[str], IPv4Address]

# getaddrinfo's answers that say the name has no IPv4 address (not that DNS could not be asked).
_DEFINITE = frozenset(
    code
    for code in (
        getattr(socket, "EAI_NONAME", None),
        getattr(socket, "EAI_NODATA", None),
        getattr(socket, "EAI_ADDRFAMILY", None),
        getattr(socket, "EAI_FAIL", None),
    )
    if code is not None
)


def absolute(host: str) -> str:
    """``host`` as an absolute name: glibc never applies the search list to a name ending in a dot."""
    return host if host.endswith(".") else f"{host}."


def lookup(host: str) -> IPv4Address:
    """The lowest IPv4 address of ``host``, resolved as an absolute name (deterministic when a name has
    several)."""
    infos = socket.getaddrinfo(absolute(host), None, family=socket.AF_INET, type=socket.SOCK_STREAM)
    addresses = [IPv4Address(i[4][0]) for i in infos]
    if not addresses:
        raise LookupError(f"{host} has no IPv4 address")
    return min(addresses)


def answer_of(host: str, exc: BaseException) -> Unresolved:
    """What a failed lookup says: definite when DNS answered that the name has no IPv4 address."""
    detail = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, socket.gaierror) and exc.errno in _DEFINITE:
        return Unresolved(detail, temporary=False)
    if isinstance(exc, LookupError | ValueError | UnicodeError):  # no IPv4 address, or an IDNA refusal
        return Unresolved(detail, temporary=False)
    return Unresolved(detail, temporary=True)


@dataclass
class _Pending:
    done: threading.Event = field(default_factory=threading.Event)
    result: IPv4Address | BaseException | None = None


@dataclass
class Lookups:
    """Lookups in flight, kept between applies (one per name at most)."""

    pending: dict[str, _Pending] = field(default_factory=dict)

    def resolve(self, hosts: Iterable[str], lookup: Lookup, timeout: float) -> dict[str, Answer]:
        """Each of ``hosts`` resolved by ``lookup`` concurrently, waiting ``timeout`` seconds in all."""
        wanted = list(dict.fromkeys(hosts))
        for host in wanted:
            if host not in self.pending:
                self.pending[host] = job = _Pending()
                threading.Thread(
                    target=_run, args=(lookup, host, job), name=f"initnat-dns-{host}"[:60], daemon=True
                ).start()
        deadline = time.monotonic() + timeout
        out: dict[str, Answer] = {}
        for host in wanted:
            job = self.pending[host]
            if not job.done.wait(max(0.0, deadline - time.monotonic())):
                out[host] = Unresolved(f"no answer within {timeout:g} s", temporary=True)
                continue
            del self.pending[host]
            result = job.result
            out[host] = result if isinstance(result, IPv4Address) else answer_of(host, _error(result))
        return out


def _error(result: object) -> BaseException:
    return result if isinstance(result, BaseException) else RuntimeError(f"lookup returned {result!r}")


def _run(lookup: Lookup, host: str, job: _Pending) -> None:
    try:
        job.result = lookup(host)
    except BaseException as exc:  # reported as the name's answer, never raised in a daemon thread
        job.result = exc
    finally:
        job.done.set()
