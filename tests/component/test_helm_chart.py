"""The Helm chart, checked with the real helm binary (installed by scripts/setup.sh into .tools/bin).

Its CRDs, the controller's RBAC rules and the monitoring files are generated copies (controller.chartgen:
from controller.api.crds, controller.rbac and monitoring/); these tests fail on drift, so the chart a platform
engineer installs always carries the admission rules the controller validates with and exactly the rights
its code uses.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.api.crds import crds
from controller.chartgen import COPIES, generated_files, rules_file
from controller.rbac import (
    CLUSTER,
    GATEWAY_NAMESPACE,
    LEADER_ELECTION,
    MIGRATION,
    SCOPES,
    TENANT_NAMESPACE,
    rules,
)

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "vpngw"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
HELM = shutil.which("helm", path=str(ROOT / ".tools" / "bin")) or shutil.which("helm")
NAMESPACE = "vpngw-system"

PROMETHEUS_OPERATOR = tuple(
    arg
    for kind in ("PrometheusRule", "ServiceMonitor", "PodMonitor")
    for arg in ("--api-versions", f"monitoring.coreos.com/v1/{kind}")
)
"""What a cluster with the Prometheus Operator's CRDs tells helm (``helm template`` knows no cluster)."""
MONITORING_KINDS = {"PrometheusRule", "ServiceMonitor", "PodMonitor"}
CONTROLLER_KINDS = [
    "ClusterRole",
    "ClusterRoleBinding",
    "ConfigMap",
    "CustomResourceDefinition",
    "Deployment",
    "Namespace",
    "NetworkPolicy",
    "Pod",  # `helm test`'s hook
    "Role",
    "RoleBinding",
    "Service",
    "ServiceAccount",
]


@pytest.fixture(scope="module")
def helm() -> str:
    if HELM is None:
        pytest.fail("helm is missing: run scripts/setup.sh (it installs helm into .tools/bin)")
    return HELM


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, check=False, cwd=ROOT)


def render(
    helm: str, *args: str, release: str = "vpngw", namespace: str = NAMESPACE, crds: bool = False
) -> list[dict[str, Any]]:
    """``helm template`` of the chart: its documents (the CRDs too with ``crds``)."""
    res = run_helm(
        helm, "template", release, str(CHART), "-n", namespace, *(["--include-crds"] if crds else []), *args
    )
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def _template(helm: str, *args: str) -> list[dict[str, Any]]:
    return render(helm, *args, release="t", namespace="default", crds=True)


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    return doc


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: v.name if v else "no-file")
def test_chart_lints_strictly(helm: str, values: Path | None) -> None:
    res = run_helm(helm, "lint", "--strict", str(CHART), *(["-f", str(values)] if values else []))
    assert res.returncode == 0, res.stdout + res.stderr


def test_chart_crds_are_the_generated_ones(helm: str) -> None:
    """The rendered CRDs are `python -m controller crds` plus the chart's labels and the keep policy."""
    generated = subprocess.run(
        [sys.executable, "-m", "controller", "crds"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    rendered = [d for d in render(helm) if d["kind"] == "CustomResourceDefinition"]
    for crd in rendered:
        meta = crd["metadata"]
        assert meta.pop("annotations") == {"helm.sh/resource-policy": "keep"}, (
            "helm uninstall must keep the CRDs"
        )
        labels = meta.pop("labels")
        assert labels["app.kubernetes.io/managed-by"] == "Helm" and labels["helm.sh/chart"].startswith(
            "vpngw-"
        )
    assert rendered == list(yaml.safe_load_all(generated)), (
        "helm/vpngw/templates/crds.yaml drifted from `python -m controller crds`: run `make chart`"
    )


def test_crds_install_false_renders_no_crd(helm: str) -> None:
    docs = render(helm, "--set", "crds.install=false")
    assert docs and not [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    assert not (CHART / "crds").exists(), "Helm never upgrades crds/: the CRDs are templates"


@pytest.mark.parametrize("path", sorted(generated_files()))
def test_chart_generated_files_are_what_the_generator_writes(path: str) -> None:
    assert (CHART / path).read_text() == generated_files()[path], (
        f"helm/vpngw/{path} drifted from controller.chartgen (controller/rbac.py, controller/api/crds.py): "
        "run `make chart`"
    )


@pytest.mark.parametrize("name", sorted(COPIES))
def test_chart_monitoring_files_are_copies_of_monitoring(name: str) -> None:
    assert (CHART / name).read_bytes() == (ROOT / COPIES[name]).read_bytes(), (
        f"helm/vpngw/{name} drifted from {COPIES[name]}: run `make chart`"
    )


def test_the_rendered_rbac_is_exactly_the_declared_rights(helm: str) -> None:
    """Each scope of controller/rbac.py becomes one Role or ClusterRole with exactly its rules, bound where
    the scope says: cluster-wide, in the gateway namespace, in each listed tenant namespace (and nowhere
    else: no cluster-wide Secret read), while migrating, in the release's namespace. No other RBAC object is
    rendered (the gateway pods' Roles are the controller's to create, per gateway)."""
    docs = render(helm, *PROMETHEUS_OPERATOR, "--set", "tenants.namespaces={tenant-a,tenant-b}")
    rbac = [d for d in docs if d["apiVersion"].startswith("rbac.authorization.k8s.io/")]
    got = sorted((d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", "")) for d in rbac)
    gw = "vpngw-gateways"
    assert got == sorted(
        [
            ("ClusterRole", "vpngw-controller", ""),
            ("ClusterRoleBinding", "vpngw-controller", ""),
            ("Role", "vpngw-controller", gw),
            ("RoleBinding", "vpngw-controller", gw),
            ("ClusterRole", "vpngw-controller-tenant", ""),
            ("RoleBinding", "vpngw-controller-tenant", "tenant-a"),
            ("RoleBinding", "vpngw-controller-tenant", "tenant-b"),
            ("ClusterRole", "vpngw-controller-migration", ""),
            ("RoleBinding", "vpngw-controller-migration", "tenant-a"),
            ("RoleBinding", "vpngw-controller-migration", "tenant-b"),
            ("Role", "vpngw-controller-leader-election", NAMESPACE),
            ("RoleBinding", "vpngw-controller-leader-election", NAMESPACE),
        ]
    )
    by = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace", "")): d for d in rbac}
    for scope, key in (
        (CLUSTER, ("ClusterRole", "vpngw-controller", "")),
        (GATEWAY_NAMESPACE, ("Role", "vpngw-controller", gw)),
        (TENANT_NAMESPACE, ("ClusterRole", "vpngw-controller-tenant", "")),
        (MIGRATION, ("ClusterRole", "vpngw-controller-migration", "")),
        (LEADER_ELECTION, ("Role", "vpngw-controller-leader-election", NAMESPACE)),
    ):
        assert by[key]["rules"] == rules(scope), scope.name
    sa = [{"kind": "ServiceAccount", "name": "vpngw-controller", "namespace": NAMESPACE}]
    for d in rbac:
        if d["kind"].endswith("Binding"):
            assert d["subjects"] == sa and d["roleRef"]["name"] == d["metadata"]["name"], d["metadata"]
    secrets = [
        (k, n) for (k, n, _), d in by.items() if any("secrets" in r["resources"] for r in d.get("rules", []))
    ]
    assert secrets == [("ClusterRole", "vpngw-controller-tenant")], "Secrets only through the tenant bindings"
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "vpngw-controller"
    # Each rule's reason travels with it into the rendered manifest.
    rendered = run_helm(helm, "template", "vpngw", str(CHART), "-s", "templates/controller-rbac.yaml").stdout
    assert "# controller.desired: the gateway pod" in rendered
    assert all((CHART / rules_file(s)).exists() for s in SCOPES)
    off = render(helm, "--set", "migration.enabled=false")
    assert not [d for d in off if d["metadata"]["name"].endswith("-migration")]
    args = one(off, "Deployment", "vpngw-controller")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-migrate" in args and f"--gateway-namespace={gw}" in args


def test_the_gateway_namespace_is_made_privileged_and_kept(helm: str) -> None:
    ns = one(render(helm), "Namespace")
    assert ns["metadata"]["name"] == "vpngw-gateways"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert ns["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert not [d for d in render(helm, "--set", "gateway.createNamespace=false") if d["kind"] == "Namespace"]


def test_rendered_chart_carries_crds_rules_and_dashboard_verbatim(helm: str) -> None:
    docs = _template(helm, *PROMETHEUS_OPERATOR)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds.count("CustomResourceDefinition") == 4
    crd_names = {d["metadata"]["name"] for d in docs if d["kind"] == "CustomResourceDefinition"}
    assert {"vpngateways.vpn.bnerd.net", "vpnpeers.vpn.bnerd.net"} <= crd_names
    rule = one(docs, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load((ROOT / "monitoring" / "alerts.yml").read_text())
    # Prometheus' own templates must reach Prometheus untouched by Helm.
    descriptions = [r["annotations"]["description"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert any("{{ $labels." in d for d in descriptions)
    dash = one(docs, "ConfigMap", "t-vpngw-dashboard")
    assert json.loads(dash["data"]["vpngw.json"]) == json.loads(
        (ROOT / "monitoring" / "grafana-dashboard.json").read_text()
    )
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_monitoring_objects_can_be_switched_off(helm: str) -> None:
    on = render(helm, *PROMETHEUS_OPERATOR)
    assert {d["kind"] for d in on} >= MONITORING_KINDS
    off = render(
        helm,
        *PROMETHEUS_OPERATOR,
        *("--set", "monitoring.prometheusRule.enabled=false"),
        *("--set", "monitoring.grafanaDashboard.enabled=false"),
        *("--set", "monitoring.serviceMonitor.enabled=false"),
        *("--set", "monitoring.podMonitor.enabled=false"),
    )
    assert sorted({d["kind"] for d in off}) == CONTROLLER_KINDS
    assert [d["metadata"]["name"] for d in off if d["kind"] == "ConfigMap"] == ["vpngw-controller"]


def test_without_the_prometheus_operator_its_objects_are_left_out_and_the_notes_say_so(helm: str) -> None:
    """On a cluster that does not serve monitoring.coreos.com/v1, rendering one of its kinds would fail the
    whole install."""
    docs = _template(helm)
    assert not MONITORING_KINDS & {d["kind"] for d in docs}
    assert "ConfigMap" in {d["kind"] for d in docs}
    res = run_helm(helm, "install", "t", str(CHART), "--dry-run=client")
    assert res.returncode == 0, res.stderr
    notes = res.stdout.split("NOTES:", 1)[1]
    assert "Alerting rules: NOT installed" in notes and "PrometheusRule" in notes
    assert "ServiceMonitor: NOT installed" in notes and "PodMonitor: NOT installed" in notes


def test_the_chart_refuses_a_kubernetes_without_cel_reason_and_field_path(helm: str) -> None:
    old = run_helm(helm, "template", "t", str(CHART), "--kube-version", "1.27.9")
    assert old.returncode != 0 and "kubeVersion" in old.stderr
    assert _template(helm, "--kube-version", "1.28.0")


def test_helm_test_checks_readyz_and_that_the_crds_are_served(helm: str) -> None:
    """`helm test`'s pod, rendered (the real-install tier runs no kubelet, so no pod of the chart runs there):
    a test hook in the controller's image (whose python runs the check) reaching the controller's Service,
    admitted by the controller's NetworkPolicy, and expecting exactly the CRDs' group/versions and plurals."""
    docs = render(helm)
    (pod,) = [d for d in docs if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    assert pod["kind"] == "Pod" and pod["spec"]["restartPolicy"] == "Never"
    (c,) = pod["spec"]["containers"]
    assert c["image"] == one_controller(docs)["image"] and c["command"] == ["python", "-c"]
    script = c["args"][0]
    compile(script, "helm-test", "exec")
    assert f"http://vpngw-controller.{NAMESPACE}.svc:8080/readyz" in script
    (want_line,) = [line for line in script.splitlines() if line.startswith("want = ")]
    want = ast.literal_eval(want_line.removeprefix("want = "))
    served: dict[str, set[str]] = {}
    for crd in crds():
        for v in crd["spec"]["versions"]:
            if v["served"]:
                served.setdefault(f"{crd['spec']['group']}/{v['name']}", set()).add(
                    crd["spec"]["names"]["plural"]
                )
    assert want == served
    assert c["securityContext"]["readOnlyRootFilesystem"] and c["securityContext"]["capabilities"][
        "drop"
    ] == ["ALL"]
    np = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "vpngw-controller")
    pod_labels = pod["metadata"]["labels"]
    assert any(
        all(
            pod_labels.get(k) == v
            for k, v in src.get("podSelector", {}).get("matchLabels", {"-": "-"}).items()
        )
        for rule in np["spec"]["ingress"]
        for src in rule["from"]
    ), "the controller's NetworkPolicy must admit the test pod"


def one_controller(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (d,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "vpngw-controller"]
    return dict(d["spec"]["template"]["spec"]["containers"][0])


def test_chart_metadata_lists_the_crds_and_images_it_installs(helm: str) -> None:
    """Artifact Hub's annotations are hand-written: they must name exactly the CRDs and images rendered."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    listed = yaml.safe_load(chart["annotations"]["artifacthub.io/crds"])
    assert [(c["kind"], c["name"], c["version"], c["description"]) for c in listed] == [
        (
            c["spec"]["names"]["kind"],
            c["metadata"]["name"],
            c["spec"]["versions"][0]["name"],
            c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"],
        )
        for c in crds()
    ]
    images = {i["name"]: i["image"] for i in yaml.safe_load(chart["annotations"]["artifacthub.io/images"])}
    docs = render(helm)
    controller = one_controller(docs)
    assert images["controller"] == controller["image"]
    assert f"--gateway-image={images['gateway']}" in controller["args"]
    assert {"vpn", "ipsec", "wireguard"} <= set(chart["keywords"])
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}


def test_log_format_reaches_the_controller_and_through_it_the_gateway_pods(helm: str, tmp_path: Path) -> None:
    """``logFormat`` is the controller's ``--log-format``; the controller's settings, read from the rendered
    command line and ConfigMap as the pod would, give the gateway pods the same (``GatewayPod.log_format``,
    tests/unit/test_gateway_log_format.py: their programs' command lines)."""
    from controller.__main__ import build_parser
    from controller.runcli import settings_of

    for values, want in (((), "text"), (("--set", "logFormat=json"), "json")):
        docs = render(helm, *values)
        args = build_parser().parse_args(one_controller(docs)["args"])
        assert args.command == "run" and args.log_format == want
        config = tmp_path / f"config-{want}.yaml"
        config.write_text(one(docs, "ConfigMap", "vpngw-controller")["data"]["config.yaml"])
        args.config = config
        assert settings_of(args).pod.log_format == want
    res = run_helm(helm, "template", "vpngw", str(CHART), "-n", NAMESPACE, "--set", "logFormat=yaml")
    assert res.returncode != 0 and "logFormat" in res.stderr and "'text', 'json'" in res.stderr, res.stderr


def test_the_pod_monitor_scrapes_exactly_the_ports_the_gateway_network_policy_admits(helm: str) -> None:
    """The PodMonitor names container ports; the controller's NetworkPolicy for each gateway pod admits the
    monitoring namespace by port number. Each scraped port must be admitted (else Prometheus times out on
    it, and nothing says why), and nothing is admitted that is not scraped."""
    from tests.unit.test_controller_desired import IPSEC, WIREGUARD, by_kind, run, snapshot

    monitor = one(render(helm, *PROMETHEUS_OPERATOR), "PodMonitor")
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    assert {e["path"] for e in endpoints} == {"/metrics"}
    for docs in (IPSEC, WIREGUARD):
        objs = by_kind(run(snapshot(docs)))
        pod = objs["Deployment"]["spec"]["template"]["spec"]
        ports = {p["name"]: p["containerPort"] for c in pod["containers"] for p in c.get("ports") or []}
        scraped = {ports[e["port"]] for e in endpoints}  # KeyError: a port the pod does not have
        (rule,) = objs["NetworkPolicy"]["spec"]["ingress"]
        assert rule["from"] == [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ]
        assert {p["port"] for p in rule["ports"]} == scraped == set(ports.values())
        assert {p["protocol"] for p in rule["ports"]} == {"TCP"}


ADDED_SINCE_0_1_0: tuple[tuple[str, ...], ...] = (
    ("logFormat",),
    ("crds",),
    ("networkPolicy", "cilium"),
    ("monitoring", "runbookBaseURL"),
)
"""values.yaml keys chart 0.1.0 did not have (add each key you add). ``helm upgrade --reuse-values`` from a
0.1.0 release renders the new templates with that release's values, where they are absent."""


def defaults_of_0_1_0() -> dict[str, Any]:
    """values.yaml without the keys added since chart 0.1.0."""
    old = yaml.safe_load((CHART / "values.yaml").read_text())
    for path in ADDED_SINCE_0_1_0:
        parent = old
        for key in path[:-1]:
            parent = parent[key]
        del parent[path[-1]]  # KeyError: the key is not in values.yaml (any more)
    return dict(old)


def chart_with_values(tmp_path: Path, values: dict[str, Any]) -> Path:
    """A copy of the chart whose values.yaml (its defaults) is ``values``: what ``--reuse-values`` does
    (Helm replaces the new chart's defaults with the old release's coalesced values)."""
    copy = tmp_path / "vpngw"
    shutil.copytree(CHART, copy)
    (copy / "values.yaml").write_text(yaml.safe_dump(values, sort_keys=False))
    return copy


def test_a_release_without_the_settings_added_since_0_1_0_renders_as_with_their_defaults(
    helm: str, tmp_path: Path
) -> None:
    """`helm upgrade --reuse-values` from chart 0.1.0: every template reads a newer key with its values.yaml
    default (before: ``nil pointer evaluating interface {}.install`` in templates/crds.yaml, and the schema
    required logFormat), so the objects are exactly what the defaults render, the CRDs included."""
    chart = chart_with_values(tmp_path, defaults_of_0_1_0())

    def rendered(where: Path) -> list[dict[str, Any]]:
        res = run_helm(
            helm, "template", "vpngw", str(where), "-n", NAMESPACE, "--include-crds", *PROMETHEUS_OPERATOR
        )
        assert res.returncode == 0, res.stderr
        return [d for d in yaml.safe_load_all(res.stdout) if d]

    docs = rendered(chart)
    assert len([d for d in docs if d["kind"] == "CustomResourceDefinition"]) == 4
    assert "--log-format=text" in one_controller(docs)["args"]
    assert docs == rendered(CHART)
    res = run_helm(helm, "install", "vpngw", str(chart), "-n", NAMESPACE, "--dry-run=client")
    assert res.returncode == 0, res.stderr
    notes = res.stdout.split("NOTES:", 1)[1]
    assert "`helm upgrade` upgrades the CRDs too" in notes and "--reset-then-reuse-values" in notes


def test_the_chart_version_says_the_crds_moved_and_the_app_version_is_the_projects() -> None:
    """0.1.0 shipped the CRDs in crds/; a chart with them in templates/ (crds.install, --skip-crds no longer
    skips them) is another chart version. appVersion is the version every program reports (gwkit.version:
    pyproject.toml's) and the images' tag (images/build.sh), which the image defaults derive from."""
    import tomllib

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (CHART / "templates" / "crds.yaml").exists() and not (CHART / "crds").exists()
    major, minor, _ = (int(x) for x in str(chart["version"]).split("."))
    assert (major, minor) >= (0, 2), chart["version"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == project


def test_gateways_are_pinned_to_linux_nodes_by_default(helm: str, tmp_path: Path) -> None:
    """The controller pins gateway pods itself (nodeName, no scheduler): gateway.nodeSelector's default
    kubernetes.io/os=linux reaches its --config, and its placement never picks an untainted Windows node
    (AKS' default). A selector set in a values file adds to it (Helm merges maps); null removes it."""
    from controller.__main__ import build_parser
    from controller.placement import place
    from controller.runcli import settings_of
    from lab.cluster import node

    def selector(*values: str) -> dict[str, str]:
        docs = render(helm, *values)
        args = build_parser().parse_args(one_controller(docs)["args"])
        config = tmp_path / "config.yaml"
        config.write_text(one(docs, "ConfigMap", "vpngw-controller")["data"]["config.yaml"])
        args.config = config
        return dict(settings_of(args).pod.node_selector)

    linux = {"kubernetes.io/os": "linux"}
    assert selector() == linux
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    windows = {**node("aks-win-0", labels={"kubernetes.io/os": "windows"}), **ready}
    lab = {**node("z-linux"), **ready}  # the lab's nodes carry the label, as every kubelet registers it
    chosen = place(None, [windows, lab], {}, selector=selector(), tolerations=[])
    assert chosen.node == "z-linux", chosen
    assert place(None, [windows], {}, selector=selector(), tolerations=[]).node is None
    assert selector("-f", str(CHART / "ci" / "static-values.yaml")) == {
        **linux,
        "node-role.kubernetes.io/vpn": "",
    }
    assert selector("--set", "gateway.nodeSelector.kubernetes\\.io/os=null") == {}


def test_runbook_urls_are_made_absolute_with_runbook_base_url(helm: str) -> None:
    """Alertmanager cannot open a relative runbook_url: monitoring.runbookBaseURL prefixes each one; the
    rest of every rule (Prometheus' own {{ }} templates too) is alerts.yml's."""
    alerts = yaml.safe_load((ROOT / "monitoring" / "alerts.yml").read_text())
    base = "https://git.example.com/vpngw/blob/v0.1.0"
    for given in (base, base + "/"):
        spec = one(
            render(helm, *PROMETHEUS_OPERATOR, "--set", f"monitoring.runbookBaseURL={given}"),
            "PrometheusRule",
        )["spec"]
        urls = [r["annotations"].pop("runbook_url") for g in spec["groups"] for r in g["rules"]]
        want = [r["annotations"].get("runbook_url") for g in alerts["groups"] for r in g["rules"]]
        assert urls == [f"{base}/{u}" for u in want] and all(u.startswith("docs/runbooks.md#") for u in want)
        for g in alerts["groups"]:
            for r in g["rules"]:
                r["annotations"].pop("runbook_url", None)
        assert spec == alerts
        alerts = yaml.safe_load((ROOT / "monitoring" / "alerts.yml").read_text())
    res = run_helm(helm, "template", "t", str(CHART), "--set", "monitoring.runbookBaseURL=docs/")
    assert res.returncode != 0 and "runbookBaseURL" in res.stderr, res.stderr


def notes_of(helm: str, *args: str) -> str:
    res = run_helm(helm, "install", "vpngw", str(CHART), "-n", NAMESPACE, "--dry-run=client", *args)
    assert res.returncode == 0, res.stderr
    return res.stdout.split("NOTES:", 1)[1]


def test_the_notes_give_the_operating_commands_and_warn_of_unpublished_images(helm: str) -> None:
    notes = notes_of(helm)
    (get,) = [line for line in notes.splitlines() if "kubectl get vpngateways,vpnpeers -A" in line]
    columns = {
        c["spec"]["names"]["kind"]: {
            col["name"].upper() for col in c["spec"]["versions"][0]["additionalPrinterColumns"]
        }
        for c in crds()
    }
    assert "TUNNELS" in get and "TUNNELS" in columns["VPNGateway"]
    assert "STATE" in get and "STATE" in columns["VPNPeer"]
    assert (
        "kubectl vpngw diagnose <namespace>/<name>" in notes and (ROOT / "scripts" / "kubectl-vpngw").exists()
    )
    assert "python -m controller diagnose <namespace>/<name>" in notes
    from controller.__main__ import build_parser

    assert build_parser().parse_args(["diagnose", "tenant-acme/acme"]).command == "diagnose"
    assert "WARNING" in notes and "ImagePullBackOff" in notes
    for which in ("controller", "gateway"):
        assert f"images.{which}.repository=localhost/vpngw-{which}" in notes
    published = notes_of(
        helm,
        *("--set", "images.controller.repository=registry.example/vpngw-controller"),
        *("--set", "images.gateway.repository=registry.example/vpngw-gateway"),
    )
    assert "WARNING" not in published and "ImagePullBackOff" not in published
    one_local = notes_of(helm, "--set", "images.controller.repository=registry.example/vpngw-controller")
    assert "images.gateway.repository=localhost/vpngw-gateway" in one_local
    assert "images.controller.repository" not in one_local


def test_the_readme_says_who_owns_the_crds_how_to_skip_them_and_the_tested_helm(helm: str) -> None:
    readme = " ".join((CHART / "README.md").read_text().split())
    assert "only skip a chart's `crds/` directory" in readme and "`crds.install=false`" in readme
    for skip in ("`--skip-crds`", "`skipCrds: true`", "`install.crds: Skip`"):
        assert skip in readme, skip
    assert (
        "exactly one installs with `crds.install=true`" in readme and "invalid ownership metadata" in readme
    )
    tested = run_helm(helm, "version", "--template", "{{ .Version }}").stdout.strip().removeprefix("v")
    assert f"Tested with Helm {tested} " in readme, tested
    assert "Helm 3 is untested here" in readme


def test_the_notes_say_how_to_check_ha_only_where_it_is_allowed(helm: str) -> None:
    ha = notes_of(helm, "-f", str(CHART / "ci" / "gateway-ha-static-values.yaml"))
    assert "{.status.ha}" in ha and "reason=Failover" in ha and '"<namespace>/<name>#b"' in ha
    assert "{.status.ha}" not in notes_of(helm)
    openstack = notes_of(helm, "-f", str(CHART / "ci" / "openstack-values.yaml"), "--set", "ha.allowed=true")
    assert "{.status.ha}" in openstack and "#b" not in openstack
