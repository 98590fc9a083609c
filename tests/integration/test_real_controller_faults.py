"""The controller against the REAL control plane through the fault-injecting proxy (lab.controlplane.proxy),
installed as tests/integration/test_real_install.py installs it (the chart, static cloud, the chart's
ServiceAccount token): injected 409s on its writes and 500s on its lists, and it converges without an
error loop; a no-op resync writes nothing, read from the proxy's request log (the emulator's version:
tests/component/test_controller_operator.py ``test_a_no_op_resync_writes_nothing``)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from gwkit.kube.client import BOOKMARK_SILENCE
from lab.cluster import Controller, secrets_for
from lab.controlplane import ControlPlane
from lab.controlplane.proxy import Fault, KubeProxy, status
from lab.openstack.proxy import Record
from lab.wait import wait_for
from tests.component.test_controller_operator import metric
from tests.component.test_helm_chart import NAMESPACE
from tests.component.test_helm_install import GATEWAYS, spawn_controller
from tests.helpers import condition
from tests.integration.test_real_install import EXAMPLE, TENANT, get, helm, installed, node, owned, waiting

__all__ = ["helm", "installed", "node"]  # the fixtures

pytestmark = pytest.mark.lab

AGENT = "vpngw-controller"  # the controller's User-Agent
NOT_WATCH = r"^(?!.*watch=)"
GATEWAY_LISTS = r"^/apis/vpn\.bnerd\.net/v1alpha1/(namespaces/[^/]+/)?vpngateways$"
DEPLOYMENT_LISTS = r"^/apis/apps/v1/(namespaces/[^/]+/)?deployments$"


@pytest.fixture
def proxy(controlplane: ControlPlane) -> Iterator[KubeProxy]:
    with KubeProxy(controlplane) as p:
        yield p


def start_through(cp: ControlPlane, proxy: KubeProxy, sa: Path, root: Path, resync: int) -> Controller:
    """The chart's controller (its Deployment's args and env), its API traffic through ``proxy`` with the
    ServiceAccount's token, resyncing every ``resync`` seconds."""
    deployment = get(cp, "deployment", "vpngw-controller", "-n", NAMESPACE)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    at = next(i for i, a in enumerate(args) if a.startswith("--resync-seconds="))
    args[at] = f"--resync-seconds={resync}"

    def source(kind: str, name: str) -> Mapping[str, Any] | None:
        return get(cp, kind.lower(), name, "-n", NAMESPACE)  # type: ignore[no-any-return]

    kubeconfig = proxy.kubeconfig(sa, root / "controller-proxy.kubeconfig")
    ctl = spawn_controller(deployment, source, kubeconfig, root, "controller")
    waiting(ctl, cp, lambda: ctl.ready() or ctl.proc.poll() is not None, 60, "the controller to be ready")
    assert ctl.proc.poll() is None, ctl.log()
    return ctl


def apply_example(cp: ControlPlane) -> None:
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(secrets_for(docs)))
    cp.kubectl("apply", "-f", str(EXAMPLE))


def reconciled(cp: ControlPlane) -> bool:
    gw = get(cp, "vpngateway", "acme", "-n", TENANT) or {}
    ok = all(condition(gw, t).get("status") == "True" for t in ("ConfigRendered", "CloudReady"))
    return ok and bool(owned(cp, "deployments", GATEWAYS)) and bool(gw.get("metadata", {}).get("finalizers"))


def controller_writes(proxy: KubeProxy, since: int = 0) -> list[Record]:
    """The controller's writes the proxy saw after ``since`` (its Lease renewals aside)."""
    return [
        r
        for r in proxy.writes()
        if r.seq > since
        and r.user_agent == AGENT
        and "/leases/" not in r.path
        and not r.path.endswith("/leases")
    ]


def last_seq(proxy: KubeProxy) -> int:
    recs = proxy.records()
    return recs[-1].seq if recs else 0


def settle(ctl: Controller, cp: ControlPlane, proxy: KubeProxy) -> None:
    """Wait until two reconciles have finished since the controller's last write and nothing waits in its
    queue: the set-up's writes are done. (Not the emulator test's "counted writes == logged writes": the
    controller counts a reconcile's writes when it returns, so a reconcile that a 409 failed after some
    writes never counts them, and the real server answers such 409s on its own, on a stale status patch.)"""
    seen = {"seq": -1, "reconciles": 0.0}

    def quiet() -> bool:
        writes = controller_writes(proxy)
        last = writes[-1].seq if writes else 0
        done = metric(ctl, "vpngw_controller_reconcile_total")
        if last != seen["seq"]:
            seen.update(seq=last, reconciles=done)
            return False
        return done >= seen["reconciles"] + 2 and metric(ctl, "vpngw_controller_queue_depth") == 0

    try:
        waiting(ctl, cp, quiet, 45, "two reconciles without a write")
    except AssertionError as exc:
        log = [(r.method, r.path, r.status) for r in controller_writes(proxy)]
        raise AssertionError(f"the controller's writes: {log}\n{exc}") from None


def stop(ctl: Controller, cp: ControlPlane) -> None:
    """Stop the controller. A gateway a failed test left behind is deleted first, by the controller while
    it runs (else its Deployment keeps making pods that no kubelet confirms the deletion of, and the
    fixture's namespace deletion waits for them), or without its finalizer when that fails."""
    if get(cp, "vpngateway", "acme", "-n", TENANT) is not None and ctl.proc.poll() is None:
        cp.kubectl("delete", "vpngateway", "acme", "-n", TENANT, "--wait=false", check=False)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: get(cp, "vpngateway", "acme", "-n", TENANT) is None, 60, "the CR deleted")
    code = ctl.stop(signal.SIGTERM)
    if get(cp, "vpngateway", "acme", "-n", TENANT) is not None:
        patch = '{"metadata":{"finalizers":null}}'
        cp.kubectl("patch", "vpngateway", "acme", "-n", TENANT, "--type=merge", "-p", patch, check=False)
    assert code == 0, f"the controller exited {code} on SIGTERM:\n{ctl.log()[-4000:]}"


def test_injected_conflicts_and_list_errors_are_retried_until_it_converges_without_an_error_loop(
    controlplane: ControlPlane, installed: Path, proxy: KubeProxy, tmp_path: Path
) -> None:
    cp = controlplane
    # Its informers' first lists fail (500), twice each; its first writes in both namespaces are refused
    # as conflicting (409): the status patch, the finalizer patch, the creates.
    lists = [
        proxy.add("GET", GATEWAY_LISTS, status(500, "injected: etcd timeout"), times=2, query=NOT_WATCH),
        proxy.add("GET", DEPLOYMENT_LISTS, status(500, "injected: etcd timeout"), times=2, query=NOT_WATCH),
    ]
    writes = [
        proxy.add(
            "PATCH",
            rf"^/apis/vpn\.bnerd\.net/v1alpha1/namespaces/{TENANT}/vpngateways/",
            status(409),
            times=2,
        ),
        proxy.add("POST", rf"^/apis?/.*namespaces/{GATEWAYS}/", status(409), times=2),
    ]
    ctl = start_through(cp, proxy, installed, tmp_path, resync=10)
    try:
        apply_example(cp)
        waiting(ctl, cp, lambda: reconciled(cp), 90, "the gateway reconciled through the faults")
        assert [r.hits for r in lists + writes] == [2, 2, 2, 2], "every injected fault was met"
        refused = [r for r in proxy.records() if r.user_agent == AGENT and r.outcome == "injected"]
        assert len(refused) == 8 and not any(r.forwarded for r in refused)

        # No error loop: once settled, another reconcile (a resync comes every 10 s) brings no failed
        # request and no write.
        settle(ctl, cp, proxy)
        mark = last_seq(proxy)
        before = metric(ctl, "vpngw_controller_reconcile_total")
        waiting(
            ctl,
            cp,
            lambda: metric(ctl, "vpngw_controller_reconcile_total") >= before + 1,
            30,
            "another reconcile",
        )
        after = [r for r in proxy.records() if r.seq > mark and r.user_agent == AGENT]
        assert [r for r in after if r.status is None or r.status >= 400] == []
        assert controller_writes(proxy, mark) == []
        assert ctl.proc.poll() is None, ctl.log()
        cp.kubectl("delete", "vpngateway", "acme", "-n", TENANT, "--wait=false")
        waiting(ctl, cp, lambda: get(cp, "vpngateway", "acme", "-n", TENANT) is None, 60, "the CR deleted")
    finally:
        stop(ctl, cp)


def test_a_no_op_resync_writes_nothing_on_the_real_server(
    controlplane: ControlPlane, installed: Path, proxy: KubeProxy, tmp_path: Path
) -> None:
    cp = controlplane
    ctl = start_through(cp, proxy, installed, tmp_path, resync=10)
    try:
        apply_example(cp)
        waiting(ctl, cp, lambda: reconciled(cp), 60, "the gateway reconciled")
        settle(ctl, cp, proxy)
        assert controller_writes(proxy), "the set-up's writes went through the proxy"
        mark = last_seq(proxy)
        before = metric(ctl, "vpngw_controller_reconcile_total")
        # The periodic resync (every 10 s) reconciles the gateway again in the window, and writes nothing.
        waiting(
            ctl, cp, lambda: metric(ctl, "vpngw_controller_reconcile_total") >= before + 2, 35, "two resyncs"
        )
        assert controller_writes(proxy, mark) == []
        # The controller never gets a Secret: it lists and watches only those opted in for gateways, and
        # asks for their metadata alone.
        reads = [(r.method, r.query) for r in proxy.calls(path=r"/secrets$") if r.user_agent == AGENT]
        assert reads and all(
            method == "GET" and "labelSelector=vpn.bnerd.net%2Fgateway-secret%3Dtrue" in query
            for method, query in reads
        ), reads
        assert not [r for r in proxy.calls(path=r"/secrets/") if r.user_agent == AGENT]
        secret_reads = [r for r in proxy.calls(path=r"/secrets$") if r.user_agent == AGENT]
        assert all("PartialObjectMetadata" in (r.header("accept") or "") for r in secret_reads)
        cp.kubectl("delete", "vpngateway", "acme", "-n", TENANT, "--wait=false")
        waiting(ctl, cp, lambda: get(cp, "vpngateway", "acme", "-n", TENANT) is None, 60, "the CR deleted")
    finally:
        stop(ctl, cp)


def test_a_stalled_gateway_watch_is_given_up_within_the_bookmark_silence(
    controlplane: ControlPlane, installed: Path, proxy: KubeProxy, tmp_path: Path
) -> None:
    """A watch that goes half-open (the headers came, then nothing: a dead NAT entry, a hung apiserver)
    is given up after ``BOOKMARK_SILENCE`` and made again; without that the controller would never see a
    gateway change again."""
    cp = controlplane
    ctl = start_through(cp, proxy, installed, tmp_path, resync=600)
    try:
        apply_example(cp)
        waiting(ctl, cp, lambda: reconciled(cp), 60, "the gateway reconciled")
        stall = proxy.add("GET", GATEWAY_LISTS, Fault.stall(300), times=1, query="watch=")
        proxy.unreachable(0.5, mode="reset")  # every open watch cut: the controller makes them again

        def watches() -> list[Record]:
            return [
                r for r in proxy.calls("GET", GATEWAY_LISTS) if "watch=" in r.query and r.user_agent == AGENT
            ]

        # (logged once the server's headers were relayed: a moment after the rule's hit)
        (stalled,) = wait_for(
            lambda: [r for r in watches() if r.outcome == "stalled"], 30, "the next VPNGateway watch, stalled"
        )
        assert stall.hits == 1
        after = waiting(
            ctl,
            cp,
            lambda: [r for r in watches() if r.seq > stalled.seq],
            BOOKMARK_SILENCE + 40,
            "a new VPNGateway watch after the stalled one",
        )
        given_up = after[0].started - stalled.started
        assert BOOKMARK_SILENCE - 1 <= given_up <= BOOKMARK_SILENCE + 30, given_up
        # The new watch works: the deletion reaches the controller through it (the resync is 600 s away),
        # and it releases its finalizer.
        cp.kubectl("delete", "vpngateway", "acme", "-n", TENANT, "--wait=false")
        waiting(ctl, cp, lambda: get(cp, "vpngateway", "acme", "-n", TENANT) is None, 60, "the CR deleted")
    finally:
        stop(ctl, cp)
