"""The operator's gateway pod settings in any valid form (``0.5``, ``1024Mi``, ``0.1Gi``, a toleration with an
empty value) against the REAL kube-apiserver v1.35 (lab.controlplane): it stores them in its own form
(canonical quantities, empty ``omitempty`` fields gone), and after the first reconcile a resync makes no
write (the controller's own count of its writes, ``vpngw_controller_api_writes_total``: a write the real
server finds changes nothing leaves no other trace). The same test against the emulator:
tests/component/test_controller_quantities.py."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.names import LABEL_TENANT, TENANT_ENABLED
from lab.cluster import ROOT, Controller, crd_documents, secrets_for
from lab.controlplane import ControlPlane
from lab.controlplane.nodeagent import NodeAgent
from lab.wait import wait_for
from tests.component.test_controller_operator import CONFIG, NIC, metric
from tests.component.test_controller_quantities import (
    CANONICAL,
    GATEWAY_POD,
    TOLERATIONS,
    api_writes,
    pod_shape,
    reconciles,
)
from tests.examples import example_docs

pytestmark = pytest.mark.lab

TENANT = "tenant-qty"
GATEWAYS = "vpngw-qty-gateways"
SYSTEM = "vpngw-qty-system"
NODE = "vpn-qty"


def get(cp: ControlPlane, *args: str) -> Any:
    res = cp.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(res.stdout) if res.returncode == 0 else None


def docs() -> list[dict[str, Any]]:
    out = copy.deepcopy(example_docs("ipsec.yaml"))
    for d in out:
        d["metadata"]["namespace"] = TENANT
    return out


@pytest.fixture
def installed(controlplane: ControlPlane) -> Iterator[ControlPlane]:
    """The CRDs (the project's and Multus' NAD), a Ready node, the operator's namespaces and an enabled
    tenant namespace with the example's Secrets; all removed on every exit path."""
    cp = controlplane
    node = NodeAgent(cp, NODE, interval=1.0)
    node.register()
    crds = crd_documents()
    try:
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(crds))
        for crd in crds:
            cp.kubectl(
                "wait", "--for=condition=established", "--timeout=60s", f"crd/{crd['metadata']['name']}"
            )
        for ns in (GATEWAYS, SYSTEM, TENANT):
            cp.kubectl("create", "namespace", ns)
        cp.kubectl("label", "namespace", TENANT, f"{LABEL_TENANT}={TENANT_ENABLED}")
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(secrets_for(docs())))
        yield cp
    finally:
        node.silence()
        for ns in (TENANT, GATEWAYS, SYSTEM):
            cp.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)
        cp.kubectl("delete", "node", NODE, "--wait=false", "--ignore-not-found", check=False)
        for crd in crds:
            name = crd["metadata"]["name"]
            cp.kubectl("delete", "crd", name, "--timeout=30s", "--ignore-not-found", check=False)


def start_controller(cp: ControlPlane, workdir: Path) -> Controller:
    config = {**CONFIG, "gatewayPod": GATEWAY_POD, "staticNICs": {f"{TENANT}/acme": NIC}}
    cfg = workdir / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    argv = [
        sys.executable, "-m", "controller", "run",
        "--kubeconfig", str(cp.kubeconfig),
        "--config", str(cfg),
        "--listen", "127.0.0.1:0",
        "--gateway-namespace", GATEWAYS,
        "--leader-election-namespace", SYSTEM,
        "--instance", "vpngw-qty",
        "--resync-seconds", "10",
    ]  # fmt: skip
    log_path = workdir / "controller.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}
        )
    return Controller(proc, log_path)


def test_settings_in_any_valid_form_make_no_write_at_a_resync_on_the_real_server(
    installed: ControlPlane, tmp_path: Path
) -> None:
    cp = installed
    ctl = start_controller(cp, tmp_path)
    try:
        wait_for(lambda: ctl.ready() or ctl.proc.poll() is not None, 60, "the controller to be ready")
        assert ctl.proc.poll() is None, ctl.log()
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs()))

        def deployment() -> dict[str, Any] | None:
            found = get(cp, "deployments", "-n", GATEWAYS, "-l", "vpn.bnerd.net/gateway=acme")
            return found["items"][0] if found and found["items"] else None

        def ready() -> bool:
            gw = get(cp, "vpngateway", "acme", "-n", TENANT) or {}
            return any(c["type"] == "Ready" for c in (gw.get("status") or {}).get("conditions") or [])

        try:
            dep = wait_for(deployment, 60, "the gateway's Deployment")
            wait_for(ready, 30, "the gateway's status")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{ctl.log()[-4000:]}") from None
        resources, tolerations = pod_shape(dep)
        # The real server's own form of the settings: what the emulator stores and the settings now hold.
        assert resources["charon"] == CANONICAL["charon"]
        assert resources["status-agent"] == CANONICAL["status-agent"]
        assert tolerations[2:] == TOLERATIONS
        # Settled, not a fixed pause: the watch events of the set-up's own writes have been reconciled when
        # two reconciles in a row wrote nothing and nothing waits in the queue (no request log here to
        # compare with, as tests/component/test_controller_quantities.py does).
        base = [reconciles(ctl), api_writes(ctl)]

        def settled() -> bool:
            done, wrote = reconciles(ctl), api_writes(ctl)
            if wrote != base[1]:
                base[:] = [done, wrote]  # a write: count the reconciles again from here
                return False
            return done >= base[0] + 2 and metric(ctl, "vpngw_controller_queue_depth") == 0

        wait_for(settled, 40, "two reconciles in a row without a write (the set-up settled)")
        done, wrote = reconciles(ctl), api_writes(ctl)
        time.sleep(12)  # at least one full resync (every 10 s)
        assert reconciles(ctl) > done, "a resync reconciled the gateway in the window"
        assert api_writes(ctl) == wrote, ctl.log()[-4000:]
    finally:
        with contextlib.suppress(Exception):
            cp.kubectl("delete", "vpngateway", "acme", "-n", TENANT, "--timeout=30s", check=False)
        code = ctl.stop(signal.SIGTERM)
        assert code == 0, f"the controller exited {code} on SIGTERM:\n{ctl.log()[-4000:]}"
