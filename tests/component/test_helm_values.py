"""The chart's values: every values file under helm/vpngw/ci/ renders manifests that Kubernetes' own schemas
accept (kubernetes-validate, strict: an unknown field fails), that the controller's own command line
accepts with the settings the values asked for, and bad values are refused at install naming the value.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.__main__ import build_parser
from controller.runcli import settings_of
from controller.settings import SettingsError, StaticNic, check_nad_template
from tests.component.test_helm_chart import (
    CHART,
    CI_VALUES,
    MONITORING_KINDS,
    NAMESPACE,
    PROMETHEUS_OPERATOR,
    helm,
    one,
    render,
    run_helm,
)
from tests.component.test_helm_install import pod_process

__all__ = ["helm"]  # the fixture

kv: Any = importlib.import_module("kubernetes_validate")  # untyped; pinned in pyproject's dev extras
KUBERNETES = ("1.28.0", kv.utils.latest_version())
"""The oldest Kubernetes the chart admits (kubeVersion) and the newest kubernetes-validate knows."""
VALUES_IDS = [v.stem for v in CI_VALUES]


def values_of(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()) or {})


@pytest.mark.parametrize("version", KUBERNETES)
@pytest.mark.parametrize("values", CI_VALUES, ids=VALUES_IDS)
def test_every_rendered_manifest_passes_kubernetes_schemas(helm: str, values: Path, version: str) -> None:
    docs = render(helm, "-f", str(values), *PROMETHEUS_OPERATOR, "--kube-version", version, crds=True)
    unchecked = []
    for d in docs:
        try:
            kv.validate(d, version, strict=True)
        except kv.utils.SchemaNotFoundError:
            unchecked.append(d["kind"])
        except kv.utils.ValidationError as exc:
            path = ".".join(map(str, exc.path))
            pytest.fail(f"{d['kind']} {d['metadata']['name']}: {path}: {exc.message}")
    # Only the Prometheus Operator's kinds have no schema here (they are not Kubernetes'): checked by shape.
    assert set(unchecked) == MONITORING_KINDS
    assert len(docs) - len(unchecked) >= 13


def test_the_schema_check_is_strict_enough_to_catch_a_misspelt_field(helm: str) -> None:
    """The negative control of the test above: a field Kubernetes does not know fails validation."""
    deployment = one(render(helm), "Deployment")
    kv.validate(deployment, KUBERNETES[0], strict=True)
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["runAsNonroot"] = True
    with pytest.raises(kv.utils.ValidationError):
        kv.validate(deployment, KUBERNETES[0], strict=True)


@pytest.mark.parametrize(
    "release, extra, fullname",
    [
        pytest.param("vpngw", (), "vpngw", id="release-is-the-chart-name"),
        pytest.param("edge", (), "edge-vpngw", id="another-release"),
        pytest.param("edge", ("--set", "fullnameOverride=vpn"), "vpn", id="fullnameOverride"),
    ],
)
def test_object_names_read_well(helm: str, release: str, extra: tuple[str, ...], fullname: str) -> None:
    docs = render(helm, *extra, *PROMETHEUS_OPERATOR, "--set", "controller.replicas=2", release=release)
    names = {
        d["metadata"]["name"] for d in docs if d["kind"] != "CustomResourceDefinition"
    }  # <plural>.<group>
    assert all(n == fullname or n.startswith(f"{fullname}-") for n in names), names
    assert f"{fullname}-gateways" in names, "the gateway namespace: one per installation"
    assert not any("vpngw-vpngw" in n for n in names), names
    assert {f"{fullname}-controller", f"{fullname}-controller-leader-election"} <= names
    deployment = one(docs, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--leader-election-id={fullname}-controller" in args
    assert f"--instance={release}" in args  # labels of the owned objects, OpenStack tags


def controller_args(
    docs: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> argparse.Namespace:
    """The rendered Deployment's command line parsed by the controller's own parser, with the rendered
    ConfigMap and the container's env as its pod would have them."""
    configmap = one(docs, "ConfigMap", "vpngw-controller")

    def source(kind: str, name: str) -> dict[str, Any] | None:
        if kind == "ConfigMap" and name == configmap["metadata"]["name"]:
            return configmap
        return {"data": {}} if kind == "Secret" else None  # the credentials Secret is the user's

    deployment = one(docs, "Deployment")
    if any("secret" in v for v in deployment["spec"]["template"]["spec"]["volumes"]):
        deployment = _without_secret_items(deployment)
    args, env = pod_process(deployment, source, tmp_path / "pod")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return build_parser().parse_args(args)


def _without_secret_items(deployment: dict[str, Any]) -> dict[str, Any]:
    """The clouds.yaml is not the chart's: mount an empty Secret volume in its place."""
    import copy

    d = copy.deepcopy(deployment)
    for v in d["spec"]["template"]["spec"]["volumes"]:
        if "secret" in v:
            v["secret"].pop("items", None)
    return d


def test_the_controllers_command_line_and_config_carry_the_static_values(
    helm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = values_of(CHART / "ci" / "static-values.yaml")
    args = controller_args(
        render(helm, "-f", str(CHART / "ci" / "static-values.yaml")), tmp_path, monkeypatch
    )
    assert args.command == "run" and args.leader_elect and args.cloud == "static"
    s = settings_of(args)  # the controller's own validation: exit 2 on anything it refuses
    assert s.operator_namespace == NAMESPACE  # the Lease's namespace, from POD_NAMESPACE (downward API)
    assert s.instance == "vpngw"
    assert s.internal_source_cidrs == ("192.0.2.64/26",)
    assert s.pod.image == "localhost/vpngw-gateway:0.1.0" and s.pod.image_pull_policy == "IfNotPresent"
    assert s.pod.sysctls == "pod" and s.pod.wireguard == "kernel" and s.pod.max_gateways_per_node == 8
    # Helm merges the values file's map with the chart's default (kubernetes.io/os: linux).
    assert s.pod.node_selector == {"kubernetes.io/os": "linux", "node-role.kubernetes.io/vpn": ""}
    assert list(s.pod.tolerations) == values["gateway"]["tolerations"]
    assert s.pod.resources["charon"].to_api() == values["gateway"]["resources"]["charon"]
    assert s.pod.resources["exporter"].requests  # the controller's default for a container not named
    assert s.pod.priority_class_name == "system-node-critical"
    assert s.pod.image_pull_secrets == ("gateway-pull",)
    assert s.network_policy.api_server == (("198.18.0.10/32", 6443),)
    assert s.network_policy.monitoring_namespace == "monitoring"
    assert s.static_nics["tenant-acme/acme"] == StaticNic(
        "fa:16:3e:00:00:01", "192.0.2.2/26", "192.0.2.1", "203.0.113.10"
    )
    assert s.static_nics["tenant-wg/acme-wg"].public_ip is None


def test_the_controllers_command_line_carries_the_gateway_ha_values(
    helm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ha.allowed is --allow-ha, and a static NIC keyed namespace/name#b is slot b's NIC2 (no public IP)."""
    docs = render(helm, "-f", str(CHART / "ci" / "gateway-ha-static-values.yaml"))
    args = controller_args(docs, tmp_path, monkeypatch)
    s = settings_of(args)
    assert s.ha_allowed is True and s.cloud == "static"
    assert s.static_nics["tenant-acme/acme#b"] == StaticNic(
        "fa:16:3e:00:00:11", "192.0.2.12/26", "192.0.2.1", None
    )
    assert s.static_nics["tenant-acme/acme"].public_ip == "203.0.113.10"
    assert settings_of(controller_args(render(helm), tmp_path / "off", monkeypatch)).ha_allowed is False


def test_the_controllers_command_line_carries_the_openstack_values(
    helm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(helm, "-f", str(CHART / "ci" / "openstack-values.yaml"))
    args = controller_args(docs, tmp_path, monkeypatch)
    s = settings_of(args)
    assert s.cloud == "openstack" and s.static_nics == {}
    assert (args.os_cloud, args.gateway_network, args.gateway_subnet, args.external_network) == (
        "vpngw",
        "vpn-gateways",
        "vpn-gateways-v4",
        "public",
    )
    assert s.pod.sysctls == "privileged-init" and s.pod.wireguard == "wireguard-go"
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "openstack"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "openstack"]
    assert volume["secret"]["secretName"] == "vpngw-openstack"
    assert env["OS_CLIENT_CONFIG_FILE"] == f"{mount['mountPath']}/{volume['secret']['items'][0]['path']}"
    assert mount["readOnly"] is True
    assert spec["securityContext"]["fsGroup"] == 65532  # the 0440 file is the controller's group's


def test_the_controller_deployment(helm: str) -> None:
    docs = render(helm, "-f", str(CHART / "ci" / "controller-replicas-values.yaml"))
    d = one(docs, "Deployment")
    assert d["spec"]["replicas"] == 2
    pod = d["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "localhost/vpngw-controller:0.1.0"
    args = c["args"]
    assert "--leader-elect" in args and "--leader-election-namespace=$(POD_NAMESPACE)" in args
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in c[
        "env"
    ]
    listen = next(a for a in args if a.startswith("--listen="))
    (port,) = c["ports"]
    assert listen == f"--listen=0.0.0.0:{port['containerPort']}" and port["containerPort"] == 8080
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}
    assert (
        c["resources"]
        == values_of(CHART / "ci" / "controller-replicas-values.yaml")["controller"]["resources"]
    )
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == sc["runAsGroup"] == 65532
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    config = next(a for a in args if a.startswith("--config=")).split("=", 1)[1]
    (mount,) = [m for m in c["volumeMounts"] if config.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    cm = one(docs, "ConfigMap", volume["configMap"]["name"])
    assert config.rsplit("/", 1)[1] in cm["data"]
    # Standbys spread over nodes; a drain never takes the last one.
    assert pod["affinity"]["podAntiAffinity"]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": d["spec"]["selector"]}


def test_a_pdb_only_with_more_than_one_replica(helm: str) -> None:
    assert "PodDisruptionBudget" not in {d["kind"] for d in render(helm)}
    assert "PodDisruptionBudget" in {d["kind"] for d in render(helm, "--set", "controller.replicas=3")}


def test_a_changed_config_rolls_the_controller(helm: str) -> None:
    def checksum(*args: str) -> str:
        d = one(render(helm, *args), "Deployment")
        return str(d["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum() == checksum("--set", "controller.replicas=2")
    # A flag changes the pod template (and so rolls it) by itself, not the config's checksum.
    assert checksum() == checksum("--set", "gateway.maxGatewaysPerNode=3")
    assert checksum() != checksum("--set-json", 'internalSourceCIDRs=["10.0.0.0/16"]')


def _egress(netpol: dict[str, Any]) -> list[tuple[str | None, tuple[tuple[str, int], ...]]]:
    out = []
    for rule in netpol["spec"]["egress"]:
        peers = rule.get("to") or [{}]
        for p in peers:
            who = p.get("ipBlock", {}).get("cidr") or (
                p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] if p else None
            )
            out.append((who, tuple((x["protocol"], x["port"]) for x in rule["ports"])))
    return out


def test_the_controllers_network_policy(helm: str) -> None:
    default = one(render(helm), "NetworkPolicy")
    assert default["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert (
        default["spec"]["podSelector"]["matchLabels"]
        == one(render(helm), "Deployment")["spec"]["selector"]["matchLabels"]
    )
    ingress, helm_test = default["spec"]["ingress"]
    assert ingress["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert ingress["ports"] == [{"port": 8080, "protocol": "TCP"}]
    # `helm test`'s pod, in the release's namespace only (no namespaceSelector).
    assert helm_test["from"] == [
        {
            "podSelector": {
                "matchLabels": {
                    "app.kubernetes.io/instance": "vpngw",
                    "app.kubernetes.io/component": "helm-test",
                }
            }
        }
    ]
    assert helm_test["ports"] == [{"port": 8080, "protocol": "TCP"}]
    dns = ("kube-system", (("UDP", 53), ("TCP", 53)))
    # The static cloud: the API server only (the controller resolves nothing: observed, docs/e2e.md).
    assert _egress(default) == [(None, (("TCP", 443), ("TCP", 6443)))]
    static = one(render(helm, "-f", str(CHART / "ci" / "static-values.yaml")), "NetworkPolicy")
    assert _egress(static) == [("198.18.0.10/32", (("TCP", 6443),))]
    # OpenStack: cluster DNS (clouds.yaml names endpoints) and the endpoints.
    openstack = one(render(helm, "-f", str(CHART / "ci" / "openstack-values.yaml")), "NetworkPolicy")
    assert _egress(openstack)[1] == dns
    assert _egress(openstack)[-1] == ("198.51.100.10/32", (("TCP", 5000), ("TCP", 9696), ("TCP", 8774)))
    off = render(helm, "--set", "controller.networkPolicy.enabled=false")
    assert "NetworkPolicy" not in {d["kind"] for d in off}


def test_the_monitors_select_the_controller_and_the_gateways(helm: str) -> None:
    docs = render(helm, "-f", str(CHART / "ci" / "monitoring-values.yaml"), *PROMETHEUS_OPERATOR)
    sm, pm, svc = one(docs, "ServiceMonitor"), one(docs, "PodMonitor"), one(docs, "Service")
    assert sm["metadata"]["labels"]["release"] == pm["metadata"]["labels"]["release"] == "prometheus"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]
    assert svc["spec"]["ports"][0]["name"] == "http"
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["vpngw-gateways"]}, "ours only"
    # (the gateway pods the controller creates match it: tests/component/test_helm_install.py)
    assert pm["spec"]["selector"]["matchLabels"]["vpn.bnerd.net/operator"] == "vpngw"
    netpol = one(docs, "NetworkPolicy")
    assert netpol["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "observability"
    }
    cfg = yaml.safe_load(one(docs, "ConfigMap", "vpngw-controller")["data"]["config.yaml"])
    assert cfg["networkPolicy"]["monitoringNamespace"] == "observability"  # the gateway pods' policy too


NIC = {"mac": "fa:16:3e:00:00:01", "address": "192.0.2.2/26", "gateway": "192.0.2.1"}
OPENSTACK = {"credentialsSecret": "s", "cloud": "c", "gatewayNetwork": "n", "externalNetwork": "e"}


def _nics(nics: dict[str, Any]) -> dict[str, Any]:
    return {"cloud": {"static": {"nics": nics}}}


def _openstack(**over: Any) -> dict[str, Any]:
    return {"cloud": {"type": "openstack", "openstack": {**OPENSTACK, **over}}}


BAD_VALUES: list[tuple[dict[str, Any], str]] = [
    ({"gateway": {"sysctls": "yes"}}, "/gateway/sysctls"),
    ({"gateway": {"wireguardMode": "userspace"}}, "/gateway/wireguardMode"),
    ({"gateway": {"maxGatewaysPerNode": -1}}, "/gateway/maxGatewaysPerNode"),
    ({"gateway": {"resources": {"racoon": {}}}}, "racoon"),
    (
        {"gateway": {"resources": {"charon": {"requests": {"cpu": "lots"}}}}},
        "/gateway/resources/charon/requests/cpu",
    ),
    ({"gateway": {"resources": {"charon": {"requests": {"gpu": "1"}}}}}, "gpu"),
    ({"gateway": {"nadTemplate": '{"type": "host-device"}'}}, "/gateway/nadTemplate"),
    ({"gateway": {"tolerations": [{"key": "a", "efect": "NoSchedule"}]}}, "efect"),
    ({"gateway": {"nodeSelector": {"vpn node": ""}}}, "/gateway/nodeSelector"),
    ({"internalSourceCIDRs": ["10.0.0.0/33"]}, "/internalSourceCIDRs/0"),
    ({"internalSourceCidrs": ["10.0.0.0/16"]}, "internalSourceCidrs"),
    ({"instance": "Edge_1"}, "/instance"),
    ({"controller": {"replicas": -1}}, "/controller/replicas"),
    ({"controller": {"workers": 100}}, "/controller/workers"),
    ({"controller": {"resyncSeconds": 1}}, "/controller/resyncSeconds"),
    ({"controller": {"logLevel": "CHATTY"}}, "/controller/logLevel"),
    ({"images": {"gateway": {"pullPolicy": "Sometimes"}}}, "/images/gateway/pullPolicy"),
    ({"images": {"controller": {"tag": 1.0}}}, "/images/controller/tag"),
    ({"networkPolicy": {"apiServer": ["10.0.0.1:6443"]}}, "/networkPolicy/apiServer/0"),
    ({"networkPolicy": {"monitoringNamespace": "Monitoring"}}, "/networkPolicy/monitoringNamespace"),
    ({"cloud": {"type": "aws"}}, "/cloud/type"),
    (
        _nics({"tenant-acme/acme": {**NIC, "mac": "fa:16:3e:00:00"}}),
        "/cloud/static/nics/tenant-acme~1acme/mac",
    ),
    (
        _nics({"tenant-acme/acme": {**NIC, "address": "192.0.2.2"}}),
        "/cloud/static/nics/tenant-acme~1acme/address",
    ),
    (_nics({"acme": NIC}), "/cloud/static/nics"),
    (_nics({"tenant-acme/acme#c": NIC}), "/cloud/static/nics"),  # only slot b has a key of its own
    (
        _nics({"tenant-acme/acme#b": {**NIC, "publicIP": "203.0.113.10"}}),
        "publicIP",
    ),  # the gateway's is slot a's
    ({"cloud": {"type": "openstack"}}, "/cloud/openstack/credentialsSecret"),
    (_openstack(), "/cloud/openstack/endpoints"),
    (
        _openstack(endpoints=[{"cidr": "198.51.100.10/32", "ports": [70000]}]),
        "/cloud/openstack/endpoints/0/ports/0",
    ),
    ({"monitoring": {"serviceMonitor": {"interval": "soon"}}}, "/monitoring/serviceMonitor/interval"),
]


"""Refused by values.schema.json: at install, upgrade, template and lint."""

BAD_TEMPLATES: list[tuple[dict[str, Any], str]] = [
    ({"gateway": {"nadTemplate": '{"hwaddr": "$mac"'}}, "gateway.nadTemplate: not a JSON object"),
    ({"gateway": {"nadTemplate": '{"hwaddr": "$mac", "x": "$cluster"}'}}, "gateway.nadTemplate: only $mac"),
    # (the commands run without -n: the release's namespace is "default")
    ({"gateway": {"namespace": "default"}}, "gateway.namespace: default is the release's namespace"),
    ({"tenants": {"namespaces": ["vpngw-gateways"]}}, "tenants.namespaces: vpngw-gateways is the gateway"),
]
"""Refused by the templates' own checks (what a JSON schema cannot say): at install, upgrade and template.
``helm lint`` does not run a template's ``fail`` (Helm 4's lint mode logs it at INFO and passes)."""

COMMANDS = {
    "template": ("template", "vpngw"),
    "install": ("install", "vpngw", "--dry-run=client"),
    "lint": ("lint",),
}


@pytest.mark.parametrize(
    "command, values, named",
    [
        *[pytest.param(c, v, n, id=f"{c}-{n}") for c in COMMANDS for v, n in BAD_VALUES],
        *[pytest.param(c, v, n, id=f"{c}-{n}") for c in ("template", "install") for v, n in BAD_TEMPLATES],
    ],
)
def test_bad_values_are_refused_naming_the_value(
    helm: str, tmp_path: Path, command: str, values: dict[str, Any], named: str
) -> None:
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    res = run_helm(helm, *COMMANDS[command], str(CHART), "-f", str(f))
    assert res.returncode != 0, f"{values} was accepted"
    assert named in res.stdout + res.stderr, res.stdout + res.stderr


def test_the_values_schema_is_a_json_schema_and_every_values_file_meets_it() -> None:
    """The same check helm makes, with another implementation (jsonschema): the schema is well-formed
    draft-07 and holds no rule helm's validator reads differently."""
    import json

    import jsonschema

    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    defaults = values_of(CHART / "values.yaml")
    validator = jsonschema.Draft7Validator(schema)
    for path in CI_VALUES:
        merged = _merge(defaults, values_of(path))
        assert list(validator.iter_errors(merged)) == [], path.name
    for values, named in BAD_VALUES:
        errors = list(validator.iter_errors(_merge(defaults, values)))
        assert errors, named


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of values files: maps merge, everything else replaces."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def test_a_release_name_that_is_no_instance_name_is_refused_unless_instance_is_set(helm: str) -> None:
    res = run_helm(helm, "template", "vpn.gw", str(CHART))
    assert res.returncode != 0 and 'instance: "vpn.gw" is not a DNS label' in res.stderr
    assert render(helm, "--set", "instance=vpngw", release="vpn.gw")


@pytest.mark.parametrize(
    "template",
    [
        '{"cniVersion": "0.3.1", "name": "$name", "type": "host-device", "hwaddr": "$mac"}',
        '{"type": "macvlan", "master": "ens7", "mac": "${mac}", "ns": "$namespace", "price": "$$5"}',
        '{"type": "host-device", "hwaddr": "$mac", "x": "$machine"}',
        '{"type": "host-device", "hwaddr": "$mac", "x": "$name_2"}',
        '{"type": "host-device", "hwaddr": "$mac"',
        '{"type": "host-device", "hwaddr": $mac}',
        '{"type": "host-device"}',
        '{"type": "host-device", "hwaddr": "$mac_x"}',
    ],
)
def test_the_chart_accepts_the_nad_templates_the_controller_accepts(
    helm: str, tmp_path: Path, template: str
) -> None:
    """The chart checks gateway.nadTemplate with the controller's rule, so a template the controller would
    refuse at start (exit 2, a crash-looping pod) is refused at install instead, and none it accepts is."""
    try:
        check_nad_template(template)
        controller_accepts = True
    except SettingsError:
        controller_accepts = False
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump({"gateway": {"nadTemplate": template}}))
    res = run_helm(helm, "template", "vpngw", str(CHART), "-f", str(f))
    assert (res.returncode == 0) == controller_accepts, res.stderr
    if controller_accepts:
        cfg = yaml.safe_load(
            one([d for d in yaml.safe_load_all(res.stdout) if d], "ConfigMap", "vpngw-controller")["data"][
                "config.yaml"
            ]
        )
        assert cfg["gatewayPod"]["nadTemplate"] == template


def _notes(helm: str, *args: str) -> str:
    res = run_helm(helm, "install", "vpngw", str(CHART), "-n", NAMESPACE, "--dry-run=client", *args)
    assert res.returncode == 0, res.stderr
    return res.stdout.split("NOTES:", 1)[1]


def test_the_notes_say_what_to_do_next_and_what_is_missing(helm: str) -> None:
    notes = _notes(helm)
    for what in (
        "kubectl get vpngateways",
        "kubectl explain vpngateway.spec",
        f"helm test vpngw -n {NAMESPACE}",
        f"kubectl -n {NAMESPACE} logs deployment/vpngw-controller",
        "-c status-agent",
        "Multus",
        "--allowed-unsafe-sysctls=net.ipv4.ip_forward,net.ipv4.conf.all.rp_filter",
        "internalSourceCIDRs is empty",
        "`helm upgrade` upgrades the CRDs too",
    ):
        assert what in notes, what
    # What to do next, without paths of the project's repository (a user has the chart, not the repository).
    assert "docs/" not in notes and "helm/vpngw" not in notes
    assert "apply the new chart version's CRDs yourself" in _notes(helm, "--set", "crds.install=false")
    assert "gateway-status" not in notes  # the obsolete status-agent ClusterRole is gone
    privileged = _notes(helm, "--set", "gateway.sysctls=privileged-init")
    assert "--allowed-unsafe-sysctls" not in privileged and "privileged" in privileged
    openstack = _notes(helm, "-f", str(CHART / "ci" / "openstack-values.yaml"))
    assert "Secret vpngw-openstack" in openstack and "create secret generic vpngw-openstack" in openstack
    assert "cloud.static.nics" not in openstack
    static = _notes(helm, "-f", str(CHART / "ci" / "static-values.yaml"))
    assert "(2 configured)" in static and "internalSourceCIDRs is empty" not in static


def test_cilium_policies_allow_the_api_server_by_entity(helm: str) -> None:
    """networkPolicy.cilium: one CiliumNetworkPolicy for the controller, one for the instance's gateway pods,
    each allowing egress to the entity kube-apiserver on the API server's endpoint ports; none by default."""
    assert not [d for d in render(helm) if d["kind"] == "CiliumNetworkPolicy"]
    docs = render(helm, "--set", "networkPolicy.cilium=true", "-f", str(CHART / "ci" / "static-values.yaml"))
    cnps = {d["metadata"]["namespace"]: d for d in docs if d["kind"] == "CiliumNetworkPolicy"}
    assert set(cnps) == {NAMESPACE, "vpngw-gateways"}
    controller = one(docs, "Deployment")
    assert (
        cnps[NAMESPACE]["spec"]["endpointSelector"]["matchLabels"]
        == controller["spec"]["selector"]["matchLabels"]
    )
    assert cnps["vpngw-gateways"]["spec"]["endpointSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "vpngw-gateway",  # controller/names.py labels()
        "vpn.bnerd.net/operator": "vpngw",
    }
    for cnp in cnps.values():
        (egress,) = cnp["spec"]["egress"]
        assert egress["toEntities"] == ["kube-apiserver"]
        assert egress["toPorts"] == [
            {"ports": [{"port": "6443", "protocol": "TCP"}]}
        ]  # static-values' apiServer
