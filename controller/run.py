"""``python -m controller run``: the operator loop. I/O and wiring; the decisions are in ``reconcile``.

::

    informers (list+watch: gateways, peers, owned objects, pods, nodes)
        -> on change: the affected gateway keys -> work queue (one key at most once; never two workers)
        -> workers (only while this replica leads): reconcile(key)
              snapshot from the caches -> render -> place -> cloud.ensure -> decide -> execute
              409 / stale cache: requeued at once-ish; other failures: requeued with a capped backoff
        -> a resync enqueues every gateway now and then (a no-op reconcile writes nothing)

Metrics (``/metrics``): reconciles by result, reconcile duration, queue depth, API errors by resource
and code, leadership, gateways by Ready. ``/healthz`` answers while the process runs; ``/readyz`` once
every informer has synced.
"""

from __future__ import annotations

import logging
import time
from collections import Counter as Tally
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

import anyio
import anyio.abc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

import gwplan
from controller import execute
from controller.cloud import CLOUD_READY, Cloud, CloudError, CloudState, CloudWant
from controller.desired import OWNED_KINDS, Nic2, plan_of
from controller.informer import Informer
from controller.names import (
    GATEWAY_KINDS,
    LABEL_GATEWAY,
    LABEL_INSTANCE,
    LABEL_KIND,
    GatewayKey,
    key_of,
    owner_of,
)
from controller.placement import ready
from controller.reconcile import (
    Claim,
    Rendered,
    Snapshot,
    claim_of,
    cluster_links,
    decide,
    my_claim,
    neighbours,
    peers_of,
    place,
    provider_id,
    render_gateway,
)
from controller.settings import Settings
from controller.status import Condition
from controller.workqueue import WorkQueue
from gwkit import httpd
from gwkit.kube import ApiError, KubeClient, KubeError, Obj, Resource, Unreachable
from gwkit.kube.client import BY_KIND, CLUSTERLINKS, NODES, PODS, VPNPEERS

log = logging.getLogger(__name__)


class Elector(Protocol):
    leading: bool
    changed: anyio.Event
    identity: str

    async def run(self) -> None: ...


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.reconciles = Counter(
            "vpngw_controller_reconcile", "Reconciles by result.", ["result"], registry=r
        )
        self.duration = Histogram(
            "vpngw_controller_reconcile_duration_seconds",
            "Time one reconcile took.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.queue_depth = Gauge(
            "vpngw_controller_queue_depth", "Gateways waiting to be reconciled.", registry=r
        )
        self.api_errors = Counter(
            "vpngw_controller_api_errors",
            "Kubernetes API errors by resource and code.",
            ["resource", "code"],
            registry=r,
        )
        self.writes = Counter(
            "vpngw_controller_api_writes", "API writes by the reconciles.", ["verb"], registry=r
        )
        self.leader = Gauge("vpngw_controller_leader", "1 while this replica leads.", registry=r)
        self.gateways = Gauge(
            "vpngw_controller_gateways", "Gateways by their Ready condition.", ["ready"], registry=r
        )

    def api_error(self, res: Resource | str, exc: BaseException) -> None:
        code = (
            str(exc.code)
            if isinstance(exc, ApiError)
            else "unreachable"
            if isinstance(exc, Unreachable)
            else "other"
        )
        self.api_errors.labels(str(res), code).inc()


class Operator:
    def __init__(
        self,
        kube: KubeClient,
        settings: Settings,
        cloud: Cloud,
        elector: Elector,
        *,
        workers: int = 4,
        resync_seconds: float = 600.0,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.cloud = cloud
        self.elector = elector
        self.workers = workers
        self.resync_seconds = resync_seconds
        self.queue: WorkQueue[GatewayKey] = WorkQueue()
        self.metrics = Metrics()
        self.pins: dict[GatewayKey, str] = {}
        self._deployed: dict[GatewayKey, tuple[tuple[str, str], str | None]] = {}
        """The serviceCIDR of each gateway's deployed plan, by the ConfigMap's (uid, resourceVersion)."""
        self._place_lock = anyio.Lock()
        ns = settings.namespace
        owned_selector = f"{LABEL_INSTANCE}={settings.instance}"

        def inf(res: Resource, *, namespaced: bool = True, selector: str | None = None) -> Informer:
            return Informer(
                kube,
                res,
                namespace=ns if namespaced else None,
                label_selector=selector,
                on_change=lambda old, new: self._changed(res.kind, old, new),
                on_error=self.metrics.api_error,
            )

        self.informers: dict[str, Informer] = {k: inf(BY_KIND[k]) for k in GATEWAY_KINDS}
        self.informers["VPNPeer"] = inf(VPNPEERS)
        self.informers["ClusterLink"] = inf(CLUSTERLINKS)
        for kind in OWNED_KINDS:
            self.informers[kind] = inf(BY_KIND[kind], selector=owned_selector)
        self.informers["Pod"] = inf(PODS, selector=owned_selector)
        self.informers["Node"] = inf(NODES, namespaced=False)

    # --- events -> keys ----------------------------------------------------------------------------

    def _changed(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        for key in self._keys(kind, old, new):
            self.queue.add(key)
        self.metrics.queue_depth.set(len(self.queue))

    def _keys(self, kind: str, old: Obj | None, new: Obj | None) -> set[GatewayKey]:
        objs = [o for o in (old, new) if o is not None]
        keys: set[GatewayKey] = set()
        if kind in GATEWAY_KINDS:
            keys |= {key_of({**o, "kind": kind}) for o in objs}
        elif kind == "VPNPeer":
            for o in objs:
                ref = ((o.get("spec") or {}).get("gatewayRef") or {}).get("name")
                if ref:
                    keys.add(GatewayKey("VPNGateway", str(o["metadata"]["namespace"]), str(ref)))
        elif kind == "ClusterLink":
            for o in objs:
                for name in (o.get("spec") or {}).get("gateways") or []:
                    for k in GATEWAY_KINDS:
                        keys.add(GatewayKey(k, str(o["metadata"]["namespace"]), str(name)))
        elif kind == "Pod":
            for o in objs:
                md = o.get("metadata") or {}
                labels = md.get("labels") or {}
                if labels.get(LABEL_KIND) in GATEWAY_KINDS and labels.get(LABEL_GATEWAY):
                    keys.add(
                        GatewayKey(labels[LABEL_KIND], str(md.get("namespace")), str(labels[LABEL_GATEWAY]))
                    )
        elif kind == "Node":
            if old is not None and new is not None and not _placement_relevant(old, new):
                return keys
            names = {str(o["metadata"]["name"]) for o in objs}
            keys |= {k for k, node in self.pins.items() if node in names}
            if new is not None and ready(new):  # a node that can take gateways: the unpinned ones look again
                keys |= {self._key(g) for g in self._gateways() if self._key(g) not in self.pins}
        else:
            keys |= {k for k in (owner_of(o) for o in objs) if k is not None}
        return keys

    @staticmethod
    def _key(gw: Mapping[str, Any]) -> GatewayKey:
        return key_of(gw)

    def _gateways(self) -> list[Obj]:
        return [o for k in GATEWAY_KINDS for o in self.informers[k].items()]

    # --- one reconcile -------------------------------------------------------------------------------

    def snapshot(self, key: GatewayKey, gateway: Obj) -> Snapshot:
        owned = {}
        for kind in OWNED_KINDS:
            obj = self.informers[kind].get(key.namespace, key.object_name)
            if obj is not None:
                owned[kind] = obj
        pods = tuple(
            p
            for p in self.informers["Pod"].items()
            if p["metadata"].get("namespace") == key.namespace
            and (p["metadata"].get("labels") or {}).get(LABEL_GATEWAY) == key.name
            and (p["metadata"].get("labels") or {}).get(LABEL_KIND) == key.kind
        )
        peers = peers_of(key, list(self.informers["VPNPeer"].items())) if key.kind == "VPNGateway" else ()
        pinned = Tally(node for k, node in self.pins.items() if k != key)
        mine = my_claim(key, gateway, self._deployed_cidr(key))
        others: list[Claim] = []
        for g in self._gateways():
            k = self._key(g)
            c = claim_of(k, g, self._deployed_cidr(k)) if k != key else None
            if c is not None:
                others.append(c)
        links = cluster_links(
            key, self.informers["ClusterLink"].items(), self.settings.allowance(key.namespace).routers
        )
        return Snapshot(
            key=key,
            gateway=gateway,
            peers=peers,
            owned=owned,
            pods=pods,
            nodes=tuple(self.informers["Node"].items()),
            pinned=dict(pinned),
            neighbours=neighbours(mine, others) if mine is not None else (),
            links=links,
        )

    def _deployed_cidr(self, key: GatewayKey) -> str | None:
        """The serviceCIDR ``key``'s deployed plan serves (parsed once per ConfigMap version)."""
        cm = self.informers["ConfigMap"].get(key.namespace, key.object_name)
        if cm is None:
            self._deployed.pop(key, None)
            return None
        version = (str(cm["metadata"].get("uid")), str(cm["metadata"].get("resourceVersion")))
        hit = self._deployed.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        try:
            cidr: str | None = plan_of(cm).nat.service_cidr
        except gwplan.PlanError:
            cidr = None
        self._deployed[key] = (version, cidr)
        return cidr

    async def reconcile(self, key: GatewayKey) -> str:
        gateway = self.informers[key.kind].get(key.namespace, key.name)
        if gateway is None:
            self.pins.pop(key, None)
            return "gone"
        gateway = {**gateway, "kind": key.kind}
        snap = self.snapshot(key, gateway)
        if snap.deleting:
            self.pins.pop(key, None)
            if snap.has_finalizer:
                await self.cloud.release(key)
                await execute.remove_finalizer(self.kube, key, gateway)
                log.info("gateway.released gateway=%s", key)
            return "deleted"
        rendered = render_gateway(snap, self.settings, await self.cloud.transit_cidrs())
        async with self._place_lock:
            snap = self.snapshot(key, gateway)  # the pins of reconciles that placed meanwhile
            where = place(snap, self.settings)
            if where.node is not None:
                self.pins[key] = where.node
        want = CloudWant(
            key, where.node, provider_id(snap, where.node), rendered.in_force, snap.links.routers
        )
        cloud_failed = False
        try:
            cloud = await self.cloud.ensure(want)
        except CloudError as exc:
            log.warning("cloud.failed gateway=%s step=%s error=%r", key, exc.step, str(exc))
            cloud = CloudState(
                _deployed_nic(rendered),
                snap.current_status.get("publicIP"),
                (Condition(CLOUD_READY, False, exc.step, str(exc)),),
            )
            cloud_failed = True
        now = now_rfc3339()
        decision = decide(snap, self.settings, rendered, where, cloud, now)
        counts = await execute.apply(
            self.kube, key, gateway, decision, now=now, reporter=self.elector.identity
        )
        for verb, n in (("create", counts.creates), ("replace", counts.replaces)):
            if n:
                self.metrics.writes.labels(verb).inc(n)
        other = counts.writes - counts.creates - counts.replaces
        if other:
            self.metrics.writes.labels("patch").inc(other)
        if counts.writes:
            log.info(
                "gateway.reconciled gateway=%s writes=%d node=%s rendered=%s",
                key,
                counts.writes,
                where.node,
                "yes" if rendered.plan is not None else "no",
            )
        return "cloud-failed" if cloud_failed else "ok"

    async def worker(self) -> None:
        while True:
            key = await self.queue.get()
            started = time.monotonic()
            result = "error"
            try:
                result = await self.reconcile(key)
                if result == "cloud-failed":
                    # Everything else was written (the status says which cloud step failed): try the
                    # cloud again with a growing backoff, not at once.
                    delay = self.queue.retry(key)
                    log.info("gateway.cloud_retry gateway=%s retry_in=%.1f", key, delay)
                else:
                    self.queue.forget(key)
            except execute.Requeue as exc:
                result = "conflict"
                log.info("gateway.requeued gateway=%s why=%r", key, str(exc))
                self.queue.retry(key)
            except (KubeError, CloudError) as exc:
                self.metrics.api_error(key.kind, exc)
                delay = self.queue.retry(key)
                log.warning("gateway.failed gateway=%s retry_in=%.1f error=%r", key, delay, str(exc))
            except Exception as exc:  # a bug: say so loudly, keep the operator running, look again later
                delay = self.queue.retry(key)
                log.exception("gateway.crashed gateway=%s retry_in=%.1f error=%r", key, delay, str(exc))
            finally:
                self.queue.done(key)
                self.metrics.reconciles.labels(result).inc()
                self.metrics.duration.observe(time.monotonic() - started)
                self.metrics.queue_depth.set(len(self.queue))

    def enqueue_all(self) -> None:
        """Every gateway, behind any change (the resync; docs/controller.md)."""
        for gw in self._gateways():
            self.queue.add(self._key(gw), background=True)

    def _gauge_ready(self) -> None:
        tally: Tally[str] = Tally()
        for gw in self._gateways():
            cond = next(
                (c for c in (gw.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"),
                None,
            )
            tally[cond.get("status", "Unknown") if cond else "Unknown"] += 1
        for state in ("True", "False", "Unknown"):
            self.metrics.gateways.labels(state).set(tally.get(state, 0))

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers.values())

    async def http(self, path: str) -> httpd.Answer:
        if path == "/healthz":
            return 200, "text/plain", b"ok\n"
        if path == "/readyz":
            if self.synced:
                return (
                    200,
                    "text/plain",
                    f"ready (leading: {'yes' if self.elector.leading else 'no'})\n".encode(),
                )
            waiting = ",".join(k for k, i in self.informers.items() if not i.synced.is_set())
            return 503, "text/plain", f"caches not synced: {waiting}\n".encode()
        if path == "/metrics":
            self._gauge_ready()
            self.metrics.leader.set(1 if self.elector.leading else 0)
            self.metrics.queue_depth.set(len(self.queue))
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.metrics.registry)
        return 404, "text/plain", b"not found\n"

    async def _lead(self) -> None:
        """Run the workers while this replica leads; stop them the moment it does not."""
        while True:
            if not self.elector.leading:
                self.metrics.leader.set(0)
                await self.elector.changed.wait()
                continue
            self.metrics.leader.set(1)
            for i in self.informers.values():
                await i.synced.wait()
            async with anyio.create_task_group() as tg:
                for _ in range(self.workers):
                    tg.start_soon(self.worker)
                tg.start_soon(self._resync)
                self.enqueue_all()
                log.info("operator.leading workers=%d gateways=%d", self.workers, len(self._gateways()))
                while self.elector.leading:
                    await self.elector.changed.wait()
                tg.cancel_scope.cancel()
            log.info("operator.standby")

    async def _resync(self) -> None:
        while True:
            await anyio.sleep(self.resync_seconds)
            self.enqueue_all()

    async def run(
        self,
        listen: str | None = None,
        *,
        task_status: anyio.abc.TaskStatus[int | None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        async with anyio.create_task_group() as tg:
            port: int | None = None
            if listen is not None:
                port = await tg.start(httpd.serve, listen, self.http)
                log.info("operator.listening address=%s port=%d", listen.rpartition(":")[0], port)
            for i in self.informers.values():
                tg.start_soon(i.run)
            tg.start_soon(self.elector.run)
            tg.start_soon(self._lead)
            task_status.started(port)


def _placement_relevant(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """A Node change that can move a gateway: readiness, labels, taints, cordon, deletion."""
    if ready(old) != ready(new):
        return True
    o, n = old.get("metadata") or {}, new.get("metadata") or {}
    if o.get("labels") != n.get("labels") or bool(o.get("deletionTimestamp")) != bool(
        n.get("deletionTimestamp")
    ):
        return True
    os_, ns_ = old.get("spec") or {}, new.get("spec") or {}
    return bool(
        os_.get("taints") != ns_.get("taints") or os_.get("unschedulable") != ns_.get("unschedulable")
    )


def _deployed_nic(rendered: Rendered) -> Nic2 | None:
    """NIC2 as the deployed plan has it: what a reconcile uses while the cloud cannot be asked."""
    p = rendered.previous
    if p is None or not (p.nic.mac and p.nic.address and p.nic.gateway):
        return None
    return Nic2(p.nic.mac, p.nic.address, p.nic.gateway)
