"""Small helpers more than one test module needs, kept once here (fixtures the integration modules share
are in tests/integration/conftest.py; polling is lab.wait)."""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from controller.names import LABEL_TENANT, TENANT_ENABLED
from gwkit.kube import KubeClient, NotFound, Resource
from lab import netns
from lab.cluster import MANIFESTS
from lab.controlplane import ControlPlane
from lab.wait import wait_for_async


def conditions(gw: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A custom resource's status conditions by type (none yet: empty)."""
    return {c["type"]: c for c in (gw.get("status") or {}).get("conditions") or []}


def condition(gw: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The status condition of type ``kind``; empty (falsy, for a wait) while the resource has none."""
    return dict(conditions(gw).get(kind) or {})


def conntrack(ns: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    """``conntrack`` in network namespace ``ns``; the caller checks the return code."""
    return netns.run(netns.ns_exec(ns, "conntrack", *args), check=False)


async def create_when_served(
    kube: KubeClient, res: Resource, doc: Mapping[str, Any], namespace: str
) -> dict[str, Any]:
    """``doc`` (a copy, in ``namespace``) created once its endpoint is served: a CRD's resource answers
    NotFound for a moment after the CRD is Established, on the real server and the emulator alike."""
    body = copy.deepcopy(dict(doc))
    body["metadata"]["namespace"] = namespace
    created: dict[str, Any] = await wait_for_async(
        lambda: kube.create(res, body, namespace),
        30,
        f"the {res.kind} created (once its endpoint is served)",
        interval=0.2,
        ignoring=(NotFound,),
    )
    return created


def tenant_namespace(cp: ControlPlane, name: str) -> None:
    """On the real control plane, what a platform engineer does before a tenant's first gateway: Multus'
    NetworkAttachmentDefinition CRD served, and the tenant's namespace opted in and Pod Security
    restricted (the gateway pod lives in the gateway namespace, never here)."""
    cp.kubectl("apply", "-f", str(MANIFESTS / "network-attachment-definition.yaml"))
    cp.kubectl("create", "namespace", name)
    cp.kubectl(
        "label",
        "namespace",
        name,
        f"{LABEL_TENANT}={TENANT_ENABLED}",
        "pod-security.kubernetes.io/enforce=restricted",
    )


@contextlib.contextmanager
def agent_as_pod(
    kube: Any, home: str, service_account: str, plan_json: str, workdir: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """The status-agent as the gateway pod runs it, with its ServiceAccount's token from ``kube`` (the API
    emulator) and no charon, writing status; its log in ``workdir/agent.log``; SIGTERMed on exit."""
    token = kube.mint_token(home, service_account)
    kubeconfig = kube.write_kubeconfig(workdir / "agent.kubeconfig", token, home, "agent")
    (workdir / "plan.json").write_text(plan_json)
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    argv = [
        *(sys.executable, "-m", "agent", "--plan", str(workdir / "plan.json")),
        *("--secrets-dir", str(workdir), "--vici-socket", str(workdir / "no-charon.vici")),
        *("--kube-status", "--poll-interval", "0.05"),
    ]
    with (workdir / "agent.log").open("wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
