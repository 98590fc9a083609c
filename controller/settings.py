"""The operator's settings: parsed once into frozen dataclasses, documented field by field.

They come from flags and environment variables (``python -m controller run --help``) and, for what does
not fit a flag (resources, tolerations, the NAD template), an optional YAML file (``--config``, the chart
mounts one from a ConfigMap). Everything is validated here, with the field named, before the controller
talks to anything: a bad setting is exit 2, never a half-running operator.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Literal

import gwplan

DEFAULT_GATEWAY_IMAGE = "localhost/vpngw-gateway:0.1.0"
DEFAULT_NAD_TEMPLATE = '{"cniVersion": "0.3.1", "name": "$name", "type": "host-device", "hwaddr": "$mac"}'
"""Multus' host-device plugin moving the Neutron port with this MAC into the pod (the seed's verified
default). ``$mac``, ``$name`` (the NAD's name) and ``$namespace`` are substituted; the result must be JSON."""

SysctlMode = Literal["pod", "privileged-init", "none"]
WireGuardMode = Literal["kernel", "wireguard-go"]
LogFormat = Literal["text", "json"]


class SettingsError(ValueError):
    """A setting is invalid; the message names it and the rule."""


@dataclass(frozen=True)
class ContainerResources:
    requests: Mapping[str, str] = field(default_factory=dict)
    limits: Mapping[str, str] = field(default_factory=dict)

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.requests:
            out["requests"] = dict(self.requests)
        if self.limits:
            out["limits"] = dict(self.limits)
        return out


DEFAULT_RESOURCES: Mapping[str, ContainerResources] = {
    "init-nat": ContainerResources({"cpu": "10m", "memory": "48Mi"}, {"memory": "128Mi"}),
    "charon": ContainerResources({"cpu": "50m", "memory": "32Mi"}, {"memory": "256Mi"}),
    "wireguard-go": ContainerResources({"cpu": "50m", "memory": "32Mi"}, {"memory": "256Mi"}),
    "status-agent": ContainerResources({"cpu": "20m", "memory": "64Mi"}, {"memory": "192Mi"}),
    "exporter": ContainerResources({"cpu": "20m", "memory": "48Mi"}, {"memory": "128Mi"}),
}
"""Measured footprints with headroom (docs/controller.md): the agents' RSS is 40-70 MB, charon's 10-20 MB."""


@dataclass(frozen=True)
class GatewayPod:
    """How gateway pods are built (the same for every gateway of this operator)."""

    image: str = DEFAULT_GATEWAY_IMAGE
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    node_selector: Mapping[str, str] = field(default_factory=dict)
    """Nodes a gateway may be pinned to (labels they must carry); empty: every Ready node."""
    tolerations: tuple[Mapping[str, Any], ...] = ()
    """Added to the not-ready/unreachable NoExecute 30 s tolerations every gateway pod has."""
    max_gateways_per_node: int = 0
    """Nova's per-instance interface limit: a node holding this many gateways is skipped (0: no cap)."""
    priority_class_name: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    """Secrets in the gateway namespace the gateway pods pull their image with."""
    resources: Mapping[str, ContainerResources] = field(default_factory=lambda: dict(DEFAULT_RESOURCES))
    nad_template: str = DEFAULT_NAD_TEMPLATE
    sysctls: SysctlMode = "pod"
    """How init-nat gets a forwarding namespace: ``pod`` sets ``securityContext.sysctls`` (the kubelet must
    allow them: --allowed-unsafe-sysctls=net.ipv4.ip_forward,net.ipv4.conf.all.rp_filter),
    ``privileged-init`` runs the init container privileged, ``none`` relies on the node's runtime
    (init-nat fails loudly if it does not forward)."""
    wireguard: WireGuardMode = "kernel"
    """``kernel``: the agent creates the device over netlink; ``wireguard-go``: a container runs it."""
    health_port: int = 8081
    metrics_port: int = 9100
    termination_grace_seconds: int = 10
    log_format: LogFormat = "text"
    """``--log-format`` of the pod's programs (init-nat, status-agent, exporter): the controller's own, so one
    installation's log lines are all parsed the same way. ``text`` adds no flag (the programs' default),
    so the pod template of a text installation is the same as before the setting existed."""


@dataclass(frozen=True)
class NetworkPolicySettings:
    monitoring_namespace: str = "monitoring"
    """Its pods may scrape the exporter's port."""
    dns_namespace: str = "kube-system"
    dns_pod_labels: Mapping[str, str] = field(default_factory=lambda: {"k8s-app": "kube-dns"})
    api_server: tuple[tuple[str, int], ...] = ()
    """(CIDR, port) of the API server's endpoints: the agent's only other egress. Empty: egress to any
    address on port 443 and 6443 (the API server's address is not known)."""


STATIC_SLOT_B = "#b"
"""The ``staticNICs`` key suffix of a warm-standby gateway's second slot: ``namespace/name#b``."""


@dataclass(frozen=True)
class StaticNic:
    mac: str
    address: str
    """With prefix."""
    gateway: str
    public_ip: str | None = None


@dataclass(frozen=True)
class Allowance:
    """What a namespace's gateways may reach in shared infrastructure. Tenants choose exposure targets
    and ClusterLink routers, but both reach what other tenants and the cloud share: the operator says
    which, per namespace (docs/security.md). The default allows nothing."""

    exposure_targets: tuple[str, ...] = ()
    """CIDRs an exposure's target (an address, or what a host name resolves to in the pod) must lie in."""
    routers: tuple[str, ...] = ()
    """Router ids a ClusterLink may name (its gateways' reverse-exposure routes go there)."""
    service_cidrs: tuple[str, ...] | None = None
    """Ranges its gateways' serviceCIDRs must lie in; None: any range the other rules leave (the
    serviceCIDRs of one transit network are first come, first served: this keeps one tenant from
    claiming a range others need)."""


@dataclass(frozen=True)
class Settings:
    internal_source_cidrs: tuple[str, ...] = ()
    """IPSEC_INTERNAL_SOURCE_CIDRS: fabric sources allowed to reach reverse exposures."""
    namespace: str | None = None
    """Watch only this namespace (None: all)."""
    wireguard_interface: str = "wg0"
    pod: GatewayPod = field(default_factory=GatewayPod)
    network_policy: NetworkPolicySettings = field(default_factory=NetworkPolicySettings)
    cloud: Literal["static", "openstack"] = "static"
    static_nics: Mapping[str, StaticNic] = field(default_factory=dict)
    """``namespace/name`` -> NIC2 of that gateway (the static cloud backend); ``namespace/name#b`` -> NIC2
    of its slot b when it runs with warm-standby HA (``controller.cloud.StaticCloud``: its own MAC and
    address; no publicIP of its own, as the gateway has one public address, which
    the operator routes to the active slot's NIC2)."""
    operator_namespace: str = "vpngw-system"
    gateway_namespace: str = "vpngw-gateways"
    """Where the gateway pods and their objects live: the operator's, never a tenant's (the pods hold
    NET_ADMIN, NET_RAW and unsafe sysctls; the chart makes it with Pod Security ``privileged``)."""
    migrate: bool = True
    """Delete what an earlier release made in tenant namespaces (the pod's Deployment, ConfigMap, ...)
    once the gateway's objects live in the gateway namespace (needs the chart's migration rights)."""
    instance: str = "vpngw"
    """This operator installation's name: labels and (OpenStack) tags carry it, so two installations in one
    cluster or cloud never touch each other's objects."""
    allowances: Mapping[str, Allowance] = field(default_factory=dict)
    """namespace -> what its gateways may reach; a namespace not named gets ``default_allowance``."""
    default_allowance: Allowance = field(default_factory=Allowance)
    """For every namespace without its own entry: nothing, unless the operator says otherwise."""
    ha_lease_seconds: int = 3
    """HA gateways' Lease duration: a holder that stopped renewing is replaced after it (the active fences
    itself 1 s earlier). Shorter: faster failovers; longer: API server stalls (etcd elections, API Priority
    and Fairness queueing) do not fence a healthy active (docs/ha.md)."""
    ha_renew_seconds: float = 1.0
    """How often the holder renews (and the standby looks); below ``ha_lease_seconds``."""
    ha_allowed: bool = False
    """Tenants may run warm-standby HA gateways (``spec.ha.enabled``: a second pod, node slot and NIC2 per
    gateway; docs/ha.md). Off: such a gateway runs one pod and ``StandbyReady`` says why."""

    def allowance(self, namespace: str) -> Allowance:
        return self.allowances.get(namespace, self.default_allowance)


_LABEL_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_QUANTITY = re.compile(
    r"(?P<number>[0-9]+(\.[0-9]*)?|\.[0-9]+)(?P<suffix>[numkMGTPE]?|[KMGTPE]i|[eE][-+]?[0-9]{1,3})"
)
_DECIMAL_SI = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SI = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_MAX_QUANTITY = (1 << 63) - 1


def _power_of_ten(suffix: str) -> int:
    """A decimal SI suffix's (``k``: 3) or an exponent's (``e3``, ``E-3``)."""
    return _DECIMAL_SI[suffix] if suffix in _DECIMAL_SI else int(suffix[1:])


def canonical_quantity(text: str) -> str:
    """``text`` as the API server stores it: a ``resource.Quantity`` printed in canonical form
    (k8s.io/apimachinery pkg/api/resource quantity.go, ``ParseQuantity`` then ``CanonicalizeBytes``). The
    suffix family stays: decimal SI and exponents print decimal (``0.5`` -> ``500m``, ``1000m`` -> ``1``,
    ``1e3`` -> ``1e3``); binary SI prints binary when the value is a whole number of at least 1024
    (``1024Mi`` -> ``1Gi``), else decimal SI (``0.5Gi`` -> ``512Mi``, ``0.1Gi`` -> ``107374182400m``); the
    exponent is the largest (a multiple of 3, of 10 for binary) that loses no digit, and a value finer
    than 1m is rounded up to 1m (as ``SetDefaults_ResourceList``, kubernetes pkg/apis/core/v1/defaults.go,
    rounds every request and limit). A setting in this form is one the server stores unchanged, so the
    Deployment the controller writes is the Deployment it reads back. Raises ValueError (no sign: the
    server refuses negative resources; at most 2^63-1)."""
    m = _QUANTITY.fullmatch(text)
    if m is None:
        raise ValueError("not a quantity (e.g. 250m, 0.5, 64Mi, 1Gi, 1e3)")
    number, suffix = m["number"], m["suffix"]
    value = Fraction(number)
    binary = suffix in _BINARY_SI
    if binary:
        value *= 1 << (10 * _BINARY_SI[suffix])
    else:
        value *= Fraction(10) ** _power_of_ten(suffix)
    value = Fraction(math.ceil(value * 1000), 1000)  # SetDefaults_ResourceList: rounded up to 1m
    if value > _MAX_QUANTITY:
        raise ValueError(f"more than {_MAX_QUANTITY}, the largest quantity")
    if value == 0:
        return "0"
    if binary and value >= 1024 and value.denominator == 1:
        whole, power = int(value), 0
        while whole % 1024 == 0:
            whole, power = whole // 1024, power + 1
        return f"{whole}{next(k for k, v in _BINARY_SI.items() if v == power) if power else ''}"
    exponent = 0
    while value.denominator != 1:
        value, exponent = value * 10, exponent - 1
    mantissa = int(value)
    while mantissa % 10 == 0:
        mantissa, exponent = mantissa // 10, exponent + 1
    mantissa, exponent = mantissa * 10 ** (exponent % 3), exponent - exponent % 3
    if suffix not in _DECIMAL_SI and not binary:  # an exponent (e3): printed as one
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)
    return f"{mantissa}{next(k for k, v in _DECIMAL_SI.items() if v == exponent)}"


TOLERATION_KEYS = ("key", "operator", "value", "effect", "tolerationSeconds")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_QUALIFIED_NAME = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)


def canonical_toleration(doc: Any, what: str) -> dict[str, Any]:
    """A toleration as the API server stores it (``core/v1 Toleration``: its five fields, the empty ones
    left out as ``omitempty`` does), refused here by the rules of ``ValidateTolerations``
    (kubernetes pkg/apis/core/validation/validation.go) with the field named."""
    if not isinstance(doc, Mapping):
        raise SettingsError(
            f"{what}: expected a toleration (key, operator, value, effect, tolerationSeconds)"
        )
    unknown = sorted(str(k) for k in doc if k not in TOLERATION_KEYS)
    if unknown:
        raise SettingsError(
            f"{what}: unknown field(s) {', '.join(unknown)} (a toleration has {', '.join(TOLERATION_KEYS)};"
            " the API server would drop them)"
        )
    out: dict[str, Any] = {}
    for k in ("key", "operator", "value", "effect"):
        v = doc.get(k)
        if v is not None and not isinstance(v, str):
            raise SettingsError(f"{what}.{k}: {v!r} is not a string")
        if v:
            out[k] = v
    seconds = doc.get("tolerationSeconds")
    if seconds is not None:
        if isinstance(seconds, float) and seconds.is_integer():
            seconds = int(seconds)  # Helm's numbers are float64
        if isinstance(seconds, bool) or not isinstance(seconds, int):
            raise SettingsError(f"{what}.tolerationSeconds: {seconds!r} is not a whole number of seconds")
        out["tolerationSeconds"] = seconds
    key, op, value, effect = (str(out.get(k, "")) for k in ("key", "operator", "value", "effect"))
    if key and (not _QUALIFIED_NAME.fullmatch(key) or len(key.rpartition("/")[2]) > 63 or len(key) > 317):
        raise SettingsError(f"{what}.key: {key!r} is not a qualified name ([prefix/]name, as a label key)")
    if not key and op != "Exists":
        raise SettingsError(
            f"{what}.operator: must be Exists when key is empty (it then matches every taint)"
        )
    if "tolerationSeconds" in out and effect != "NoExecute":
        raise SettingsError(f"{what}.effect: must be NoExecute when tolerationSeconds is set")
    if op not in ("", "Equal", "Exists"):
        raise SettingsError(f"{what}.operator: {op!r} is not Equal or Exists")
    if op == "Exists" and value:
        raise SettingsError(f"{what}.value: must be empty when operator is Exists")
    if op != "Exists" and not _LABEL_VALUE.fullmatch(value):
        raise SettingsError(f"{what}.value: {value!r} is not a label value (at most 63 characters)")
    if effect and effect not in TAINT_EFFECTS:
        raise SettingsError(f"{what}.effect: {effect!r} is not one of {', '.join(TAINT_EFFECTS)}")
    return out


_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}")


def parse_labels(text: str, what: str) -> dict[str, str]:
    """``k=v,k2=v2`` (a label selector of equalities)."""
    out: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
            raise SettingsError(f"{what}: {item!r} is not label=value")
        out[key] = value
    return out


def parse_cidrs(text: str, what: str) -> tuple[str, ...]:
    out = []
    for i, c in enumerate(filter(None, (p.strip() for p in text.split(",")))):
        try:
            out.append(str(ipaddress.IPv4Network(c, strict=False)))
        except ValueError:
            raise SettingsError(f"{what}[{i}]: {c!r} is not an IPv4 CIDR") from None
    return tuple(out)


def parse_endpoints(text: str, what: str) -> tuple[tuple[str, int], ...]:
    """``CIDR:PORT,...`` (the API server's endpoints)."""
    out = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        cidr, _, port = item.rpartition(":")
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise SettingsError(f"{what}: {item!r} is not CIDR:PORT")
        out.append((parse_cidrs(cidr, what)[0], int(port)))
    return tuple(out)


def check_nad_template(template: str) -> None:
    try:
        rendered = string.Template(template).substitute(mac="fa:16:3e:00:00:01", name="x", namespace="y")
    except (KeyError, ValueError) as exc:
        raise SettingsError(
            f"nadTemplate: only $mac, $name and $namespace may be substituted ({exc})"
        ) from exc
    try:
        json.loads(rendered)
    except ValueError as exc:
        raise SettingsError(f"nadTemplate: not JSON once substituted: {exc}") from exc
    if "$mac" not in template and "${mac}" not in template:
        raise SettingsError("nadTemplate: must contain $mac (the Neutron port's MAC selects the device)")


def _resources(doc: Any, what: str) -> dict[str, ContainerResources]:
    out = dict(DEFAULT_RESOURCES)
    if doc is None:
        return out
    if not isinstance(doc, Mapping):
        raise SettingsError(f"{what}: expected a mapping of container name to requests/limits")
    for name, body in doc.items():
        if name not in DEFAULT_RESOURCES:
            raise SettingsError(f"{what}.{name}: not a gateway container ({', '.join(DEFAULT_RESOURCES)})")
        if not isinstance(body, Mapping):
            raise SettingsError(f"{what}.{name}: expected requests/limits")
        parts: dict[str, dict[str, str]] = {}
        for part in ("requests", "limits"):
            values = body.get(part) or {}
            if not isinstance(values, Mapping):
                raise SettingsError(f"{what}.{name}.{part}: expected a mapping")
            parts[part] = {}
            for k, v in values.items():
                if k not in ("cpu", "memory") or isinstance(v, bool) or not isinstance(v, str | int | float):
                    raise SettingsError(f"{what}.{name}.{part}.{k}: {v!r} is not a cpu/memory quantity")
                try:
                    parts[part][str(k)] = canonical_quantity(str(v).strip())
                except ValueError as exc:
                    raise SettingsError(f"{what}.{name}.{part}.{k}: {v!r}: {exc}") from None
        for k, request in parts["requests"].items():
            limit = parts["limits"].get(k)
            if limit is not None and _quantity_value(request) > _quantity_value(limit):
                raise SettingsError(
                    f"{what}.{name}.requests.{k}: {request} is more than its limit {limit} (the API server "
                    "refuses a request above its limit: ValidateResourceRequirements)"
                )
        out[str(name)] = ContainerResources(parts["requests"], parts["limits"])
    return out


def _quantity_value(canonical: str) -> Fraction:
    """The value of a quantity ``canonical_quantity`` printed."""
    m = _QUANTITY.fullmatch(canonical)
    assert m is not None
    suffix = m["suffix"]
    if suffix in _BINARY_SI:
        return Fraction(m["number"]) * (1 << (10 * _BINARY_SI[suffix]))
    return Fraction(m["number"]) * Fraction(10) ** _power_of_ten(suffix)


def _static_nics(doc: Any, what: str) -> dict[str, StaticNic]:
    """``staticNICs``: ``namespace/name: {mac, address, gateway, publicIP?}``, and for a warm-standby
    gateway's slot b ``namespace/name#b: {mac, address, gateway}`` beside its slot a entry (its own MAC
    and address, no publicIP: the public address is the gateway's one, and the operator points it at the
    active slot)."""
    out: dict[str, StaticNic] = {}
    if doc is None:
        return out
    if not isinstance(doc, Mapping):
        raise SettingsError(f"{what}: expected a mapping of namespace/name to mac, address, gateway")
    for key, body in doc.items():
        ns, _, rest = str(key).partition("/")
        name, hash_, slot = rest.partition("#")
        if (
            not (_DNS_LABEL.fullmatch(ns) and _DNS_LABEL.fullmatch(name))
            or (hash_ and slot != "b")
            or not isinstance(body, Mapping)
        ):
            raise SettingsError(
                f"{what}: {key!r}: expected namespace/name (or namespace/name{STATIC_SLOT_B}, an HA "
                "gateway's slot b): {mac, address, gateway}"
            )
        mac = str(body.get("mac", "")).lower()
        if not _MAC.fullmatch(mac):
            raise SettingsError(f"{what}.{key}.mac: {body.get('mac')!r} is not a MAC address")
        try:
            iface = ipaddress.IPv4Interface(str(body.get("address", "")))
            gw = ipaddress.IPv4Address(str(body.get("gateway", "")))
        except ValueError as exc:
            raise SettingsError(f"{what}.{key}: address (ADDR/PREFIX) and gateway (ADDR): {exc}") from exc
        if "/" not in str(body.get("address")):
            raise SettingsError(f"{what}.{key}.address: needs a prefix (ADDR/PREFIX)")
        if gw not in iface.network:
            raise SettingsError(f"{what}.{key}.gateway: {gw} is not on {iface.network}")
        public = body.get("publicIP")
        if public is not None and hash_:
            raise SettingsError(
                f"{what}.{key}.publicIP: slot b has no public IP of its own: the gateway's is "
                f"{ns}/{name}'s, and the operator routes it to the active slot's NIC2"
            )
        if public is not None:
            try:
                public = str(ipaddress.IPv4Address(str(public)))
            except ValueError:
                raise SettingsError(f"{what}.{key}.publicIP: {public!r} is not an IPv4 address") from None
        out[f"{ns}/{name}{STATIC_SLOT_B if hash_ else ''}"] = StaticNic(mac, str(iface), str(gw), public)
    for key, b in out.items():
        if not key.endswith(STATIC_SLOT_B):
            continue
        base = key[: -len(STATIC_SLOT_B)]
        a = out.get(base)
        if a is None:
            raise SettingsError(f"{what}.{key}: slot b of {base}, which has no entry of its own (slot a)")
        if a.mac == b.mac or a.address.split("/")[0] == b.address.split("/")[0]:
            raise SettingsError(
                f"{what}.{key}: the same MAC or address as {base}'s: each slot's pod needs its own NIC2"
            )
    return out


_ROUTER_ID = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.]{0,254}")


def _allowance(doc: Any, what: str) -> Allowance:
    if not isinstance(doc, Mapping):
        raise SettingsError(f"{what}: expected a mapping with exposureTargets and clusterLinkRouters")
    known = {"exposureTargets", "clusterLinkRouters", "serviceCIDRs"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise SettingsError(
            f"{what}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )
    targets = doc.get("exposureTargets") or []
    routers = doc.get("clusterLinkRouters") or []
    if not isinstance(targets, list) or not isinstance(routers, list):
        raise SettingsError(f"{what}: exposureTargets and clusterLinkRouters are lists")
    for i, r in enumerate(routers):
        if not isinstance(r, str) or not _ROUTER_ID.fullmatch(r):
            raise SettingsError(f"{what}.clusterLinkRouters[{i}]: {r!r} is not a router id")
    service = doc.get("serviceCIDRs")
    if service is not None and not isinstance(service, list):
        raise SettingsError(f"{what}.serviceCIDRs: expected a list of CIDRs")
    return Allowance(
        parse_cidrs(",".join(map(str, targets)), f"{what}.exposureTargets"),
        tuple(sorted(set(routers))),
        None if service is None else parse_cidrs(",".join(map(str, service)), f"{what}.serviceCIDRs"),
    )


_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _pull_secrets(value: Any, what: str) -> tuple[str, ...]:
    """Secret names, as a list of names or of ``{name: ...}`` (the pod spec's and Helm's form)."""
    if not isinstance(value, list):
        raise SettingsError(f"{what}: expected a list of Secret names")
    out = []
    for i, item in enumerate(value):
        name = item.get("name") if isinstance(item, Mapping) else item
        if not isinstance(name, str) or len(name) > 253 or not _SUBDOMAIN.fullmatch(name):
            raise SettingsError(f"{what}[{i}]: {name!r} is not a Secret name (a DNS-1123 subdomain)")
        out.append(name)
    return tuple(out)


def _allowances(doc: Any, what: str) -> tuple[Allowance, dict[str, Allowance]]:
    if not isinstance(doc, Mapping):
        raise SettingsError(f"{what}: expected a mapping with default and namespaces")
    unknown = sorted(set(doc) - {"default", "namespaces"})
    if unknown:
        raise SettingsError(f"{what}: unknown key(s) {', '.join(unknown)} (known: default, namespaces)")
    default = _allowance(doc["default"], f"{what}.default") if doc.get("default") is not None else Allowance()
    namespaces = doc.get("namespaces") or {}
    if not isinstance(namespaces, Mapping):
        raise SettingsError(f"{what}.namespaces: expected a mapping of namespace to allowance")
    out = {}
    for ns, body in namespaces.items():
        if not _DNS_LABEL.fullmatch(str(ns)):
            raise SettingsError(f"{what}.namespaces: {ns!r} is not a namespace name")
        out[str(ns)] = _allowance(body, f"{what}.namespaces.{ns}")
    return default, out


def from_config(doc: Any, base: Settings | None = None) -> Settings:
    """Settings from a ``--config`` YAML document (camelCase keys, see docs/controller.md) over ``base``."""
    s = base or Settings()
    if doc is None:
        return s
    if not isinstance(doc, Mapping):
        raise SettingsError("config: expected a mapping")
    known = {"gatewayPod", "networkPolicy", "staticNICs", "internalSourceCIDRs", "allowances"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise SettingsError(
            f"config: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )
    pod = doc.get("gatewayPod") or {}
    if not isinstance(pod, Mapping):
        raise SettingsError("config.gatewayPod: expected a mapping")
    p = s.pod
    if "nadTemplate" in pod:
        check_nad_template(str(pod["nadTemplate"]))
        p = replace(p, nad_template=str(pod["nadTemplate"]))
    if "nodeSelector" in pod:
        sel = pod["nodeSelector"] or {}
        if not isinstance(sel, Mapping):
            raise SettingsError("config.gatewayPod.nodeSelector: expected a mapping")
        p = replace(
            p, node_selector=parse_labels(",".join(f"{k}={v}" for k, v in sel.items()), "nodeSelector")
        )
    if "tolerations" in pod:
        tol = pod["tolerations"] or []
        if not isinstance(tol, list):
            raise SettingsError("config.gatewayPod.tolerations: expected a list of tolerations")
        p = replace(
            p,
            tolerations=tuple(
                canonical_toleration(t, f"config.gatewayPod.tolerations[{i}]") for i, t in enumerate(tol)
            ),
        )
    if "resources" in pod:
        p = replace(p, resources=_resources(pod["resources"], "config.gatewayPod.resources"))
    if "priorityClassName" in pod:
        p = replace(p, priority_class_name=str(pod["priorityClassName"]) or None)
    if "imagePullSecrets" in pod:
        p = replace(
            p, image_pull_secrets=_pull_secrets(pod["imagePullSecrets"], "config.gatewayPod.imagePullSecrets")
        )
    s = replace(s, pod=p)
    if "staticNICs" in doc:
        s = replace(s, static_nics=_static_nics(doc["staticNICs"], "config.staticNICs"))
    if "internalSourceCIDRs" in doc:
        cidrs = doc["internalSourceCIDRs"] or []
        s = replace(s, internal_source_cidrs=parse_cidrs(",".join(map(str, cidrs)), "internalSourceCIDRs"))
    if "allowances" in doc:
        default, namespaces = _allowances(doc["allowances"] or {}, "config.allowances")
        s = replace(s, default_allowance=default, allowances=namespaces)
    np = doc.get("networkPolicy") or {}
    if np:
        if not isinstance(np, Mapping):
            raise SettingsError("config.networkPolicy: expected a mapping")
        n = s.network_policy
        if "monitoringNamespace" in np:
            n = replace(n, monitoring_namespace=str(np["monitoringNamespace"]))
        if "dnsNamespace" in np:
            n = replace(n, dns_namespace=str(np["dnsNamespace"]))
        if "dnsPodLabels" in np:
            n = replace(n, dns_pod_labels={str(k): str(v) for k, v in (np["dnsPodLabels"] or {}).items()})
        if "apiServer" in np:
            n = replace(n, api_server=parse_endpoints(",".join(map(str, np["apiServer"] or [])), "apiServer"))
        s = replace(s, network_policy=n)
    return s


def check(s: Settings) -> Settings:
    """Cross-field rules; returns ``s``."""
    if not gwplan.is_device_name(s.wireguard_interface):
        raise SettingsError(f"--wireguard-interface: {s.wireguard_interface!r}: {gwplan.DEVICE_NAME_RULE}")
    if s.namespace is not None and not _DNS_LABEL.fullmatch(s.namespace):
        raise SettingsError(f"--namespace: {s.namespace!r} is not a namespace name")
    if not _DNS_LABEL.fullmatch(s.instance):
        raise SettingsError(f"--instance: {s.instance!r} is not a DNS label")
    if not _DNS_LABEL.fullmatch(s.gateway_namespace):
        raise SettingsError(f"--gateway-namespace: {s.gateway_namespace!r} is not a namespace name")
    if s.ha_lease_seconds < 2:
        raise SettingsError(f"--ha-lease-seconds {s.ha_lease_seconds}: must be at least 2")
    if not 0 < s.ha_renew_seconds <= s.ha_lease_seconds / 2:
        raise SettingsError(
            f"--ha-renew-seconds {s.ha_renew_seconds:g}: must be above 0 and at most half of "
            f"--ha-lease-seconds ({s.ha_lease_seconds}), so a holder gets two tries before it fences itself"
        )
    if s.pod.max_gateways_per_node < 0:
        raise SettingsError("--max-gateways-per-node: must be 0 (no cap) or more")
    check_nad_template(s.pod.nad_template)
    return s
