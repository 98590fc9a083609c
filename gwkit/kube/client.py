"""A small async Kubernetes API client over httpx: the project's own boundary to the API server.

Why not the official ``kubernetes`` client (docs/controller.md has the measurements): it is synchronous
(every watch holds a thread), turns objects into generated models unless told not to, and weighs ~126 MB
in an image whose pod only patches its CR's status and follows one ConfigMap and a few Secrets. What the
project needs is the API's own verbs on plain JSON documents, with its semantics visible: list with
``resourceVersion`` and pagination, watch from a ``resourceVersion`` with bookmarks and 410 Gone, update
with a ``resourceVersion`` precondition, merge and JSON patches, status subresources, a field manager on
every write. That is this module (one ``httpx.AsyncClient``, HTTP/1.1 keep-alive).

Objects are ``dict``s as the API sends them. Errors are translated once (``gwkit.kube.errors``). Nothing
here retries, but for one case: a 401 makes the credential refresh itself (``refresh``: re-read the token
file, re-run the exec plugin), and when that gave a different credential the request is sent once more (a
401 means the server did nothing with it). Otherwise callers decide (the controller's queue requeues with
backoff, the agent's writers retry).

The credential is asked for before every request (``ClusterConfig.token``, a callable: how a rotated
service-account token or an expired exec credential is picked up); one that may run a program (an exec
plugin, ``blocking``) is asked in a worker thread unless it has a valid one cached.

``observe`` (optional) is told of every request sent: ``(verb, resource, code, seconds)``, verb as the
API's audit log names it (get, list, watch, create, update, patch, delete), resource as ``plural.group``
with ``/subresource``, code the HTTP status or ``error`` when no answer came; a watch is told when its
answer's head arrives. The controller's metrics hang on it; this module stays free of them.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Literal
from urllib.parse import quote

import anyio.to_thread
import httpx

from gwkit.kube.config import ClusterConfig
from gwkit.kube.errors import ConfigError, Fenced, Gone, KubeError, Unauthenticated, Unreachable, from_status

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Observer = Callable[[str, str, str, float], None]
"""``(verb, resource, code, seconds)`` of one request (see the module's docstring)."""
PatchType = Literal["application/merge-patch+json", "application/json-patch+json"]
MERGE: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"


@dataclass(frozen=True)
class Resource:
    """One kind of object as the API addresses it."""

    group: str
    """``""`` for the core group."""
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{quote(name, safe='')}"
            if subresource:
                base += f"/{subresource}"
        return base

    def __str__(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


@dataclass(frozen=True)
class WatchEvent:
    type: Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
    object: Obj

    @property
    def resource_version(self) -> str:
        return str(self.object.get("metadata", {}).get("resourceVersion", ""))


METADATA_LIST = (
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
)
"""The Accept of a list that wants objects' metadata only (the server converts; the trailing plain JSON
is what a server that cannot answers instead)."""
METADATA_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
"""The same for a watch, whose events are single objects: a watch negotiated as PartialObjectMetadataList
(the list's Accept) ends at its first event without sending it on a real kube-apiserver, so an informer
using it never sees a change (found against v1.35; client-go's metadata client asks the same way)."""


class KubeClient:
    """``async with KubeClient(config) as kube: ...``. Safe to share between tasks."""

    def __init__(
        self,
        config: ClusterConfig,
        *,
        timeout: float = 10.0,
        field_manager: str | None = None,
        user_agent: str = "vpngw",
        max_connections: int = 50,
        write_guard: Callable[[], bool] | None = None,
        observe: Observer | None = None,
    ) -> None:
        self.config = config
        self.observe = observe
        self.timeout = timeout
        self.field_manager = field_manager
        self.write_guard = write_guard
        """Asked before every write (any method but GET) is sent; False: ``Fenced`` instead. The
        controller's: whether it still leads, so that a deposed leader writes nothing."""

        def client(limit: int | None) -> httpx.AsyncClient:
            return httpx.AsyncClient(
                base_url=config.server,
                verify=config.ssl,
                timeout=httpx.Timeout(timeout),
                headers={"User-Agent": user_agent, "Accept": "application/json"},
                limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit),
                proxy=config.proxy,
            )

        self._http = client(max_connections)
        # Watches hold their connection for minutes (HTTP/1.1: one stream each): in the shared pool, a
        # controller watching one namespace per tenant would leave its requests, the leader's Lease renewal
        # among them, waiting for a free connection (found by review: 50 watches starve every request). So
        # watches have a pool of their own, without a cap; the count of watches is the caller's design.
        self._watches = client(None)

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._watches.aclose()

    # --- plumbing -----------------------------------------------------------------------------------

    async def _token(self) -> str:
        """The bearer token to send now ("" for none)."""
        source = self.config.token
        if source is None:
            return ""
        try:
            if getattr(source, "blocking", False):
                cached: str | None = source.cached()  # type: ignore[attr-defined]
                return cached if cached is not None else await anyio.to_thread.run_sync(source)
            return source()
        except ConfigError as exc:
            raise Unauthenticated(str(exc)) from None

    async def _refreshed(self, stale: str) -> bool:
        """After a 401 for ``stale``: whether the credential has something else to send now."""
        refresh = getattr(self.config.token, "refresh", None)
        if refresh is None:
            return False
        try:
            changed: bool = await anyio.to_thread.run_sync(refresh, stale)
        except ConfigError as exc:
            raise Unauthenticated(str(exc)) from None
        log.info("kube.credential_refreshed after=401 changed=%s source=%s", changed, self.config.source)
        return changed

    @staticmethod
    def _headers(token: str, content_type: str | None = None, *, accept: str | None = None) -> dict[str, str]:
        h: dict[str, str] = {}
        if accept:
            h["Accept"] = accept
        if token:
            h["Authorization"] = f"Bearer {token}"
        if content_type:
            h["Content-Type"] = content_type
        return h

    def _extensions(self) -> dict[str, Any]:
        return {"sni_hostname": self.config.tls_server_name} if self.config.tls_server_name else {}

    def _write_params(self, params: dict[str, str] | None = None) -> dict[str, str]:
        out = dict(params or {})
        if self.field_manager:
            out["fieldManager"] = self.field_manager
        return out

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float | None = None,
        metadata_only: bool = False,
    ) -> Obj:
        if method != "GET" and self.write_guard is not None and not self.write_guard():
            raise Fenced(f"{method} {path}: not sent, this replica no longer leads")
        content = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        if content is not None and content_type is None:
            content_type = "application/json"
        token = await self._token()
        for attempt in (1, 2):
            started, code = time.monotonic(), "error"
            try:
                res = await self._http.request(
                    method,
                    path,
                    params=dict(params or {}),
                    content=content,
                    headers=self._headers(
                        token, content_type, accept=METADATA_LIST if metadata_only else None
                    ),
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                    extensions=self._extensions(),
                )
                code = str(res.status_code)
            except httpx.TimeoutException as exc:
                raise Unreachable(f"{method} {path}: timed out ({type(exc).__name__})") from None
            except httpx.TransportError as exc:
                raise Unreachable(f"{method} {path}: {type(exc).__name__}: {exc}") from None
            finally:
                if self.observe is not None:
                    self.observe(
                        verb_of(method, path), resource_of_path(path), code, time.monotonic() - started
                    )
            if res.status_code != 401 or attempt == 2 or not await self._refreshed(token):
                break
            token = await self._token()
        return _answer(res, method, path)

    # --- verbs ----------------------------------------------------------------------------------------

    async def get(
        self, res: Resource, name: str, namespace: str | None = None, subresource: str | None = None
    ) -> Obj:
        return await self.request("GET", res.path(namespace, name, subresource))

    async def list(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int = 500,
        metadata_only: bool = False,
    ) -> tuple[list[Obj], str]:
        """Every matching object and the list's resourceVersion (pages of ``limit``). ``metadata_only``:
        the server sends each object's metadata alone (``PartialObjectMetadataList``): a Secret's values
        never cross the wire."""
        items: list[Obj] = []
        params: dict[str, str] = {"limit": str(limit)}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        while True:
            try:
                page = await self.request(
                    "GET", res.path(namespace), params=params, metadata_only=metadata_only
                )
            except Gone:
                if "continue" not in params:
                    raise
                # The continue token expired (the server compacted meanwhile): start over, consistently.
                items, params = [], {k: v for k, v in params.items() if k != "continue"}
                continue
            items += page.get("items") or []
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                kind = res.kind
                for item in items:  # list items carry no kind/apiVersion of their own
                    item.setdefault("kind", kind)
                    item.setdefault("apiVersion", res.api_version)
                return items, str(meta.get("resourceVersion") or "")
            params["continue"] = str(token)

    async def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int = 300,
        bookmarks: bool = True,
        metadata_only: bool = False,
    ) -> AsyncIterator[WatchEvent]:
        """Events after ``resource_version`` until the server ends the stream (``timeout_seconds``).
        Raises ``Gone`` when the server no longer has that version (relist), ``Unreachable`` when the
        connection breaks."""
        params = {"watch": "1", "timeoutSeconds": str(timeout_seconds)}
        if resource_version:
            params["resourceVersion"] = resource_version
        if bookmarks:
            params["allowWatchBookmarks"] = "true"
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        path = res.path(namespace)
        # With bookmarks the server sends something at least every minute (k8s.io/apiserver cacher.go,
        # defaultBookmarkFrequency): 90 s of silence is a half-open connection, not a quiet resource.
        silence = timeout_seconds + 30.0
        timeout = httpx.Timeout(self.timeout, read=min(silence, BOOKMARK_SILENCE) if bookmarks else silence)
        token = await self._token()
        started, observed = time.monotonic(), False
        try:
            async with self._watches.stream(
                "GET",
                path,
                params=params,
                headers=self._headers(token, accept=METADATA_WATCH if metadata_only else None),
                timeout=timeout,
                extensions=self._extensions(),
            ) as stream:
                if self.observe is not None:
                    observed = True
                    self.observe("watch", str(res), str(stream.status_code), time.monotonic() - started)
                if stream.status_code >= 400:
                    await stream.aread()
                    if stream.status_code == 401:
                        await self._refreshed(token)  # the caller's next watch sends what it got
                    _answer(stream, "WATCH", path)
                async for line in stream.aiter_lines():
                    if not line.strip():
                        continue
                    try:
                        event = json.loads(line)
                    except ValueError as exc:
                        raise Unreachable(f"WATCH {path}: a broken event ({exc})") from None
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        raise from_status(int(obj.get("code") or 500), obj)
                    if kind in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
                        if kind != "BOOKMARK":
                            obj.setdefault("kind", res.kind)
                            obj.setdefault("apiVersion", res.api_version)
                        yield WatchEvent(kind, obj)
        except httpx.TimeoutException as exc:
            if self.observe is not None and not observed:
                self.observe("watch", str(res), "error", time.monotonic() - started)
            raise Unreachable(f"WATCH {path}: timed out ({type(exc).__name__})") from None
        except httpx.TransportError as exc:
            if self.observe is not None and not observed:
                self.observe("watch", str(res), "error", time.monotonic() - started)
            raise Unreachable(f"WATCH {path}: {type(exc).__name__}: {exc}") from None

    async def create(self, res: Resource, obj: Mapping[str, Any], namespace: str | None = None) -> Obj:
        return await self.request("POST", res.path(namespace), params=self._write_params(), body=obj)

    async def replace(
        self,
        res: Resource,
        obj: Mapping[str, Any],
        namespace: str | None = None,
        subresource: str | None = None,
    ) -> Obj:
        """PUT: ``obj`` must carry ``metadata.resourceVersion`` (409 Conflict when stale)."""
        name = str(obj["metadata"]["name"])
        return await self.request(
            "PUT", res.path(namespace, name, subresource), params=self._write_params(), body=obj
        )

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        content_type: PatchType = MERGE,
    ) -> Obj:
        return await self.request(
            "PATCH",
            res.path(namespace, name, subresource),
            params=self._write_params(),
            body=patch,
            content_type=content_type,
        )

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        propagation: Literal["Background", "Foreground", "Orphan"] | None = None,
        grace_seconds: int | None = None,
    ) -> Obj:
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if propagation:
            body["propagationPolicy"] = propagation
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        return await self.request("DELETE", res.path(namespace, name), body=body)


VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _segments(path: str) -> tuple[str, list[str]]:
    """(group, the segments after the version) of an API path; ("", []) for one outside /api, /apis."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return "", []
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]  # a namespaced resource; /namespaces/NAME alone is the namespace itself
    return group, rest


def resource_of_path(path: str) -> str:
    """``plural.group`` (``plural`` for the core group) of an API path, with ``/subresource`` when it
    names one (``vpngateways.vpn.bnerd.net/status``); ``other`` for paths outside the resource API
    (discovery, ``/version``): never a name, so a metric labelled with it stays bounded (pure)."""
    group, rest = _segments(path)
    if not rest:
        return "other"
    res = f"{rest[0]}.{group}" if group else rest[0]
    return f"{res}/{rest[2]}" if len(rest) >= 3 else res


def verb_of(method: str, path: str) -> str:
    """The API's verb for a request: a GET of a collection is ``list`` (pure)."""
    if method == "GET":
        return "get" if len(_segments(path)[1]) >= 2 else "list"
    return VERBS.get(method, method.lower())


def _answer(res: httpx.Response, method: str, path: str) -> Obj:
    if res.status_code < 400:
        try:
            out = res.json() if res.content else {}
        except ValueError as exc:
            raise KubeError(f"{method} {path}: the answer is not JSON ({exc})") from None
        return out if isinstance(out, dict) else {"value": out}
    try:
        body = res.json()
    except ValueError:
        body = {"message": res.text[:300]}
    retry_after = None
    if "Retry-After" in res.headers:
        try:
            retry_after = float(res.headers["Retry-After"])
        except ValueError:
            retry_after = None
    raise from_status(res.status_code, body, retry_after)


# --- the resources the project uses ----------------------------------------------------------------

BOOKMARK_SILENCE = 90.0
"""Seconds without a byte on a watch with bookmarks after which it is given up (and re-made)."""
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
SECRETS = Resource("", "v1", "secrets", "Secret")
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount")
PODS = Resource("", "v1", "pods", "Pod")
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
EVENTS = Resource("", "v1", "events", "Event")
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles", "Role")
ROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
NETWORKPOLICIES = Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
NADS = Resource("k8s.cni.cncf.io", "v1", "network-attachment-definitions", "NetworkAttachmentDefinition")
VPNGATEWAYS = Resource("vpn.bnerd.net", "v1alpha1", "vpngateways", "VPNGateway")
VPNPEERS = Resource("vpn.bnerd.net", "v1alpha1", "vpnpeers", "VPNPeer")
IPSECGATEWAYS = Resource("ipsec.bnerd.net", "v1alpha1", "ipsecgateways", "IPsecGateway")
CLUSTERLINKS = Resource("ipsec.bnerd.net", "v1alpha1", "clusterlinks", "ClusterLink")

BY_KIND: dict[str, Resource] = {
    r.kind: r
    for r in (
        CONFIGMAPS, SECRETS, SERVICEACCOUNTS, PODS, NODES, EVENTS, NAMESPACES, DEPLOYMENTS, ROLES,
        ROLEBINDINGS, NETWORKPOLICIES, LEASES, NADS, VPNGATEWAYS, VPNPEERS, IPSECGATEWAYS, CLUSTERLINKS,
    )
}  # fmt: skip


def resource_of(obj: Mapping[str, Any], known: Sequence[Resource] = tuple(BY_KIND.values())) -> Resource:
    kind, api_version = obj.get("kind"), obj.get("apiVersion")
    for r in known:
        if r.kind == kind and r.api_version == api_version:
            return r
    raise KeyError(f"{api_version}/{kind}: not a resource this project knows")
