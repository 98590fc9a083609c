"""PodSecurity admission in the API emulator (lab.kubeapi.podsecurity and the store's use of it): the
checks' words and order as k8s.io/pod-security-admission v0.35.4 gives them, the namespace labels'
policy, which writes are checked, and the switch. The words against the real server: the
``pod_security`` differential scenario (tests/kube_differential.py)."""

from __future__ import annotations

from typing import Any

import pytest

from lab.kubeapi import podsecurity as ps
from lab.kubeapi.errors import ApiError
from lab.kubeapi.store import Store
from tests.component.test_controller_pod_ready import PODSECURITY
from tests.examples import example_docs
from tests.unit.test_controller_desired import by_kind, run, snapshot

ENFORCE = "pod-security.kubernetes.io/enforce"


def gateway_template() -> dict[str, Any]:
    template: dict[str, Any] = by_kind(run(snapshot(example_docs("ipsec.yaml"))))["Deployment"]["spec"][
        "template"
    ]
    return template


def test_the_gateway_pod_at_baseline_is_refused_in_the_real_servers_words() -> None:
    # PODSECURITY was captured from kube-apiserver v1.35.4 refusing the controller's gateway pod.
    t = gateway_template()
    detail = ps.refusal({ENFORCE: "baseline"}, t["metadata"], t["spec"])
    assert detail is not None
    assert PODSECURITY.endswith(f" is forbidden: {detail}"), detail


def test_restricted_runs_the_baseline_checks_first_and_replaces_the_ones_it_overrides() -> None:
    spec = {
        "hostPID": True,
        "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
        "containers": [{"name": "c", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}],
    }
    reasons = [r for r, _ in ps.evaluate("restricted", {}, spec)]
    assert reasons == [
        "host namespaces",
        "allowPrivilegeEscalation != false",
        "unrestricted capabilities",
        "restricted volume types",
        "runAsNonRoot != true",
        "seccompProfile",
    ]
    assert [r for r, _ in ps.evaluate("baseline", {}, spec)] == [
        "non-default capabilities",
        "host namespaces",
        "hostPath volumes",
    ]
    assert ps.evaluate("privileged", {}, spec) == []


def test_a_pod_that_meets_restricted_passes() -> None:
    container = {
        "name": "c",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
        },
    }
    spec = {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": "v", "projected": {"sources": []}}],
    }
    assert ps.evaluate("restricted", {}, spec) == []


@pytest.mark.parametrize(
    ("labels", "want"),
    [
        ({}, ps.Policy()),
        (
            {ENFORCE: "restricted"},
            ps.Policy(ps.LevelVersion("restricted"), ps.LevelVersion(), ps.LevelVersion("restricted")),
        ),
        (
            {ENFORCE: "baseline", "pod-security.kubernetes.io/warn": "privileged"},
            ps.Policy(ps.LevelVersion("baseline"), ps.LevelVersion(), ps.LevelVersion()),
        ),
        (
            {ENFORCE: "baseline", "pod-security.kubernetes.io/enforce-version": "v1.30"},
            ps.Policy(
                ps.LevelVersion("baseline", "v1.30"), ps.LevelVersion(), ps.LevelVersion("baseline", "v1.30")
            ),
        ),
        (
            {ENFORCE: "nonsense"},
            ps.Policy(ps.LevelVersion("restricted"), ps.LevelVersion(), ps.LevelVersion()),
        ),
    ],
)
def test_the_namespace_labels_make_the_policy(labels: dict[str, str], want: ps.Policy) -> None:
    assert ps.policy(labels) == want


def _store(*, pod_security: bool = True, level: str = "restricted") -> Store:
    store = Store(pod_security=pod_security)
    store.create(store.rtype("", "namespaces"), "", {"metadata": {"name": "t", "labels": {ENFORCE: level}}})
    return store


def _pod(name: str = "p", image: str = "x") -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": image}]}}


def test_the_store_refuses_a_pod_and_warns_about_a_deployment() -> None:
    store = _store()
    with pytest.raises(ApiError) as err:
        store.create(store.rtype("", "pods"), "t", _pod())
    assert err.value.code == 403 and err.value.reason == "Forbidden"
    assert err.value.message.startswith('pods "p" is forbidden: violates PodSecurity "restricted:latest": ')
    t = gateway_template()
    deployment = {
        "metadata": {"name": "d"},
        "spec": {"selector": {"matchLabels": t["metadata"]["labels"]}, "template": t},
    }
    warnings: list[str] = []
    store.create(store.rtype("apps", "deployments"), "t", deployment, warnings=warnings)
    assert [w.split(": ")[0] for w in warnings] == ['would violate PodSecurity "restricted:latest"']


def test_only_significant_pod_updates_and_no_status_write_are_checked() -> None:
    store = _store(level="privileged")
    pods = store.rtype("", "pods")
    store.create(pods, "t", _pod())
    merge = "application/merge-patch+json"
    labels = {"metadata": {"labels": {ENFORCE: "restricted"}}}
    store.patch(store.rtype("", "namespaces"), "", "t", merge, labels)
    store.patch(pods, "t", "p", merge, {"metadata": {"labels": {"a": "b"}}})
    store.patch(pods, "t", "p", merge, {"status": {"phase": "Running"}}, subresource="status")
    with pytest.raises(ApiError) as err:
        store.patch(pods, "t", "p", merge, {"spec": {"containers": [{"name": "c", "image": "y"}]}})
    assert err.value.code == 403


def test_switched_off_every_pod_is_admitted() -> None:
    store = _store(pod_security=False)
    store.create(store.rtype("", "pods"), "t", _pod())
