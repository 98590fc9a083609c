"""The chart installed for real where it can be: into the Kubernetes API EMULATOR (``lab.kubeapi`` via
``lab.cluster``; docs/kubeapi.md says what it models), with the real helm and kubectl.

* ``helm template | kubectl apply -f -``: every object lands; then the controller runs as a process from
  the Deployment that landed (its args, env, downward API and volumes, as a kubelet would give them: see
  ``pod_process``) with a token of the chart's ServiceAccount, so the API server's RBAC (escalation
  included: the gateway pods' Roles) judges exactly what the chart grants; it reconciles a gateway
  following the chart-rendered --config. What is left out is the pod itself (no kubelet runs here), so
  --listen binds a free loopback port instead of the pod's own 8080 and cluster access is a kubeconfig
  with that token instead of the mounted one.
* ``helm install`` / ``helm upgrade``: the Prometheus Operator's objects appear exactly when the cluster
  serves their kinds (helm asks its discovery), the PodDisruptionBudget with a second replica, and a
  changed --config rolls the controller's pods (the checksum annotation).
* The OpenStack credentials Secret reaches the controller (mounted, OS_CLIENT_CONFIG_FILE, OS_CLOUD).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.cluster import ROOT, Cluster, Controller, home_of, secrets_for
from lab.ports import free_port
from lab.wait import wait_for
from tests.component.test_controller_operator import OWNED
from tests.component.test_helm_chart import CHART, NAMESPACE, helm, one, run_helm
from tests.helpers import condition

__all__ = ["helm"]  # the fixture

KUBECTL = str(ROOT / ".tools" / "bin" / "kubectl")
VPN = "vpn.bnerd.net/v1alpha1"
SA_USER = f"system:serviceaccount:{NAMESPACE}:vpngw-controller"
GATEWAYS = "vpngw-gateways"
STATIC_VALUES = CHART / "ci" / "static-values.yaml"
OPENSTACK_VALUES = CHART / "ci" / "openstack-values.yaml"


def kubectl(kubeconfig: Path, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KUBECTL, "--kubeconfig", str(kubeconfig), *args],
        input=input,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


Source = Callable[[str, str], Mapping[str, Any] | None]
"""(kind, name) -> the ConfigMap or Secret a volume refers to, from wherever the test holds them."""


def pod_process(
    deployment: Mapping[str, Any], source: Source, root: Path
) -> tuple[list[str], dict[str, str]]:
    """The first container of ``deployment``'s pod template as a kubelet would start it: its args (after the
    image's ENTRYPOINT) and environment, with the downward API's namespace and name, ``$(VAR)`` expanded
    from the container's env, and every volume mount made a directory under ``root`` (ConfigMap and Secret
    keys, or their ``items``, written as files with the volume's mode; emptyDirs empty) whose path replaces
    the mount path in the args and env values. Anything else in the spec fails the test."""
    md = deployment["metadata"]
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env: dict[str, str] = {}
    for e in container.get("env") or []:
        if "value" in e:
            env[e["name"]] = str(e["value"])
            continue
        field = e["valueFrom"]["fieldRef"]["fieldPath"]
        env[e["name"]] = {"metadata.namespace": md["namespace"], "metadata.name": f"{md['name']}-0"}[field]
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    mounts: dict[str, Path] = {}
    for m in container.get("volumeMounts") or []:
        vol = volumes[m["name"]]
        where = root / m["name"]
        where.mkdir(parents=True)
        for kind, key, ref in (("ConfigMap", "configMap", "name"), ("Secret", "secret", "secretName")):
            if key not in vol:
                continue
            obj = source(kind, vol[key][ref])
            assert obj is not None, f"volume {m['name']}: {kind} {vol[key][ref]} does not exist"
            data = dict(obj.get("data") or {})
            if kind == "Secret":
                data = {k: base64.b64decode(v).decode() for k, v in data.items()}
            items = vol[key].get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                assert item["key"] in data, f"volume {m['name']}: {kind} has no key {item['key']}"
                f = where / item["path"]
                f.write_text(data[item["key"]])
                f.chmod(vol[key].get("defaultMode", 0o644))
        if not ({"configMap", "secret", "emptyDir"} & set(vol)):
            pytest.fail(f"volume {m['name']}: a kind this helper does not know: {sorted(vol)}")
        mounts[m["mountPath"]] = where

    paths = "|".join(re.escape(p) for p in sorted(mounts, key=len, reverse=True))
    mounted = re.compile(rf"(^|=)({paths})(?=/|$)")

    def remap(s: str) -> str:  # one pass: a replaced path is never matched again
        return mounted.sub(lambda x: x.group(1) + str(mounts[x.group(2)]), s) if mounts else s

    env = {k: remap(v) for k, v in env.items()}
    args = [re.sub(r"\$\((\w+)\)", lambda x: env.get(x.group(1), x.group(0)), a) for a in container["args"]]
    return [remap(a) for a in args], env


def start_pod_process(
    c: Cluster, deployment: Mapping[str, Any], kubeconfig: Path, name: str = "pod"
) -> Controller:
    """``python -m controller`` (the image's ENTRYPOINT) with the Deployment's args and env, as a child of
    the test (stopped by the Cluster on every exit path)."""

    def source(kind: str, obj_name: str) -> dict[str, Any] | None:
        return c.get("v1", kind, obj_name, deployment["metadata"]["namespace"])

    ctl = spawn_controller(deployment, source, kubeconfig, c.workdir, name)
    c.controllers.append(ctl)
    return ctl


def spawn_controller(
    deployment: Mapping[str, Any], source: Source, kubeconfig: Path, workdir: Path, name: str = "pod"
) -> Controller:
    """The controller process of ``deployment``'s pod (``pod_process``), on a loopback port of its own
    choosing (``--listen=127.0.0.1:0``), with ``kubeconfig`` for cluster access; its log in
    ``workdir/<name>.log``. The caller stops it."""
    args, env = pod_process(deployment, source, workdir / name)
    args = [a if not a.startswith("--listen=") else "--listen=127.0.0.1:0" for a in args]
    run = args.index("run")
    args[run + 1 : run + 1] = ["--kubeconfig", str(kubeconfig)]
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "controller", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        )
    return Controller(proc, log_path)


def token_kubeconfig(c: Cluster, sa: str = "vpngw-controller") -> Path:
    token = c.kube.mint_token(NAMESPACE, sa)
    return c.kube.write_kubeconfig(c.workdir / f"{sa}.kubeconfig", token, NAMESPACE, sa)


def helm_template_apply(helm: str, c: Cluster, *args: str) -> list[dict[str, Any]]:
    res = run_helm(helm, "template", "vpngw", str(CHART), "-n", NAMESPACE, "--include-crds", *args)
    assert res.returncode == 0, res.stderr
    applied = kubectl(c.kubeconfig, "apply", "-f", "-", input=res.stdout)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def test_helm_template_applied_with_kubectl_then_the_controller_runs_as_the_charts_service_account(
    helm: str, tmp_path: Path
) -> None:
    with Cluster(tmp_path / "k8s") as c:
        c.add_node("vpn-a", labels={"node-role.kubernetes.io/vpn": ""})
        c.add_node("worker-b")  # not a VPN node: the chart's gateway.nodeSelector keeps gateways off it
        # The platform opts the tenant's namespace in (its label; the chart's tenant RoleBinding there).
        c.namespace("tenant-acme")
        docs = helm_template_apply(
            helm, c, "-f", str(STATIC_VALUES), "--set", "tenants.namespaces={tenant-acme}"
        )

        for d in docs:  # every rendered object landed as rendered
            md = d["metadata"]
            got = c.get(d["apiVersion"], d["kind"], md["name"], md.get("namespace", ""))
            assert got is not None, f"{d['kind']} {md['name']} did not land"
            for field in ("rules", "roleRef", "subjects", "data"):
                if field in d:
                    assert got[field] == d[field], (d["kind"], field)
        assert {d["kind"] for d in docs} >= {
            "Deployment",
            "ClusterRole",
            "Role",
            "NetworkPolicy",
            "ConfigMap",
        }

        kubeconfig = token_kubeconfig(c)
        # What the chart grants, as the API server answers the ServiceAccount itself.
        for verb, what, ns, allowed in (
            ("create", "roles.rbac.authorization.k8s.io", "tenant-acme", "yes"),
            ("create", "roles.rbac.authorization.k8s.io", "tenant-x", "no"),
            ("update", "roles.rbac.authorization.k8s.io", "kube-system", "no"),
            ("update", "deployments.apps", GATEWAYS, "yes"),
            ("update", "deployments.apps", "tenant-x", "no"),
            ("create", "configmaps", "tenant-x", "no"),
            ("update", "leases.coordination.k8s.io", NAMESPACE, "yes"),
            ("update", "leases.coordination.k8s.io", "tenant-x", "no"),
            ("delete", "deployments.apps", "tenant-acme", "yes"),  # migration.enabled (the default)
            ("delete", "deployments.apps", "tenant-x", "no"),
            ("create", "clusterroles.rbac.authorization.k8s.io", "", "no"),
            ("list", "secrets", "tenant-acme", "yes"),
            ("list", "secrets", "tenant-x", "no"),  # not opted in: no Secret read at all
            ("patch", "secrets", "tenant-acme", "no"),
        ):
            res = kubectl(kubeconfig, "auth", "can-i", verb, what, *(["-n", ns] if ns else []))
            assert res.stdout.strip() == allowed, (verb, what, ns, res.stdout, res.stderr)

        deployment = c.get("apps/v1", "Deployment", "vpngw-controller", NAMESPACE)
        assert deployment is not None
        ctl = start_pod_process(c, deployment, kubeconfig)
        wait_for(lambda: ctl.ready() or ctl.proc.poll() is not None, 30, "the controller to be ready")
        assert ctl.proc.poll() is None, ctl.log()
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        for probe in ("livenessProbe", "readinessProbe"):  # the Deployment's probes, as a kubelet asks them
            assert ctl.get(container[probe]["httpGet"]["path"])[0] == 200, probe

        # The user's path: the Secrets (opted in) and the example gateway, then kubectl get vpngateways.
        example_path = ROOT / "docs" / "examples" / "ipsec.yaml"
        c.apply(secrets_for([d for d in yaml.safe_load_all(example_path.read_text()) if d]))
        example = kubectl(c.kubeconfig, "apply", "-f", str(example_path))
        assert example.returncode == 0, example.stderr

        def reconciled() -> dict[str, Any] | None:
            gw = c.get(VPN, "VPNGateway", "acme", "tenant-acme") or {}
            ok = all(condition(gw, t).get("status") == "True" for t in ("ConfigRendered", "CloudReady"))
            return gw if ok and all(c.owned(a, k, "acme", "tenant-acme") for a, k in OWNED) else None

        gw = wait_for(reconciled, 30, "the gateway reconciled")
        # The chart's --config, followed: the static NIC, the gateway nodeSelector, image, resources, ...
        assert gw["status"]["publicIP"] == "203.0.113.10" and gw["status"]["nodeName"] == "vpn-a"
        gw_deploy = c.owned("apps/v1", "Deployment", "acme", "tenant-acme")
        assert gw_deploy is not None
        pod = gw_deploy["spec"]["template"]["spec"]
        values = yaml.safe_load(STATIC_VALUES.read_text())
        charon = next(x for x in pod["containers"] if x["name"] == "charon")
        assert charon["image"] == "localhost/vpngw-gateway:0.1.0"
        assert charon["resources"] == values["gateway"]["resources"]["charon"]
        assert values["gateway"]["tolerations"][0] in pod["tolerations"]
        assert pod["priorityClassName"] == "system-node-critical"
        assert pod["imagePullSecrets"] == [{"name": "gateway-pull"}]  # the gateway pods' own
        assert {s["name"] for s in pod["securityContext"]["sysctls"]} == {
            "net.ipv4.ip_forward",
            "net.ipv4.conf.all.rp_filter",
        }  # gateway.sysctls=pod
        nad = c.owned("k8s.cni.cncf.io/v1", "NetworkAttachmentDefinition", "acme", "tenant-acme")
        assert nad is not None
        assert json.loads(nad["spec"]["config"]) == {
            "cniVersion": "0.3.1",
            "name": home_of("acme", "tenant-acme")[0],
            "type": "host-device",
            "hwaddr": "fa:16:3e:00:00:01",
        }
        gw_netpol = c.owned("networking.k8s.io/v1", "NetworkPolicy", "acme", "tenant-acme")
        assert gw_netpol is not None
        assert {"ipBlock": {"cidr": "198.18.0.10/32"}} in [
            t for r in gw_netpol["spec"]["egress"] for t in r.get("to", [])
        ]
        # The gateway pod's Roles (in the gateway namespace, in the tenant's) were created by the
        # ServiceAccount: RBAC's escalation rule passed, with the Secret read of the tenant RoleBinding.
        created = c.kube.requests(user=SA_USER, verb="create", resource="roles")
        assert sorted((r.namespace, r.code) for r in created) == [("tenant-acme", 201), (GATEWAYS, 201)]
        # Leader election in the release namespace (POD_NAMESPACE, the downward API), the chart's Lease id.
        lease = c.get("coordination.k8s.io/v1", "Lease", "vpngw-controller", NAMESPACE)
        assert lease is not None and lease["spec"]["holderIdentity"]

        # The PodMonitor the chart renders selects the pods this controller creates, on a port they have.
        caps = ("--api-versions", "monitoring.coreos.com/v1/PodMonitor")
        monitor = one(
            [
                d
                for d in yaml.safe_load_all(
                    run_helm(helm, "template", "vpngw", str(CHART), "-n", NAMESPACE, *caps).stdout
                )
                if d
            ],
            "PodMonitor",
        )
        labels = gw_deploy["spec"]["template"]["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ports = {p["name"] for x in pod["containers"] for p in x.get("ports") or []}
        assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in ports

        listed = kubectl(c.kubeconfig, "get", "vpngateways", "-n", "tenant-acme")
        assert listed.returncode == 0 and "acme" in listed.stdout and "203.0.113.10" in listed.stdout
        refused = [(r.verb, r.path) for r in c.kube.requests(user=SA_USER) if r.code == 403]
        assert refused == []
        assert ctl.proc.poll() is None, ctl.log()


NO_CRDS = ("--set", "crds.install=false")
"""For ``helm install`` into the emulator: ``Cluster`` already serves the CRDs, created without Helm's
ownership metadata, which Helm refuses to adopt (docs/install.md says how to hand such CRDs to a release)."""


def _stand_in_crd(kind: str) -> dict[str, Any]:
    """A STAND-IN for one of the Prometheus Operator's CRDs (its name and group; any content), so the
    emulated cluster serves the kind the way a cluster with the Prometheus Operator does."""
    plural = kind.lower() + "s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com", "labels": {"vpngw.test/stand-in": "true"}},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }


def test_helm_install_and_upgrade_follow_what_the_cluster_serves(helm: str, tmp_path: Path) -> None:
    with Cluster(tmp_path / "k8s", gateway_namespace=False) as c:

        def install(verb: str, *args: str) -> str:
            res = run_helm(
                helm,
                verb,
                "vpngw",
                str(CHART),
                "-n",
                NAMESPACE,
                "--kubeconfig",
                str(c.kubeconfig),
                *NO_CRDS,
                *args,
            )
            assert res.returncode == 0, res.stdout + res.stderr
            return res.stdout.split("NOTES:", 1)[1]

        def checksum() -> str:
            d = c.get("apps/v1", "Deployment", "vpngw-controller", NAMESPACE)
            assert d is not None
            return str(d["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

        monitors = (
            ("ServiceMonitor", "vpngw-controller"),
            ("PodMonitor", "vpngw-gateways"),
            ("PrometheusRule", "vpngw"),
        )
        notes = install("install")
        for kind, _ in monitors:
            assert f"{kind}: NOT installed" in notes or (
                kind == "PrometheusRule" and "Alerting rules: NOT installed" in notes
            )
        assert c.get("apps/v1", "Deployment", "vpngw-controller", NAMESPACE) is not None
        assert c.get("policy/v1", "PodDisruptionBudget", "vpngw-controller", NAMESPACE) is None
        before = checksum()

        for kind, _ in monitors:
            c.kube.create(_stand_in_crd(kind))
        notes = install("upgrade", "--set", "controller.replicas=2")
        for kind, name in monitors:
            assert c.get("monitoring.coreos.com/v1", kind, name, NAMESPACE) is not None, kind
        assert "NOT installed" not in notes and "ServiceMonitor vpngw-controller" in notes
        pdb = c.get("policy/v1", "PodDisruptionBudget", "vpngw-controller", NAMESPACE)
        assert pdb is not None and pdb["spec"]["minAvailable"] == 1
        assert checksum() == before  # the config did not change: no roll

        install(
            "upgrade", "--set", "controller.replicas=2", "--set-json", 'internalSourceCIDRs=["10.0.0.0/16"]'
        )
        assert checksum() != before  # a new --config rolls the controller's pods
        cm = c.get("v1", "ConfigMap", "vpngw-controller", NAMESPACE)
        assert cm is not None and yaml.safe_load(cm["data"]["config.yaml"])["internalSourceCIDRs"] == [
            "10.0.0.0/16"
        ]
        gone = run_helm(helm, "uninstall", "vpngw", "-n", NAMESPACE, "--kubeconfig", str(c.kubeconfig))
        assert gone.returncode == 0, gone.stdout + gone.stderr  # its DELETEs carry protobuf DeleteOptions
        assert c.get("apps/v1", "Deployment", "vpngw-controller", NAMESPACE) is None


def _clouds(cloud: str) -> str:
    return yaml.safe_dump(
        {
            "clouds": {
                cloud: {
                    "auth_type": "none",
                    "auth": {"endpoint": f"http://127.0.0.1:{free_port()}"},
                    "region_name": "RegionOne",
                }
            }
        }
    )


def test_the_openstack_credentials_secret_reaches_the_controller(helm: str, tmp_path: Path) -> None:
    """The chart mounts the named Secret and points OS_CLIENT_CONFIG_FILE at it, OS_CLOUD at the entry:
    with a clouds.yaml lacking that entry the controller refuses to start (exit 2, naming --os-cloud);
    with it, it starts and is ready. (A real Neutron: tests/integration/test_controller_openstack.py.)"""
    with Cluster(tmp_path / "k8s", gateway_namespace=False) as c:
        helm_template_apply(helm, c, "-f", str(OPENSTACK_VALUES))
        deployment = c.get("apps/v1", "Deployment", "vpngw-controller", NAMESPACE)
        assert deployment is not None
        env = {
            e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert env["OS_CLOUD"] == "vpngw" and env["OS_CLIENT_CONFIG_FILE"] == "/etc/openstack/clouds.yaml"
        kubeconfig = token_kubeconfig(c)
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "vpngw-openstack", "namespace": NAMESPACE},
        }

        c.kube.create({**secret, "stringData": {"clouds.yaml": _clouds("some-other-cloud")}})
        wrong = start_pod_process(c, deployment, kubeconfig, name="wrong")
        assert wrong.proc.wait(60) == 2
        assert "--os-cloud vpngw" in wrong.log(), wrong.log()

        c.kube.delete("v1", "Secret", "vpngw-openstack", NAMESPACE)
        c.kube.create({**secret, "stringData": {"clouds.yaml": _clouds("vpngw")}})
        right = start_pod_process(c, deployment, kubeconfig, name="right")
        wait_for(lambda: right.ready() or right.proc.poll() is not None, 30, "the controller to be ready")
        assert right.proc.poll() is None, right.log()
        assert "cloud=openstack" in right.log()


def test_the_network_policies_allow_the_api_servers_endpoints_the_cluster_reports(
    helm: str, tmp_path: Path
) -> None:
    """Without networkPolicy.apiServer the chart reads default/kubernetes' EndpointSlice at install time (a
    CNI applies egress policy after kube-proxy's DNAT: the endpoints are what must be allowed), for the
    controller's own policy and, through its config, for every gateway pod's."""
    with Cluster(tmp_path / "k8s", gateway_namespace=False) as c:
        c.kube.create(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": "kubernetes",
                    "namespace": "default",
                    "labels": {"kubernetes.io/service-name": "kubernetes"},
                },
                "addressType": "IPv4",
                "endpoints": [
                    {"addresses": ["192.0.2.10"], "conditions": {"ready": True}},
                    {"addresses": ["192.0.2.11"]},
                    {"addresses": ["192.0.2.12"], "conditions": {"ready": False}},  # not an endpoint to allow
                ],
                "ports": [{"name": "https", "port": 6443, "protocol": "TCP"}],
            }
        )
        res = run_helm(
            helm, "install", "vpngw", str(CHART), "-n", NAMESPACE, "--kubeconfig", str(c.kubeconfig), *NO_CRDS
        )
        assert res.returncode == 0, res.stdout + res.stderr
        np = c.get("networking.k8s.io/v1", "NetworkPolicy", "vpngw-controller", NAMESPACE)
        assert np is not None
        blocks = [e for e in np["spec"]["egress"] if any("ipBlock" in t for t in e.get("to", []))]
        assert {(e["to"][0]["ipBlock"]["cidr"], e["ports"][0]["port"]) for e in blocks} == {
            ("192.0.2.10/32", 6443),
            ("192.0.2.11/32", 6443),
        }
        cm = c.get("v1", "ConfigMap", "vpngw-controller", NAMESPACE)
        assert cm is not None
        assert yaml.safe_load(cm["data"]["config.yaml"])["networkPolicy"]["apiServer"] == [
            "192.0.2.10/32:6443",
            "192.0.2.11/32:6443",
        ]
