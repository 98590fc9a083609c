"""``python -m controller run``: the operator loop. I/O and wiring; the decisions are in ``reconcile``.

::

    informers (list+watch: gateways, peers, owned objects, pods, nodes)
        -> on change: the affected gateway keys -> work queue (one key at most once; never two workers)
        -> workers (only while this replica leads): reconcile(key)
              snapshot from the caches -> render -> place -> cloud.ensure -> decide -> execute
              409 / stale cache: requeued at once-ish; other failures: requeued with a capped backoff
        -> a resync enqueues every gateway now and then (a no-op reconcile writes nothing), and every
           gateway the gateway namespace holds objects of: of one gone, those and its cloud resources go

Metrics (``/metrics``, ``Metrics``; docs/controller.md lists them): reconciles by result, reconcile
duration, the work queue (depth, keys held back by a backoff, time waited, retries, the longest-running
reconcile), API requests by verb, resource and code with their latency, API errors by resource and code,
informer relists, OpenStack calls, latency and errors by operation, leadership, gateways by Ready, cloud
resources swept, the build, and the process. ``/healthz`` answers while the process runs; ``/readyz``
once every informer has synced.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import re
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

import anyio
import anyio.abc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

import gwplan
from controller import execute, ha, placement
from controller.cloud import CLOUD_READY, Cloud, CloudError, CloudState, CloudWant, HaWant
from controller.cloudplan import sweepable
from controller.desired import HOME_INFORMER_KINDS, LEFTOVER_KINDS, TENANT_SLOTS, Nic2, home_slots, plan_of
from controller.informer import Informer, lean, metadata_only
from controller.names import (
    GATEWAY_KINDS,
    LABEL_GATEWAY,
    LABEL_GATEWAY_SECRET,
    LABEL_INSTANCE,
    LABEL_KIND,
    LABEL_NAMESPACE,
    LABEL_TENANT,
    TENANT_ENABLED,
    GatewayKey,
    key_of,
    owner_of,
)
from controller.peerstatus import peer_patches
from controller.placement import ready
from controller.reconcile import (
    TRANSIT_UNKNOWN,
    Claim,
    HaPlan,
    Rendered,
    Snapshot,
    claim_of,
    cleanup,
    cluster_links,
    decide,
    ha_involved,
    holds,
    my_claim,
    neighbours,
    orphans,
    peers_of,
    place,
    plan_ha,
    provider_id,
    refused_as_is,
    render_gateway,
)
from controller.settings import Settings
from controller.status import Condition
from controller.workqueue import WorkQueue
from gwkit import httpd
from gwkit.kube import ApiError, Fenced, KubeClient, KubeError, Obj, Resource, Unauthenticated, Unreachable
from gwkit.kube.client import BY_KIND, CLUSTERLINKS, NAMESPACES, NODES, PODS, SECRETS, VPNPEERS
from gwkit.version import version

log = logging.getLogger(__name__)


def service_network(gw: Mapping[str, Any] | None) -> ipaddress.IPv4Network | None:
    """The serviceCIDR a gateway's spec asks for (None: none, or not an IPv4 network)."""
    cidr = ((gw or {}).get("spec") or {}).get("serviceCIDR")
    if not isinstance(cidr, str):
        return None
    try:
        return ipaddress.IPv4Network(cidr, strict=False)
    except ValueError:
        return None


class Elector(Protocol):
    leading: bool
    changed: anyio.Event
    identity: str

    def leads(self) -> bool: ...

    async def run(self) -> None: ...

    async def release(self) -> None: ...


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    """The controller's metrics, on a registry of their own (tests read them back from it). Made before
    the clients (``runcli``): ``api_request`` is the Kubernetes client's ``observe``, ``cloud_call`` the
    OpenStack backend's; ``watch_queue`` hangs the queue's gauges on the operator's queue."""

    def __init__(self, *, process: bool = True) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        if process:  # the default registry's process_*, python_info and python_gc_* series, on ours
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)
        self.build_info = Gauge(
            "vpngw_build_info", "1, labelled with the program's version.", ["version", "program"], registry=r
        )
        self.build_info.labels(version(), "controller").set(1)
        self.reconciles = Counter(
            "vpngw_controller_reconcile", "Reconciles by result.", ["result"], registry=r
        )
        self.duration = Histogram(
            "vpngw_controller_reconcile_duration_seconds",
            "Time one reconcile took.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "vpngw_controller_queue_wait_seconds",
            "Time a gateway waited in the queue, from being queued to a worker starting its reconcile.",
            buckets=(0.001, *LATENCY_BUCKETS, 30, 60),
            registry=r,
        )
        self.api_requests = Counter(
            "vpngw_controller_api_requests",
            "Kubernetes API requests by verb, resource and HTTP code ('error': no answer).",
            ["verb", "resource", "code"],
            registry=r,
        )
        self.api_latency = Histogram(
            "vpngw_controller_api_request_duration_seconds",
            "Kubernetes API request latency (a watch: until its answer's head) by verb and resource.",
            ["verb", "resource"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.relists = Counter(
            "vpngw_controller_informer_relists",
            "Informer lists after the first (a 410 Gone, a resource not served), by resource.",
            ["resource"],
            registry=r,
        )
        self.cloud_requests = Counter(
            "vpngw_controller_openstack_requests",
            "OpenStack API calls by operation (network.create_port, ...).",
            ["operation"],
            registry=r,
        )
        self.cloud_errors = Counter(
            "vpngw_controller_openstack_errors",
            "OpenStack API calls that failed, by operation and HTTP code ('error': no answer).",
            ["operation", "code"],
            registry=r,
        )
        self.cloud_latency = Histogram(
            "vpngw_controller_openstack_request_duration_seconds",
            "OpenStack API call latency by operation (a listing: until it was read to its end).",
            ["operation"],
            buckets=(*LATENCY_BUCKETS, 30, 60),
            registry=r,
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
        self.force_deleted = Counter(
            "vpngw_controller_pods_force_deleted",
            "Gateway pods deleted with grace 0 on a node that cannot confirm it (gone, out of service, or "
            "fenced off by the cloud).",
            registry=r,
        )
        self.swept = Counter(
            "vpngw_controller_cloud_swept",
            "Cloud resources deleted because the gateway they were held for no longer exists.",
            registry=r,
        )
        self.failovers = Counter(
            ha.FAILOVERS_TOTAL,
            "HA gateways' failovers (the floating IP moved to the other slot), by why: LeaseExpired (the "
            "active stopped renewing) or Released (it stopped gracefully).",
            ["reason"],
            registry=r,
        )
        self.failover_seconds = Histogram(
            ha.FAILOVER_SECONDS,
            "From the previous holder's last renewal the controller saw to its decision to move the "
            "floating IP (the cloud's move and the tunnels' renegotiation come after).",
            buckets=(0.5, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 60),
            registry=r,
        )

    def ha(self, samples: Iterable[ha.Sample]) -> None:
        """Record an HA decision's metric samples (``controller.ha.failover_metrics``)."""
        for sample in samples:
            labels = dict(sample.labels)
            if sample.name == ha.FAILOVERS_TOTAL:
                self.failovers.labels(**labels).inc(sample.value)
            elif sample.name == ha.FAILOVER_SECONDS:
                self.failover_seconds.observe(sample.value)

    def api_error(self, res: Resource | str, exc: BaseException) -> None:
        code = (
            str(exc.code)
            if isinstance(exc, ApiError)
            else "unreachable"
            if isinstance(exc, Unreachable)
            else "not_leading"
            if isinstance(exc, Fenced)
            else "unauthenticated"
            if isinstance(exc, Unauthenticated)
            else "other"
        )
        self.api_errors.labels(str(res), code).inc()

    def api_request(self, verb: str, resource: str, code: str, seconds: float) -> None:
        """``gwkit.kube.KubeClient``'s ``observe``."""
        self.api_requests.labels(verb, resource, code).inc()
        self.api_latency.labels(verb, resource).observe(seconds)

    def cloud_call(self, operation: str, seconds: float, error: BaseException | None) -> None:
        """``controller.openstack.OpenStackCloud``'s ``observe`` (called on its worker threads)."""
        self.cloud_requests.labels(operation).inc()
        self.cloud_latency.labels(operation).observe(seconds)
        if error is not None:
            code = getattr(error, "status_code", None)
            self.cloud_errors.labels(operation, str(code) if code else "error").inc()

    def relisted(self, res: Resource) -> None:
        """An informer's ``on_relist``."""
        self.relists.labels(str(res)).inc()

    def watch_queue(self, queue: WorkQueue[GatewayKey]) -> None:
        """The queue's depth, delayed keys, retries and longest-running reconcile, read from ``queue`` at
        each scrape (``QueueCollector``)."""
        self.registry.register(QueueCollector(queue))


class QueueCollector:
    """prometheus_client Collector over the operator's work queue (read at each scrape, so the values are
    never stale)."""

    def __init__(self, queue: WorkQueue[GatewayKey]) -> None:
        self.queue = queue

    def collect(self) -> Iterator[Metric]:
        q = self.queue
        # Depth as controller-runtime's workqueue_depth (queued for a worker now); the keys waiting out a
        # backoff are their own gauge: the queue holds depth + delayed keys in all.
        yield GaugeMetricFamily(
            "vpngw_controller_queue_depth", "Gateways queued for a worker now.", value=len(q)
        )
        yield GaugeMetricFamily(
            "vpngw_controller_queue_delayed",
            "Gateways held back by a retry backoff (or a requeue delay), not queued meanwhile: the queue "
            "holds depth + delayed gateways.",
            value=q.waiting() - len(q),
        )
        yield CounterMetricFamily(
            "vpngw_controller_retries",
            "Reconciles queued again after a backoff (failures, conflicts, a cloud step that failed).",
            value=q.retries,
        )
        yield GaugeMetricFamily(
            "vpngw_controller_longest_running_reconcile_seconds",
            "How long the reconcile that has been running longest has run (0: none runs).",
            value=q.longest_running(),
        )

    def describe(self) -> list[Metric]:
        return []


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
        sweep_grace_seconds: float = 300.0,
        metrics: Metrics | None = None,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.cloud = cloud
        self.elector = elector
        self.workers = workers
        self.resync_seconds = resync_seconds
        self.sweep_grace_seconds = sweep_grace_seconds
        self.metrics = metrics if metrics is not None else Metrics(process=False)
        """Given by ``runcli`` (its clients report to it); a test's operator gets its own, without the
        process collectors (they read /proc at each scrape)."""
        self.queue: WorkQueue[GatewayKey] = WorkQueue(on_wait=self.metrics.queue_wait.observe)
        self.metrics.watch_queue(self.queue)
        self.pins: dict[GatewayKey, str] = {}
        self.pins_b: dict[GatewayKey, str] = {}
        """HA gateways' slot b's nodes (``pins`` holds slot a's)."""
        self._deployed: dict[GatewayKey, tuple[tuple[str, str], str | None]] = {}
        """The serviceCIDR of each gateway's deployed plan, by the ConfigMap's (uid, resourceVersion)."""
        self._place_lock = anyio.Lock()
        ns = settings.namespace
        self._owned_selector = owned_selector = f"{LABEL_INSTANCE}={settings.instance}"
        home = settings.gateway_namespace

        def inf(
            res: Resource, *, namespace: str | None = ns, selector: str | None = None, **kw: Any
        ) -> Informer:
            return Informer(
                kube,
                res,
                namespace=namespace,
                label_selector=selector,
                on_change=lambda old, new: self._changed(res.kind, old, new),
                on_error=self.metrics.api_error,
                on_relist=self._relisted,
                **kw,
            )

        # What others write is cached ``lean``: a tenant's kubectl apply of 1,000 peers would otherwise
        # hold each one three times (spec, last-applied copy, managedFields).
        self.informers: dict[str, Informer] = {k: inf(BY_KIND[k], transform=lean) for k in GATEWAY_KINDS}
        self.informers["VPNPeer"] = inf(VPNPEERS, transform=lean)
        self.informers["ClusterLink"] = inf(CLUSTERLINKS, transform=lean)
        # The gateways' own objects and pods: in the gateway namespace, and nowhere else.
        for kind in HOME_INFORMER_KINDS:
            self.informers[kind] = inf(BY_KIND[kind], namespace=home, selector=owned_selector)
        self.informers["Pod"] = inf(PODS, namespace=home, selector=owned_selector, transform=lean)
        self.informers["Node"] = inf(NODES, namespace=None, transform=lean)
        self.informers["Namespace"] = inf(
            NAMESPACES, namespace=None, selector=f"{LABEL_TENANT}={TENANT_ENABLED}", transform=lean
        )
        self.tenants: dict[str, TenantCaches] = {}
        """Per enabled tenant namespace: what the controller reads there (``TenantCaches``)."""
        self.fip_slots: dict[GatewayKey, ha.Slot] = {}
        """Per HA gateway: the slot this replica's last cloud step left the floating IP on (what the
        status says may be stale: a status write lost after the move)."""
        self.leases: dict[GatewayKey, ha.Observation] = {}
        """Per HA gateway: its Lease as this replica has watched it (``ha.observe``, fed every version the
        informer delivers: a renewal never seen would end the previous holder's fence too early)."""
        self._tg: anyio.abc.TaskGroup | None = None

    def _relisted(self, res: Resource) -> None:
        self.metrics.relisted(res)
        if res.kind == "Lease":
            self._leases_relisted()

    # --- events -> keys ----------------------------------------------------------------------------

    def _changed(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        if kind == "Namespace":
            self._namespace_changed(old, new)
        if kind == "Lease" and not self._lease_changed(old, new):
            return
        for key in self._keys(kind, old, new):
            self.queue.add(key)

    def _lease_changed(self, old: Obj | None, new: Obj | None) -> bool:
        """Records an HA gateway's Lease version (every one: the renewals are what ``ha.observe`` measures
        expiry by) and says whether its gateway must be reconciled: only when the holder changed, or the
        Lease came or went. Its holder renews about every second: a reconcile (and a cloud call) per
        renewal would be one per second per HA gateway, for nothing."""
        obj = new if new is not None else old
        key = owner_of(obj) if obj is not None else None
        # Its labels name the gateway, and the pods may write their Lease whole (update): a Lease is only
        # its gateway's when its name is that gateway's home name, a hash of kind, namespace and name (found
        # by review: a pod relabelled its own Lease as another tenant's and froze that one's failover).
        if key is None or obj is None or (obj.get("metadata") or {}).get("name") != key.home_name:
            return False
        self.leases[key] = ha.observe(
            self.leases.get(key), self._trusted_lease(new), time.monotonic(), default_duration=self._lease_s
        )
        if old is None or new is None:
            return True
        return bool(_holder(old) != _holder(new))

    @property
    def _lease_s(self) -> float:
        return float(self.settings.ha_lease_seconds)

    def _trusted_lease(self, lease: Mapping[str, Any] | None) -> Obj | None:
        """The Lease as the controller judges it: the configured duration, not what a pod wrote there (one
        that wrote 2^31 s would never expire), and a holder that cannot be a pod's name replaced by a
        placeholder no pod has (it reaches status messages, Events and logs)."""
        if lease is None:
            return None
        spec = dict(lease.get("spec") or {})
        spec["leaseDurationSeconds"] = self.settings.ha_lease_seconds
        holder = str(spec.get("holderIdentity") or "")
        if holder and not _DNS_SUBDOMAIN.fullmatch(holder):
            spec["holderIdentity"] = "invalid-holder-identity"
        return {**lease, "spec": spec}

    def _leases_relisted(self) -> None:
        """The Lease informer listed anew (a watch too old to resume): the versions in between were never
        seen, so every holder may have renewed meanwhile; each fence starts again from now, as at start."""
        now = time.monotonic()
        self.leases = {k: ha.refence(o, now, self._lease_s) for k, o in self.leases.items()}

    def _keys(self, kind: str, old: Obj | None, new: Obj | None) -> set[GatewayKey]:
        objs = [o for o in (old, new) if o is not None]
        keys: set[GatewayKey] = set()
        if (
            kind in (*GATEWAY_KINDS, "VPNPeer")
            and old is not None
            and new is not None
            and status_only(old, new)
            and not (kind == "VPNPeer" and admission_changed(old, new))
        ):
            # The agents' status (counters every ~30 s per gateway) and our own status writes: nothing a
            # reconcile reads, so no reconcile (each one asks the cloud; the resync still comes). Except a
            # VPNPeer whose admission flipped: a status-agent's write queued under the old plan may land
            # after the controller's NotAdmitted (found by review: it stood until the resync, 600 s).
            return keys
        if kind in GATEWAY_KINDS:
            keys |= {key_of({**o, "kind": kind}) for o in objs}
            # A range it claimed is freed (the gateway gone, or its serviceCIDR moved): the gateways refused
            # an overlapping one (ServiceCIDRTaken) look again now, not at the next resync (found on the
            # real control plane, where a deleted gateway of another test held the example's range).
            freed = service_network(old)
            if freed is not None and (new is None or service_network(new) != freed):
                keys |= {
                    self._key(g)
                    for g in self._gateways()
                    if (net := service_network(g)) is not None and net.overlaps(freed)
                }
        elif kind == "VPNPeer":
            for o in objs:
                ref = ((o.get("spec") or {}).get("gatewayRef") or {}).get("name")
                if ref:
                    keys.add(GatewayKey("VPNGateway", str(o["metadata"]["namespace"]), str(ref)))
        elif kind == "ClusterLink":
            for o in objs:
                link_ns = str(o["metadata"]["namespace"])
                names = (o.get("spec") or {}).get("gateways") or []
                for name in names:
                    for k in GATEWAY_KINDS:
                        keys.add(GatewayKey(k, link_ns, str(name)))
                if not names:  # the seed's shape: every gateway of its namespace says so (RoutingReady)
                    keys |= {g for gw in self._gateways() if (g := self._key(gw)).namespace == link_ns}
        elif kind == "Pod":
            for o in objs:
                md = o.get("metadata") or {}
                labels = md.get("labels") or {}
                if labels.get(LABEL_KIND) in GATEWAY_KINDS and labels.get(LABEL_GATEWAY):
                    # Its namespace label only counts in the gateway namespace: elsewhere anyone may write it.
                    inside = md.get("namespace") == self.settings.gateway_namespace
                    ns = labels.get(LABEL_NAMESPACE) if inside else md.get("namespace")
                    keys.add(GatewayKey(labels[LABEL_KIND], str(ns), str(labels[LABEL_GATEWAY])))
        elif kind in ("Namespace", "Secret"):
            names = {
                str((o.get("metadata") or {}).get("name" if kind == "Namespace" else "namespace"))
                for o in objs
            }
            keys |= {self._key(g) for g in self._gateways() if g["metadata"].get("namespace") in names}
        elif kind == "Node":
            if old is not None and new is not None and not _placement_relevant(old, new):
                return keys
            names = {str(o["metadata"]["name"]) for o in objs}
            keys |= {k for pins in (self.pins, self.pins_b) for k, node in pins.items() if node in names}
            # And those with a pod there (re-pinned away: the pod may now be deleted without its kubelet,
            # placement.stranded, when the node is tainted out-of-service or goes).
            for pod in self.informers["Pod"].items():
                if (pod.get("spec") or {}).get("nodeName") in names:
                    keys |= self._keys("Pod", None, pod)
            if new is not None and ready(new):
                # A node that can take gateways: those without a node look again, and those pinned to a node
                # that cannot keep them (found when status writes stopped driving reconciles: a gateway
                # whose node died while no other was Ready stayed there once one was).
                keys |= {self._key(g) for g in self._gateways() if not self._pinned_to_ready(self._key(g))}
        else:
            keys |= {k for k in (owner_of(o) for o in objs) if k is not None}
        return keys

    def _pinned_to_ready(self, key: GatewayKey) -> bool:
        node = self.pins.get(key)
        obj = self.informers["Node"].get("", node) if node is not None else None
        return obj is not None and ready(obj)

    @staticmethod
    def _key(gw: Mapping[str, Any]) -> GatewayKey:
        return key_of(gw)

    def _gateways(self) -> list[Obj]:
        return [o for k in GATEWAY_KINDS for o in self.informers[k].items()]

    # --- one reconcile -------------------------------------------------------------------------------

    def _namespace_changed(self, old: Obj | None, new: Obj | None) -> None:
        """Start an enabled namespace's caches, stop them when it is no longer enabled."""
        name = str(((new or old) or {}).get("metadata", {}).get("name"))
        if new is not None and name not in self.tenants and self._tg is not None:
            caches = TenantCaches(name, self._tenant_informers(name))
            self.tenants[name] = caches
            self._tg.start_soon(caches.run, lambda: self._enqueue_namespace(name))
        elif new is None and name in self.tenants:
            self.tenants.pop(name).stop()

    def _tenant_informers(self, namespace: str) -> dict[str, Informer]:
        """What the controller reads in a tenant's namespace, with the rights the chart gives it there
        (controller/rbac.py TENANT_NAMESPACE, and MIGRATION while migrating)."""

        def inf(res: Resource, selector: str, **kw: Any) -> Informer:
            return Informer(
                self.kube,
                res,
                namespace=namespace,
                label_selector=selector,
                on_change=lambda old, new: self._changed(res.kind, old, new),
                on_error=self.metrics.api_error,
                on_relist=self.metrics.relisted,
                **kw,
            )

        out = {
            # The Secrets opted in for gateways: their metadata only (their values never cross the wire).
            "Secret": inf(
                SECRETS, f"{LABEL_GATEWAY_SECRET}=true", transform=metadata_only, metadata_only=True
            ),
            **{kind: inf(BY_KIND[kind], self._owned_selector) for kind in TENANT_SLOTS.values()},
        }
        if self.settings.migrate:
            out.update({kind: inf(BY_KIND[kind], self._owned_selector) for kind in LEFTOVER_KINDS})
            out["Pod"] = inf(PODS, self._owned_selector)
        return out

    def _enqueue_namespace(self, namespace: str) -> None:
        for gw in self._gateways():
            if gw["metadata"].get("namespace") == namespace:
                self.queue.add(self._key(gw))

    async def tenant_caches(self, namespace: str) -> TenantCaches | str:
        """The namespace's caches once synced, or why they are not: the namespace is not enabled, or they
        have not synced (waited for up to 5 s after they started; caches that never sync mean the
        controller may not read there)."""
        caches = self.tenants.get(namespace)
        if caches is None:
            return f"namespace {namespace} is not enabled"
        if not await caches.synced(wait=max(0.0, caches.started + 5.0 - time.monotonic())):
            why = f": {caches.last_error}" if caches.last_error else ""
            return (
                f"the controller cannot read namespace {namespace}{why} (it needs the chart's tenant "
                f"RoleBinding there: add {namespace} to tenants.namespaces; docs/install.md)"
            )
        return caches

    def snapshot(self, key: GatewayKey, gateway: Obj, tenant: TenantCaches | str | None = None) -> Snapshot:
        """What the caches hold for ``key`` now; ``tenant``: its namespace's caches (or why there are none
        to read: its Role, Secrets and leftovers are then unknown and left as they are)."""
        home = self.settings.gateway_namespace
        owned: dict[str, Obj] = {}
        for slot, (kind, name) in home_slots(key).items():  # an HA gateway's slot b: <kind>/b, <home_name>-b
            obj = self.informers[kind].get(home, name)
            if obj is not None:
                owned[slot] = obj
        leftovers: list[Obj] = []
        pods = [p for p in self.informers["Pod"].items() if _pod_of(p, key)]
        if isinstance(tenant, TenantCaches):
            for slot, kind in TENANT_SLOTS.items():
                obj = tenant.get(kind, key.object_name)
                if obj is not None:
                    owned[slot] = obj
            if key.namespace != home:
                leftovers = [
                    {**o, "kind": kind}
                    for kind in LEFTOVER_KINDS
                    if (o := tenant.get(kind, key.object_name)) is not None
                ]
                # An earlier release's pod in the tenant's namespace: its own labels name the gateway (no
                # namespace label), and only a pod of this namespace can be this gateway's.
                pods += [p for p in tenant.items("Pod") if _pod_of(p, key, where=key.namespace)]
        peers = peers_of(key, list(self.informers["VPNPeer"].items())) if key.kind == "VPNGateway" else ()
        pinned = Tally(node for pins in (self.pins, self.pins_b) for k, node in pins.items() if k != key)
        claim = my_claim(key, gateway, self._deployed_cidr(key))
        others: list[Claim] = []
        for g in self._gateways():
            k = self._key(g)
            c = claim_of(k, g, self._deployed_cidr(k)) if k != key else None
            enabled = self.informers["Namespace"].get("", k.namespace) is not None
            allowed = self.settings.allowance(k.namespace).service_cidrs
            if c is not None and holds(c, enabled, allowed, refused_as_is(g)):
                others.append(c)
        links = cluster_links(
            key, self.informers["ClusterLink"].items(), self.settings.allowance(key.namespace).routers
        )
        return Snapshot(
            key=key,
            gateway=gateway,
            peers=peers,
            owned=owned,
            pods=tuple(pods),
            nodes=tuple(self.informers["Node"].items()),
            pinned=dict(pinned),
            neighbours=neighbours(claim, others) if claim is not None else (),
            links=links,
            leftovers=tuple(leftovers),
            namespace_enabled=self.informers["Namespace"].get("", key.namespace) is not None,
            secrets=tenant.opted_in() if isinstance(tenant, TenantCaches) else frozenset(),
            secrets_unreadable=tenant if isinstance(tenant, str) else None,
        )

    def _deployed_cidr(self, key: GatewayKey) -> str | None:
        """The serviceCIDR ``key``'s deployed plan serves (parsed once per ConfigMap version)."""
        cm = self.informers["ConfigMap"].get(self.settings.gateway_namespace, key.home_name)
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
            self.pins_b.pop(key, None)
            self.leases.pop(key, None)
            self.fip_slots.pop(key, None)
            if self.settings.namespace not in (None, key.namespace):
                return "gone"  # not watched here: its gateway's existence is unknown
            if not self.informers[key.kind].served:
                return "gone"  # its kind answers 404: an empty cache says nothing of what exists
            home = self.settings.gateway_namespace
            objs = [
                {**o, "kind": kind}
                for kind, name in home_slots(key).values()
                if (o := self.informers[kind].get(home, name))
            ]
            gone = orphans(key, objs)
            if gone:
                log.warning("gateway.orphans gateway=%s objects=%d", key, len(gone))
                await execute.delete_all(self.kube, gone)
            # Its finalizer was removed by hand (or it went while no controller ran): what the cloud holds
            # for it goes too. Here, one key at a time through the work queue, for a gateway this cluster
            # had: a deletion seen, its objects in the gateway namespace, or cloud resources tagged with
            # this installation and this cluster's identity (``sweep``; never by the instance tag alone,
            # which two clusters with the same instance name share).
            released = await self.cloud.release(key)
            if released:
                log.warning("cloud.swept gateway=%s deleted=%d", key, released)
                self.metrics.swept.inc(released)
            return "gone"
        gateway = {**gateway, "kind": key.kind}
        snap = self.snapshot(key, gateway)
        if snap.deleting:
            self.pins.pop(key, None)
            self.pins_b.pop(key, None)
            self.leases.pop(key, None)
            self.fip_slots.pop(key, None)
            if snap.has_finalizer:
                await self.cloud.release(key)
                deleted = await execute.delete_all(self.kube, cleanup(snap))
                await execute.remove_finalizer(self.kube, key, gateway)
                log.info("gateway.released gateway=%s deleted=%d", key, deleted)
            return "deleted"
        tenant = await self.tenant_caches(key.namespace) if snap.namespace_enabled else None
        snap = self.snapshot(key, gateway, tenant)
        transit = await self.cloud.transit_cidrs()
        # Rendering is pure but not cheap (seconds for thousands of peers): off the event loop, so that
        # one tenant's large gateway never stalls the informers, the other workers or the Lease.
        rendered = await anyio.to_thread.run_sync(render_gateway, snap, self.settings, transit)
        cloud_failed = False
        pair: HaPlan | None = None
        if rendered.in_force is None:
            # Nothing to serve (a new gateway that does not render): no node slot, no cloud resources.
            # A tenant's invalid or unserved CRs must not take capacity every tenant shares.
            self.pins.pop(key, None)
            self.pins_b.pop(key, None)
            where = placement.Placement(None, "NotRendered", "nothing to serve until the gateway renders")
            cloud = CloudState(None, None, (Condition(CLOUD_READY, False, "NotRendered", where.message),))
            if transit is None:  # the cloud cannot be asked: say so, and try again with the backoff
                why = "the cloud cannot be asked for the gateways' transit network (see the controller's log)"
                cloud = CloudState(None, None, (Condition(CLOUD_READY, False, TRANSIT_UNKNOWN, why),))
                cloud_failed = True
        else:
            if not snap.has_finalizer:
                # On the CR, and confirmed by the API, before the first cloud step that creates anything:
                # a gateway deleted during its first reconcile is then held until ``release`` ran. Written
                # after the cloud, as it was, 3 of 6 gateways deleted 0-2.5 s after creation left their
                # port and floating IP for good. (Not before: a gateway that never renders holds nothing,
                # and its deletion must not wait for the cloud.)
                gateway = {**await execute.add_finalizer(self.kube, key, gateway), "kind": key.kind}
                self.metrics.writes.labels("patch").inc()
            async with self._place_lock:
                snap = self.snapshot(key, gateway, tenant)  # the pins of reconciles that placed meanwhile
                pair = self._plan_ha(key, snap)
                where = pair.slot_a if pair is not None else place(snap, self.settings)
                if where.node is not None:
                    self.pins[key] = where.node
                if pair is not None and pair.mode == "full" and pair.slot_b.node is not None:
                    self.pins_b[key] = pair.slot_b.node
                else:
                    self.pins_b.pop(key, None)
            ha_want = None
            if pair is not None and pair.mode != "off":
                node_b = pair.slot_b.node if pair.mode == "full" else None
                ha_want = HaWant(node_b, provider_id(snap, node_b), pair.active)
            want = CloudWant(
                key,
                where.node,
                provider_id(snap, where.node),
                rendered.in_force,
                snap.links.routers,
                ha=ha_want,
            )
            cloud, cloud_failed = await self._ensure(key, want, snap, rendered)
            if ha_want is not None and cloud.floating_ip_slot is None and key in self.fip_slots:
                # The cloud could not be asked (or failed half-way through a move): the slot it last left
                # the floating IP on, so that no other slot's plan says publicHere before it is there.
                cloud = dataclasses.replace(cloud, floating_ip_slot=self.fip_slots[key])
            if cloud.floating_ip_slot is not None:
                self.fip_slots[key] = cloud.floating_ip_slot
            elif ha_want is None:
                self.fip_slots.pop(key, None)
        now = now_rfc3339()
        decision = decide(snap, self.settings, rendered, where, cloud, now, pair, cloud.nic_b)
        counts = execute.Counts()
        try:
            await execute.apply(
                self.kube, key, gateway, decision, now=now, reporter=self.elector.identity, counts=counts
            )
        finally:  # a later write's failure (a status 409) must not hide the writes made before it
            self._count_writes(counts)
        if key.kind == "VPNGateway":
            planned = set(gwplan.peer_names(rendered.in_force)) if rendered.in_force is not None else set()
            patches = peer_patches(
                snap.peers, planned, rendered.problems, rendered=rendered.plan is not None, now=now
            )
            if patches:
                n = await execute.write_peer_statuses(self.kube, key.namespace, patches)
                counts.writes += n
                self.metrics.writes.labels("patch").inc(n)
        # The Deployment now pins the new node; the old pod on a dead node is deleted without its kubelet's
        # word once it cannot serve (the cloud fenced it off, or the node is gone or out of service):
        # else the Recreate Deployment waits for it forever (no kubelet confirms its deletion).
        if pair is not None and pair.mode == "full":
            self.metrics.ha(pair.decision.metrics)
            if pair.decision.serving.move is not None and pair.decision.serving.move.failover:
                move = pair.decision.serving.move
                log.warning(
                    "ha.failover gateway=%s from=%s to=%s reason=%s seconds=%s",
                    key,
                    move.from_pod,
                    move.to_pod,
                    move.reason,
                    f"{move.seconds:.2f}" if move.seconds is not None else "unknown",
                )
        if pair is not None and pair.decision.requeue_at is not None:  # a fence, a hold or an expiry ends
            self.queue.add_after(key, max(0.0, pair.decision.requeue_at - time.monotonic()))
        homed = [p for p in snap.pods if p["metadata"].get("namespace") == self.settings.gateway_namespace]
        slots: list[tuple[list[Mapping[str, Any]], str | None, bool]] = [(homed, where.node, cloud.fenced)]
        if pair is not None and pair.mode == "full":  # each slot's pods against its own pin and port
            slots = [
                ([p for p in homed if ha.slot_of_pod(p) == "a"], where.node, cloud.fenced),
                ([p for p in homed if ha.slot_of_pod(p) == "b"], pair.slot_b.node, cloud.fenced_b),
            ]
        for pods, pin, fenced in slots:
            await self._delete_stranded(key, gateway, pods, snap, pin, fenced, now)
        if counts.writes:
            log.info(
                "gateway.reconciled gateway=%s writes=%d node=%s rendered=%s",
                key,
                counts.writes,
                where.node,
                "yes" if rendered.plan is not None else "no",
            )
        if counts.failures:  # the status says them; try again with the backoff
            raise execute.Failed(counts.failures)
        return "cloud-failed" if cloud_failed else "ok"

    async def _delete_stranded(
        self,
        key: GatewayKey,
        gateway: Obj,
        pods: list[Mapping[str, Any]],
        snap: Snapshot,
        pin: str | None,
        fenced: bool,
        now: str,
    ) -> None:
        """The Deployment now pins ``pin``; its old pod on a dead node is deleted without its kubelet's
        word once it cannot serve (the cloud fenced it off, or the node is gone or out of service): else
        the Recreate Deployment waits for it forever (no kubelet confirms its deletion)."""
        for pod in placement.stranded(pods, snap.nodes, pin, fenced=fenced):
            on = pod["spec"]["nodeName"]
            why = (
                f"node {on} is not Ready and NIC2 is attached to {pin} now"
                if fenced
                else f"node {on} is gone or out of service"
            )
            if await execute.force_delete(
                self.kube, key, gateway, pod, why, now=now, reporter=self.elector.identity
            ):
                self.metrics.writes.labels("delete").inc()
                self.metrics.force_deleted.inc()

    def _plan_ha(self, key: GatewayKey, snap: Snapshot) -> HaPlan | None:
        """The HA part of ``key``'s reconcile (``reconcile.plan_ha``) over this replica's watch of its Lease
        (first read from the cache when this replica has seen no version yet)."""
        if not ha_involved(snap, self.settings):
            return None
        now = time.monotonic()
        observed = self.leases.get(key)
        if observed is None:
            lease = self._trusted_lease(snap.owned.get("Lease"))
            observed = self.leases[key] = ha.observe(None, lease, now, default_duration=self._lease_s)
        return plan_ha(snap, self.settings, observed, now, now_rfc3339(), self.fip_slots.get(key))

    def _count_writes(self, counts: execute.Counts) -> None:
        for verb, n in (("create", counts.creates), ("replace", counts.replaces)):
            if n:
                self.metrics.writes.labels(verb).inc(n)
        other = counts.writes - counts.creates - counts.replaces
        if other:
            self.metrics.writes.labels("patch").inc(other)

    async def _ensure(
        self, key: GatewayKey, want: CloudWant, snap: Snapshot, rendered: Rendered
    ) -> tuple[CloudState, bool]:
        """The cloud's answer, and whether a step failed (then what the deployed plan says stands in)."""
        try:
            state = await self.cloud.ensure(want)
            return state, state.failed
        except CloudError as exc:
            log.warning("cloud.failed gateway=%s step=%s error=%r", key, exc.step, str(exc))
            state = CloudState(
                _deployed_nic(rendered),
                snap.current_status.get("publicIP"),
                (Condition(CLOUD_READY, False, exc.step, str(exc)),),
                nic_b=_deployed_nic_b(snap) if want.ha is not None else None,
            )
            return state, True

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

    def enqueue_all(self) -> None:
        """Every gateway, behind any change (the resync; docs/controller.md), and every gateway the
        gateway namespace holds objects of (those of a gateway gone go: ``orphans``)."""
        keys = {self._key(gw) for gw in self._gateways()}
        for kind in HOME_INFORMER_KINDS:
            keys |= {k for o in self.informers[kind].items() if (k := owner_of(o)) is not None}
        for key in sorted(keys, key=str):
            self.queue.add(key, background=True)

    async def sweep(self) -> tuple[GatewayKey, ...]:
        """Enqueue every gateway the cloud holds resources for (this installation's and this cluster's
        tags) that does not exist and whose resources are older than the grace period: its reconcile's
        gone path releases them. Nothing while the cloud cannot be asked, or for a kind answering 404 or a
        namespace not watched (their gateways' existence is unknown)."""
        try:
            held = await self.cloud.owned()
        except CloudError as exc:
            log.warning("cloud.sweep_failed step=%s error=%r", exc.step, str(exc))
            return ()

        def exists(key: GatewayKey) -> bool | None:
            informer = self.informers[key.kind]
            if self.settings.namespace not in (None, key.namespace) or not informer.served:
                return None
            return informer.get(key.namespace, key.name) is not None

        before = datetime.fromtimestamp(time.time() - self.sweep_grace_seconds, UTC)
        found: list[GatewayKey] = []
        for key in sweepable(held, exists, before.strftime("%Y-%m-%dT%H:%M:%SZ")):
            # The cache may be behind (a watch failing since its sync): the API itself must not hold it.
            try:
                items, _ = await self.kube.list(
                    self.informers[key.kind].res, key.namespace, field_selector=f"metadata.name={key.name}"
                )
            except KubeError as exc:
                log.warning("cloud.sweep_skipped gateway=%s error=%r", key, str(exc))
                continue
            if items:
                continue
            log.warning("cloud.sweep_found gateway=%s: its gateway does not exist", key)
            self.queue.add(key, background=True)
            found.append(key)
        return tuple(found)

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
            await self.sweep()
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
            self._tg = tg
            for i in self.informers.values():
                tg.start_soon(i.run)
            tg.start_soon(self.elector.run)
            tg.start_soon(self._lead)
            task_status.started(port)


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""A pod's name (RFC 1123 subdomain, at most 253 characters: checked apart)."""


def _holder(lease: Mapping[str, Any]) -> str:
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def _pod_of(pod: Mapping[str, Any], key: GatewayKey, where: str | None = None) -> bool:
    """``pod`` is ``key``'s: in the gateway namespace by its labels (the controller's Deployment put them
    there); in a tenant's namespace (``where``: an earlier release's) only a pod of that namespace."""
    md = pod.get("metadata") or {}
    lbl = md.get("labels") or {}
    if lbl.get(LABEL_GATEWAY) != key.name or lbl.get(LABEL_KIND) != key.kind:
        return False
    if where is not None:
        return bool(md.get("namespace") == where)
    return bool(lbl.get(LABEL_NAMESPACE) == key.namespace)


class TenantCaches:
    """The informers of one enabled tenant namespace, started and stopped together."""

    def __init__(self, namespace: str, informers: Mapping[str, Informer]) -> None:
        self.namespace = namespace
        self.informers = dict(informers)
        self.started = time.monotonic()
        self._scope = anyio.CancelScope()

    async def run(self, on_synced: Callable[[], None]) -> None:
        """Until stopped; ``on_synced`` once every cache has synced (its gateways can be decided)."""
        with self._scope:
            async with anyio.create_task_group() as tg:
                for i in self.informers.values():
                    tg.start_soon(i.run)
                for i in self.informers.values():
                    await i.synced.wait()
                on_synced()

    def stop(self) -> None:
        self._scope.cancel()

    async def synced(self, wait: float) -> bool:
        with anyio.move_on_after(wait):
            for i in self.informers.values():
                await i.synced.wait()
        return all(i.synced.is_set() for i in self.informers.values())

    @property
    def last_error(self) -> str | None:
        return next((i.last_error for i in self.informers.values() if i.last_error), None)

    def get(self, kind: str, name: str) -> Obj | None:
        informer = self.informers.get(kind)
        return informer.get(self.namespace, name) if informer is not None else None

    def items(self, kind: str) -> list[Obj]:
        informer = self.informers.get(kind)
        return list(informer.items()) if informer is not None else []

    def opted_in(self) -> frozenset[str]:
        return frozenset(str(o["metadata"]["name"]) for o in self.items("Secret"))


def status_only(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether ``old`` and ``new`` differ only in ``status`` (and the resourceVersion every write moves)."""

    def rest(o: Mapping[str, Any]) -> dict[str, Any]:
        md = {
            k: v
            for k, v in (o.get("metadata") or {}).items()
            if k not in ("resourceVersion", "managedFields")
        }
        return {**{k: v for k, v in o.items() if k != "status"}, "metadata": md}

    return rest(old) == rest(new)


def admission_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether a VPNPeer's ``Admitted`` condition (or its NotAdmitted state) differs between the two."""

    def admitted(o: Mapping[str, Any]) -> tuple[Any, Any]:
        status = o.get("status") or {}
        conds = [
            c
            for c in status.get("conditions") or []
            if isinstance(c, Mapping) and c.get("type") == "Admitted"
        ]
        return (status.get("state") == "NotAdmitted", conds[0].get("status") if conds else None)

    return admitted(old) != admitted(new)


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
    return _nic_of(rendered.previous)


def _deployed_nic_b(snap: Snapshot) -> Nic2 | None:
    """An HA gateway's slot b's NIC2 as its deployed plan (``ConfigMap/b``) has it."""
    cm = snap.owned.get("ConfigMap/b")
    try:
        return _nic_of(plan_of(cm)) if cm is not None else None
    except gwplan.PlanError:
        return None


def _nic_of(p: gwplan.Plan | None) -> Nic2 | None:
    if p is None or not (p.nic.mac and p.nic.address and p.nic.gateway):
        return None
    return Nic2(p.nic.mac, p.nic.address, p.nic.gateway)
