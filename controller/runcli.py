"""``python -m controller run``'s command line: flags and environment variables -> ``Settings``, then the
operator until SIGTERM/SIGINT. Wiring only.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import secrets
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import yaml

from controller.cloud import Cloud, CloudError, StaticCloud
from controller.leader import AlwaysLeader, LeaderElector
from controller.names import FIELD_MANAGER, GatewayKey
from controller.run import Elector, Metrics, Operator
from controller.settings import (
    GatewayPod,
    NetworkPolicySettings,
    Settings,
    SettingsError,
    check,
    from_config,
    parse_cidrs,
    parse_endpoints,
    parse_labels,
)
from gwkit import httpd
from gwkit.kube import ConfigError, KubeClient, KubeError, load
from gwkit.kube.client import NAMESPACES, NODES

if TYPE_CHECKING:
    from controller.openstack import CallObserver, OpenStackCloud

log = logging.getLogger("controller")
CLUSTER_ID = re.compile(r"^[-._a-zA-Z0-9]{1,64}$")
"""A cluster identity fits a Neutron tag and its filter (no comma)."""
EXIT_OK, EXIT_RUNTIME, EXIT_USAGE = 0, 1, 2

ENV = {
    "namespace": "VPNGW_WATCH_NAMESPACE",
    "internal_source_cidrs": "IPSEC_INTERNAL_SOURCE_CIDRS",
    "gateway_image": "VPNGW_GATEWAY_IMAGE",
    "node_selector": "VPNGW_NODE_SELECTOR",
    "instance": "VPNGW_INSTANCE",
    "leader_election_namespace": "POD_NAMESPACE",
    "config": "VPNGW_CONFIG",
}


class RunFailed(Exception):
    """The operator could not start or stopped on a failure (exit 1)."""


def add_run_parser(sub: Any) -> None:
    r = sub.add_parser(
        "run",
        help="run the operator (reconcile gateways into pods and objects)",
        description=(
            "Reconcile every VPNGateway and legacy IPsecGateway into its plan ConfigMap, Deployment, "
            "NetworkAttachmentDefinition, ServiceAccount, Role, RoleBinding and NetworkPolicy, with leader "
            "election on a Lease. Cluster access: --kubeconfig, else in-cluster, else the $KUBECONFIG files "
            "(merged) or ~/.kube/config; --context picks a context (and means a kubeconfig). Settings come "
            "from flags, environment variables (named below) and --config."
        ),
        epilog="Exit codes: 0 stopped by SIGTERM/SIGINT, 1 runtime failure, 2 bad usage or settings.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    env = os.environ.get
    add_kube_args(r)
    r.add_argument(
        "--namespace", default=env(ENV["namespace"]), help=f"watch only this namespace (${ENV['namespace']})"
    )
    r.add_argument(
        "--internal-source-cidrs",
        default=env(ENV["internal_source_cidrs"], ""),
        metavar="CIDR[,CIDR]",
        help=f"fabric sources allowed to reach reverse exposures (${ENV['internal_source_cidrs']})",
    )
    r.add_argument(
        "--gateway-image",
        default=env(ENV["gateway_image"], GatewayPod.image),
        help=f"the gateway pods' image (${ENV['gateway_image']})",
    )
    r.add_argument(
        "--image-pull-policy",
        choices=("Always", "IfNotPresent", "Never"),
        default="IfNotPresent",
        help="the gateway pods' containers' imagePullPolicy",
    )
    r.add_argument(
        "--node-selector",
        default=env(ENV["node_selector"], ""),
        metavar="K=V[,K=V]",
        help=f"nodes gateways may be pinned to (${ENV['node_selector']})",
    )
    r.add_argument("--max-gateways-per-node", type=int, default=0, help="0: no cap (Nova's interface limit)")
    r.add_argument(
        "--allow-ha",
        action="store_true",
        help="let tenants run warm-standby HA gateways (spec.ha.enabled: two pods, nodes and NIC2s each; "
        "docs/ha.md); without it such a gateway runs one pod",
    )
    r.add_argument(
        "--ha-lease-seconds",
        type=int,
        default=3,
        help="HA gateways' Lease duration: the failover's main term; longer rides out API server stalls",
    )
    r.add_argument(
        "--ha-renew-seconds",
        type=float,
        default=1.0,
        help="how often an HA gateway's holder renews its Lease",
    )
    r.add_argument(
        "--gateway-sysctls",
        choices=("pod", "privileged-init", "none"),
        default="pod",
        help="how init-nat gets a forwarding namespace: the pod's securityContext.sysctls (the kubelet must "
        "allow net.ipv4.ip_forward and net.ipv4.conf.all.rp_filter), a privileged init container, or the "
        "node's runtime",
    )
    r.add_argument(
        "--wireguard-mode",
        choices=("kernel", "wireguard-go"),
        default="kernel",
        help="WireGuard gateways: the node's kernel module, or a wireguard-go container in the pod",
    )
    r.add_argument("--wireguard-interface", default="wg0", help="the WireGuard device's name in the pod")
    r.add_argument(
        "--config",
        type=Path,
        default=env(ENV["config"]),
        help="YAML settings: gatewayPod (resources, tolerations, nodeSelector, nadTemplate, "
        "priorityClassName), staticNICs, networkPolicy, internalSourceCIDRs, "
        f"allowances (per tenant namespace) (${ENV['config']}; docs/controller.md)",
    )
    r.add_argument(
        "--cloud",
        choices=("static", "openstack"),
        default=env("VPNGW_CLOUD", "static"),
        help="where NIC2 comes from: staticNICs in --config, or OpenStack (a Neutron port per gateway) "
        "($VPNGW_CLOUD)",
    )
    add_openstack_args(r)
    r.add_argument("--monitoring-namespace", default="monitoring", help="may scrape the gateway exporters")
    r.add_argument(
        "--apiserver-endpoints",
        default="",
        metavar="CIDR:PORT[,...]",
        help="the API server's endpoints, for the gateway pods' egress NetworkPolicy "
        "(empty: any address on 443 and 6443)",
    )
    r.add_argument(
        "--gateway-namespace",
        default=env("VPNGW_GATEWAY_NAMESPACE", "vpngw-gateways"),
        help="where the gateway pods and their objects live, never a tenant's namespace "
        "($VPNGW_GATEWAY_NAMESPACE; Pod Security privileged)",
    )
    r.add_argument(
        "--migrate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="delete gateway objects an earlier release made in tenant namespaces (needs the chart's "
        "migration rights)",
    )
    r.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="hold a Lease before reconciling (more replicas wait as standbys)",
    )
    r.add_argument(
        "--leader-election-namespace",
        default=env(ENV["leader_election_namespace"], "vpngw-system"),
        help=f"where the Lease lives (${ENV['leader_election_namespace']})",
    )
    r.add_argument("--leader-election-id", default="vpngw-controller", help="the Lease's name")
    r.add_argument("--listen", default="0.0.0.0:8080", help="/healthz, /readyz and /metrics")
    r.add_argument("--workers", type=int, default=4, help="gateways reconciled at the same time")
    r.add_argument(
        "--resync-seconds", type=float, default=600.0, help="every gateway is looked at again this often"
    )
    r.add_argument(
        "--cluster-id",
        default=env("VPNGW_CLUSTER_ID", ""),
        help="this cluster's identity in its cloud resources' tags, what the sweep of gateways gone "
        "without their finalizer may touch (empty: the kube-system namespace's uid, read at start; "
        "$VPNGW_CLUSTER_ID)",
    )
    r.add_argument(
        "--sweep-grace-seconds",
        type=float,
        default=300.0,
        help="cloud resources of a gateway that does not exist are released only once older than this",
    )


def add_gateway_arg(p: Any) -> None:
    """The GATEWAY positional, the same on every subcommand that names one gateway (``gateway_key``)."""
    p.add_argument(
        "gateway", metavar="GATEWAY", help="[KIND/]NAMESPACE/NAME; KIND VPNGateway or IPsecGateway"
    )


def add_kube_args(
    p: Any, kubeconfig_help: str = "kubeconfig file (unset: in-cluster, else $KUBECONFIG)"
) -> None:
    """``--kubeconfig`` and ``--context``, the same on every subcommand that talks to the cluster."""
    p.add_argument("--kubeconfig", type=Path, help=kubeconfig_help)
    p.add_argument("--context", help="the kubeconfig context to use (unset: its current-context)")


def add_openstack_args(r: Any) -> None:
    """The OpenStack flags ``run`` and ``adopt`` share (and the installation's name, which tags)."""
    env = os.environ.get
    r.add_argument("--os-cloud", default=env("OS_CLOUD"), help="the clouds.yaml entry ($OS_CLOUD)")
    r.add_argument(
        "--gateway-network",
        default=env("VPNGW_GATEWAY_NETWORK"),
        help="Neutron network for gateway ports ($VPNGW_GATEWAY_NETWORK)",
    )
    r.add_argument(
        "--gateway-subnet",
        default=env("VPNGW_GATEWAY_SUBNET"),
        help="its subnet (default: its only IPv4 subnet; $VPNGW_GATEWAY_SUBNET)",
    )
    r.add_argument(
        "--external-network",
        default=env("VPNGW_EXTERNAL_NETWORK"),
        help="where floating IPs come from ($VPNGW_EXTERNAL_NETWORK)",
    )
    r.add_argument(
        "--instance",
        default=env(ENV["instance"], "vpngw"),
        help=f"this installation's name, in the tags of its cloud resources (${ENV['instance']})",
    )


def add_adopt_parser(sub: Any) -> None:
    a = sub.add_parser(
        "adopt",
        help="make an existing Neutron port (and its floating IP) a gateway's, e.g. one the earlier "
        "release created",
        description=(
            "Tag an existing port on the gateway network, and the floating IP on it, as GATEWAY's, so the "
            "controller uses them instead of creating new ones: a gateway moved from the earlier release "
            "keeps its address and floating IP, and no remote peer changes anything. Run it before the "
            "gateway's first reconcile. Refused, with nothing tagged, when the port is on another network, "
            "when it or its floating IP is tagged for another gateway or installation, or when the gateway "
            "already has a port. Needs the same cloud credentials as the controller."
        ),
        epilog="Exit codes: 0 adopted (or already the gateway's), 1 the cloud failed, 2 bad usage or "
        "refused.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_gateway_arg(a)
    a.add_argument("port", metavar="PORT_ID", help="the Neutron port to adopt")
    a.add_argument("--dry-run", action="store_true", help="check and report, tag nothing")
    a.add_argument(
        "--force",
        action="store_true",
        help="adopt a port attached to a server that is not one of the cluster's nodes (or when the nodes "
        "cannot be read): the reconcile moves it to the gateway's node",
    )
    add_kube_args(a, "the cluster, for its nodes and identity (unset: in-cluster or $KUBECONFIG)")
    a.add_argument(
        "--cluster-id",
        default=os.environ.get("VPNGW_CLUSTER_ID", ""),
        help="as the controller's (empty: the kube-system namespace's uid)",
    )
    add_openstack_args(a)


def gateway_key(text: str) -> GatewayKey:
    parts = text.split("/")
    if len(parts) == 2:
        parts = ["VPNGateway", *parts]
    if len(parts) == 3 and all(parts):
        if parts[0] == "VPNGateway":
            return GatewayKey("VPNGateway", parts[1], parts[2])
        if parts[0] == "IPsecGateway":
            return GatewayKey("IPsecGateway", parts[1], parts[2])
    raise SettingsError(f"GATEWAY {text!r}: must be [VPNGateway|IPsecGateway/]NAMESPACE/NAME")


def adopt_command(args: argparse.Namespace) -> int:
    from controller.openstack import AdoptionRefused

    key = gateway_key(args.gateway)
    nodes, cluster = anyio.run(_cluster_facts, args)
    cloud = openstack_cloud(args, args.instance, cluster=args.cluster_id or cluster)
    try:
        got = cloud.adopt(key, args.port, nodes=nodes, force=args.force, dry_run=args.dry_run)
    except AdoptionRefused as exc:
        print(f"error: {exc}", file=sys.stderr)
        log.error("adopt.refused gateway=%s port=%s reason=%r", key, args.port, str(exc))
        return EXIT_USAGE
    except CloudError as exc:
        log.error("adopt.failed gateway=%s port=%s error=%r", key, args.port, str(exc))
        return EXIT_RUNTIME
    verb = "would tag" if args.dry_run else "tagged"
    fips = ", ".join(got.floating_ips) or "-"
    what = ", ".join(got.tagged) or "nothing (already the gateway's)"
    on = f" on server {got.server} (moved to the gateway's node by its reconcile)" if got.server else ""
    print(f"{key}: port {got.port_id} address {got.address}{on} floating IP(s) {fips}; {verb}: {what}")
    return EXIT_OK


async def _cluster_facts(args: argparse.Namespace) -> tuple[frozenset[str] | None, str | None]:
    """The servers behind the cluster's Nodes and its identity, for ``adopt``; (None, None), warned, when
    the cluster cannot be asked (a port attached to a server then needs --force)."""
    from controller.openstack import server_of

    try:
        config = await anyio.to_thread.run_sync(lambda: load(args.kubeconfig, context=args.context))
        async with KubeClient(config, user_agent="vpngw-adopt") as kube:
            items, _ = await kube.list(NODES)
            uid = await kube_system_uid(kube)
    except (ConfigError, KubeError) as exc:
        log.warning("adopt.no_cluster error=%r: the nodes and the cluster's identity are unknown", str(exc))
        return None, None
    servers = {s for n in items if (s := server_of((n.get("spec") or {}).get("providerID")))}
    return frozenset(servers), uid


def settings_of(args: argparse.Namespace) -> Settings:
    s = Settings(
        internal_source_cidrs=parse_cidrs(args.internal_source_cidrs or "", "--internal-source-cidrs"),
        namespace=args.namespace or None,
        wireguard_interface=args.wireguard_interface,
        pod=GatewayPod(
            image=args.gateway_image,
            image_pull_policy=args.image_pull_policy,
            node_selector=parse_labels(args.node_selector or "", "--node-selector"),
            max_gateways_per_node=args.max_gateways_per_node,
            sysctls=args.gateway_sysctls,
            wireguard=args.wireguard_mode,
            log_format=getattr(args, "log_format", "text"),  # the controller's own --log-format
        ),
        network_policy=NetworkPolicySettings(
            monitoring_namespace=args.monitoring_namespace,
            api_server=parse_endpoints(args.apiserver_endpoints or "", "--apiserver-endpoints"),
        ),
        cloud=args.cloud,
        operator_namespace=args.leader_election_namespace,
        gateway_namespace=args.gateway_namespace,
        migrate=args.migrate,
        instance=args.instance,
        ha_allowed=args.allow_ha,
        ha_lease_seconds=args.ha_lease_seconds,
        ha_renew_seconds=args.ha_renew_seconds,
    )
    if args.config is not None:
        try:
            doc = yaml.safe_load(Path(args.config).read_text())
        except OSError as exc:
            raise SettingsError(f"--config {args.config}: cannot read: {exc.strerror or exc}") from exc
        except yaml.YAMLError as exc:
            raise SettingsError(f"--config {args.config}: not YAML: {exc}") from exc
        cli_cidrs = s.internal_source_cidrs
        s = from_config(doc, s)
        if cli_cidrs:
            s = replace(s, internal_source_cidrs=cli_cidrs)  # the flag (or env) wins over the file
    if not 1 <= args.workers <= 64:
        raise SettingsError("--workers: must be 1-64")
    if not 10 <= args.resync_seconds <= 86400:  # also refuses nan
        raise SettingsError("--resync-seconds: must be 10-86400")
    try:
        httpd.split_listen(args.listen)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    return check(s)


def cloud_of(
    s: Settings,
    args: argparse.Namespace,
    guard: Callable[[], bool] | None = None,
    cluster: str | None = None,
    *,
    observe: CallObserver | None = None,
) -> Cloud:
    if s.cloud == "static":
        return StaticCloud(s.static_nics)
    return openstack_cloud(args, s.instance, guard, cluster, observe=observe)


async def kube_system_uid(kube: KubeClient) -> str | None:
    """The kube-system namespace's uid (the usual cluster identity), None when there is no such namespace;
    raises KubeError when the API cannot be asked."""
    items, _ = await kube.list(NAMESPACES, field_selector="metadata.name=kube-system", limit=1)
    uid = str((items[0].get("metadata") or {}).get("uid") or "") if items else ""
    return uid or None


async def cluster_identity(kube: KubeClient, *, attempts: int = 8) -> str:
    """The kube-system namespace's uid (the usual cluster identity, in every cloud resource's tags: what the
    sweep may touch). Retried with backoff (about a minute); RunFailed when it cannot be read: running
    without it would create resources another cluster's sweep could take for its own."""
    delay, error = 0.5, ""
    for attempt in range(attempts):
        try:
            uid = await kube_system_uid(kube)
        except KubeError as exc:
            error = str(exc)
            log.warning("controller.cluster_id_unreadable attempt=%d error=%r", attempt + 1, error)
            await anyio.sleep(delay)
            delay = min(delay * 2, 15.0)
            continue
        if uid:
            return uid
        error = "the cluster has no kube-system namespace"
        break
    raise RunFailed(f"the cluster's identity (kube-system's uid) cannot be read: {error}; set --cluster-id")


async def cluster_id(kube: KubeClient, given: str, *, attempts: int = 8) -> str:
    """The cluster identity the controller tags its cloud resources with: ``given`` (``--cluster-id``),
    else ``cluster_identity`` (``attempts`` tries); what ``run`` uses, and ``diagnose`` to tell the
    controller's resources from another cluster's. SettingsError when it does not fit a tag."""
    cluster = given or await cluster_identity(kube, attempts=attempts)
    if not CLUSTER_ID.match(cluster):
        raise SettingsError(f"--cluster-id {cluster!r}: letters, digits, '-', '_' and '.' only, at most 64")
    return cluster


def openstack_cloud(
    args: argparse.Namespace,
    instance: str,
    guard: Callable[[], bool] | None = None,
    cluster: str | None = None,
    *,
    observe: CallObserver | None = None,
) -> OpenStackCloud:
    for flag, value in (("--os-cloud", args.os_cloud), ("--gateway-network", args.gateway_network),
                        ("--external-network", args.external_network)):  # fmt: skip
        if not value:
            raise SettingsError(f"{flag}: required with --cloud openstack")
    import openstack
    import openstack.exceptions

    from controller.openstack import OpenStackCloud, OpenStackSettings

    try:
        # No retries inside the SDK: a POST whose answer was lost would be re-sent (a second port); the
        # reconcile retries, after finding what exists by tag.
        conn = openstack.connect(
            cloud=args.os_cloud, connect_retries=0, status_code_retries=0, api_timeout=30
        )
    except openstack.exceptions.ConfigException as exc:
        raise SettingsError(f"--os-cloud {args.os_cloud}: {exc}") from exc
    return OpenStackCloud(
        conn,
        OpenStackSettings(
            args.gateway_network, args.external_network, args.gateway_subnet, instance, cluster=cluster
        ),
        guard=guard,
        observe=observe,
    )


def run_command(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    try:
        config = load(args.kubeconfig, context=args.context)
    except ConfigError as exc:
        raise SettingsError(str(exc)) from exc
    return anyio.run(_run, args, settings, config)


async def _run(args: argparse.Namespace, settings: Settings, config: Any) -> int:
    identity = f"{socket.gethostname()}_{secrets.token_hex(4)}"
    # Two clients: the Lease's own (renewals never wait behind the reconciles' requests), and the
    # reconciles', which sends no write once this replica no longer leads (``leads``: by the clock, also
    # before the elector's task noticed), as the cloud starts no step then.
    metrics = Metrics()  # before the clients: they report their requests to it
    async with contextlib.AsyncExitStack() as stack:
        lease_kube = await stack.enter_async_context(
            KubeClient(
                config,
                field_manager=FIELD_MANAGER,
                user_agent="vpngw-controller",
                observe=metrics.api_request,
            )
        )
        elector: Elector
        if args.leader_elect:
            elector = LeaderElector(
                lease_kube, settings.operator_namespace, args.leader_election_id, identity
            )
        else:
            elector = AlwaysLeader()
        kube = await stack.enter_async_context(
            KubeClient(
                config,
                field_manager=FIELD_MANAGER,
                user_agent="vpngw-controller",
                write_guard=elector.leads,
                observe=metrics.api_request,
            )
        )
        cluster = await cluster_id(kube, args.cluster_id) if settings.cloud == "openstack" else None
        cloud = cloud_of(settings, args, elector.leads, cluster, observe=metrics.cloud_call)
        op = Operator(kube, settings, cloud, elector,
                      workers=args.workers, resync_seconds=args.resync_seconds,
                      sweep_grace_seconds=args.sweep_grace_seconds, metrics=metrics)  # fmt: skip
        log.info(
            "controller.starting identity=%s api=%s source=%s namespace=%s instance=%s cloud=%s "
            "cluster=%s leader_elect=%s",
            identity,
            config.server,
            config.source,
            settings.namespace or "*",
            settings.instance,
            settings.cloud,
            cluster or "-",
            "yes" if args.leader_elect else "no",
        )
        async with anyio.create_task_group() as tg:

            async def stop_on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for signum in signals:
                        log.info("controller.stopping signal=%s", signal.Signals(signum).name)
                        tg.cancel_scope.cancel()
                        return

            tg.start_soon(stop_on_signal)
            try:
                await tg.start(op.run, args.listen)
            except OSError as exc:
                raise RunFailed(f"--listen {args.listen}: {exc.strerror or exc}") from exc
        # Every worker has stopped: hand the Lease over at once instead of letting it run out.
        await elector.release()
    return 0
