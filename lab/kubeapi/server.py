"""The HTTP(S) layer: routing, authentication, authorization, content negotiation, watch streams, controls.

Built directly on aiohttp (not on kmock's emulator: see docs/kubeapi.md). Every request goes through one
handler: authenticate the bearer token (401), resolve impersonation, parse the request into Kubernetes
request attributes (verb, group, resource, subresource, namespace, name), authorize with RBAC (403),
apply injected faults, then call the store. Watches are chunked streams of JSON lines fed by the store's
synchronous fan-out through unbounded in-memory queues, so many watchers cost one queue each.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import math
import os
import random
import socket
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, timedelta
from typing import Any

import anyio
import yaml
from aiohttp import web

from lab.kubeapi import discovery, protobuf, rbac, selectors, tables
from lab.kubeapi.auth import TokenRecord, Tokens, impersonated, user_info_dict
from lab.kubeapi.controls import Fault, Faults, RequestLog
from lab.kubeapi.errors import (
    ApiError,
    FieldError,
    bad_request,
    for_code,
    forbidden,
    group_version_not_served,
    invalid,
    method_not_allowed,
    not_found,
    patch_failed,
    path_not_found,
    unauthorized,
    unsupported_media_type,
)
from lab.kubeapi.patch import PatchError, json_patch, merge_patch, strategic_merge
from lab.kubeapi.rbac import ANONYMOUS, UNAUTHENTICATED, Attributes, UserInfo
from lab.kubeapi.resources import ResourceType
from lab.kubeapi.store import DeleteOptions, Store, Watcher

log = logging.getLogger(__name__)

CONTROL_PREFIX = "/_emulator"
JSON = "application/json"
CLOSE = "__close__"
STALL = "__stall__"
"""A half-open watch: the connection stays, nothing more is sent (a lost FIN, a dead middlebox)."""
DISCONNECT_CHECK = 1.0
"""Seconds between checks whether an idle watch's client is still connected."""


@dataclass(frozen=True)
class RequestInfo:
    """A request as the authorizer sees it (apiserver's RequestInfo)."""

    resource_request: bool
    verb: str
    path: str
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    watch: bool = False


def parse_request(method: str, path: str, query: Mapping[str, str]) -> RequestInfo:
    """apiserver's RequestInfoFactory: path + method -> verb and resource coordinates (pure)."""
    http_verb = method.lower()
    segs = [s for s in path.strip("/").split("/") if s]
    if not segs or segs[0] not in ("api", "apis"):
        return RequestInfo(False, http_verb, path)
    if segs[0] == "api":
        if len(segs) < 2:
            return RequestInfo(False, http_verb, path)
        group, version, rest = "", segs[1], segs[2:]
    else:
        if len(segs) < 3:
            return RequestInfo(False, http_verb, path)
        group, version, rest = segs[1], segs[2], segs[3:]
    if not rest:
        return RequestInfo(False, http_verb, path)
    watch = False
    if rest[0] == "watch":
        watch, rest = True, rest[1:]
    ns = ""
    if rest and rest[0] == "namespaces":
        if len(rest) >= 3 and not (group == "" and rest[2] in ("status", "finalize")):
            ns, rest = rest[1], rest[2:]
        elif len(rest) >= 2:
            ns = rest[1]
    if not rest:
        return RequestInfo(False, http_verb, path)
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    sub = rest[2] if len(rest) > 2 else ""
    if len(rest) > 3 and sub != "proxy":  # a proxy subresource carries the backend's path after it
        return RequestInfo(False, http_verb, path)
    if query.get("watch") in ("1", "true", "True"):
        watch = True
    verb = {
        "get": "get",
        "head": "get",
        "post": "create",
        "put": "update",
        "patch": "patch",
        "delete": "delete",
    }.get(http_verb, http_verb)
    if watch:
        verb = "watch"
    elif verb == "get" and not name:
        verb = "list"
    elif verb == "delete" and not name:
        verb = "deletecollection"
    if not name and verb in ("list", "watch"):
        try:
            name = selectors.name_from_fields(
                selectors.parse_fields(query.get("fieldSelector"), _any_fields())
            )
        except ApiError:
            name = ""
    return RequestInfo(True, verb, path, group, version, resource, sub, ns, name, watch)


def _any_fields() -> ResourceType:
    return ResourceType("", "v1", "_", "_", True, field_selectors=("*",))


def _media(header: str) -> str:
    return header.split(";", 1)[0].strip().lower()


def _accepts(accept: str, what: str) -> bool:
    return any(f"as={what}" in part.replace(" ", "") for part in accept.split(","))


def _first_as(accept: str) -> str | None:
    """The ``as=`` of the media type content negotiation picks: the Accept header's first JSON one
    (``None``: plain objects). kube-apiserver takes the first type it can serve, in order
    (apimachinery's negotiation.NegotiateMediaTypeOptions)."""
    for part in accept.split(","):
        params = [p.strip() for p in part.split(";")]
        if params[0] in ("application/json", "*/*"):
            return next((p[3:] for p in params[1:] if p.startswith("as=")), None)
    return None


def _warning(text: str) -> str:
    """An RFC 7234 Warning header value as kube-apiserver writes it (code 299, agent "-")."""
    return '299 - "' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _json_response(obj: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=_dumps(obj), status=status, content_type=JSON, headers=headers)


def _error_response(err: ApiError) -> web.Response:
    if err.plain:  # Go's http.Error: text/plain; charset=utf-8, nosniff
        headers = {**err.headers, "X-Content-Type-Options": "nosniff"}
        return web.Response(text=err.message, status=err.code, content_type="text/plain", headers=headers)
    return _json_response(err.status(), err.code, err.headers)


@dataclass(frozen=True)
class Settings:
    """How the emulator runs."""

    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free port."""
    http_port: int | None = None
    """Also serve plain HTTP on this port (0 = pick one); None = HTTPS only."""
    sans: tuple[str, ...] = ()
    """Extra certificate SANs (IP addresses or DNS names), e.g. 10.96.0.1."""
    bookmark_interval: float = 60.0
    """Seconds between BOOKMARK events on watches that allow them (real servers: about a minute)."""
    history: int = 10000
    """Events kept for watches from an older resourceVersion; older ones give 410 Expired."""
    validate_schemas: bool = True
    """Validate and default custom resources against their CRD's openAPIV3Schema and CEL rules."""
    pod_security: bool = True
    """The PodSecurity admission plugin: the namespace's pod-security.kubernetes.io/* labels refuse pods
    and warn about pod templates (lab.kubeapi.podsecurity; on by default, as in kube-apiserver)."""
    watch_timeout: tuple[float, float] = (1800.0, 3600.0)
    """Server-side watch duration when the client sets no timeoutSeconds (min-request-timeout..2x)."""
    rbac_delay: float = 0.0
    """Seconds before a Role, ClusterRole or binding written is seen by the authorizer (kube-apiserver's
    RBAC authorizer reads informer caches: rbac.LaggingCache); 0 = at once."""


class _WatchCache:
    """Serialised objects shared by every watcher of one event (bounded)."""

    def __init__(self, size: int = 4096) -> None:
        self._cache: OrderedDict[int, tuple[dict[str, Any], bytes]] = OrderedDict()
        self._size = size

    def encode(self, obj: dict[str, Any]) -> bytes:
        hit = self._cache.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
        data = _dumps(obj)
        self._cache[id(obj)] = (obj, data)
        while len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return data


class ApiServer:
    """The aiohttp application around one :class:`Store` (used by :class:`lab.kubeapi.KubeAPI`)."""

    def __init__(
        self, store: Store, tokens: Tokens, settings: Settings, server_address: Callable[[], str]
    ) -> None:
        self.store = store
        self.tokens = tokens
        self.settings = settings
        self.server_address = server_address
        self.log = RequestLog()
        self.faults = Faults()
        self._watch_streams: set[Callable[[], None]] = set()
        self._stallable: set[Callable[[], None]] = set()
        self._cache = _WatchCache()
        self._gc_event = anyio.Event()
        self.app = web.Application(client_max_size=64 * 1024 * 1024)
        self.app.router.add_route("*", "/{tail:.*}", self.handle)
        self.on_unreachable: Callable[[float], Awaitable[None]] | None = None
        store.on_change = self._wake_gc
        self._rbac_cache: rbac.LaggingCache | None = None
        self.rbac_delay = settings.rbac_delay
        self.pod_network: str | None = None
        """The network namespace (``ip netns`` name) pods/proxy dials pod IPs in; None: the emulator's own
        (a real API server reaches the pod network, which the user's machine often cannot)."""
        self._rbac_watchers: list[Watcher] = []

    # --- background: the garbage collector, namespace and CRD cleanup ------------------------------------

    def _wake_gc(self) -> None:
        self._gc_event.set()

    async def gc_loop(self) -> None:
        # The garbage collector's loop (a daemon's main loop: the sleep lets the request answer first;
        # allowed in tests/unit/test_no_polling_loops.py).
        while True:
            await self._gc_event.wait()
            self._gc_event = anyio.Event()
            await anyio.sleep(0.01)  # background, as the real collector: the request answers first
            if self.store.gc_pending():
                try:
                    self.store.run_gc()
                except Exception:
                    log.exception("kubeapi.gc_failed")

    # --- authentication ---------------------------------------------------------------------------------

    def _sa_uid(self, ns: str, name: str) -> str | None:
        obj = self.store.peek(self.store.rtype("", "serviceaccounts"), ns, name)
        return None if obj is None else str(obj["metadata"]["uid"])

    def authenticate(self, request: web.Request) -> UserInfo:
        header = request.headers.get("Authorization", "")
        if not header:
            return UserInfo(ANONYMOUS, (UNAUTHENTICATED,))
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise unauthorized()
        rec = self.tokens.authenticate(token.strip(), self.store.clock(), self._sa_uid)
        if rec is None:
            raise unauthorized()
        user = rec.user
        imp_user = request.headers.get("Impersonate-User")
        if imp_user:
            groups = request.headers.getall("Impersonate-Group", [])
            uid = request.headers.get("Impersonate-Uid", "")
            extra = {
                k[len("Impersonate-Extra-") :].lower(): tuple(request.headers.getall(k))
                for k in request.headers
                if k.lower().startswith("impersonate-extra-")
            }
            self._check_impersonation(user, imp_user, groups)
            return impersonated(imp_user, groups, uid, extra)
        return user

    def _check_impersonation(self, user: UserInfo, name: str, groups: list[str]) -> None:
        snap = self.authorizer_snapshot()
        checks: list[Attributes] = []
        if name.startswith(rbac.SA_PREFIX) and name.count(":") == 3:
            _, _, ns, sa = name.split(":")
            checks.append(Attributes(user, "impersonate", True, "", "serviceaccounts", "", ns, sa))
        else:
            checks.append(Attributes(user, "impersonate", True, "", "users", "", "", name))
        checks += [Attributes(user, "impersonate", True, "", "groups", "", "", g) for g in groups]
        for a in checks:
            if not rbac.authorize(a, snap)[0]:
                raise forbidden(a.group, a.resource, a.name, rbac.forbidden_message(a))

    # --- authorization ----------------------------------------------------------------------------------

    def rbac_snapshot(self) -> rbac.Snapshot:
        s = self.store
        g = "rbac.authorization.k8s.io"
        return rbac.Snapshot(
            roles={(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in s.items((g, "roles"))},
            cluster_roles={o["metadata"]["name"]: o for o in s.items((g, "clusterroles"))},
            role_bindings=list(s.items((g, "rolebindings"))),
            cluster_role_bindings=list(s.items((g, "clusterrolebindings"))),
        )

    def authorizer_snapshot(self) -> rbac.Snapshot:
        """What the authorizer decides with: the store's RBAC objects, or with ``rbac_delay`` its watch
        caches (started, synced, by ``set_rbac_delay``: at the emulator's start)."""
        if self.rbac_delay <= 0:
            return self.rbac_snapshot()
        if self._rbac_cache is None:
            cache = self._rbac_cache = rbac.LaggingCache(self.rbac_delay)
            for plural in rbac.RBAC_PLURALS:
                syncing = [True]  # the watch's initial ADDED events come before it returns: the list

                def deliver(
                    etype: str, obj: dict[str, Any], plural: str = plural, s: list[bool] = syncing
                ) -> None:
                    cache.offer(time.monotonic(), plural, etype, obj, synced=s[0])

                rtype = self.store.rtype(rbac.RBAC_GROUP, plural)
                self._rbac_watchers.append(self.store.watch(rtype, "", (), (), deliver))
                syncing[0] = False
        return self._rbac_cache.snapshot(time.monotonic())

    def set_rbac_delay(self, seconds: float) -> None:
        """The authorizer's lag from now on; its caches start over (synced) at the next request."""
        if self._rbac_cache is not None:
            for w in list(self._rbac_watchers):
                self.store.unwatch(w)
        self._rbac_watchers = []
        self._rbac_cache = None
        self.rbac_delay = max(0.0, seconds)
        self.authorizer_snapshot()  # the caches start (synced) now: later changes lag

    def attributes(self, user: UserInfo, info: RequestInfo) -> Attributes:
        if not info.resource_request:
            return Attributes(user, info.verb, False, path=info.path)
        return Attributes(
            user, info.verb, True, info.group, info.resource, info.subresource, info.namespace, info.name
        )

    def authorize(self, a: Attributes) -> None:
        if a.user.privileged:
            return
        ok, reason = rbac.authorize(a, self.authorizer_snapshot())
        if not ok:
            msg = rbac.forbidden_message(a) + (f": {reason}" if reason else "")
            if not a.resource_request:
                raise forbidden("", "", "", msg)
            raise forbidden(a.group, a.resource, a.name, msg)

    # --- the one handler ----------------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.time()
        t0 = time.perf_counter()
        user_name = "?"
        info = RequestInfo(False, request.method.lower(), request.path)
        status = 500
        try:
            user = self.authenticate(request)
            user_name = user.name
            info = parse_request(request.method, request.path, request.query)
            if request.path.startswith(CONTROL_PREFIX + "/") or request.path == CONTROL_PREFIX:
                if not user.privileged:
                    raise forbidden("", "", "", rbac.forbidden_message(self.attributes(user, info)))
                resp = await self.control(request)
                status = resp.status
                return resp
            self.authorize(self.attributes(user, info))
            fault = self.faults.take(
                {
                    "verb": info.verb,
                    "resource": info.resource,
                    "name": info.name,
                    "subresource": info.subresource,
                    "namespace": info.namespace,
                    "user": user.name,
                }
            )
            if fault is not None:
                if fault.hang:
                    await anyio.sleep(fault.hang)
                if fault.code:
                    rtype = self.store.registry.get(info.group, info.resource)
                    err = for_code(fault.code, rtype, info.name, fault.retry_after)
                    if fault.message:
                        err.message = fault.message
                    if fault.retry_after and "Retry-After" not in err.headers:
                        err.headers["Retry-After"] = str(fault.retry_after)
                    raise err
            answer = await self.dispatch(request, user, info)
            status = answer.status
            return answer
        except ApiError as e:
            status = e.code
            return _error_response(e)
        except Exception as e:
            log.exception("kubeapi.handler_failed path=%r", request.path)
            status = 500
            return _error_response(
                ApiError(500, "InternalError", f"Internal error occurred: {type(e).__name__}: {e}")
            )
        finally:
            self.log.add(
                time=started,
                user=user_name,
                verb=info.verb,
                method=request.method,
                path=request.path_qs,
                code=status,
                group=info.group,
                resource=info.resource,
                subresource=info.subresource,
                namespace=info.namespace,
                name=info.name,
                content_type=request.headers.get("Content-Type", ""),
                user_agent=request.headers.get("User-Agent", ""),
                duration=time.perf_counter() - t0,
            )
            log.debug(
                "kubeapi.request user=%s verb=%s path=%r code=%d",
                user_name,
                info.verb,
                request.path_qs,
                status,
            )

    async def _proxy_to_pod(self, request: web.Request, ns: str, name: str) -> web.StreamResponse:
        """``GET .../pods/[SCHEME:]NAME[:PORT]/proxy/PATH``: the pod's answer, as kube-apiserver relays it
        (kubernetes ``pkg/registry/core/pod/strategy.go`` ``ResourceLocation``, ``pkg/registry/core/pod/
        rest/subresources.go`` ``ProxyREST``; apimachinery ``pkg/util/proxy/transport.go``). It dials the
        pod's IP in ``pod_network`` (the netns the cluster's pods are reachable in; None: its own)."""
        if request.method not in ("GET", "HEAD"):
            raise ApiError(405, "MethodNotAllowed", "not modelled: pods/proxy with a method but GET and HEAD")
        parts = name.split(":")
        scheme, pod_name, port = (
            ("", parts[0], "") if len(parts) == 1
            else ("", parts[0], parts[1]) if len(parts) == 2
            else (parts[0], parts[1], parts[2]) if len(parts) == 3
            else ("!", "", "")
        )  # fmt: skip
        if scheme not in ("", "http", "https") or not pod_name:
            raise bad_request(f'invalid pod request "{name}"')
        if scheme == "https":
            raise ApiError(400, "BadRequest", "not modelled: pods/proxy over https")
        pod = self.store.get(self.store.rtype("", "pods"), ns, pod_name, "v1")
        ip = str((pod.get("status") or {}).get("podIP") or "")
        if not _proxyable(ip):
            raise bad_request("address not allowed")
        if not port:  # the first container port, else the scheme's
            ports = [p for c in pod["spec"].get("containers") or [] for p in c.get("ports") or []]
            port = str(ports[0]["containerPort"]) if ports else "80"
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise bad_request(f'invalid pod request "{name}"')
        tail = request.path.split("/proxy", 1)[1] or "/"
        target = f"{tail}?{request.query_string}" if request.query_string else tail
        try:
            code, headers, body = await _http_get(self.pod_network, ip, int(port), target)
        except OSError as exc:
            raise ApiError(
                503,
                "ServiceUnavailable",
                f"error trying to reach service: dial tcp {ip}:{port}: {_go_error(exc)}",
            ) from None
        ctype = headers.get("content-type", "text/plain; charset=utf-8")
        return web.Response(body=b"" if request.method == "HEAD" else body, status=code,
                            headers={"Content-Type": ctype})  # fmt: skip

    # --- non-resource paths ---------------------------------------------------------------------------------

    def _non_resource(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        reg = self.store.registry
        if path in ("/healthz", "/livez", "/readyz") or path.startswith(("/healthz/", "/livez/", "/readyz/")):
            if "verbose" in request.query:
                return web.Response(text=f"[+]ping ok\n[+]etcd ok\n{path.strip('/')} check passed\n")
            return web.Response(text="ok")
        if path == "/version":
            return _json_response(discovery.VERSION)
        if path == "/api":
            return _json_response(discovery.api_versions(self.server_address()))
        if path == "/apis":
            return _json_response(discovery.group_list(reg))
        segs = path.strip("/").split("/")
        if segs[0] == "api" and len(segs) == 2:
            doc = discovery.resource_list(reg, "", segs[1])
            if doc is not None:
                return _json_response(doc)
        if segs[0] == "apis" and len(segs) == 2:
            g = discovery.group(reg, segs[1])
            if g is not None:
                return _json_response(g)
        if segs[0] == "apis" and len(segs) == 3:
            doc = discovery.resource_list(reg, segs[1], segs[2])
            if doc is not None:
                return _json_response(doc)
        if path == "/openapi/v3":
            return _json_response(discovery.openapi_v3_root(reg))
        if path.startswith("/openapi/v3/"):
            rest = path[len("/openapi/v3/") :].split("/")
            doc = None
            if rest[0] == "api" and len(rest) == 2:
                doc = discovery.openapi_v3_doc(reg, "", rest[1])
            elif rest[0] == "apis" and len(rest) == 3:
                doc = discovery.openapi_v3_doc(reg, rest[1], rest[2])
            if doc is not None:
                return _json_response(
                    doc, headers={"Cache-Control": "public, immutable"} if "hash" in request.query else None
                )
        raise path_not_found()

    # --- resources ----------------------------------------------------------------------------------------

    async def _body(self, request: web.Request, rtype: ResourceType | None = None) -> Any:
        raw = await request.read()
        ctype = _media(request.headers.get("Content-Type", JSON))
        if not raw:
            return None
        if ctype == protobuf.CONTENT_TYPE:
            decoded = protobuf.decode(raw)
            if decoded is None:
                raise unsupported_media_type(ctype, (JSON, "application/yaml"))
            return decoded
        try:
            if ctype in ("application/yaml", "application/apply-patch+yaml"):
                try:
                    return json.loads(raw)
                except ValueError:
                    return yaml.safe_load(raw)
            if ctype in (
                JSON,
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/strategic-merge-patch+json",
                "*/*",
                "",
            ):
                return json.loads(raw)
        except (ValueError, yaml.YAMLError) as e:
            raise bad_request(f"error decoding body: {e}") from None
        raise unsupported_media_type(ctype, (JSON, "application/yaml", protobuf.CONTENT_TYPE))

    def _resolve(self, info: RequestInfo) -> ResourceType:
        rtype = self.store.registry.lookup(info.group, info.version, info.resource)
        if rtype is None:
            if info.group and not self.store.registry.in_group_version(info.group, info.version):
                raise group_version_not_served()
            raise path_not_found()
        if info.namespace and not rtype.namespaced and not (rtype.key == ("", "namespaces")):
            raise path_not_found()
        if info.subresource and info.subresource not in rtype.subresources and not _pod_proxy(rtype, info):
            raise path_not_found()
        return rtype

    async def dispatch(self, request: web.Request, user: UserInfo, info: RequestInfo) -> web.StreamResponse:
        if not info.resource_request:
            if request.method not in ("GET", "HEAD"):
                raise method_not_allowed()
            return self._non_resource(request)
        rtype = self._resolve(info)
        q = request.query
        ns = info.namespace if rtype.namespaced else ""
        name = info.name
        version = info.version
        dry_run = q.get("dryRun") == "All"
        warnings: list[str] = []
        accept = request.headers.get("Accept", "")

        def respond(obj: dict[str, Any], code: int = 200) -> web.Response:
            headers = {"Warning": ", ".join(_warning(w) for w in warnings)} if warnings else None
            if _accepts(accept, "Table"):
                return _json_response(
                    tables.table(
                        rtype,
                        [obj],
                        self.store.clock(),
                        include_object=q.get("includeObject", "Metadata"),
                        resource_version=obj["metadata"].get("resourceVersion", ""),
                    ),
                    code,
                    headers,
                )
            if _accepts(accept, "PartialObjectMetadata"):
                return _json_response(tables.partial_metadata(obj), code, headers)
            return _json_response(obj, code, headers)

        if rtype.virtual:
            if info.verb != "create":
                raise method_not_allowed()
            return _json_response(self._review(rtype, user, await self._body(request), ns), 201)
        if info.subresource == "token":
            if info.verb != "create":
                raise method_not_allowed()
            return _json_response(self._token_request(ns, name, await self._body(request) or {}), 201)
        if info.subresource == "scale":
            return await self._scale(request, rtype, ns, name, info, dry_run)
        if info.subresource == "finalize":
            raise method_not_allowed()
        if _pod_proxy(rtype, info):
            return await self._proxy_to_pod(request, ns, name)
        if rtype.namespaced and not ns and info.verb not in ("list", "watch"):
            raise path_not_found()

        if info.verb == "get":
            return respond(self.store.get(rtype, ns, name, version))
        if info.verb in ("list", "watch"):
            labels = selectors.parse_labels(q.get("labelSelector"))
            fields = selectors.parse_fields(q.get("fieldSelector"), rtype)
            if info.verb == "watch":
                return await self._watch(request, rtype, ns, labels, fields, version)
            return self._list(rtype, ns, labels, fields, q, version, accept)
        if info.verb == "create":
            body = await self._body(request, rtype)
            if not isinstance(body, dict):
                raise bad_request("the body of the request must be a Kubernetes object")
            self._check_escalation(user, rtype, ns, body)
            obj = self.store.create(
                rtype,
                ns,
                body,
                version=version,
                dry_run=dry_run,
                field_manager=q.get("fieldManager", ""),
                field_validation=q.get("fieldValidation", ""),
                warnings=warnings,
            )
            return respond(obj, 201)
        if info.verb == "update":
            body = await self._body(request, rtype)
            if not isinstance(body, dict):
                raise bad_request("the body of the request must be a Kubernetes object")
            if not info.subresource:
                self._check_escalation(user, rtype, ns, body)
            if (
                rtype.allow_create_on_update
                and not info.subresource
                and self.store.peek(rtype, ns, name) is None
            ):
                body.setdefault("metadata", {}).setdefault("name", name)
                if body["metadata"]["name"] != name:
                    raise bad_request(
                        f"the name of the object ({body['metadata']['name']}) does not match the name "
                        f"on the URL ({name})"
                    )
                body["metadata"].pop("resourceVersion", None)
                made = self.store.create(rtype, ns, body, version=version, dry_run=dry_run, warnings=warnings)
                return respond(made, 201)
            obj = self.store.update(
                rtype,
                ns,
                name,
                body,
                subresource=info.subresource,
                version=version,
                dry_run=dry_run,
                field_validation=q.get("fieldValidation", ""),
                warnings=warnings,
            )
            return respond(obj)
        if info.verb == "patch":
            ctype = _media(request.headers.get("Content-Type", ""))
            body = await self._body(request, rtype)
            kw: dict[str, Any] = {
                "subresource": info.subresource,
                "version": version,
                "field_manager": q.get("fieldManager", ""),
                "field_validation": q.get("fieldValidation", ""),
            }
            if self._needs_escalation_check(user, rtype):
                # the escalation check looks at the object the patch would produce
                preview, _ = self.store.patch(rtype, ns, name, ctype, body, dry_run=True, **kw)
                self._check_escalation(user, rtype, ns, preview)
            obj, created = self.store.patch(
                rtype, ns, name, ctype, body, dry_run=dry_run, warnings=warnings, **kw
            )
            return respond(obj, 201 if created else 200)
        if info.verb == "delete":
            opts = self._delete_options(q, await self._body(request))
            obj = self.store.delete(rtype, ns, name, opts)
            if obj["metadata"].get("deletionTimestamp") and self.store.peek(rtype, ns, name) is not None:
                return respond(obj)
            if rtype.crd or rtype.key in (("", "pods"), ("", "namespaces"), ("", "services")):
                return respond(obj)
            return _json_response(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "details": {
                        "name": name,
                        **({"group": rtype.group} if rtype.group else {}),
                        "kind": rtype.plural,
                        "uid": obj["metadata"]["uid"],
                    },
                }
            )
        if info.verb == "deletecollection":
            opts = self._delete_options(q, await self._body(request))
            labels = selectors.parse_labels(q.get("labelSelector"))
            fields = selectors.parse_fields(q.get("fieldSelector"), rtype)
            items = []
            for ident, _ in list(self.store.select(rtype, ns, labels, fields)):
                with contextlib.suppress(ApiError):
                    items.append(self.store.delete(rtype, ident[0], ident[1], opts))
            return _json_response(
                {
                    "kind": f"{rtype.kind}List",
                    "apiVersion": rtype.api_version,
                    "metadata": {"resourceVersion": str(self.store.rv)},
                    "items": items,
                }
            )
        raise method_not_allowed()

    def _delete_options(self, q: Mapping[str, str], body: Any) -> DeleteOptions:
        opts = DeleteOptions()
        if isinstance(body, dict):
            pre = body.get("preconditions") or {}
            opts.uid = str(pre.get("uid") or "")
            opts.resource_version = str(pre.get("resourceVersion") or "")
            opts.propagation = str(body.get("propagationPolicy") or "")
            if body.get("orphanDependents") is True and not opts.propagation:
                opts.propagation = "Orphan"
            opts.dry_run = "All" in (body.get("dryRun") or [])
            if body.get("gracePeriodSeconds") is not None:
                opts.grace_seconds = int(body["gracePeriodSeconds"])
        if q.get("propagationPolicy"):
            opts.propagation = q["propagationPolicy"]
        if q.get("orphanDependents") == "true" and not opts.propagation:
            opts.propagation = "Orphan"
        if q.get("dryRun") == "All":
            opts.dry_run = True
        return opts

    def _list(
        self,
        rtype: ResourceType,
        ns: str,
        labels: selectors.LabelSelector,
        fields: selectors.FieldSelector,
        q: Mapping[str, str],
        version: str,
        accept: str,
    ) -> web.Response:
        try:
            limit = int(q.get("limit") or 0)
        except ValueError:
            raise bad_request(f"invalid limit: {q.get('limit')!r}") from None
        res = self.store.list(
            rtype,
            ns,
            labels,
            fields,
            limit=max(limit, 0),
            continue_token=q.get("continue", ""),
            version=version,
            resource_version=q.get("resourceVersion", ""),
            resource_version_match=q.get("resourceVersionMatch", ""),
        )
        if _accepts(accept, "Table"):
            return _json_response(
                tables.table(
                    rtype,
                    res.items,
                    self.store.clock(),
                    include_object=q.get("includeObject", "Metadata"),
                    resource_version=res.resource_version,
                    continue_token=res.continue_token,
                    remaining=res.remaining,
                )
            )
        meta: dict[str, Any] = {"resourceVersion": res.resource_version}
        if res.continue_token:
            meta["continue"] = res.continue_token
        if res.remaining is not None:
            meta["remainingItemCount"] = res.remaining
        if _accepts(accept, "PartialObjectMetadataList"):
            return _json_response(
                {
                    "kind": "PartialObjectMetadataList",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": meta,
                    "items": [tables.partial_metadata(o) for o in res.items],
                }
            )
        api_version = f"{rtype.group}/{version}" if rtype.group else version
        head = _dumps({"kind": f"{rtype.kind}List", "apiVersion": api_version, "metadata": meta})[:-1]
        if rtype.crd:
            items = [self._cache.encode(o) for o in res.items]
        else:  # built-in lists carry no kind/apiVersion per item
            items = [
                _dumps({k: v for k, v in o.items() if k not in ("kind", "apiVersion")}) for o in res.items
            ]
        body = head + b',"items":[' + b",".join(items) + b"]}"
        return web.Response(body=body, content_type=JSON)

    async def _watch(
        self,
        request: web.Request,
        rtype: ResourceType,
        ns: str,
        labels: selectors.LabelSelector,
        fields: selectors.FieldSelector,
        version: str,
    ) -> web.StreamResponse:
        q = request.query
        accept = request.headers.get("Accept", "")
        as_table = _accepts(accept, "Table")
        as_meta = _accepts(accept, "PartialObjectMetadata")
        # A watch negotiated as PartialObjectMetadataList (a list type first in Accept) cannot encode its
        # first event, a single object: the real server ends the stream there without sending it
        # (apiserver handlers/response.go asPartialObjectMetadataList "the requested object is not a
        # list"; handlers/watch.go serveWatch returns on the Encode error). So does the emulator.
        as_list = _first_as(accept) == "PartialObjectMetadataList"
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        send_initial = q.get("sendInitialEvents") == "true"
        if send_initial and (q.get("resourceVersionMatch") != "NotOlderThan" or not bookmarks):
            raise invalid(
                rtype,
                "",
                [
                    FieldError(
                        "sendInitialEvents",
                        "Forbidden",
                        "sendInitialEvents is forbidden for watch unless the WatchList feature gate is "
                        "enabled and resourceVersionMatch is set to NotOlderThan and allowWatchBookmarks "
                        "is set",
                    )
                ],
            )
        try:
            timeout = (
                float(q["timeoutSeconds"])
                if q.get("timeoutSeconds")
                else random.uniform(*self.settings.watch_timeout)  # noqa: S311 (not a secret)
            )
        except ValueError:
            raise bad_request("invalid timeoutSeconds") from None
        send, recv = anyio.create_memory_object_stream[tuple[str, dict[str, Any]]](math.inf)

        def push(etype: str, obj: dict[str, Any]) -> None:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                send.send_nowait((etype, obj))

        resp = web.StreamResponse(
            status=200, headers={"Content-Type": JSON, "Cache-Control": "no-cache, private"}
        )
        resp.enable_chunked_encoding()
        watcher: Watcher | None = None
        expired: ApiError | None = None
        try:
            watcher = self.store.watch(
                rtype,
                ns,
                labels,
                fields,
                push,
                resource_version=q.get("resourceVersion", ""),
                send_initial_events=send_initial,
            )
        except ApiError as e:
            if e.code != 410:
                raise
            expired = e
        await resp.prepare(request)
        first_table = True

        def encode(etype: str, obj: dict[str, Any]) -> bytes:
            nonlocal first_table
            if etype in ("BOOKMARK",):
                if as_table:
                    obj = {
                        "kind": "Table",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": obj["metadata"],
                        "columnDefinitions": None,
                        "rows": None,
                    }
                return b'{"type":"BOOKMARK","object":' + _dumps(obj) + b"}\n"
            view = self.store.view(rtype, obj, version)
            if as_table:
                t = tables.table(
                    rtype,
                    [view],
                    self.store.clock(),
                    include_object=q.get("includeObject", "Metadata"),
                    resource_version=view["metadata"].get("resourceVersion", ""),
                    with_columns=first_table,
                )
                first_table = False
                return b'{"type":"' + etype.encode() + b'","object":' + _dumps(t) + b"}\n"
            if as_meta:
                return (
                    b'{"type":"'
                    + etype.encode()
                    + b'","object":'
                    + _dumps(tables.partial_metadata(view))
                    + b"}\n"
                )
            data = self._cache.encode(view) if view is obj else _dumps(view)
            return b'{"type":"' + etype.encode() + b'","object":' + data + b"}\n"

        def bookmark(initial_end: bool = False) -> dict[str, Any]:
            meta: dict[str, Any] = {"resourceVersion": str(self.store.rv)}
            if initial_end:
                meta["annotations"] = {"k8s.io/initial-events-end": "true"}
            return {
                "kind": rtype.kind,
                "apiVersion": f"{rtype.group}/{version}" if rtype.group else version,
                "metadata": meta,
            }

        def close() -> None:
            push(CLOSE, {})

        def stall() -> None:
            push(STALL, {})

        self._watch_streams.add(close)
        self._stallable.add(stall)
        try:
            if expired is not None:
                await resp.write(b'{"type":"ERROR","object":' + _dumps(expired.status()) + b"}\n")
                return resp
            interval = self.settings.bookmark_interval
            with anyio.move_on_after(timeout):
                next_bookmark = anyio.current_time() + interval
                while True:
                    wait = max(0.0, next_bookmark - anyio.current_time()) if bookmarks else math.inf
                    item: tuple[str, dict[str, Any]] | None = None
                    # aiohttp does not cancel a handler whose client went away: look every second
                    with anyio.move_on_after(min(wait, DISCONNECT_CHECK)):
                        item = await recv.receive()
                    if item is None:
                        if request.transport is None or request.transport.is_closing():
                            break
                        if bookmarks and anyio.current_time() >= next_bookmark:
                            if as_list:
                                break
                            await resp.write(encode("BOOKMARK", bookmark()))
                            next_bookmark = anyio.current_time() + interval
                        continue
                    etype, obj = item
                    if etype == CLOSE:
                        break
                    if etype == STALL:
                        # Half-open: no event, no bookmark, no end of the stream (not even at its
                        # timeout) until the client gives up on the connection.
                        with anyio.CancelScope(shield=True):
                            # No deadline by design: held until the client gives up (aiohttp tells no
                            # one a client left), no timeout to report (allowed in tests/unit/
                            # test_no_polling_loops.py).
                            while request.transport is not None and not request.transport.is_closing():  # noqa: ASYNC110 (aiohttp tells no one a client left)
                                await anyio.sleep(DISCONNECT_CHECK)
                        break
                    if as_list:
                        break
                    if etype == "INITIAL-END":
                        await resp.write(encode("BOOKMARK", bookmark(initial_end=True)))
                        continue
                    await resp.write(encode(etype, obj))
            with contextlib.suppress(ConnectionError, RuntimeError):
                await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client went away (or the emulator dropped it)
        finally:
            self._watch_streams.discard(close)
            self._stallable.discard(stall)
            if watcher is not None:
                self.store.unwatch(watcher)
            send.close()
            recv.close()
        return resp

    def close_watches(self) -> int:
        streams = list(self._watch_streams)
        for close in streams:
            close()
        return len(streams)

    def stall_watches(self) -> int:
        """Every open watch goes half-open (``STALL``); watches opened later are served as usual."""
        streams = list(self._stallable)
        for stall in streams:
            stall()
        return len(streams)

    # --- escalation -------------------------------------------------------------------------------------

    def _needs_escalation_check(self, user: UserInfo, rtype: ResourceType) -> bool:
        return not user.privileged and rtype.group == "rbac.authorization.k8s.io"

    def _check_escalation(self, user: UserInfo, rtype: ResourceType, ns: str, obj: Mapping[str, Any]) -> None:
        """pkg/registry/rbac: the ``escalate`` (RoleEscalationAuthorized) and ``bind``
        (BindingAuthorized) verbs are asked of the authorizer, so with ``rbac_delay`` they lag as every
        authorization does; the rule check (ConfirmNoEscalation, the referenced role's rules) resolves
        from storage, so it sees every RBAC object written."""
        if not self._needs_escalation_check(user, rtype):
            return
        snap = self.rbac_snapshot()
        authorizer = self.authorizer_snapshot()
        name = (obj.get("metadata") or {}).get("name", "")
        plural = rtype.plural
        if plural in ("roles", "clusterroles"):
            esc = Attributes(user, "escalate", True, rtype.group, plural, "", ns, name)
            if rbac.authorize(esc, authorizer)[0]:
                return
            owner, errors = rbac.rules_for(user, ns if plural == "roles" else "", snap)
            missing = rbac.missing_rights(owner, list(obj.get("rules") or []))
        else:
            ref = obj.get("roleRef") or {}
            role_plural = "clusterroles" if ref.get("kind") == "ClusterRole" else "roles"
            bind = Attributes(
                user,
                "bind",
                True,
                rtype.group,
                role_plural,
                "",
                ns if plural == "rolebindings" else "",
                ref.get("name", ""),
            )
            if rbac.authorize(bind, authorizer)[0]:
                return
            wanted, ref_errors = rbac.role_rules(snap, ref, ns)
            owner, errors = rbac.rules_for(user, ns if plural == "rolebindings" else "", snap)
            errors = errors + ref_errors
            missing = rbac.missing_rights(owner, wanted)
            if ref_errors and not wanted:
                raise forbidden(rtype.group, plural, name, rbac.escalation_message(user, [], ref_errors))
        if missing:
            raise forbidden(rtype.group, plural, name, rbac.escalation_message(user, missing, errors))

    # --- subresources and reviews ---------------------------------------------------------------------------

    def _token_request(self, ns: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        sa_type = self.store.rtype("", "serviceaccounts")
        sa = self.store.peek(sa_type, ns, name)
        if sa is None:
            raise not_found(sa_type, name)
        spec = body.get("spec") or {}
        seconds = int(spec.get("expirationSeconds") or 3600)
        if seconds < 600:
            raise invalid(
                self.store.rtype("", "serviceaccounts"),
                name,
                [
                    FieldError(
                        "spec.expirationSeconds",
                        "Invalid value",
                        "may not specify a duration less than 10 minutes",
                        seconds,
                        True,
                    )
                ],
            )
        audiences = tuple(spec.get("audiences") or ("https://kubernetes.default.svc.cluster.local",))
        expires = self.store.clock() + timedelta(seconds=seconds)
        token = self.tokens.mint_service_account(ns, name, sa["metadata"]["uid"], expires, audiences)
        return {
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": None},
            "spec": {
                "audiences": list(audiences),
                "expirationSeconds": seconds,
                "boundObjectRef": spec.get("boundObjectRef"),
            },
            "status": {
                "token": token,
                "expirationTimestamp": expires.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
        }

    def _review(self, rtype: ResourceType, user: UserInfo, body: Any, ns: str) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a review object")
        spec = body.get("spec") or {}
        out = {
            "kind": rtype.kind,
            "apiVersion": rtype.api_version,
            "metadata": {"creationTimestamp": None},
            "spec": spec,
        }
        snap = self.authorizer_snapshot()  # reviews ask the authorizer (and its caches)
        if rtype.plural == "selfsubjectreviews":
            out["status"] = {"userInfo": user_info_dict(user)}
            return out
        if rtype.plural == "tokenreviews":
            rec = self.tokens.authenticate(str(spec.get("token", "")), self.store.clock(), self._sa_uid)
            out["status"] = (
                {"authenticated": True, "user": user_info_dict(rec.user), "audiences": list(rec.audiences)}
                if rec
                else {"user": {}}
            )
            return out
        subject = user
        if rtype.plural in ("subjectaccessreviews", "localsubjectaccessreviews"):
            subject = UserInfo(
                str(spec.get("user", "")), tuple(spec.get("groups") or ()), str(spec.get("uid", ""))
            )
        if rtype.plural == "selfsubjectrulesreviews":
            target_ns = str(spec.get("namespace", ""))
            if user.privileged:
                rules: list[Mapping[str, Any]] = [
                    {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                    {"nonResourceURLs": ["*"], "verbs": ["*"]},
                ]
            else:
                rules, _ = rbac.rules_for(user, target_ns, snap)
            out["status"] = {
                "resourceRules": [
                    {k: r[k] for k in ("verbs", "apiGroups", "resources", "resourceNames") if r.get(k)}
                    for r in rules
                    if r.get("resources")
                ],
                "nonResourceRules": [
                    {k: r[k] for k in ("verbs", "nonResourceURLs") if r.get(k)}
                    for r in rules
                    if r.get("nonResourceURLs")
                ],
                "incomplete": False,
            }
            return out
        ra, nra = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
        if ra:
            a = Attributes(
                subject,
                str(ra.get("verb", "")),
                True,
                str(ra.get("group", "")),
                str(ra.get("resource", "")),
                str(ra.get("subresource", "")),
                str(ra.get("namespace", "") or (ns if rtype.plural == "localsubjectaccessreviews" else "")),
                str(ra.get("name", "")),
            )
        elif nra:
            a = Attributes(subject, str(nra.get("verb", "")), False, path=str(nra.get("path", "")))
        else:
            raise invalid(
                rtype,
                "",
                [
                    FieldError(
                        "spec.resourceAttributes",
                        "Invalid value",
                        "exactly one of nonResourceAttributes or resourceAttributes must be specified",
                        "null",
                        False,
                    )
                ],
            )
        ok, reason = rbac.authorize(a, snap)
        status: dict[str, Any] = {"allowed": ok}
        if ok and not subject.privileged:
            status["reason"] = "RBAC: allowed"
        elif reason:
            status["reason"] = reason
        out["status"] = status
        return out

    async def _scale(
        self, request: web.Request, rtype: ResourceType, ns: str, name: str, info: RequestInfo, dry_run: bool
    ) -> web.Response:
        obj = self.store.get(rtype, ns, name)

        def scale(o: Mapping[str, Any]) -> dict[str, Any]:
            m = o["metadata"]
            sel = ((o.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            return {
                "kind": "Scale",
                "apiVersion": "autoscaling/v1",
                "metadata": {
                    k: m[k]
                    for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                    if k in m
                },
                "spec": {"replicas": int((o.get("spec") or {}).get("replicas", 0))},
                "status": {
                    "replicas": int((o.get("status") or {}).get("replicas", 0)),
                    "selector": ",".join(f"{k}={v}" for k, v in sorted(sel.items())),
                },
            }

        if info.verb == "get":
            return _json_response(scale(obj))
        body = await self._body(request)
        current = scale(obj)
        if info.verb == "update":
            new = body if isinstance(body, dict) else {}
        elif info.verb == "patch":
            ctype = _media(request.headers.get("Content-Type", ""))
            try:
                new = (
                    json_patch(current, body)
                    if ctype == "application/json-patch+json"
                    else merge_patch(current, body)
                    if ctype == "application/merge-patch+json"
                    else strategic_merge(current, body)
                )
            except PatchError as e:
                raise patch_failed(str(e)) from None
        else:
            raise method_not_allowed()
        replicas = (new.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise invalid(
                rtype,
                name,
                [
                    FieldError(
                        "spec.replicas", "Invalid value", "must be greater than or equal to 0", replicas, True
                    )
                ],
            )
        patched = {**obj, "spec": {**(obj.get("spec") or {}), "replicas": replicas}}
        rv = str((new.get("metadata") or {}).get("resourceVersion") or "")
        if rv:
            patched = {**patched, "metadata": {**patched["metadata"], "resourceVersion": rv}}
        out = self.store.update(rtype, ns, name, patched, dry_run=dry_run)
        return _json_response(scale(out))

    # --- emulator controls (admin only) --

    async def control(self, request: web.Request) -> web.Response:
        path = request.path[len(CONTROL_PREFIX) :].rstrip("/")
        q = request.query
        body: Any = None
        if request.can_read_body:
            raw = await request.read()
            body = json.loads(raw) if raw else None
        if path == "/requests" and request.method == "GET":
            filters: dict[str, Any] = {
                k: q[k]
                for k in ("verb", "resource", "subresource", "name", "namespace", "user", "path_contains")
                if k in q
            }
            if "since" in q:
                filters["since"] = int(q["since"])
            if q.get("writes") in ("1", "true"):
                filters["writes_only"] = True
            return _json_response(
                {"items": [r.as_dict() for r in self.log.query(**filters)], "seq": self.log.seq}
            )
        if path == "/requests/reset" and request.method == "POST":
            return _json_response({"seq": self.log.reset()})
        if path == "/faults" and request.method == "POST":
            try:
                fault = self.faults.add(Fault.from_dict(body or {}))
            except (ValueError, TypeError) as e:
                raise bad_request(str(e)) from None
            return _json_response({"id": fault.id}, 201)
        if path == "/faults" and request.method == "DELETE":
            self.faults.clear()
            return _json_response({})
        if path == "/faults" and request.method == "GET":
            return _json_response(
                {
                    "items": [
                        {"id": f.id, "code": f.code, "count": f.count, "hits": f.hits}
                        for f in self.faults.rules
                    ]
                }
            )
        if path == "/compact" and request.method == "POST":
            return _json_response({"compactedResourceVersion": str(self.store.compact())})
        if path == "/close-watches" and request.method == "POST":
            return _json_response({"closed": self.close_watches()})
        if path == "/stall-watches" and request.method == "POST":
            return _json_response({"stalled": self.stall_watches()})
        if path == "/unreachable" and request.method == "POST":
            seconds = float(q.get("seconds", (body or {}).get("seconds", 1)))
            if self.on_unreachable is None:
                raise method_not_allowed()
            callback = self.on_unreachable
            asyncio_loop_call_later(0.05, callback, seconds)
            return _json_response({"seconds": seconds})
        if path == "/tokens" and request.method == "POST":
            b = body or {}
            if b.get("user"):
                token = self.tokens.add(
                    TokenRecord(UserInfo(str(b["user"]), (*tuple(b.get("groups") or ()), rbac.AUTHENTICATED)))
                )
            else:
                ns, name = str(b.get("namespace", "")), str(b.get("name", ""))
                token = self._token_request(
                    ns, name, {"spec": {"expirationSeconds": b.get("expirationSeconds", 3600)}}
                )["status"]["token"]
            return _json_response({"token": token}, 201)
        if path == "/clock" and request.method == "GET":
            return _json_response({"now": self.store.now()})
        if path == "/stats" and request.method == "GET":
            return _json_response(
                {
                    "objects": self.store.count(),
                    "resourceVersion": str(self.store.rv),
                    "watchers": self.store.watcher_count(),
                    "compactedResourceVersion": str(self.store.compacted_rv),
                    "gcDeletions": self.store.stats.gc_deletions,
                }
            )
        raise path_not_found()


def asyncio_loop_call_later(delay: float, callback: Callable[[float], Awaitable[None]], arg: float) -> None:
    """Run ``callback(arg)`` soon as a task of the running loop (the control answers first)."""
    loop = asyncio.get_running_loop()

    def start() -> None:
        t = loop.create_task(_run(callback, arg))
        _BACKGROUND.add(t)
        t.add_done_callback(_BACKGROUND.discard)

    loop.call_later(delay, start)


async def _run(callback: Callable[[float], Awaitable[None]], arg: float) -> None:
    await callback(arg)


_BACKGROUND: set[asyncio.Task[None]] = set()


def _pod_proxy(rtype: ResourceType, info: RequestInfo) -> bool:
    return info.subresource == "proxy" and rtype.key == ("", "pods") and bool(info.name)


def _proxyable(ip: str) -> bool:
    """kubernetes ``pkg/proxy/util`` ``IsProxyableIP``: Go's ``IsGlobalUnicast`` (not unspecified, the
    IPv4 broadcast, loopback, multicast or link-local unicast)."""
    try:
        a = ipaddress.ip_address(ip)
    except ValueError:
        return False
    broadcast = a == ipaddress.IPv4Address("255.255.255.255")
    return not (a.is_unspecified or broadcast or a.is_loopback or a.is_multicast or a.is_link_local)


def _go_error(exc: OSError) -> str:
    """A dial error in Go's words (``connect: connection refused``)."""
    if isinstance(exc, TimeoutError):
        return "i/o timeout"
    return f"connect: {os.strerror(exc.errno).lower()}" if exc.errno else str(exc)


PROXY_TIMEOUT = 5.0
PROXY_LIMIT = 1 << 20


async def _http_get(netns: str | None, ip: str, port: int, target: str) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 GET to ``ip:port`` (a socket made in ``netns``), read to its end (Connection: close)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET

    def dial() -> socket.socket:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(PROXY_TIMEOUT)
            sock.connect((ip, port))
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    if netns is None:
        sock = await asyncio.to_thread(dial)
    else:
        from lab.kubelet.nsnet import in_netns

        sock = await asyncio.to_thread(in_netns, netns, dial)
    host = f"[{ip}]" if family == socket.AF_INET6 else ip
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        writer.write(f"GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(PROXY_LIMIT), PROXY_TIMEOUT)
        while len(raw) < PROXY_LIMIT:
            more = await asyncio.wait_for(reader.read(PROXY_LIMIT - len(raw)), PROXY_TIMEOUT)
            if not more:
                break
            raw += more
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    code = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out, rest = b"", body
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            n = int(size.split(b";")[0], 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2 :]
        body = out
    return code, headers, body
