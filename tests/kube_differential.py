"""Scenarios of requests the project's code makes, observed on an API server: status codes, reasons,
messages and the fields our code reads. tests/integration/test_kube_differential.py runs each against the
real kube-apiserver and the emulator and requires the same observations; a difference is fixed in the
emulator or written down in docs/kubeapi.md ("Differences from the real server")."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gwkit.kube import ApiError, KubeClient
from gwkit.kube.client import CONFIGMAPS, DEPLOYMENTS, NAMESPACES, PODS, SERVICEACCOUNTS, VPNGATEWAYS
from gwkit.kube.config import from_kubeconfig
from gwkit.kube.errors import Conflict, Forbidden
from lab.wait import wait_for_async
from tests.examples import example_docs
from tests.helpers import create_when_served
from tests.kube_contract import _with_crds

Observations = dict[str, Any]


class Observer:
    """Records what each labelled call gave: ``("ok", what)`` or ``(code, reason, message)``."""

    def __init__(self, kube: KubeClient, namespace: str) -> None:
        self.kube = kube
        self.ns = namespace
        self.seen: Observations = {}

    async def call(
        self,
        label: str,
        call: Awaitable[dict[str, Any]],
        keep: Callable[[dict[str, Any]], Any] = lambda o: None,
    ) -> dict[str, Any] | None:
        try:
            out = await call
        except ApiError as exc:
            self.seen[label] = (exc.code, exc.reason, _plain(str(exc), self.ns))
            return None
        self.seen[label] = ("ok", keep(out))
        return out


def _plain(message: str, namespace: str) -> str:
    """A message without what differs by run (the namespace's name)."""
    return message.replace(namespace, "<ns>")


async def _fresh(kube: KubeClient, namespace: str) -> None:
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    with contextlib.suppress(Conflict):
        await kube.create(NAMESPACES, ns)


def _cm(name: str, namespace: str, **fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        **fields,
    }


async def config_maps(kube: KubeClient, ns: str) -> Observations:
    """The plan's ConfigMap: size limit, keys, data vs binaryData; a stale PUT."""
    o = Observer(kube, ns)
    await o.call("1MiB+1", kube.create(CONFIGMAPS, _cm("big", ns, data={"a": "x" * (1024 * 1024 + 1)}), ns))
    await o.call(
        "1MiB-1k", kube.create(CONFIGMAPS, _cm("fits", ns, data={"a": "x" * (1024 * 1024 - 1024)}), ns)
    )
    await o.call("key with a slash", kube.create(CONFIGMAPS, _cm("slash", ns, data={"a/b": "x"}), ns))
    await o.call(
        "key in both",
        kube.create(CONFIGMAPS, _cm("both", ns, data={"k": "x"}, binaryData={"k": "eA=="}), ns),
    )
    made = await o.call("create", kube.create(CONFIGMAPS, _cm("plan", ns, data={"k": "1"}), ns))
    assert made is not None
    await kube.patch(CONFIGMAPS, "plan", {"data": {"k": "2"}}, ns)
    stale = copy.deepcopy(made)
    stale["data"] = {"k": "3"}
    await o.call("stale PUT", kube.replace(CONFIGMAPS, stale, ns))
    no_rv = copy.deepcopy(made)
    del no_rv["metadata"]["resourceVersion"]
    await o.call("PUT without resourceVersion", kube.replace(CONFIGMAPS, no_rv, ns), lambda x: x["data"])
    await o.call("create again", kube.create(CONFIGMAPS, _cm("plan", ns, data={"k": "1"}), ns))
    await o.call("get missing", kube.get(CONFIGMAPS, "nothing", ns))
    return o.seen


async def gateway_status_and_finalizers(kube: KubeClient, ns: str) -> Observations:
    """The CR's status subresource, generation, finalizers and deletion as the controller uses them."""
    await _with_crds(kube)
    o = Observer(kube, ns)
    doc = {**example_docs("wireguard.yaml")[0], "status": {"publicIP": "203.0.113.99"}}
    made = await create_when_served(kube, VPNGATEWAYS, doc, ns)
    name = made["metadata"]["name"]
    o.seen["status on create"] = made.get("status")
    o.seen["generation on create"] = made["metadata"].get("generation")

    def gen(x: dict[str, Any]) -> Any:
        return (x["metadata"].get("generation"), x.get("status"), x["spec"].get("serviceCIDR"))

    await o.call(
        "status through the main resource",
        kube.patch(VPNGATEWAYS, name, {"status": {"publicIP": "203.0.113.98"}}, ns),
        gen,
    )
    await o.call(
        "spec through status",
        kube.patch(
            VPNGATEWAYS,
            name,
            {"spec": {"serviceCIDR": "198.18.9.0/24"}, "status": {"publicIP": "203.0.113.97"}},
            ns,
            subresource="status",
        ),
        gen,
    )
    await o.call("label", kube.patch(VPNGATEWAYS, name, {"metadata": {"labels": {"a": "b"}}}, ns), gen)
    await o.call("spec", kube.patch(VPNGATEWAYS, name, {"spec": {"serviceCIDR": "198.18.9.0/24"}}, ns), gen)
    await o.call(
        "status null",
        kube.patch(VPNGATEWAYS, name, {"status": {"publicIP": None}}, ns, subresource="status"),
        gen,
    )
    await o.call(
        "finalizer",
        kube.patch(VPNGATEWAYS, name, {"metadata": {"finalizers": ["vpn.bnerd.net/cleanup"]}}, ns),
        lambda x: (x["metadata"].get("finalizers"), x["metadata"].get("generation")),
    )
    await o.call(
        "delete with a finalizer",
        kube.delete(VPNGATEWAYS, name, ns),
        lambda x: (x.get("kind"), "deletionTimestamp" in x.get("metadata", {})),
    )
    await o.call(
        "after delete",
        kube.get(VPNGATEWAYS, name, ns),
        lambda x: ("deletionTimestamp" in x["metadata"], x["metadata"].get("generation")),
    )
    await o.call(
        "a new finalizer while deleting",
        kube.patch(
            VPNGATEWAYS, name, {"metadata": {"finalizers": ["vpn.bnerd.net/cleanup", "x.example/y"]}}, ns
        ),
        lambda x: x["metadata"].get("finalizers"),
    )
    await o.call(
        "finalizers removed",
        kube.patch(VPNGATEWAYS, name, {"metadata": {"finalizers": []}}, ns),
        lambda x: x.get("kind"),
    )
    await o.call("gone", kube.get(VPNGATEWAYS, name, ns))
    return o.seen


async def lists(kube: KubeClient, ns: str) -> Observations:
    """Pagination as the informers list (limit, continue, remainingItemCount) and label selectors."""
    o = Observer(kube, ns)
    # The real namespace has one ConfigMap more, kube-root-ca.crt (kube-controller-manager publishes it):
    # ours sit before it in name order, and the counts say how many follow.
    for i in range(5):
        await kube.create(CONFIGMAPS, _cm(f"c{i}", ns, data={"i": str(i)}), ns)
        if i % 2:
            await kube.patch(CONFIGMAPS, f"c{i}", {"metadata": {"labels": {"odd": "yes"}}}, ns)
    names = [i["metadata"]["name"] for i in (await kube.request("GET", CONFIGMAPS.path(ns)))["items"]]
    others = len([n for n in names if not n.startswith("c")])

    def ours(remaining: Any) -> Any:
        return remaining - others if isinstance(remaining, int) else remaining

    page = await o.call(
        "limit 2",
        kube.request("GET", CONFIGMAPS.path(ns), params={"limit": "2"}),
        lambda x: (
            [i["metadata"]["name"] for i in x["items"]],
            bool(x["metadata"].get("continue")),
            ours(x["metadata"].get("remainingItemCount")),
        ),
    )
    assert page is not None
    await o.call(
        "next page",
        kube.request(
            "GET", CONFIGMAPS.path(ns), params={"limit": "2", "continue": page["metadata"]["continue"]}
        ),
        lambda x: (
            [i["metadata"]["name"] for i in x["items"]],
            ours(x["metadata"].get("remainingItemCount")),
        ),
    )
    await o.call(
        "selector and limit",
        kube.request("GET", CONFIGMAPS.path(ns), params={"labelSelector": "odd=yes", "limit": "1"}),
        lambda x: (
            [i["metadata"]["name"] for i in x["items"]],
            bool(x["metadata"].get("continue")),
            x["metadata"].get("remainingItemCount"),
        ),
    )
    await o.call(
        "selector",
        kube.request("GET", CONFIGMAPS.path(ns), params={"labelSelector": "odd=yes"}),
        lambda x: sorted(i["metadata"]["name"] for i in x["items"]),
    )
    await o.call(
        "bad selector",
        kube.request("GET", CONFIGMAPS.path(ns), params={"labelSelector": "odd=="}),
    )
    await o.call(
        "bad continue",
        kube.request("GET", CONFIGMAPS.path(ns), params={"limit": "2", "continue": "not-a-token"}),
    )
    code, reason, message = o.seen["bad continue"]  # the decoder's own words after this are Go's
    o.seen["bad continue"] = (code, reason, message.split(": continue key is not valid")[0])
    return o.seen


async def owned_objects(kube: KubeClient, ns: str) -> Observations:
    """The objects the controller writes for a gateway, as each server stores them (its defaults
    included): the controller compares what it wants with what is stored, so a default the emulator
    adds differently would be a write on every reconcile against a real cluster, or none at all."""
    from controller.names import GatewayKey
    from controller.status import StatusEvent, event_object
    from gwkit.kube.client import BY_KIND
    from tests.unit.test_controller_desired import by_kind, run, snapshot

    o = Observer(kube, ns)
    wanted = by_kind(run(snapshot(example_docs("ipsec.yaml"))))
    for slot in sorted(wanted):
        obj = copy.deepcopy(wanted[slot])
        if obj["kind"] in ("NetworkAttachmentDefinition",) or "namespace" not in obj["metadata"]:
            continue  # not served by both (the NAD is a Multus CRD)
        obj["metadata"]["namespace"] = ns
        obj["metadata"].pop("ownerReferences", None)  # their owner is not there
        res = BY_KIND[obj["kind"]]

        def stored(x: dict[str, Any]) -> Any:
            return {k: v for k, v in x.items() if k not in ("metadata", "status")}

        await o.call(f"{obj['kind']} {slot}", kube.create(res, obj, ns), stored)
    key = GatewayKey("VPNGateway", ns, "acme")
    event = event_object(
        key, "uid-1", StatusEvent("Warning", "Invalid", "spec.x: bad"), "2026-01-01T00:00:00Z", "r"
    )
    await o.call(
        "Event",
        kube.create(BY_KIND["Event"], event, ns),
        lambda x: {k: x.get(k) for k in ("type", "reason", "count", "source", "reportingComponent")},
    )
    elsewhere = event_object(
        key, "uid-2", StatusEvent("Warning", "Invalid", "x"), "2026-01-01T00:00:00Z", "r", namespace="default"
    )
    await o.call("Event in another namespace", kube.create(BY_KIND["Event"], elsewhere, "default"))
    return o.seen


def _deployment(name: str, namespace: str, containers: list[dict[str, Any]], **pod: Any) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 0,  # nothing to schedule: the object as stored is what is compared
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": containers, **pod}},
        },
    }


def _container(name: str, **resources: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "image": "registry.example/x:1", "resources": resources}


def _pod_shape(spec: dict[str, Any]) -> Any:
    return {
        "resources": {c["name"]: c.get("resources") for c in spec.get("containers") or []},
        "tolerations": spec.get("tolerations"),
        "volumes": spec.get("volumes"),
    }


async def pod_specs(kube: KubeClient, ns: str) -> Observations:
    """Quantities, resources and tolerations in a Deployment's pod template and a Pod, as each server
    decodes, stores and validates them (lab.kubeapi.podspec): canonical forms, the string kept as written
    when it already is canonical, empty fields gone, unknown fields dropped, requests above limits and
    bad tolerations refused, a limit without a request defaulted (Pods only)."""
    o = Observer(kube, ns)
    canonicalised = _deployment(
        "quantities",
        ns,
        [
            _container(
                "a", requests={"cpu": 0.5, "memory": "1024Mi"}, limits={"cpu": "1000m", "memory": "1.5Gi"}
            ),
            _container("b", requests={"cpu": "+1", "memory": "01", "ephemeral-storage": "1."}),
            _container(
                "c",
                requests={"cpu": "0.1n", "memory": "0.1Gi", "ephemeral-storage": "1e3"},
                limits={"memory": "2Gi"},
            ),
            _container("d", requests={}, limits={}),
            _container("e", requests={"cpu": "1001u", "memory": "1000001n", "ephemeral-storage": "+0.5Ki"}),
        ],
        tolerations=[
            {"key": "k", "operator": "Exists", "value": "", "effect": "NoExecute", "tolerationSeconds": 0},
            {"key": "dedicated", "operator": "Equal", "value": "vpn", "effect": "", "unknown": "x"},
            {"operator": "Exists", "tolerationSeconds": None},
        ],
        volumes=[{"name": "v", "emptyDir": {"medium": "Memory", "sizeLimit": "1024Ki"}}],
    )
    await o.call(
        "non-canonical",
        kube.create(DEPLOYMENTS, canonicalised, ns),
        lambda x: _pod_shape(x["spec"]["template"]["spec"]),
    )
    await o.call(
        "merge patch of a quantity",
        kube.patch(
            DEPLOYMENTS,
            "quantities",
            {"spec": {"template": {"spec": {"volumes": [{"name": "v", "emptyDir": {"sizeLimit": 0.5}}]}}}},
            ns,
        ),
        lambda x: x["spec"]["template"]["spec"]["volumes"],
    )
    over = _container("a", requests={"cpu": "1", "memory": "1Gi"}, limits={"cpu": "0.5", "memory": "1Gi"})
    await o.call("requests above limits", kube.create(DEPLOYMENTS, _deployment("over", ns, [over]), ns))
    await o.call(
        "not a quantity",
        kube.create(DEPLOYMENTS, _deployment("bad", ns, [_container("a", limits={"cpu": "1 core"})]), ns),
    )
    await o.call(
        "a suffix after an exponent",
        kube.create(DEPLOYMENTS, _deployment("bad", ns, [_container("a", limits={"memory": "1e3Mi"})]), ns),
    )
    await o.call(
        "negative",
        kube.create(DEPLOYMENTS, _deployment("neg", ns, [_container("a", requests={"memory": "-1Mi"})]), ns),
    )
    await o.call(
        "unknown resource",
        kube.create(DEPLOYMENTS, _deployment("gpu", ns, [_container("a", limits={"gpu": "1"})]), ns),
    )
    for label, toleration in (
        ("toleration without key, Equal", {"operator": "Equal", "value": "x"}),
        ("tolerationSeconds without NoExecute", {"key": "k", "operator": "Exists", "tolerationSeconds": 5}),
        ("toleration Exists with a value", {"key": "k", "operator": "Exists", "value": "v"}),
        ("toleration effect", {"key": "k", "effect": "Never"}),
        ("toleration operator", {"key": "k", "operator": "In"}),
        ("toleration key", {"key": "a/b/c", "operator": "Exists"}),
    ):
        doc = _deployment("tol", ns, [_container("a")], tolerations=[toleration])
        await o.call(label, kube.create(DEPLOYMENTS, doc, ns))
    strict = _deployment("strict", ns, [_container("a")], tolerations=[{"key": "k", "bogus": 1}])
    await o.call(
        "unknown field, Strict",
        kube.request("POST", DEPLOYMENTS.path(ns), params={"fieldValidation": "Strict"}, body=strict),
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "limits-only", "namespace": ns},
        "spec": {
            "nodeName": "nowhere",  # never scheduled, never run
            "automountServiceAccountToken": False,
            "containers": [_container("a", limits={"cpu": "0.25", "memory": "64Mi"})],
        },
    }
    # Forbidden: the namespace's default ServiceAccount, a moment after the namespace
    made = await wait_for_async(
        lambda: kube.create(PODS, pod, ns),
        30,
        "the Pod created (once the default ServiceAccount exists)",
        interval=0.2,
        ignoring=(Forbidden,),
    )
    o.seen["Pod with limits only"] = _pod_shape(made["spec"])["resources"]
    return o.seen


async def not_served(kube: KubeClient, ns: str) -> Observations:
    """Writes of a kind the server does not serve (the NetworkAttachmentDefinition without Multus: the
    controller says the answer in its status), and a status patch on a stale resourceVersion (the
    controller's status carries the version its decision saw)."""
    from gwkit.kube import Resource

    o = Observer(kube, ns)
    widget = {"apiVersion": "nothing.example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    for label, res in (
        ("group not served", Resource("nothing.example.com", "v1", "widgets", "Widget")),
        ("core resource not served", Resource("", "v1", "widgets", "Widget")),
        ("apps resource not served", Resource("apps", "v1", "widgets", "Widget")),
    ):
        await o.call(f"create: {label}", kube.create(res, widget, ns))
        await o.call(f"list: {label}", kube.request("GET", res.path(ns)))
    await _with_crds(kube)
    gw = await create_when_served(kube, VPNGATEWAYS, example_docs("wireguard.yaml")[0], ns)
    name, version = gw["metadata"]["name"], gw["metadata"]["resourceVersion"]
    status = {"status": {"observedGeneration": 1}}
    await o.call("status patch", kube.patch(VPNGATEWAYS, name, status, ns, subresource="status"))
    stale = {**status, "metadata": {"resourceVersion": version}}
    await o.call(
        "status patch on a stale resourceVersion",
        kube.patch(VPNGATEWAYS, name, stale, ns, subresource="status"),
    )
    return o.seen


def _pod(name: str, namespace: str, spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, **meta},
        # Bound to a node that does not exist: never run; the ServiceAccount exists before any pod, so
        # the ServiceAccount admission plugin (which runs first) never refuses one.
        "spec": {
            "nodeName": "nowhere",
            "serviceAccountName": "ps",
            "automountServiceAccountToken": False,
            **spec,
        },
    }


RESTRICTED_CONTAINER = {
    "name": "ok",
    "image": "registry.example/x:1",
    "securityContext": {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
}


async def pod_security(kube: KubeClient, ns: str) -> Observations:
    """PodSecurity admission (lab.kubeapi.podsecurity): pods refused by a namespace labelled
    ``enforce: restricted``, then ``baseline``, in the real words (which checks, in which order, which
    containers), the gateway pod the controller writes among them; a restricted pod admitted; a
    Deployment whose template violates the level admitted (only its pods are refused)."""
    from tests.unit.test_controller_desired import by_kind, run, snapshot

    o = Observer(kube, ns)
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "ps", "namespace": ns}}
    await kube.create(SERVICEACCOUNTS, sa, ns)
    label = "pod-security.kubernetes.io/enforce"
    await kube.patch(NAMESPACES, ns, {"metadata": {"labels": {label: "restricted"}}})
    plain = {"name": "plain", "image": "registry.example/x:1"}
    gateway = by_kind(run(snapshot(example_docs("ipsec.yaml"))))["Deployment"]["spec"]["template"]
    gateway_spec = {**gateway["spec"], "nodeName": "nowhere", "serviceAccountName": "ps"}
    refused: dict[str, dict[str, Any]] = {
        "a plain container": {"containers": [plain]},
        "privileged, init and plain": {
            "initContainers": [{**plain, "name": "init", "securityContext": {"privileged": True}}],
            "containers": [plain, {**RESTRICTED_CONTAINER, "securityContext": {"runAsUser": 0}}],
        },
        "host namespaces, ports, volumes, sysctls": {
            # Not hostNetwork (a hostPort must then equal its containerPort) nor hostIPC (no IPC sysctl
            # then): the real server refuses those as invalid (422) before PodSecurity is asked.
            "hostPID": True,
            "securityContext": {
                "sysctls": [
                    {"name": "net.ipv4.ip_forward", "value": "1"},
                    {"name": "kernel.shm_rmid_forced", "value": "0"},
                ],
                "seccompProfile": {"type": "Unconfined"},
            },
            "containers": [
                {
                    **RESTRICTED_CONTAINER,
                    "ports": [
                        {"containerPort": 80, "hostPort": 8080},
                        {"containerPort": 9, "hostPort": 10000},
                    ],
                    "securityContext": {
                        **RESTRICTED_CONTAINER["securityContext"],  # type: ignore[dict-item]
                        "capabilities": {"add": ["NET_ADMIN", "SYS_TIME"]},
                        "seLinuxOptions": {"type": "spc_t", "user": "u"},
                    },
                    "readinessProbe": {"tcpSocket": {"port": 80, "host": "10.0.0.1"}},
                }
            ],
            "volumes": [
                {"name": "tun", "hostPath": {"path": "/dev/net/tun"}},
                {"name": "git", "gitRepo": {"repository": "https://example.com/r"}},
                {"name": "data", "emptyDir": {}},
            ],
        },
        "the gateway pod": gateway_spec,
    }
    for what, spec in refused.items():
        await o.call(f"restricted: {what}", kube.create(PODS, _pod("p", ns, spec), ns))
    await o.call(
        "restricted: admitted",
        kube.create(PODS, _pod("ok", ns, {"containers": [RESTRICTED_CONTAINER]}), ns),
        lambda x: x["metadata"]["name"],
    )
    await o.call(
        "restricted: a Deployment with the gateway's template",
        kube.create(
            DEPLOYMENTS,
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "gw", "namespace": ns},
                "spec": {
                    "replicas": 0,
                    "selector": {"matchLabels": gateway["metadata"]["labels"]},
                    "template": gateway,
                },
            },
            ns,
        ),
        lambda x: x["metadata"]["name"],
    )
    await kube.patch(NAMESPACES, ns, {"metadata": {"labels": {label: "baseline"}}})
    await o.call("baseline: the gateway pod", kube.create(PODS, _pod("p", ns, gateway_spec), ns))
    await o.call(
        "baseline: a plain container",
        kube.create(PODS, _pod("plain", ns, {"containers": [plain]}), ns),
        lambda x: x["metadata"]["name"],
    )
    await o.call(
        "baseline: generateName",
        kube.create(PODS, _pod("", ns, gateway_spec, generateName="gw-"), ns),
    )
    seen = o.seen["baseline: generateName"]
    if len(seen) == 3:  # refused: the name in the message is the generated one, random
        o.seen["baseline: generateName"] = (*seen[:2], 'pods "gw-' in seen[2], seen[2].split(" is ", 1)[-1])
    return o.seen


SCENARIOS: dict[str, Callable[[KubeClient, str], Awaitable[Observations]]] = {
    "not_served": not_served,
    "config_maps": config_maps,
    "gateway_status_and_finalizers": gateway_status_and_finalizers,
    "lists": lists,
    "owned_objects": owned_objects,
    "pod_specs": pod_specs,
    "pod_security": pod_security,
}


async def observe(kubeconfig: Path, scenario: str, namespace: str) -> Observations:
    async with KubeClient(from_kubeconfig(kubeconfig)) as kube:
        await _fresh(kube, namespace)
        return await SCENARIOS[scenario](kube, namespace)
