"""``python -m controller diagnose [KIND/]NAMESPACE/NAME``: why a gateway is not Ready, and what to do.

The thin reader: what the API (and, with ``--cloud openstack``, the cloud) holds about one gateway into a
``controller.diagnose.Snapshot``, then the pure ``diagnose`` and its text or JSON. It only reads: GETs
and LISTs on the API (Secrets as metadata only: no value crosses the wire), the status-agent's
``/readyz`` on the pod's address, else (often unreachable from outside the cluster, and the gateway's
NetworkPolicy admits neither) through the API server's pod proxy (the user's ``get pods/proxy`` in the
gateway namespace; the output says which answered, and neither is a note), and the
OpenStack backend's read-only ``inspect`` (its writes refused by a guard that always says no).

Exit codes: 0 no problem, 1 a problem found (or the gateway cannot be read), 2 bad usage (a malformed
GATEWAY, an unreadable kubeconfig, a missing OpenStack flag), as ``adopt`` and ``run`` use them.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import anyio
import httpx

from controller.diagnose import (
    READYZ_DIRECT,
    READYZ_PROXY,
    Readyz,
    Snapshot,
    agents_answer,
    as_json,
    diagnose,
    printable,
    problems,
    secret_refs,
    secret_state,
    text,
)
from controller.names import GatewayKey
from controller.reconcile import peers_of, pod_selector
from controller.runcli import (
    RunFailed,
    add_gateway_arg,
    add_kube_args,
    add_openstack_args,
    cluster_id,
    gateway_key,
    openstack_cloud,
)
from controller.settings import Settings, SettingsError
from gwkit.kube import ConfigError, KubeClient, KubeError, load
from gwkit.kube.client import (
    CONFIGMAPS,
    DEPLOYMENTS,
    EVENTS,
    IPSECGATEWAYS,
    NADS,
    NAMESPACES,
    NETWORKPOLICIES,
    NODES,
    PODS,
    ROLEBINDINGS,
    ROLES,
    SECRETS,
    SERVICEACCOUNTS,
    VPNGATEWAYS,
    VPNPEERS,
    Resource,
)
from gwkit.kube.errors import NotFound

log = logging.getLogger("controller")
EXIT_OK, EXIT_PROBLEM, EXIT_USAGE = 0, 1, 2
T = TypeVar("T")
HOME_KINDS = (CONFIGMAPS, DEPLOYMENTS, SERVICEACCOUNTS, ROLES, ROLEBINDINGS, NETWORKPOLICIES)
REPLICASETS = Resource("apps", "v1", "replicasets", "ReplicaSet")
"""The gateway Deployment's ReplicaSets: only for their uids (the FailedCreate Events are about them)."""


def uid_of(obj: Mapping[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("uid") or "")


def owner_uids(obj: Mapping[str, Any]) -> set[str]:
    return {str(r.get("uid")) for r in (obj.get("metadata") or {}).get("ownerReferences") or []}


def add_diagnose_parser(sub: Any) -> None:
    d = sub.add_parser(
        "diagnose",
        help="say why a gateway is not Ready: each problem with its cause and its fix",
        description=(
            "Read one gateway's CR, its peers and conditions, Events, the objects the controller made for it "
            "(plan ConfigMap, Deployment, NAD, ...), its pod and containers, the nodes, the Secrets it "
            "references (names and labels only), the status-agent's /readyz (on the pod's IP, else through "
            "the API server's pod proxy), and with "
            "--cloud openstack its port, floating IP, security group and routes; print every problem with "
            "its cause and fix, most important first. It only reads. Also `kubectl vpngw diagnose "
            "NAMESPACE/NAME` with scripts/kubectl-vpngw on the PATH."
        ),
        epilog="Exit codes: 0 no problem found, 1 a problem found (or the gateway cannot be read), "
        "2 bad usage.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_gateway_arg(d)
    d.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="human text, or one JSON document"
    )
    add_kube_args(d)
    d.add_argument(
        "--gateway-namespace",
        default=os.environ.get("VPNGW_GATEWAY_NAMESPACE", Settings.gateway_namespace),
        help="where the controller puts gateway pods and their objects ($VPNGW_GATEWAY_NAMESPACE)",
    )
    d.add_argument(
        "--readyz-timeout",
        type=float,
        default=2.0,
        help="seconds to wait for the status-agent's /readyz on the pod's address, then through the API "
        "server's pod proxy (needs get pods/proxy in the gateway namespace; 0: do not ask)",
    )
    d.add_argument(
        "--cloud",
        choices=("static", "openstack"),
        default=os.environ.get("VPNGW_CLOUD", "static"),
        help="openstack: also read the gateway's port, floating IP, security group and routes with the "
        "controller's credentials (the flags below; $VPNGW_CLOUD)",
    )
    d.add_argument(
        "--cluster-id",
        default=os.environ.get("VPNGW_CLUSTER_ID", ""),
        help="with --cloud openstack: the cluster identity the controller tags its cloud resources with, "
        "as the controller's (empty: the kube-system namespace's uid; $VPNGW_CLUSTER_ID)",
    )
    add_openstack_args(d)


def diagnose_command(args: argparse.Namespace) -> int:
    key = gateway_key(args.gateway)
    if not 0 <= args.readyz_timeout <= 60:  # also refuses nan
        raise SettingsError("--readyz-timeout: must be 0-60")
    try:
        config = load(args.kubeconfig, context=args.context)
    except ConfigError as exc:
        raise SettingsError(str(exc)) from exc
    cloud: CloudOf | None = None
    if args.cloud == "openstack":
        cloud = CloudOf(
            args.cluster_id, lambda cluster: openstack_cloud(args, args.instance, lambda: False, cluster)
        )
    snap = anyio.run(gather, key, config, args.gateway_namespace, args.readyz_timeout, cloud)
    found = diagnose(snap)
    sys.stdout.write(as_json(snap, found) if args.output == "json" else text(snap, found))
    log.info(
        "diagnose.done gateway=%s findings=%d codes=%s",
        printable(str(key)),
        len(found),
        ",".join(printable(f.code) for f in found),  # a code may be a condition's reason: status words
    )
    return EXIT_PROBLEM if problems(found) else EXIT_OK


@dataclass(frozen=True)
class CloudOf:
    """How to ask the cloud: the cluster identity given (``--cluster-id``; empty: the cluster's own, as
    ``run`` resolves it) and the read-only cloud for an identity. Without the identity the controller's own
    resources, tagged with it, would look like another cluster's: none found (found by review)."""

    given: str
    make: Callable[[str], Any]


async def gather(
    key: GatewayKey, config: Any, gateway_namespace: str, readyz_timeout: float, cloud: CloudOf | None
) -> Snapshot:
    """Read everything ``diagnose`` looks at; what cannot be read goes to ``Snapshot.unreadable``."""
    unreadable: dict[str, str] = {}
    inspect: Any = None

    async def read(what: str, call: Callable[[], Awaitable[T]]) -> T | None:
        try:
            return await call()
        except KubeError as exc:
            unreadable[what] = f"{type(exc).__name__}: {exc}"
            return None

    async with KubeClient(config, user_agent="vpngw-diagnose") as kube:
        if cloud is not None:  # first: a missing OpenStack flag is bad usage, whatever the gateway
            try:
                inspect = cloud.make(await cluster_id(kube, cloud.given, attempts=1))
            except RunFailed as exc:
                unreadable["cloud"] = str(exc)
        res = VPNGATEWAYS if key.kind == "VPNGateway" else IPSECGATEWAYS
        try:
            gw: dict[str, Any] | None = await kube.get(res, key.name, key.namespace)
        except NotFound:
            gw = None
        except KubeError as exc:
            return Snapshot(
                key, None, gateway_namespace, unreadable={"gateway": f"{type(exc).__name__}: {exc}"}
            )
        if gw is None:
            return Snapshot(key, None, gateway_namespace)

        async def listed(r: Resource, ns: str | None = None, **kw: Any) -> list[dict[str, Any]]:
            items, _ = await kube.list(r, ns, **kw)
            return items

        namespace = await read("namespace", lambda: kube.get(NAMESPACES, key.namespace))
        peers = (
            await read("peers", lambda: listed(VPNPEERS, key.namespace)) if key.kind == "VPNGateway" else []
        )
        mine = peers_of(key, peers or [])
        metas = await read("secrets", lambda: listed(SECRETS, key.namespace, metadata_only=True))
        secrets = None
        if metas is not None:
            by_name = {str((m.get("metadata") or {}).get("name")): m for m in metas}
            secrets = {name: secret_state(by_name.get(name)) for name in secret_refs([gw, *mine])}
        nodes = await read("nodes", lambda: listed(NODES))
        owned: dict[str, Any] = {}
        for r in HOME_KINDS:
            try:
                owned[r.kind] = await kube.get(r, key.home_name, gateway_namespace)
            except NotFound:
                pass
            except KubeError as exc:
                unreadable[f"{r.kind} {gateway_namespace}/{key.home_name}"] = f"{type(exc).__name__}: {exc}"
        nad_served: bool | None = None
        try:
            owned[NADS.kind] = await kube.get(NADS, key.home_name, gateway_namespace)
            nad_served = True
        except NotFound:
            # The object missing, or the kind not served at all: a list tells them apart.
            try:
                await kube.list(NADS, gateway_namespace, limit=1)
                nad_served = True
            except NotFound:
                nad_served = False
            except KubeError as exc:
                unreadable["NetworkAttachmentDefinitions"] = f"{type(exc).__name__}: {exc}"
        except KubeError as exc:
            unreadable["NetworkAttachmentDefinitions"] = f"{type(exc).__name__}: {exc}"
        pods = (
            await read("pods", lambda: listed(PODS, gateway_namespace, label_selector=pod_selector(key)))
            or []
        )
        replicasets: list[dict[str, Any]] = []
        if deployment := uid_of(owned.get(DEPLOYMENTS.kind)):
            try:
                rs = await listed(REPLICASETS, gateway_namespace, label_selector=pod_selector(key))
                replicasets = [r for r in rs if deployment in owner_uids(r)]
            except NotFound:
                pass  # not served (the lab's API emulator has no ReplicaSets)
            except KubeError as exc:
                unreadable[f"ReplicaSets in {gateway_namespace}"] = f"{type(exc).__name__}: {exc}"
        # Events by their involved object's uid, never by its name: in the tenant's namespace a Job or a
        # ReplicaSet may be named after the gateway, and in the gateway namespace another tenant's gateway
        # may be named so its objects' names start with this one's (found by review).
        tenant_objects = {(key.kind, uid_of(gw)), *(("VPNPeer", uid_of(p)) for p in mine)}
        home_uids = {uid_of(o) for o in [*owned.values(), *replicasets, *pods]} - {""}
        events: list[dict[str, Any]] = []
        for ns in (key.namespace, gateway_namespace):
            items = await read(f"events in {ns}", lambda ns=ns: listed(EVENTS, ns))  # type: ignore[misc]
            for e in items or []:
                about = e.get("involvedObject") or {}
                uid = str(about.get("uid") or "")
                if uid and (
                    (str(about.get("kind")), uid) in tenant_objects
                    if ns == key.namespace
                    else uid in home_uids
                ):
                    events.append(e)
        readyz = await probe_readyz(pods, readyz_timeout, kube) if readyz_timeout > 0 else None
    cloud_facts = None
    if inspect is not None:
        from controller.cloud import CloudError

        try:
            cloud_facts = await inspect.inspect(key)
        except CloudError as exc:
            unreadable["cloud"] = str(exc)
    return Snapshot(
        key=key,
        gateway=gw,
        gateway_namespace=gateway_namespace,
        namespace=namespace,
        peers=mine,
        events=tuple(sorted(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))),
        owned=owned,
        pods=tuple(pods),
        nodes=tuple(nodes) if nodes is not None else None,
        nad_served=nad_served,
        secrets=secrets,
        readyz=readyz,
        cloud=cloud_facts,
        unreadable=unreadable,
    )


def readyz_target(pod: dict[str, Any]) -> tuple[str, int, str] | None:
    """(pod IP, port, path) of the status-agent's readiness probe, from the pod's own spec."""
    ip = (pod.get("status") or {}).get("podIP")
    for c in (pod.get("spec") or {}).get("containers") or []:
        get = (
            ((c.get("readinessProbe") or {}).get("httpGet") or {}) if c.get("name") == "status-agent" else {}
        )
        if ip and isinstance(get.get("port"), int):
            return str(ip), int(get["port"]), str(get.get("path") or "/readyz")
    return None


def readyz_url(pod: dict[str, Any]) -> str | None:
    """The status-agent's readiness probe on the pod's address."""
    target = readyz_target(pod)
    if target is None:
        return None
    ip, port, path = target
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}{path}"


def proxy_path(pod: dict[str, Any]) -> str | None:
    """The same probe through the API server: ``/api/v1/namespaces/NS/pods/NAME:PORT/proxy/PATH`` (what
    ``kubectl get --raw`` asks; the right it needs is ``get pods/proxy``)."""
    target = readyz_target(pod)
    md = pod.get("metadata") or {}
    if target is None or not md.get("name") or not md.get("namespace"):
        return None
    _, port, path = target
    ns, name = quote(str(md["namespace"]), safe=""), quote(str(md["name"]), safe="")
    return f"/api/v1/namespaces/{ns}/pods/{name}:{port}/proxy{path if path.startswith('/') else '/' + path}"


async def probe_readyz(
    pods: list[dict[str, Any]], timeout: float, kube: KubeClient | None = None
) -> Readyz | None:
    """The newest live pod's ``/readyz``: on its IP, else (``kube``) through the API server's pod proxy;
    neither: ``Readyz(None, why each failed)``."""
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    if not live:
        return None
    pod = max(live, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""))
    url = readyz_url(pod)
    if url is None:
        return None
    try:
        async with httpx.AsyncClient(timeout=timeout) as client:
            res = await client.get(url)
        if agents_answer(res.status_code, res.text):
            return Readyz(res.status_code, res.text[:1024], READYZ_DIRECT)
        # Something else holds that address from here (found by the demo: a pod IP routed off the
        # machine, a proxy's 404): not the agent's word on anything.
        direct = f"{url}: HTTP {res.status_code} from something that is not the status-agent"
    except httpx.HTTPError as exc:
        # The pod's NetworkPolicy admits only the kubelet and the monitoring namespace: from outside the
        # cluster this is the usual answer, not a problem.
        direct = f"{url}: not reachable from here ({type(exc).__name__})"
    path = proxy_path(pod)
    if kube is None or path is None:
        return Readyz(None, direct)
    via = await _through_proxy(kube, path, timeout)
    return via if isinstance(via, Readyz) else Readyz(None, f"{direct}; {via}")


async def _through_proxy(kube: KubeClient, path: str, timeout: float) -> Readyz | str:
    """The agent's answer relayed by the API server, or why there is none: the API server's own refusal
    (a ``Status``: 403 without ``get pods/proxy``, 503 ``error trying to reach service`` when it cannot
    dial the pod either, 400 ``address not allowed``) is told apart from the agent's answer (text)."""
    # gwkit.kube's requests decode JSON answers; the agent's are text: its connection, token and TLS.
    # (Private members: what this wants is a public ``KubeClient.get_raw(path, *, accept, timeout) ->
    # httpx.Response``, the same auth, TLS and write-guard-free GET returning the answer undecoded.)
    try:
        token = await kube._token()
        res = await kube._http.get(
            path, headers=kube._headers(token, accept="*/*"), timeout=timeout, extensions=kube._extensions()
        )
    except (httpx.HTTPError, KubeError) as exc:
        return f"GET {path}: {type(exc).__name__}: {exc}"
    status: Any = None
    if res.headers.get("content-type", "").startswith("application/json"):
        with contextlib.suppress(ValueError):
            status = res.json()
    if isinstance(status, dict) and status.get("kind") == "Status":
        why = (
            f"GET {path}: HTTP {res.status_code} {status.get('reason') or ''}: {status.get('message') or ''}"
        )
        if res.status_code == 403:
            why += " (diagnose needs `get pods/proxy` in the gateway namespace for this detail)"
        return why
    if not agents_answer(res.status_code, res.text):
        return f"GET {path}: HTTP {res.status_code} from something that is not the status-agent"
    return Readyz(res.status_code, res.text[:1024], READYZ_PROXY)
