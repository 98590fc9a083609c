"""KubeAPI: the emulator as an async context manager, and KubeAPIThread, the same for sync code.

THIS IS AN EMULATOR of a Kubernetes API server, not Kubernetes: see docs/kubeapi.md for what is faithful
and what is not modelled. Real clients (kubectl, the official ``kubernetes`` client, httpx) talk to it over
real HTTPS on 127.0.0.1 with the written kubeconfig.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Coroutine
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import anyio
from aiohttp import web

from lab.kubeapi import rbac
from lab.kubeapi.auth import ADMIN, TokenRecord, Tokens
from lab.kubeapi.controls import Fault, RequestRecord
from lab.kubeapi.rbac import UserInfo
from lab.kubeapi.resources import ResourceType
from lab.kubeapi.schema import validator
from lab.kubeapi.server import ApiServer, Settings
from lab.kubeapi.store import DeleteOptions, Mutator, Store
from lab.kubeapi.tls import Certs, kubeconfig, make_certs, server_context, write_kubeconfig

log = logging.getLogger(__name__)
TMP_PREFIX = "kubeapi-"
T = TypeVar("T")


class KubeAPI:
    """A Kubernetes API emulator serving HTTPS on 127.0.0.1 (and optionally plain HTTP).

    ``async with KubeAPI(kubeconfig=path) as api:`` starts it; ``api.url``, ``api.kubeconfig`` (the admin
    kubeconfig file), ``api.ca_file`` and ``api.admin_token`` are then set. The control methods are plain
    methods: call them from the event loop the emulator runs in (``KubeAPIThread`` wraps them for threads).
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        kubeconfig: Path | str | None = None,
        workdir: Path | str | None = None,
        **overrides: Any,
    ) -> None:
        self.settings = replace(settings or Settings(), **overrides)
        self._kubeconfig_arg = Path(kubeconfig) if kubeconfig else None
        self._workdir_arg = Path(workdir) if workdir else None
        self._tmp: Path | None = None
        self._runner: web.AppRunner | None = None
        self._sites: list[web.TCPSite] = []
        self._gc_task: asyncio.Task[None] | None = None
        self._down: asyncio.Task[None] | None = None
        self.url = ""
        self.http_url = ""
        self.port = 0
        self.http_port = 0
        self.kubeconfig = Path()
        self.ca_file = Path()
        self.admin_token = ""
        self.certs: Certs | None = None
        self.tokens = Tokens()
        self.store = Store(
            history_size=self.settings.history,
            validator=validator if self.settings.validate_schemas else None,
            pod_security=self.settings.pod_security,
        )
        self.server = ApiServer(
            self.store, self.tokens, self.settings, lambda: f"{self.settings.host}:{self.port}"
        )
        self.server.on_unreachable = self.unreachable
        self._seed()
        self.server.set_rbac_delay(self.settings.rbac_delay)  # its caches start here, with the seed

    def _seed(self) -> None:
        for obj in rbac.bootstrap_policy():
            t = self.store.rtype(
                "rbac.authorization.k8s.io",
                "clusterroles" if obj["kind"] == "ClusterRole" else "clusterrolebindings",
            )
            self.store.create(t, "", obj)

    # --- lifecycle ---------------------------------------------------------------------------------------

    async def __aenter__(self) -> KubeAPI:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def workdir(self) -> Path:
        assert self._tmp is not None or self._workdir_arg is not None
        return self._workdir_arg or self._tmp  # type: ignore[return-value]

    async def start(self) -> None:
        if self._workdir_arg is None:
            cleanup_stale()
            self._tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX))
            (self._tmp / "pid").write_text(str(os.getpid()))
        else:
            self._workdir_arg.mkdir(parents=True, exist_ok=True)
        try:
            self.certs = make_certs(self.settings.sans)
            ctx = server_context(self.certs, self.workdir)
            self.ca_file = self.workdir / "ca.crt"
            self.ca_file.write_bytes(self.certs.ca_pem)
            self.admin_token = self.tokens.add(TokenRecord(ADMIN))
            self._runner = web.AppRunner(self.server.app, access_log=None, handle_signals=False)
            await self._runner.setup()
            site = web.TCPSite(
                self._runner,
                self.settings.host,
                self.settings.port,
                ssl_context=ctx,
                reuse_address=True,
            )
            await site.start()
            self._sites.append(site)
            self.port = _bound_port(site)
            self.url = f"https://{self.settings.host}:{self.port}"
            if self.settings.http_port is not None:
                hsite = web.TCPSite(
                    self._runner,
                    self.settings.host,
                    self.settings.http_port,
                    reuse_address=True,
                )
                await hsite.start()
                self._sites.append(hsite)
                self.http_port = _bound_port(hsite)
                self.http_url = f"http://{self.settings.host}:{self.http_port}"
            self._ssl = ctx
            self.kubeconfig = self._kubeconfig_arg or self.workdir / "kubeconfig"
            write_kubeconfig(self.kubeconfig, kubeconfig(self.url, self.admin_token, self.certs.ca_pem))
            self._gc_task = asyncio.get_running_loop().create_task(self.server.gc_loop())
        except BaseException:
            await self.stop()
            raise
        log.info("kubeapi.started url=%s objects=%d", self.url, self.store.count())

    async def stop(self) -> None:
        self.server.close_watches()
        for t in (self._gc_task, self._down):
            if t is not None:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        self._gc_task = self._down = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._sites = []
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    # --- tokens and kubeconfigs --

    def mint_token(
        self, namespace: str, name: str, expiration_seconds: int = 3600, audiences: tuple[str, ...] = ()
    ) -> str:
        """A ServiceAccount token (as TokenRequest gives); the ServiceAccount must exist."""
        sa = self.store.get(self.store.rtype("", "serviceaccounts"), namespace, name)
        expires = self.store.clock() + timedelta(seconds=expiration_seconds)
        return self.tokens.mint_service_account(namespace, name, sa["metadata"]["uid"], expires, audiences)

    def user_token(self, user: str, groups: tuple[str, ...] = ()) -> str:
        """A token for any user name (RBAC ``User``/``Group`` subjects); system:authenticated is added."""
        return self.tokens.add(TokenRecord(UserInfo(user, (*groups, rbac.AUTHENTICATED))))

    def write_kubeconfig(
        self, path: Path | str, token: str, namespace: str = "default", user: str = "user"
    ) -> Path:
        """A kubeconfig for another identity (same server and CA)."""
        assert self.certs is not None
        p = Path(path)
        write_kubeconfig(p, kubeconfig(self.url, token, self.certs.ca_pem, user=user, namespace=namespace))
        return p

    # --- controls --

    def requests(self, **filters: Any) -> list[RequestRecord]:
        """The request log: filters verb=, resource=, subresource=, name=, namespace=, user=, since=<seq>,
        writes_only=True, path_contains=."""
        return self.server.log.query(**filters)

    def reset_requests(self) -> int:
        """Clear the request log; returns the last sequence number (use as ``since``)."""
        return self.server.log.reset()

    def inject_fault(self, code: int = 0, count: int = 1, **match: Any) -> Fault:
        """The next ``count`` requests matching verb/resource/name/subresource/namespace/user answer ``code``
        (retry_after=S adds Retry-After) or first hang ``hang`` seconds."""
        return self.server.faults.add(Fault(code=code, count=count, **match))

    def clear_faults(self) -> None:
        self.server.faults.clear()

    def compact(self) -> int:
        """Forget the watch history now: watches from an older resourceVersion get 410 Expired."""
        return self.store.compact()

    def close_watches(self) -> int:
        """End every open watch stream cleanly (clients see the stream end and re-watch)."""
        return self.server.close_watches()

    def add_mutator(self, mutate: Mutator) -> None:
        """Mutating admission from now on: ``mutate((group, plural), obj)`` on every create and update, as
        a webhook would (a sidecar, a label, a toleration)."""
        self.store.mutators.append(mutate)

    def set_rbac_delay(self, seconds: float) -> None:
        """From now on the authorizer sees a Role, ClusterRole or binding change ``seconds`` after it (0: at
        once), as kube-apiserver's RBAC authorizer does once its informers deliver the change
        (``Settings.rbac_delay`` at start)."""
        self.server.set_rbac_delay(seconds)

    def set_pod_network(self, netns: str | None) -> None:
        """pods/proxy dials pod IPs inside this network namespace (``ip netns`` name; None: the emulator's
        own), as an API server reaches the cluster's pod network where the user's machine does not."""
        self.server.pod_network = netns

    def stall_watches(self) -> int:
        """Every open watch goes half-open: the connection stays, nothing more is sent (no event, no
        bookmark, no end), as behind a middlebox that lost it. Only the client's read timeout ends it."""
        return self.server.stall_watches()

    def now(self) -> datetime:
        """The wall clock the emulator stamps creationTimestamp/deletionTimestamp with."""
        return self.store.clock()

    async def unreachable(self, seconds: float) -> None:
        """Refuse connections and drop open ones for ``seconds``; state is kept. Returns once down."""
        if self._runner is None:
            return
        ports = [(s, self.port if i == 0 else self.http_port) for i, s in enumerate(self._sites)]
        for s, _ in ports:
            await s.stop()
        self.server.close_watches()
        for conn in list(self._runner.server.connections if self._runner.server else []):
            conn.force_close()
            if conn.transport is not None:
                conn.transport.abort()
        self._sites = []
        log.info("kubeapi.unreachable seconds=%.1f", seconds)

        async def come_back() -> None:
            await anyio.sleep(seconds)
            assert self._runner is not None
            for i, (_, port) in enumerate(ports):
                site = web.TCPSite(
                    self._runner,
                    self.settings.host,
                    port,
                    ssl_context=self._ssl if i == 0 else None,
                    reuse_address=True,
                )
                for _attempt in range(50):
                    try:
                        await site.start()
                        break
                    except OSError:
                        await anyio.sleep(0.05)
                self._sites.append(site)
            log.info("kubeapi.reachable url=%s", self.url)

        self._down = asyncio.get_running_loop().create_task(come_back())

    async def wait_reachable(self) -> None:
        if self._down is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._down

    # --- direct object access (admin, no HTTP) --

    def _type(self, api_version: str, kind: str) -> ResourceType:
        t = self.store.registry.by_kind(api_version, kind)
        if t is None:
            raise KeyError(f"no resource for {api_version} {kind}")
        return t

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        t = self._type(obj["apiVersion"], obj["kind"])
        return self.store.create(
            t,
            (obj.get("metadata") or {}).get("namespace", "") if t.namespaced else "",
            obj,
            version=obj["apiVersion"].rpartition("/")[2],
        )

    def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        t = self._type(api_version, kind)
        obj = self.store.peek(t, namespace, name)
        return None if obj is None else self.store.view(t, obj, api_version.rpartition("/")[2])

    def list(self, api_version: str, kind: str, namespace: str = "") -> list[dict[str, Any]]:
        t = self._type(api_version, kind)
        return self.store.list(t, namespace, version=api_version.rpartition("/")[2]).items

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        patch: Any,
        namespace: str = "",
        subresource: str = "",
        content_type: str = "application/merge-patch+json",
    ) -> dict[str, Any]:
        t = self._type(api_version, kind)
        return self.store.patch(
            t,
            namespace,
            name,
            content_type,
            patch,
            subresource=subresource,
            version=api_version.rpartition("/")[2],
        )[0]

    def delete(
        self, api_version: str, kind: str, name: str, namespace: str = "", propagation: str = ""
    ) -> dict[str, Any]:
        t = self._type(api_version, kind)
        return self.store.delete(t, namespace, name, DeleteOptions(propagation=propagation))


def cleanup_stale(tmp: Path | None = None) -> list[Path]:
    """Remove the work directories (certificates, keys) of emulators whose process is gone (SIGKILLed)."""
    removed = []
    for d in Path(tmp or tempfile.gettempdir()).glob(f"{TMP_PREFIX}*"):
        try:
            pid = int((d / "pid").read_text())
        except (OSError, ValueError):
            continue  # not ours, or still being created
        if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def _bound_port(site: web.TCPSite) -> int:
    server = site._server  # aiohttp keeps the asyncio server private; its socket has the chosen port
    assert server is not None
    sockets = getattr(server, "sockets", None) or []
    return int(sockets[0].getsockname()[1])


class KubeAPIThread:
    """KubeAPI on its own event loop thread, for sync tests: ``with KubeAPIThread() as api: ...``.

    Every control method runs on the emulator's loop and returns its result."""

    def __init__(self, settings: Settings | None = None, **kw: Any) -> None:
        self._settings = settings
        self._kw = kw
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.api: KubeAPI | None = None

    def __enter__(self) -> KubeAPIThread:
        ready = threading.Event()
        loop = asyncio.new_event_loop()
        self._loop = loop

        def run() -> None:
            asyncio.set_event_loop(loop)
            ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="kubeapi", daemon=True)
        self._thread.start()
        ready.wait()

        async def make() -> KubeAPI:
            api = KubeAPI(self._settings, **self._kw)
            await api.start()
            return api

        try:
            self.api = asyncio.run_coroutine_threadsafe(make(), loop).result(timeout=60)
        except BaseException:
            self._shutdown()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._shutdown()

    def _shutdown(self) -> None:
        loop = self._loop
        if loop is None:
            return
        if self.api is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self.api.stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=30)
        loop.close()
        self._loop = None

    def call(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """Run a (sync) function on the emulator's loop and return its result."""
        assert self._loop is not None

        async def run() -> T:
            return fn(*args, **kw)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=60)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=60)

    @property
    def _a(self) -> KubeAPI:
        assert self.api is not None
        return self.api

    @property
    def url(self) -> str:
        return self._a.url

    @property
    def http_url(self) -> str:
        return self._a.http_url

    @property
    def kubeconfig(self) -> Path:
        return self._a.kubeconfig

    @property
    def ca_file(self) -> Path:
        return self._a.ca_file

    @property
    def admin_token(self) -> str:
        return self._a.admin_token

    def mint_token(
        self, namespace: str, name: str, expiration_seconds: int = 3600, audiences: tuple[str, ...] = ()
    ) -> str:
        return self.call(self._a.mint_token, namespace, name, expiration_seconds, audiences)

    def user_token(self, user: str, groups: tuple[str, ...] = ()) -> str:
        return self.call(self._a.user_token, user, groups)

    def write_kubeconfig(
        self, path: Path | str, token: str, namespace: str = "default", user: str = "user"
    ) -> Path:
        return self.call(self._a.write_kubeconfig, path, token, namespace, user)

    def requests(self, **filters: Any) -> list[RequestRecord]:
        return self.call(self._a.requests, **filters)

    def reset_requests(self) -> int:
        return self.call(self._a.reset_requests)

    def inject_fault(self, code: int = 0, count: int = 1, **match: Any) -> Fault:
        return self.call(self._a.inject_fault, code, count, **match)

    def clear_faults(self) -> None:
        self.call(self._a.clear_faults)

    def compact(self) -> int:
        return self.call(self._a.compact)

    def close_watches(self) -> int:
        return self.call(self._a.close_watches)

    def stall_watches(self) -> int:
        return self.call(self._a.stall_watches)

    def set_rbac_delay(self, seconds: float) -> None:
        self.call(self._a.set_rbac_delay, seconds)

    def set_pod_network(self, netns: str | None) -> None:
        self.call(self._a.set_pod_network, netns)

    def add_mutator(self, mutate: Mutator) -> None:
        self.call(self._a.add_mutator, mutate)

    def now(self) -> datetime:
        return self.call(self._a.now)

    def unreachable(self, seconds: float) -> None:
        self.run(self._a.unreachable(seconds))

    def wait_reachable(self) -> None:
        self.run(self._a.wait_reachable())

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.call(self._a.create, obj)

    def get(self, api_version: str, kind: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        return self.call(self._a.get, api_version, kind, name, namespace)

    def list(self, api_version: str, kind: str, namespace: str = "") -> list[dict[str, Any]]:
        return self.call(self._a.list, api_version, kind, namespace)

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        patch: Any,
        namespace: str = "",
        subresource: str = "",
        content_type: str = "application/merge-patch+json",
    ) -> dict[str, Any]:
        return self.call(self._a.patch, api_version, kind, name, patch, namespace, subresource, content_type)

    def delete(
        self, api_version: str, kind: str, name: str, namespace: str = "", propagation: str = ""
    ) -> dict[str, Any]:
        return self.call(self._a.delete, api_version, kind, name, namespace, propagation)
