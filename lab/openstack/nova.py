"""EMULATOR of Nova's compute API, the subset a client attaching Neutron ports to servers depends on.

Nova itself is not reasonable here (LAB-FACTS.md: nova-api, conductor, scheduler, compute, placement,
RabbitMQ, four databases, Glance; no noauth). This emulator is NOT Nova. It serves, over real HTTP on
127.0.0.1::

    GET  /  and  /v2.1/                         version discovery (microversions 2.1 .. 2.100)
    GET  /v2.1/servers[/detail][?name=<regex>]  servers the TEST declared (``add_server``)
    GET  /v2.1/servers/{id}
    GET  /v2.1/servers/{id}/os-interface        ports Neutron has with device_id = {id}
    POST /v2.1/servers/{id}/os-interface        attach a port (``{"interfaceAttachment": {"port_id": ...}}``)
    GET  /v2.1/servers/{id}/os-interface/{port}
    DELETE /v2.1/servers/{id}/os-interface/{port}

Faithful where a port-attaching client depends on it (each point is Nova's code, see docs/openstack-lab.md):

* Interfaces live in the REAL Neutron: attach writes ``device_id=<server>``, ``device_owner=compute:<az>``
  and ``binding:host_id=<the server's host>`` through Neutron's API as Nova's compute manager does (so
  the port's revision_number moves by 3); the list is Neutron's ports with ``device_id=<server>``; detach
  clears the three fields (``binding:host_id`` to None).
* Attach is synchronous (an RPC call in Nova): the answer (200, the attachment) comes after the port was
  updated; ``attach_delay`` seconds pass between the update and the answer. Detach is asynchronous (an
  RPC cast): 202 at once, even for a port that is not attached; the port is cleared ``detach_delay``
  seconds later in the background (``wait_idle()`` waits for it); a failed detach is recorded in
  ``faults`` as Nova records an instance fault.
* Refusals as Nova answers them: unknown server 404 ``itemNotFound``; port not found 404; a port with a
  device_id (another server's, or this one's) 409 ``conflictingRequest`` "Port <id> is still in use.";
  both net_id and port_id 400; a server whose vm_state is not active/paused/stopped or that has a task
  409 "Cannot 'attach_interface' instance ... while it is in vm_state ..."; more interfaces than the
  server's ``max_interfaces`` 500 ``computeFault`` "Failed to attach network adapter device to <id>"
  (what a hypervisor out of PCI slots gives; Nova has no API-side limit).
* Microversions: ``OpenStack-API-Version: compute X`` / ``X-OpenStack-Nova-API-Version`` (``latest``;
  none means 2.1), echoed with ``Vary``; out of range 406, malformed 400; ``tag`` in attachments from
  2.70, accepted in the request from 2.49.

NOT modelled: booting, deleting or resizing servers (servers are declared by the test), attach by
``net_id`` (501), Neutron-side port binding results (no mechanism drivers here: ``binding_failed``,
which real Nova would refuse; the emulator ignores it), ``binding:profile`` (Neutron's policy reserves it
for the service role), VIF plugging events, the network info cache (Nova's lags Neutron; here every
answer reads Neutron), quotas, policies and Keystone (no token needed), locks, cells, rate limits.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import logging
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import Any
from urllib.parse import unquote_plus

from lab.openstack.neutron import ADMIN_PROJECT
from lab.openstack.rest import RestError, request_json

log = logging.getLogger(__name__)

MIN_VERSION = (2, 1)
MAX_VERSION = (2, 100)
"""The newest microversion the emulator announces (openstacksdk 4.22 asks up to 2.100 for servers)."""
ATTACHABLE_STATES = ("active", "paused", "stopped")
"""nova.compute.api: attach_interface / detach_interface accept these vm_states (and no task_state)."""
_STATUS = {
    "active": "ACTIVE",
    "stopped": "SHUTOFF",
    "paused": "PAUSED",
    "error": "ERROR",
    "building": "BUILD",
    "suspended": "SUSPENDED",
    "shelved_offloaded": "SHELVED_OFFLOADED",
}
_POWER = {"active": 1, "paused": 3, "stopped": 4, "suspended": 7, "error": 0, "building": 0}
_FAULT_KEY = {
    400: "badRequest",
    403: "forbidden",
    404: "itemNotFound",
    405: "badMethod",
    409: "conflictingRequest",
    501: "notImplemented",
    503: "serviceUnavailable",
}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Server:
    """A server the test declares: what the emulator answers for it and which host its ports bind to."""

    name: str
    host: str
    """The compute host (``OS-EXT-SRV-ATTR:host``): attach sets the port's ``binding:host_id`` to it."""
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    hypervisor_hostname: str = ""
    """``OS-EXT-SRV-ATTR:hypervisor_hostname`` (default: ``host``, as with libvirt)."""
    availability_zone: str = "nova"
    """Attach sets ``device_owner = compute:<availability_zone>``."""
    vm_state: str = "active"
    task_state: str | None = None
    max_interfaces: int | None = None
    """Interfaces the "hypervisor" takes (None: the emulator's ``max_interfaces``)."""
    project_id: str = ADMIN_PROJECT
    created: str = field(default_factory=_now)
    index: int = 0

    def __post_init__(self) -> None:
        if not self.hypervisor_hostname:
            self.hypervisor_hostname = self.host

    @property
    def provider_id(self) -> str:
        """The Kubernetes Node ``spec.providerID`` of a node on this server (cloud-provider-openstack)."""
        return f"openstack:///{self.id}"


class NovaError(Exception):
    """An answer in Nova's error format: ``{"<key>": {"code": .., "message": ..}}``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def body(self) -> dict[str, Any]:
        return {_FAULT_KEY.get(self.code, "computeFault"): {"code": self.code, "message": self.message}}


def parse_microversion(headers: dict[str, str]) -> tuple[int, int]:
    """The requested compute microversion (pure): 2.1 when none, the maximum for ``latest``.

    Raises NovaError 400 (malformed) or 406 (out of range), as Nova's API does."""
    raw = None
    combined = headers.get("openstack-api-version")
    if combined:
        for item in combined.split(","):
            service, _, value = item.strip().partition(" ")
            if service.lower() == "compute":
                raw = value.strip()
    if raw is None:
        raw = headers.get("x-openstack-nova-api-version")
    if raw is None:
        return MIN_VERSION
    if raw.lower() == "latest":
        return MAX_VERSION
    m = re.fullmatch(r"([1-9]\d*)\.([1-9]\d*|0)", raw)
    if not m:
        raise NovaError(
            400,
            f"API Version String {raw} is of invalid format. Must be of format MajorNum.MinorNum.",
        )
    version = (int(m.group(1)), int(m.group(2)))
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise NovaError(
            406,
            f"Version {raw} is not supported by the API. Minimum is {_v(MIN_VERSION)} and maximum "
            f"is {_v(MAX_VERSION)}.",
        )
    return version


def _v(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def attachment_view(port: dict[str, Any], *, tag: str | None, show_tag: bool) -> dict[str, Any]:
    """Nova's ``_translate_interface_attachment_view`` of a Neutron port (pure)."""
    info: dict[str, Any] = {
        "net_id": port["network_id"],
        "port_id": port["id"],
        "mac_addr": port["mac_address"],
        "port_state": port["status"],
        "fixed_ips": port.get("fixed_ips"),
    }
    if show_tag:
        info["tag"] = tag
    return info


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    nova: NovaEmulator


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        return

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # see proxy._Handler.setup

    def _dispatch(self) -> None:
        self.server.nova._serve(self)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _dispatch


Route = Callable[["_Request"], tuple[int, Any]]


@dataclass
class _Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any
    version: tuple[int, int]
    host_url: str
    args: tuple[str, ...] = ()


class NovaEmulator:
    """The os-interface EMULATOR (not Nova): servers declared by the test, interfaces in the real Neutron.

    ``neutron`` is the URL the emulator calls Neutron at (``Neutron.endpoint``, or a fault proxy in front
    of it to fail Nova's own Neutron calls)."""

    def __init__(
        self,
        neutron: str,
        *,
        max_interfaces: int | None = None,
        attach_delay: float = 0.0,
        detach_delay: float = 0.0,
        port: int = 0,
        neutron_timeout: float = 30.0,
    ) -> None:
        self.neutron = neutron.rstrip("/")
        self.max_interfaces = max_interfaces
        """Default interface limit per server (None: unlimited); ``Server.max_interfaces`` overrides."""
        self.attach_delay = attach_delay
        """Seconds between the port's update in Neutron and the attach's answer."""
        self.detach_delay = detach_delay
        """Seconds between the detach's 202 and the port's update in Neutron."""
        self.neutron_timeout = neutron_timeout
        self.faults: list[tuple[str, str]] = []
        """(server id, message) of failed asynchronous detaches: Nova's instance faults."""
        self._servers: dict[str, Server] = {}
        self._tags: dict[str, str | None] = {}
        self._lock = threading.Lock()
        self._attach_lock = threading.Lock()
        self._pending = 0
        self._idle = threading.Condition(self._lock)
        self._detach_gate = threading.Event()
        self._detach_gate.set()
        self._port = port
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self._routes: list[tuple[str, re.Pattern[str], Route]] = [
            ("GET", re.compile(r"^/?$"), self._versions),
            ("GET", re.compile(r"^/v2\.1/?$"), self._version),
            ("GET", re.compile(r"^/v2\.1/servers(?:/detail)?/?$"), self._list_servers),
            ("GET", re.compile(r"^/v2\.1/servers/([^/]+)/os-interface/?$"), self._list_interfaces),
            ("POST", re.compile(r"^/v2\.1/servers/([^/]+)/os-interface/?$"), self._attach),
            ("GET", re.compile(r"^/v2\.1/servers/([^/]+)/os-interface/([^/]+)/?$"), self._show_interface),
            ("DELETE", re.compile(r"^/v2\.1/servers/([^/]+)/os-interface/([^/]+)/?$"), self._detach),
            ("GET", re.compile(r"^/v2\.1/servers/([^/]+)/?$"), self._show_server),
        ]

    # -- life cycle and declarations ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: the root; the compute endpoint is ``url + "/v2.1"``."""
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> NovaEmulator:
        if self._httpd is not None:
            return self
        httpd = _Server(("127.0.0.1", self._port), _Handler)
        httpd.nova = self
        self._port = int(httpd.server_address[1])
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"lab-nova-{self._port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._detach_gate.set()
        self.wait_idle(timeout=10)
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    close = stop

    def __enter__(self) -> NovaEmulator:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def add_server(self, server: Server) -> Server:
        with self._lock:
            server.index = len(self._servers) + 1
            self._servers[server.id] = server
        return server

    def remove_server(self, server_id: str) -> None:
        with self._lock:
            self._servers.pop(server_id, None)

    def server(self, server_id: str) -> Server:
        with self._lock:
            return self._servers[server_id]

    @property
    def servers(self) -> list[Server]:
        with self._lock:
            return list(self._servers.values())

    def pause_detaches(self) -> None:
        """Hold the compute side of every detach (after its 202) until ``resume_detaches``: the window in
        which Nova has accepted a detach and the port still shows the server."""
        self._detach_gate.clear()

    def resume_detaches(self) -> None:
        self._detach_gate.set()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until no asynchronous detach is pending; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout=timeout)

    # -- HTTP ---------------------------------------------------------------------------------------------

    def _serve(self, h: _Handler) -> None:
        path, _, qs = h.path.partition("?")
        query = {k: v for k, _, v in (p.partition("=") for p in qs.split("&") if p)}
        headers = {k.lower(): v for k, v in h.headers.items()}
        length = int(headers.get("content-length") or 0)
        raw = h.rfile.read(length) if length else b""
        request_id = f"req-{uuid.uuid4()}"
        version = MIN_VERSION
        try:
            version = parse_microversion(headers)
            try:
                body = json.loads(raw) if raw else None
            except ValueError as e:
                raise NovaError(400, "Malformed request body") from e
            req = _Request(
                h.command, path, query, headers, body, version, f"http://{headers.get('host', '')}"
            )
            status, doc = self._route(req)
        except NovaError as e:
            status, doc = e.code, e.body()
        except Exception as e:  # an emulator bug must still answer, as Nova's fault wrapper does
            log.exception("lab.nova.error path=%s", path)
            status = 500
            doc = NovaError(500, f"Unexpected API Error. {type(e).__name__}").body()
        data = json.dumps(doc).encode() if doc is not None else b""
        try:
            h.send_response_only(status)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.send_header("OpenStack-API-Version", f"compute {_v(version)}")
            h.send_header("X-OpenStack-Nova-API-Version", _v(version))
            h.send_header("Vary", "OpenStack-API-Version, X-OpenStack-Nova-API-Version")
            h.send_header("x-openstack-request-id", request_id)
            h.send_header("x-compute-request-id", request_id)
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(data)
        except OSError:
            h.close_connection = True

    def _route(self, req: _Request) -> tuple[int, Any]:
        allowed = False
        for method, pattern, route in self._routes:
            m = pattern.match(req.path)
            if m is None:
                continue
            if method != req.method:
                allowed = True
                continue
            req.args = m.groups()
            return route(req)
        if allowed:
            raise NovaError(405, "The method specified is not allowed for this resource.")
        raise NovaError(404, "The resource could not be found.")

    # -- Neutron ------------------------------------------------------------------------------------------

    def _neutron(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        try:
            return request_json(self.neutron, method, path, body, timeout=self.neutron_timeout)
        except RestError as e:
            # nova-api with an unreachable Neutron: an unexpected error, 500
            raise NovaError(
                500,
                "Unexpected API Error. Please report this at http://bugs.launchpad.net/nova/ and attach the "
                "Nova API log if possible.\n<class 'keystoneauth1.exceptions.connection.ConnectFailure'>",
            ) from e

    def _get_port(self, port_id: str) -> dict[str, Any] | None:
        status, doc = self._neutron("GET", f"/v2.0/ports/{port_id}")
        if status == 404:
            return None
        if status >= 400:
            raise NovaError(500, f"Unexpected API Error. Neutron answered {status}")
        return dict(doc["port"])

    def _server_ports(self, server_id: str) -> list[dict[str, Any]]:
        status, doc = self._neutron("GET", f"/v2.0/ports?device_id={server_id}")
        if status >= 400:
            raise NovaError(500, f"Unexpected API Error. Neutron answered {status}")
        return list(doc["ports"])

    def _get(self, server_id: str) -> Server:
        with self._lock:
            server = self._servers.get(server_id)
        if server is None:
            raise NovaError(404, f"Instance {server_id} could not be found.")
        return server

    @staticmethod
    def _check_state(server: Server, method: str) -> None:
        if server.vm_state not in ATTACHABLE_STATES:
            raise NovaError(
                409,
                f"Cannot '{method}' instance {server.id} while it is in vm_state {server.vm_state}",
            )
        if server.task_state is not None:
            raise NovaError(
                409,
                f"Cannot '{method}' instance {server.id} while it is in task_state {server.task_state}",
            )

    # -- routes -------------------------------------------------------------------------------------------

    def _version_doc(self, host_url: str) -> dict[str, Any]:
        return {
            "id": "v2.1",
            "status": "CURRENT",
            "version": _v(MAX_VERSION),
            "min_version": _v(MIN_VERSION),
            "updated": "2013-07-23T11:33:21Z",
            "links": [
                {"rel": "self", "href": f"{host_url}/v2.1/"},
                {"rel": "describedby", "type": "text/html", "href": "http://docs.openstack.org/"},
            ],
            "media-types": [
                {"base": "application/json", "type": "application/vnd.openstack.compute+json;version=2.1"}
            ],
        }

    def _versions(self, req: _Request) -> tuple[int, Any]:
        v20 = {
            "id": "v2.0",
            "status": "SUPPORTED",
            "version": "",
            "min_version": "",
            "updated": "2011-01-21T11:33:21Z",
            "links": [{"rel": "self", "href": f"{req.host_url}/v2/"}],
        }
        return 200, {"versions": [v20, self._version_doc(req.host_url)]}

    def _version(self, req: _Request) -> tuple[int, Any]:
        return 200, {"version": self._version_doc(req.host_url)}

    def _server_view(self, server: Server, req: _Request) -> dict[str, Any]:
        ports = self._server_ports(server.id)
        names: dict[str, str] = {}
        addresses: dict[str, list[dict[str, Any]]] = {}
        for port in ports:
            net_id = port["network_id"]
            if net_id not in names:
                status, doc = self._neutron("GET", f"/v2.0/networks/{net_id}")
                names[net_id] = doc["network"]["name"] if status == 200 else net_id
            for ip in port.get("fixed_ips", []):
                addresses.setdefault(names[net_id], []).append(
                    {
                        "version": 6 if ":" in ip["ip_address"] else 4,
                        "addr": ip["ip_address"],
                        "OS-EXT-IPS:type": "fixed",
                        "OS-EXT-IPS-MAC:mac_addr": port["mac_address"],
                    }
                )
        link = f"{req.host_url}/v2.1/servers/{server.id}"
        host_id = hashlib.sha224((server.project_id + server.host).encode()).hexdigest()
        view: dict[str, Any] = {
            "id": server.id,
            "name": server.name,
            "status": _STATUS.get(server.vm_state, server.vm_state.upper()),
            "tenant_id": server.project_id,
            "user_id": "lab-user",
            "metadata": {},
            "hostId": host_id,
            "image": "",
            "created": server.created,
            "updated": server.created,
            "addresses": addresses,
            "accessIPv4": "",
            "accessIPv6": "",
            "links": [{"rel": "self", "href": link}, {"rel": "bookmark", "href": link}],
            "OS-DCF:diskConfig": "MANUAL",
            "progress": 0,
            "OS-EXT-AZ:availability_zone": server.availability_zone,
            "config_drive": "",
            "key_name": None,
            "OS-SRV-USG:launched_at": server.created,
            "OS-SRV-USG:terminated_at": None,
            "OS-EXT-SRV-ATTR:host": server.host,
            "OS-EXT-SRV-ATTR:instance_name": f"instance-{server.index:08x}",
            "OS-EXT-SRV-ATTR:hypervisor_hostname": server.hypervisor_hostname,
            "OS-EXT-STS:task_state": server.task_state,
            "OS-EXT-STS:vm_state": server.vm_state,
            "OS-EXT-STS:power_state": _POWER.get(server.vm_state, 0),
            "os-extended-volumes:volumes_attached": [],
            "security_groups": [{"name": "default"}],
        }
        v = req.version
        if v >= (2, 3):
            view["OS-EXT-SRV-ATTR:hostname"] = server.name
            view["OS-EXT-SRV-ATTR:reservation_id"] = f"r-{server.id[:8]}"
            view["OS-EXT-SRV-ATTR:launch_index"] = 0
            view["OS-EXT-SRV-ATTR:root_device_name"] = "/dev/vda"
        if v >= (2, 9):
            view["locked"] = False
        if v >= (2, 19):
            view["description"] = None
        if v >= (2, 26):
            view["tags"] = []
        if v >= (2, 47):
            view["flavor"] = {
                "vcpus": 2,
                "ram": 4096,
                "disk": 20,
                "ephemeral": 0,
                "swap": 0,
                "original_name": "lab.medium",
                "extra_specs": {},
            }
        else:
            view["flavor"] = {"id": "lab.medium", "links": []}
        if v >= (2, 73):
            view["locked_reason"] = None
        if v >= (2, 100):
            view["scheduler_hints"] = {}
        return view

    def _show_server(self, req: _Request) -> tuple[int, Any]:
        return 200, {"server": self._server_view(self._get(req.args[0]), req)}

    def _list_servers(self, req: _Request) -> tuple[int, Any]:
        detail = req.path.rstrip("/").endswith("/detail")
        pattern = re.compile(unquote_plus(req.query["name"])) if "name" in req.query else None
        out = []
        for server in self.servers:
            if pattern is not None and not pattern.search(server.name):
                continue
            if detail:
                out.append(self._server_view(server, req))
            else:
                link = f"{req.host_url}/v2.1/servers/{server.id}"
                out.append({"id": server.id, "name": server.name, "links": [{"rel": "self", "href": link}]})
        return 200, {"servers": out}

    def _list_interfaces(self, req: _Request) -> tuple[int, Any]:
        server = self._get(req.args[0])
        show_tag = req.version >= (2, 70)
        ports = self._server_ports(server.id)
        views = [attachment_view(p, tag=self._tags.get(p["id"]), show_tag=show_tag) for p in ports]
        return 200, {"interfaceAttachments": views}

    def _show_interface(self, req: _Request) -> tuple[int, Any]:
        server = self._get(req.args[0])
        port_id = req.args[1]
        port = self._get_port(port_id)
        if port is None:
            raise NovaError(404, f"Port id {port_id} could not be found.")
        if port["device_id"] != server.id:
            raise NovaError(404, f"Instance {server.id} does not have a port with id {port_id}")
        view = attachment_view(port, tag=self._tags.get(port_id), show_tag=req.version >= (2, 70))
        return 200, {"interfaceAttachment": view}

    def _attach(self, req: _Request) -> tuple[int, Any]:
        server = self._get(req.args[0])
        body = req.body if isinstance(req.body, dict) else {}
        attachment = body.get("interfaceAttachment")
        allowed = {"net_id", "port_id", "fixed_ips"} | ({"tag"} if req.version >= (2, 49) else set())
        if (
            set(body) - {"interfaceAttachment"}
            or not isinstance(attachment, dict)
            or set(attachment) - allowed
        ):
            raise NovaError(400, f"Invalid input for field/attribute interfaceAttachment. Value: {body}.")
        net_id, port_id, tag = attachment.get("net_id"), attachment.get("port_id"), attachment.get("tag")
        if net_id and port_id:
            raise NovaError(400, "Must not input both network_id and port_id")
        if attachment.get("fixed_ips") and not net_id:
            raise NovaError(400, "Must input network_id when request IP address")
        if not port_id:
            raise NovaError(
                501, "lab Nova emulator: attaching by net_id (Nova creates the port) is not emulated"
            )
        self._check_state(server, "attach_interface")
        with self._attach_lock:  # Nova serialises per instance; one lock keeps the emulator simple
            port = self._get_port(port_id)
            if port is None:
                raise NovaError(404, f"Port id {port_id} could not be found.")
            if port["device_id"]:
                raise NovaError(409, f"Port {port_id} is still in use.")
            limit = server.max_interfaces if server.max_interfaces is not None else self.max_interfaces
            if limit is not None and len(self._server_ports(server.id)) >= limit:
                log.info("lab.nova.attach_refused server=%s port=%s reason=%r", server.id, port_id, "limit")
                raise NovaError(500, f"Failed to attach network adapter device to {server.id}")
            update = {
                "device_id": server.id,
                "device_owner": f"compute:{server.availability_zone}",
                "binding:host_id": server.host,
            }
            status, doc = self._neutron("PUT", f"/v2.0/ports/{port_id}", {"port": update})
            if status >= 400:
                raise NovaError(500, f"Failed to attach network adapter device to {server.id}")
            self._tags[port_id] = tag
        log.info("lab.nova.attached server=%s port=%s host=%s", server.id, port_id, server.host)
        if self.attach_delay > 0:
            time.sleep(self.attach_delay)
        view = attachment_view(doc["port"], tag=tag, show_tag=req.version >= (2, 70))
        return 200, {"interfaceAttachment": view}

    def _detach(self, req: _Request) -> tuple[int, Any]:
        server = self._get(req.args[0])
        port_id = req.args[1]
        self._check_state(server, "detach_interface")
        with self._lock:
            self._pending += 1
        threading.Thread(
            target=self._detach_later,
            args=(server, port_id),
            name=f"lab-nova-detach-{port_id[:8]}",
            daemon=True,
        ).start()
        return 202, None

    def _detach_later(self, server: Server, port_id: str) -> None:
        """The compute manager's half of a detach (Nova casts it: the API answered 202 already)."""
        try:
            self._detach_gate.wait()
            if self.detach_delay > 0:
                time.sleep(self.detach_delay)
            with self._attach_lock:
                port = self._get_port(port_id)
                if port is None or port["device_id"] != server.id:
                    self.faults.append((server.id, f"Port {port_id} is not attached"))
                    log.info(
                        "lab.nova.detach_failed server=%s port=%s reason=%r",
                        server.id,
                        port_id,
                        "not attached",
                    )
                    return
                update = {"device_id": "", "device_owner": "", "binding:host_id": None}
                status, _ = self._neutron("PUT", f"/v2.0/ports/{port_id}", {"port": update})
                if status >= 400:
                    self.faults.append(
                        (server.id, f"Failed to detach network adapter device from {server.id}")
                    )
                    return
                self._tags.pop(port_id, None)
            log.info("lab.nova.detached server=%s port=%s", server.id, port_id)
        except NovaError as e:
            self.faults.append((server.id, e.message))
        finally:
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()
