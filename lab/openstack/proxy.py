"""A fault-injecting HTTP proxy for the OpenStack lab (real HTTP on 127.0.0.1, one thread per connection).

Put it between a client (openstacksdk) and Neutron or the Nova emulator; tests add rules and read the
call log::

    proxy = FaultProxy(neutron.endpoint).start()
    conn = neutron.connect(proxy.url)
    proxy.add("POST", r"^/v2\\.0/ports$", Fault.status(503), times=2)   # the next two POSTs: 503
    proxy.add("PUT", r"^/v2\\.0/ports/", Fault.hang(5.0))               # until cleared: no answer
    proxy.add(None, r"/floatingips", Fault.reset(forward=True))        # Neutron acts, the answer is lost
    ...
    assert proxy.writes() == []                                        # "zero writes on a no-op"

Rules match the method (None: any) and a regular expression searched in the request PATH (the query
string is not part of it; ``Record.query`` has it), and optionally one searched in the query string
(``add(..., query=...)``). The first live rule that matches decides; a rule with ``times=N`` applies to
N requests and then retires, ``times=None`` until ``remove()``/``clear()``.
Requests no rule matches pass through. The log is in arrival order; a request enters it when the proxy
is done with it (a held request: when it is released or its hang ends). Faults:

* ``status(code)``  answer ``code`` without asking the upstream; the body is the upstream's error format
  (``error_style``: Neutron's ``{"NeutronError": ...}``, Nova's ``{"computeFault": ...}``) unless given.
* ``hang(seconds, forward=False)``  hold the request ``seconds`` (a client timeout fires first), then close
  the connection with no answer. ``forward=True`` sends it upstream first: the write happens, the answer
  never arrives (what a timeout on a slow Neutron looks like to a client).
* ``reset(forward=False)``  close the connection with a TCP RST (SO_LINGER 0) instead of answering;
  ``forward=True``: after the upstream acted.
* ``delay(seconds)``  pass through, answering ``seconds`` late.
* ``passthrough()``  pass through (e.g. to stop a broader rule for some paths).

When the upstream is down (connection refused: ``Neutron.stop()``) the proxy answers ``upstream_down``:
by default 503 with HAProxy's body, as a load balancer in front of a dead Neutron does; ``"reset"`` for an
RST. ``stop()``/``start()`` of the proxy itself (same port) gives clients "connection refused".

The rule table, the faults and the log are shared with the Kubernetes API proxy (lab.controlplane.proxy:
TLS, identities, streamed watches), which subclasses ``FaultProxy`` and makes two faults only a streaming
proxy can: ``stall`` and ``expire`` (``FaultProxy.kinds`` says which a proxy makes; ``add`` refuses others).

Hop-by-hop headers are not forwarded; the client's Host header is, so Neutron's links point at the proxy.
Client connections are kept alive (HTTP/1.1) independently of the upstream's ``Connection: close``.
"""

from __future__ import annotations

import bisect
import contextlib
import http.client
import http.server
import json
import logging
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

log = logging.getLogger(__name__)

FaultKind = Literal["status", "hang", "reset", "delay", "pass", "stall", "expire"]
Outcome = Literal["passed", "injected", "hang", "reset", "delayed", "upstream-down", "stalled", "expired"]
ErrorStyle = Literal["neutron", "nova", "plain"]

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "proxy-connection",
        "content-length",
    }
)
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
HAPROXY_503 = (
    b"<html><body><h1>503 Service Unavailable</h1>\nNo server is available to handle this request.\n"
    b"</body></html>\n"
)
_NEUTRON_TYPE = {
    400: "HTTPBadRequest",
    404: "HTTPNotFound",
    409: "HTTPConflict",
    412: "HTTPPreconditionFailed",
    500: "HTTPInternalServerError",
    503: "HTTPServiceUnavailable",
}
_NOVA_KEY = {
    400: "badRequest",
    403: "forbidden",
    404: "itemNotFound",
    409: "conflictingRequest",
    503: "serviceUnavailable",
}


def error_body(style: ErrorStyle, code: int, message: str) -> tuple[bytes, str]:
    """An error body in the upstream's format, and its content type."""
    if style == "neutron":
        doc: object = {
            "NeutronError": {"type": _NEUTRON_TYPE.get(code, "HTTPError"), "message": message, "detail": ""}
        }
    elif style == "nova":
        doc = {_NOVA_KEY.get(code, "computeFault"): {"code": code, "message": message}}
    else:
        return message.encode() + b"\n", "text/plain; charset=UTF-8"
    return json.dumps(doc).encode(), "application/json"


@dataclass(frozen=True)
class Fault:
    """What a matching rule does to a request (build with the static constructors)."""

    kind: FaultKind
    code: int = 0
    body: bytes | None = None
    content_type: str = "application/json"
    message: str = ""
    seconds: float = 0.0
    forward: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    """Extra response headers of an injected status (e.g. ``Retry-After``)."""

    @staticmethod
    def status(
        code: int,
        body: bytes | None = None,
        *,
        message: str = "",
        content_type: str = "",
        headers: tuple[tuple[str, str], ...] = (),
    ) -> Fault:
        return Fault(
            "status", code=code, body=body, message=message, content_type=content_type, headers=headers
        )

    @staticmethod
    def hang(seconds: float, *, forward: bool = False) -> Fault:
        return Fault("hang", seconds=seconds, forward=forward)

    @staticmethod
    def reset(*, forward: bool = False) -> Fault:
        return Fault("reset", forward=forward)

    @staticmethod
    def delay(seconds: float) -> Fault:
        return Fault("delay", seconds=seconds)

    @staticmethod
    def passthrough() -> Fault:
        return Fault("pass")

    @staticmethod
    def stall(seconds: float) -> Fault:
        """Streaming proxies only: forward, send the upstream's status line and headers, then nothing for
        ``seconds`` (a half-open stream), then close."""
        return Fault("stall", seconds=seconds)

    @staticmethod
    def expire(message: str = "") -> Fault:
        """Streaming proxies only: answer a watch with its ERROR event 410 Gone (Expired), as a server
        that no longer has the requested resourceVersion does, without asking the upstream."""
        return Fault("expire", code=410, message=message)


@dataclass
class Rule:
    """A live rule; ``hits`` counts the requests it decided."""

    id: int
    method: str | None
    path: re.Pattern[str]
    fault: Fault
    times: int | None
    hits: int = 0
    query: re.Pattern[str] | None = None

    def matches(self, method: str, path: str, query: str = "") -> bool:
        live = self.times is None or self.hits < self.times
        return (
            live
            and (self.method is None or self.method == method)
            and bool(self.path.search(path))
            and (self.query is None or bool(self.query.search(query)))
        )


@dataclass(frozen=True)
class Record:
    """One request the proxy saw. ``status`` is what the client got (None: no answer, e.g. hang/reset)."""

    seq: int
    method: str
    path: str
    query: str
    status: int | None
    outcome: Outcome
    rule: int | None
    forwarded: bool
    """Whether the upstream received the request (a write with an injected status did not happen)."""
    headers: tuple[tuple[str, str], ...]
    """Request headers (names lower-cased), without credentials (X-Auth-Token, Authorization)."""
    body: bytes
    started: float
    seconds: float

    @property
    def write(self) -> bool:
        return self.method in WRITE_METHODS

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name.lower()), None)

    @property
    def user_agent(self) -> str:
        return self.header("user-agent") or ""

    def json(self) -> object:
        return json.loads(self.body) if self.body else None


_SECRET_HEADERS = frozenset({"x-auth-token", "authorization", "x-subject-token", "x-service-token"})


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: FaultProxy


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    lab_seq: int = 0

    def log_message(self, format: str, *args: object) -> None:
        return

    def setup(self) -> None:
        super().setup()
        # headers and body go out in two writes: without TCP_NODELAY, Nagle + the client's delayed ACK
        # hold the body back ~40 ms (measured: 45 ms per call through the proxy)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.proxy._track(self.connection, add=True)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.server.proxy._track(self.connection, add=False)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        self.server.proxy._serve(self)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _handle


class FaultProxy:
    """A fault-injecting HTTP proxy on 127.0.0.1 in front of ``upstream`` (``http://127.0.0.1:<port>``)."""

    kinds: frozenset[FaultKind] = frozenset({"status", "hang", "reset", "delay", "pass"})
    """The faults this proxy makes (``add`` refuses the others)."""
    scheme = "http"

    def __init__(
        self,
        upstream: str,
        *,
        error_style: ErrorStyle = "neutron",
        upstream_down: int | Literal["reset"] = 503,
        upstream_timeout: float = 120.0,
        port: int = 0,
        name: str = "proxy",
    ) -> None:
        host, _, port_s = upstream.removeprefix(f"{self.scheme}://").rstrip("/").partition(":")
        self.upstream = (host, int(port_s or 80))
        self.error_style: ErrorStyle = error_style
        self.upstream_down = upstream_down
        self.upstream_timeout = upstream_timeout
        self.name = name
        self._port = port
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._log: list[Record] = []
        self._next_rule = 1
        self._seq = 0
        self._conns: set[socket.socket] = set()
        self._release = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle ---------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: give it to clients instead of the upstream's URL."""
        return f"{self.scheme}://127.0.0.1:{self._port}"

    def start(self) -> FaultProxy:
        """Listen (again: the same port after ``stop()``) and serve in a background thread."""
        if self._server is not None:
            return self
        self._release.clear()
        server = self._listen()
        self._port = int(server.server_address[1])
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"lab-{self.name}-{self._port}",
            daemon=True,
        )
        self._thread.start()
        log.debug(
            "lab.openstack.proxy.started name=%s port=%d upstream=%s:%d",
            self.name,
            self._port,
            *self.upstream,
        )
        return self

    def _listen(self) -> _Server:
        """The listening server (bound; ``start`` serves it)."""
        server = _Server(("127.0.0.1", self._port), _Handler)
        server.proxy = self
        return server

    def stop(self) -> None:
        """Stop listening and cut every open client connection (clients then get connection refused)."""
        server, self._server = self._server, None
        if server is None:
            return
        self._release.set()  # wake hanging requests
        server.shutdown()
        server.server_close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    close = stop

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- rules --------------------------------------------------------------------------------------------

    def add(
        self,
        method: str | None,
        path: str,
        fault: Fault,
        *,
        times: int | None = None,
        query: str | None = None,
    ) -> Rule:
        """Add a rule (after the existing ones); ``times=None``: until removed. ``query``: a regular
        expression the query string must also match (searched)."""
        if fault.kind not in self.kinds:
            raise ValueError(f"{type(self).__name__} does not make {fault.kind!r} faults")
        with self._lock:
            rule = Rule(
                self._next_rule,
                method.upper() if method else None,
                re.compile(path),
                fault,
                times,
                query=re.compile(query) if query is not None else None,
            )
            self._next_rule += 1
            self._rules.append(rule)
        return rule

    def fail(self, method: str | None, path: str, code: int = 503, *, times: int | None = 1) -> Rule:
        """Shorthand: answer ``code`` to the next ``times`` matching requests."""
        return self.add(method, path, Fault.status(code), times=times)

    def remove(self, rule: Rule) -> None:
        with self._lock:
            self._rules = [r for r in self._rules if r.id != rule.id]

    def clear(self) -> None:
        """Remove every rule and release the requests that hang."""
        with self._lock:
            self._rules = []
        self._release.set()
        self._release = threading.Event()

    def rules(self) -> list[Rule]:
        with self._lock:
            return list(self._rules)

    # -- call log -----------------------------------------------------------------------------------------

    def records(self) -> list[Record]:
        with self._lock:
            return list(self._log)

    def calls(self, method: str | None = None, path: str | None = None) -> list[Record]:
        """Logged requests, optionally by method and a path regex (searched)."""
        pat = re.compile(path) if path is not None else None
        want = method.upper() if method else None
        return [
            r
            for r in self.records()
            if (want is None or r.method == want) and (pat is None or pat.search(r.path))
        ]

    def writes(self, path: str | None = None) -> list[Record]:
        """Logged POST/PUT/PATCH/DELETE requests (that reached the proxy; see ``Record.forwarded``)."""
        return [r for r in self.calls(path=path) if r.write]

    def clear_log(self) -> None:
        with self._lock:
            self._log = []

    # -- serving ------------------------------------------------------------------------------------------

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def _decide(self, h: _Handler, method: str, path: str, query: str = "") -> Rule | None:
        with self._lock:
            self._seq += 1
            h.lab_seq = self._seq  # the log is in arrival order, whenever a request completes
            for rule in self._rules:
                if rule.matches(method, path, query):
                    rule.hits += 1
                    return rule
        return None

    def _record(
        self,
        h: _Handler,
        body: bytes,
        t0: float,
        status: int | None,
        outcome: Outcome,
        rule: Rule | None,
        forwarded: bool,
    ) -> None:
        path, _, query = h.path.partition("?")
        headers = tuple((k.lower(), v) for k, v in h.headers.items() if k.lower() not in _SECRET_HEADERS)
        with self._lock:
            rec = Record(
                seq=h.lab_seq,
                method=h.command,
                path=path,
                query=query,
                status=status,
                outcome=outcome,
                rule=rule.id if rule else None,
                forwarded=forwarded,
                headers=headers,
                body=body,
                started=t0,
                seconds=time.monotonic() - t0,
            )
            bisect.insort(self._log, rec, key=lambda r: r.seq)
        log.debug(
            "lab.openstack.proxy.request name=%s method=%s path=%s status=%s outcome=%s",
            self.name,
            h.command,
            path,
            status,
            outcome,
        )

    def _connection(self, h: _Handler) -> http.client.HTTPConnection:
        """A new connection to the upstream for ``h``'s request (not yet connected)."""
        return http.client.HTTPConnection(*self.upstream, timeout=self.upstream_timeout)

    def _upstream_headers(self, h: _Handler) -> list[tuple[str, str]]:
        """The request headers the upstream gets: the client's, less hop-by-hop ones."""
        return [(k, v) for k, v in h.headers.items() if k.lower() not in HOP_BY_HOP]

    def _send(self, conn: http.client.HTTPConnection, h: _Handler, body: bytes) -> None:
        conn.putrequest(h.command, h.path, skip_host=True, skip_accept_encoding=True)
        for k, v in self._upstream_headers(h):
            conn.putheader(k, v)
        if body or h.command in WRITE_METHODS:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body if body else None)

    def _forward(self, h: _Handler, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes] | None:
        """Send the request upstream; None when the upstream does not answer (refused, reset, timed out)."""
        conn = self._connection(h)
        try:
            self._send(conn, h, body)
            resp = conn.getresponse()
            data = resp.read()
            headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP]
            return resp.status, resp.reason, headers, data
        except (OSError, http.client.HTTPException) as e:
            log.debug("lab.openstack.proxy.upstream_failed name=%s error=%r", self.name, str(e))
            return None
        finally:
            conn.close()

    @staticmethod
    def _reply(
        h: _Handler, status: int, headers: list[tuple[str, str]], data: bytes, reason: str = ""
    ) -> None:
        """Answer the client; a client that went away (its timeout fired) is not an error."""
        try:
            h.send_response_only(status, reason or _reason(status))
            for k, v in headers:
                h.send_header(k, v)
            h.send_header("Content-Length", str(len(data)))
            if h.close_connection:
                h.send_header("Connection", "close")
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(data)
            h.wfile.flush()
        except OSError:
            h.close_connection = True

    @staticmethod
    def _reset(h: _Handler) -> None:
        with contextlib.suppress(OSError):
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.connection.close()
        h.close_connection = True

    def _error_answer(self, code: int, fault: Fault | None) -> tuple[list[tuple[str, str]], bytes]:
        if fault is not None and fault.body is not None:
            return [("Content-Type", fault.content_type or "application/json"), *fault.headers], fault.body
        if fault is None and code == 503:
            return [("Content-Type", "text/html"), ("Cache-Control", "no-cache")], HAPROXY_503
        message = (fault.message if fault else "") or f"lab proxy: injected {code}"
        data, ctype = error_body(self.error_style, code, message)
        return [("Content-Type", ctype), *(fault.headers if fault else ())], data

    def _serve(self, h: _Handler) -> None:
        t0 = time.monotonic()
        body = h._read_body()
        path, _, query = h.path.partition("?")
        rule = self._decide(h, h.command, path, query)
        fault = rule.fault if rule else Fault.passthrough()
        release = self._release
        if fault.kind == "status":
            self._record(h, body, t0, fault.code, "injected", rule, False)
            self._reply(h, fault.code, *self._error_answer(fault.code, fault))
            return
        if fault.kind in ("hang", "reset"):
            forwarded = self._forward(h, body) is not None if fault.forward else False
            if fault.kind == "hang":
                release.wait(fault.seconds)
                h.close_connection = True
                with contextlib.suppress(OSError):
                    h.connection.shutdown(socket.SHUT_RDWR)
            else:
                self._reset(h)
            self._record(h, body, t0, None, fault.kind, rule, forwarded)
            return
        if fault.kind == "delay":
            release.wait(fault.seconds)
        self._pass(h, body, t0, rule, fault, release)

    def _upstream_failed(self, h: _Handler, body: bytes, t0: float, rule: Rule | None) -> None:
        """Answer a request the upstream did not answer, as ``upstream_down`` says."""
        if self.upstream_down == "reset":
            self._record(h, body, t0, None, "upstream-down", rule, False)
            self._reset(h)
        else:
            code = int(self.upstream_down)
            self._record(h, body, t0, code, "upstream-down", rule, False)
            self._reply(h, code, *self._error_answer(code, None))

    def _pass(
        self, h: _Handler, body: bytes, t0: float, rule: Rule | None, fault: Fault, release: threading.Event
    ) -> None:
        """Forward and answer (buffered: the upstream's whole answer, then the client's)."""
        answer = self._forward(h, body)
        if answer is None:
            self._upstream_failed(h, body, t0, rule)
            return
        status, reason, headers, data = answer
        self._record(h, body, t0, status, "delayed" if fault.kind == "delay" else "passed", rule, True)
        self._reply(h, status, headers, data, reason)


def _reason(code: int) -> str:
    try:
        return http.HTTPStatus(code).phrase
    except ValueError:
        return ""
