"""A fault-injecting proxy in front of the REAL kube-apiserver (TLS on 127.0.0.1), for the faults the real
server will not make on demand: injected 409/410/429/500 with Kubernetes' Status bodies, slow answers,
hangs and resets, half-open watch streams, an unreachable window, and the request log that zero-writes
tests read (docs/controlplane.md, "Faults: the proxy")::

    with KubeProxy(cp) as proxy:
        kubeconfig = proxy.kubeconfig(cp.service_account_kubeconfig("ns", "sa"), tmp_path / "p.kubeconfig")
        proxy.add("PATCH", r"/vpngateways/", status(409), times=2)           # the next two: Conflict
        proxy.add("GET", r"/vpngateways$", status(500), query=r"^(?!.*watch=)")  # lists, not watches
        proxy.add("GET", r"/configmaps$", Fault.stall(120), query="watch=")   # headers, then silence
        proxy.add("GET", r"/secrets$", Fault.expire(), query="watch=")        # ERROR 410 Expired event
        proxy.unreachable(5.0)                                                # refused for 5 s
        assert [r for r in proxy.writes() if r.user_agent.startswith("vpngw-controller")] == []

The rule table, the faults (``lab.openstack.proxy.Fault``) and the log (``Record``: method, path, query,
status, outcome, start time, duration, request headers without ``Authorization``) are the Neutron
proxy's: ``KubeProxy`` subclasses ``FaultProxy``. What it adds: TLS with a serving certificate the
control plane's CA signs (so clients keep the kubeconfig's CA), answers streamed as they come (a watch is
relayed event by event, chunked, for as long as it lasts), ``stall`` and ``expire``, Status bodies for
injected errors (``status()``: reason and ``Retry-After`` for 429), and ``unreachable()``.

Identity, forwarded two ways (the API server must judge the real caller, or RBAC is not tested):

* a bearer token (ServiceAccount tokens from TokenRequest, as the controller and the agent use): the
  ``Authorization`` header goes upstream as it came, over a connection with no client certificate (the
  API server's x509 authenticator runs before the token one, and would win);
* a client certificate (the admin kubeconfig, nodes, ``user_kubeconfig``): a TLS client certificate
  cannot be forwarded (its key stays with the client), so the proxy verifies it against the cluster CA,
  connects with the admin certificate (system:masters may impersonate) and sends ``Impersonate-User``
  (its CN) and ``Impersonate-Group`` (each O). The server then authorises the certificate's user and
  groups, as it would have directly. The client's own ``Impersonate-*`` headers are dropped on this path
  (``kubectl --as`` through the proxy is not supported: impersonation does not nest).

A request enters the log when the proxy has answered it; a streamed answer (a watch) when its status line
and headers went out. No credentials reach the log.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import ssl
import struct
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal

import yaml

from lab.controlplane import pki
from lab.openstack.proxy import HOP_BY_HOP, Fault, FaultKind, FaultProxy, Outcome, Rule, _Handler, _Server

if TYPE_CHECKING:
    from lab.controlplane.cluster import ControlPlane

log = logging.getLogger(__name__)

__all__ = ["Fault", "KubeProxy", "status", "status_body"]

_REASON = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}
_IMPERSONATE = ("impersonate-user", "impersonate-group", "impersonate-uid")


def status_body(code: int, message: str = "", reason: str = "") -> bytes:
    """A ``metav1.Status`` failure as kube-apiserver sends it."""
    doc = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message or f"lab proxy: injected {code}",
        "reason": reason or _REASON.get(code, "Unknown"),
        "code": code,
    }
    if code == 429:
        doc["details"] = {"retryAfterSeconds": 1}
    return json.dumps(doc).encode()


def status(code: int, message: str = "", *, reason: str = "", retry_after: int | None = None) -> Fault:
    """An injected error with a Status body (``reason`` defaults to the API's for ``code``: 409 Conflict,
    410 Expired, 429 TooManyRequests, 500 InternalError...); 429 carries ``Retry-After`` (1 s unless
    given), as the API server's priority and fairness sends it."""
    if retry_after is None and code == 429:
        retry_after = 1
    headers = (("Retry-After", str(retry_after)),) if retry_after is not None else ()
    return Fault.status(code, status_body(code, message, reason), headers=headers)


class _KubeHandler(_Handler):
    lab_refused = False

    def setup(self) -> None:
        proxy = self.server.proxy
        assert isinstance(proxy, KubeProxy)
        conn = self.request
        assert isinstance(conn, ssl.SSLSocket)
        if proxy._resetting():
            self.lab_refused = True
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
            return
        try:
            conn.settimeout(10.0)
            conn.do_handshake()
            conn.settimeout(None)
        except (OSError, ssl.SSLError):
            self.lab_refused = True
            with contextlib.suppress(OSError):
                conn.close()
            return
        super().setup()

    def handle(self) -> None:
        if not self.lab_refused:
            super().handle()

    def finish(self) -> None:
        if not self.lab_refused:
            super().finish()


class _KubeServer(_Server):
    def handle_error(self, request: object, client_address: object) -> None:
        log.debug("lab.controlplane.proxy.connection_failed client=%s", client_address, exc_info=True)


class KubeProxy(FaultProxy):
    """A fault-injecting proxy on ``https://127.0.0.1:<port>`` in front of ``cp``'s kube-apiserver.
    ``start()``/``stop()`` (or ``with``); ``url``; ``kubeconfig()`` points a kubeconfig at it."""

    kinds: frozenset[FaultKind] = FaultProxy.kinds | {"stall", "expire"}
    scheme = "https"

    def __init__(
        self,
        cp: ControlPlane,
        *,
        port: int = 0,
        upstream_down: int | Literal["reset"] = "reset",
        upstream_timeout: float = 600.0,
        name: str = "kube-proxy",
    ) -> None:
        super().__init__(
            cp.url,
            error_style="plain",
            upstream_down=upstream_down,
            upstream_timeout=upstream_timeout,
            port=port,
            name=name,
        )
        ca = cp.ca
        layout = cp.layout
        if ca is None or layout is None:
            raise RuntimeError("the control plane is not started")
        self._ca_file = cp.ca_file
        self._ca_pem = ca.cert_pem
        serving = ca.issue("lab-kube-proxy", sans=pki.apiserver_sans("10.96.0.1"), server=True)
        self._server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(cp.ca_file))
        self._server_ctx.verify_mode = ssl.CERT_OPTIONAL  # a token instead is fine
        with tempfile.TemporaryDirectory(dir=layout.run_dir) as d:
            crt, key = Path(d) / "proxy.crt", Path(d) / "proxy.key"
            pki.write_private(crt, serving.cert_pem)
            pki.write_private(key, serving.key_pem)
            self._server_ctx.load_cert_chain(crt, key)
        # Upstream: no client certificate for tokens (and anonymous requests); the admin's to impersonate.
        self._plain_ctx = ssl.create_default_context(cafile=str(cp.ca_file))
        self._admin_ctx = ssl.create_default_context(cafile=str(cp.ca_file))
        self._admin_ctx.load_cert_chain(layout.pki / "admin.crt", layout.pki / "admin.key")
        self._reset_until = 0.0
        self._window: threading.Timer | None = None

    # -- what tests use -----------------------------------------------------------------------------------

    def kubeconfig(self, source: Path, path: Path) -> Path:
        """``source`` (a kubeconfig of the control plane: its identity) pointed at the proxy, as ``path``."""
        doc = yaml.safe_load(source.read_text())
        for cluster in doc["clusters"]:
            cluster["cluster"]["server"] = self.url
        pki.write_private(path, yaml.safe_dump(doc, sort_keys=False).encode())
        return path

    def unreachable(self, seconds: float, *, mode: Literal["refuse", "reset"] = "refuse") -> None:
        """For the next ``seconds`` the API server cannot be reached: every open connection is cut (watches
        end), and new ones are refused (``refuse``: nothing listens on the port) or accepted and reset
        (``reset``: a TCP RST before TLS). Then the proxy serves again on the same port."""
        self._cancel_window()
        if mode == "refuse":
            self.stop()
            self._window = threading.Timer(seconds, self.start)
        else:
            self._reset_until = time.monotonic() + seconds
            self._cut_all()
            self._window = threading.Timer(seconds, lambda: None)
        self._window.daemon = True
        self._window.start()
        log.info("lab.controlplane.proxy.unreachable seconds=%.1f mode=%s", seconds, mode)

    def reachable(self) -> None:
        """End an ``unreachable`` window now."""
        self._cancel_window()
        self._reset_until = 0.0
        self.start()

    def start(self) -> KubeProxy:
        super().start()
        return self

    def close(self) -> None:
        self._cancel_window()
        self.stop()

    def __enter__(self) -> KubeProxy:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------------------

    def _cancel_window(self) -> None:
        window, self._window = self._window, None
        if window is not None:
            window.cancel()
            if window is not threading.current_thread():
                window.join(timeout=5)

    def _resetting(self) -> bool:
        return time.monotonic() < self._reset_until

    def _cut_all(self) -> None:
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)

    def _listen(self) -> _Server:
        server = _KubeServer(("127.0.0.1", self.port), _KubeHandler)
        server.proxy = self
        server.socket = self._server_ctx.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
        return server

    @staticmethod
    def _peer(h: _Handler) -> tuple[str, list[str]] | None:
        """The client certificate's user (CN) and groups (O), when the client presented one."""
        conn = h.connection
        cert = conn.getpeercert() if isinstance(conn, ssl.SSLSocket) else None
        if not cert:
            return None
        user, groups = "", []
        for rdn in cert.get("subject", ()):
            for attr in rdn:
                key, value = attr[0], attr[1]
                if key == "commonName":
                    user = str(value)
                elif key == "organizationName":
                    groups.append(str(value))
        return (user, groups) if user else None

    def _connection(self, h: _Handler) -> http.client.HTTPConnection:
        peer = None if h.headers.get("Authorization") else self._peer(h)
        ctx = self._admin_ctx if peer else self._plain_ctx
        return http.client.HTTPSConnection(*self.upstream, timeout=self.upstream_timeout, context=ctx)

    def _upstream_headers(self, h: _Handler) -> list[tuple[str, str]]:
        headers = super()._upstream_headers(h)
        peer = None if h.headers.get("Authorization") else self._peer(h)
        if peer is None:
            return headers
        user, groups = peer
        kept = [(k, v) for k, v in headers if k.lower() not in _IMPERSONATE]
        return [*kept, ("Impersonate-User", user), *(("Impersonate-Group", g) for g in groups)]

    def _error_answer(self, code: int, fault: Fault | None) -> tuple[list[tuple[str, str]], bytes]:
        if fault is not None and fault.body is not None:
            return [("Content-Type", fault.content_type or "application/json"), *fault.headers], fault.body
        message = (fault.message if fault else "") or f"lab proxy: injected {code}"
        headers = [("Content-Type", "application/json"), *(fault.headers if fault else ())]
        return headers, status_body(code, message)

    def _pass(
        self, h: _Handler, body: bytes, t0: float, rule: Rule | None, fault: Fault, release: threading.Event
    ) -> None:
        if fault.kind == "expire":
            message = fault.message or "too old resource version (lab proxy: injected)"
            event = {"type": "ERROR", "object": json.loads(status_body(410, message, "Expired"))}
            data = json.dumps(event).encode() + b"\n"
            self._record(h, body, t0, 200, "expired", rule, False)
            self._reply(h, 200, [("Content-Type", "application/json")], data)
            return
        conn = self._connection(h)
        try:
            try:
                self._send(conn, h, body)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                log.debug("lab.controlplane.proxy.upstream_failed error=%r", str(e))
                self._upstream_failed(h, body, t0, rule)
                return
            headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP]
            outcome: Outcome = "delayed" if fault.kind == "delay" else "passed"
            if fault.kind != "stall" and not resp.chunked and resp.length is not None:
                data = resp.read()
                self._record(h, body, t0, resp.status, outcome, rule, True)
                self._reply(h, resp.status, headers, data, resp.reason)
                return
            # A streamed answer (a watch) enters the log as its headers go out (``seconds``: until then): the
            # relay of a watch the client has left ends only at the upstream's next byte.
            streamed: Outcome = "stalled" if fault.kind == "stall" else outcome
            self._record(h, body, t0, resp.status, streamed, rule, True)
            if conn.sock is not None:
                self._track(conn.sock, add=True)  # stop() cuts it: a relay blocked on the upstream ends
            try:
                self._relay(h, resp, headers, fault, release)
            finally:
                if conn.sock is not None:
                    self._track(conn.sock, add=False)
        finally:
            conn.close()

    @staticmethod
    def _relay(
        h: _Handler,
        resp: http.client.HTTPResponse,
        headers: list[tuple[str, str]],
        fault: Fault,
        release: threading.Event,
    ) -> None:
        """Stream the upstream's answer (a watch: each event as it comes) to the client, chunked; a
        ``stall``: the status line and headers, then silence for its seconds, then the connection closed."""
        try:
            h.send_response_only(resp.status, resp.reason)
            for k, v in headers:
                h.send_header(k, v)
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            h.wfile.flush()
            if fault.kind == "stall":
                release.wait(fault.seconds)
                h.close_connection = True
                with contextlib.suppress(OSError):
                    h.connection.shutdown(socket.SHUT_RDWR)
                return
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    break
                h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                h.wfile.flush()
            h.wfile.write(b"0\r\n\r\n")
            h.wfile.flush()
        except (OSError, http.client.HTTPException):
            h.close_connection = True  # the client went away, or the upstream broke off: end both
