"""A node that dies, end to end on the REAL control plane: real pods, real tunnels (issue 21's acceptance,
with test_real_node_loss.py's API side now run by lab kubelets).

Two lab kubelets are nodes of the real control plane (lab/kubelet/realnode.py): ``node-a``, whose
namespace holds NIC2 (the gateway's port, attached to its server), and ``node-b``. A gateway with two
IPsec site peers (each a remote site with its own charon) runs on node-a with both tunnels Established
and traffic through them. Then node-a is partitioned (``RealNode.silence()``): its heartbeat stops, its
kubelet writes nothing and its pods lose the API server, and every process of its pod keeps running.

The real node lifecycle controller marks node-a NotReady; the controller re-pins the gateway to node-b and
the Recreate rollout deletes the old pod, which stays Terminating (no kubelet confirms it). The static cloud
fences nothing, so the operator does what docs/install.md says once the node is known to be down: the
out-of-service taint. The lab plays what "down" means for the data plane at that moment: NIC2 leaves
node-a's old pod (the interface is moved out of its network namespace, as a port detached from a dead
server no longer reaches it) and appears on node-b's server (its namespace), as the port re-attached
there. The old pod's charon and agents keep running but have no NIC2: they cannot keep the tunnels. The
controller then deletes the old pod with grace 0 (``placement.stranded``), unless kube-controller-manager's
pod GC does it first (``gcTerminating``: a terminating pod on a NotReady node tainted out-of-service, on
its 20 s period): whichever deletes first wins, the other finds nothing; ``Timeline.deleter`` says which
(the controller's ``PodForceDeleted`` Event, or pod GC's line in kube-controller-manager's log). The
ReplicaSet controller makes
the new pod on node-b, node-b's kubelet runs it (host-device takes NIC2 by MAC), its agent initiates both
site tunnels, and traffic flows again.

No timing is asserted beyond generous timeouts; ``node_loss`` returns the timeline, which the test prints
and bench/bench_node_loss.py measures (docs/e2e.md).
"""

from __future__ import annotations

import functools
import json
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from lab import netns
from lab.controlplane import ControlPlane
from lab.kubelet.sandbox import link_by_mac
from tests.integration.test_real_kubelet import (
    GATEWAY,
    HOME_NS,
    TENANT,
    RealWorld,
    pod_sas,
)

pytestmark = [pytest.mark.lab, pytest.mark.timeout(600)]

OUT_OF_SERVICE = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
PEERS = ("s1", "s2")


@dataclass
class Timeline:
    """Seconds since node-a was silenced (``marks``), and what was seen on the way."""

    marks: dict[str, float] = field(default_factory=dict)
    old_pod: str = ""
    new_pod: str = ""
    deleter: str = ""
    """Who force-deleted the old pod: ``controller`` (ours) or ``podgc`` (kube-controller-manager's)."""

    def breakdown(self) -> dict[str, float]:
        """Each phase's own seconds (they add up to the total): detection (silence -> NotReady), re-pin
        (-> the controller re-pinned the gateway), rollout (-> the Recreate rollout deleted the old pod,
        and the test, as the operator, fenced NIC2 and tainted the node at once), fence (the taint -> the
        old pod force-deleted), pod start (-> the new pod Running on node-b), IKE (-> both tunnels
        Established on the CR, by the new agent), traffic (-> both sites reach the exposure)."""
        m = self.marks
        return {
            "detection": m["not_ready"],
            "repin": m["repinned"] - m["not_ready"],
            "rollout": m["tainted"] - m["repinned"],
            "fence": m["force_deleted"] - m["tainted"],
            "pod_start": m["pod_running"] - m["force_deleted"],
            "ike": m["established"] - m["pod_running"],
            "traffic": m["traffic"] - m["established"],
            "total": m["traffic"],
        }


def node_ready(w: RealWorld, name: str) -> str:
    node = w.get("node", name) or {}
    conds = (node.get("status") or {}).get("conditions") or []
    return next((str(c.get("status")) for c in conds if c.get("type") == "Ready"), "")


PODGC_LINE = '"PodGC is force deleting Pod"'
"""What kube-controller-manager's pod GC logs (at level 0) before it marks a pod Failed and deletes it with
grace 0 (pkg/controller/podgc/gc_controller.go markFailedAndDeletePodWithCondition)."""


def podgc_tried(log_text: str, namespace: str, name: str) -> bool:
    """Whether pod GC's force delete of ``namespace/name`` is in ``log_text`` (kube-controller-manager's)."""
    pod = f'pod="{namespace}/{name}"'
    return any(PODGC_LINE in line and pod in line for line in log_text.splitlines())


def force_deleter(events: list[dict[str, Any]], log_text: str, namespace: str, name: str) -> str:
    """Who deleted the old pod with grace 0, from the gateway's ``PodForceDeleted`` Events and the part of
    kube-controller-manager's log written since the taint. Both try: the controller writes its Event only
    when its own DELETE (uid precondition) found the pod, so one Event means it won; none means pod GC did,
    which its log must then show (its status patch and DELETE follow that line)."""
    assert len(events) <= 1, f"more than one PodForceDeleted Event: {events}"
    if events:
        assert [e["involvedObject"]["name"] for e in events] == [GATEWAY], events
        assert "node node-a is gone or out of service" in events[0]["message"], events
        return "controller"
    assert podgc_tried(log_text, namespace, name), (
        f"no PodForceDeleted Event and no {PODGC_LINE} for {namespace}/{name} in the controller manager log"
    )
    return "podgc"


def up(w: RealWorld) -> tuple[dict[str, Any], Any]:
    """Two sites, the gateway on node-a, both tunnels Established, both sites reaching web."""
    sites = [w.add_site(p) for p in PEERS]
    w.apply_gateway()
    pod = w.wait(lambda: next(iter(w.pods()), None), 60, "the gateway pod")
    assert pod["spec"]["nodeName"] == "node-a", "placed on the first node (fewest gateways, then by name)"
    worker = w.wait(lambda: w.worker("node-a", pod["metadata"]["uid"]), 60, "node-a running the pod")
    w.wait(lambda: w.established(PEERS), 90, "both tunnels Established on the CR")
    vip = w.vip()
    for s in sites:
        w.wait(functools.partial(w.reaches, s, vip, 80), 30, f"{s.role} reaching web through its tunnel")
    return pod, worker


def node_loss(w: RealWorld) -> Timeline:
    """node-a partitioned, the operator's taint once it is NotReady (with the lab's fence of NIC2), the
    gateway back on node-b: the timeline, every step checked."""
    pod, old = up(w)
    tl = Timeline(old_pod=str(pod["metadata"]["name"]))
    old_sas = {str(sa.get("initiator-spi")) for _, sa in pod_sas(old)}
    assert old_sas, "the old pod's charon holds the IKE_SAs"
    time.sleep(1.0)  # establishedAt has whole seconds: a new SA's is then after ``silenced_at``
    silenced_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t0 = time.monotonic()

    def mark(name: str) -> None:
        tl.marks[name] = time.monotonic() - t0

    w.nodes["node-a"].silence()
    w.wait(
        lambda: node_ready(w, "node-a") not in ("True", ""), 60, "node-a NotReady (node lifecycle controller)"
    )
    mark("not_ready")
    w.wait(
        lambda: w.gateway_node() == "node-b",
        60,
        "the gateway re-pinned to node-b",
    )
    mark("repinned")

    def old_terminating() -> bool:
        p = w.get("pod", tl.old_pod, "-n", HOME_NS)
        return bool(p and p["metadata"].get("deletionTimestamp"))

    w.wait(old_terminating, 60, "the Recreate rollout deleting the old pod")
    mark("old_terminating")
    # What no kubelet on node-a can do now: confirm. The old pod stays Terminating, its processes run.
    assert w.get("pod", tl.old_pod, "-n", HOME_NS) is not None

    # The operator, node-a known to be down: the lab's fence of the data plane (NIC2 leaves node-a, is
    # attached to node-b's server), then the taint docs/install.md gives.
    taken = w.nodes["node-a"].kubelet.take_host_device(w.lab.nic2_mac, w.node_ns["node-b"])
    assert taken == [f"{HOME_NS}/{tl.old_pod}"], taken
    kcm_log = w.cp.log_path("kube-controller-manager")
    kcm_from = kcm_log.stat().st_size  # one control plane may serve many rounds (the bench)
    w.cp.kubectl("taint", "node", "node-a", OUT_OF_SERVICE)
    mark("tainted")
    w.wait(lambda: w.get("pod", tl.old_pod, "-n", HOME_NS) is None, 60, "the old pod force-deleted")
    mark("force_deleted")

    def new_running() -> Any:
        pods = [p for p in w.pods() if p["spec"].get("nodeName") == "node-b"]
        if not pods or (pods[0].get("status") or {}).get("phase") != "Running":
            return None
        return w.worker("node-b", pods[0]["metadata"]["uid"])

    new = w.wait(new_running, 90, "the new pod Running on node-b")
    tl.new_pod = new.name
    mark("pod_running")

    def established_again() -> bool:
        t = w.tunnels()
        return all(
            t.get(p, {}).get("state") == "Established" and (t[p].get("establishedAt") or "") >= silenced_at
            for p in PEERS
        )

    w.wait(established_again, 90, "both tunnels Established again, by the new pod")
    mark("established")
    vip = w.vip()
    for name in PEERS:
        site = w.sites[name]
        w.wait(functools.partial(w.reaches, site, vip, 80), 60, f"{name} reaching web through the new pod")
    mark("traffic")

    # The old pod is still running on node-a (a partition, not a stop), but holds no NIC2 and no tunnel.
    assert old.uid in w.nodes["node-a"].kubelet.kubelet.workers, "the old pod's worker still runs"
    assert old.instances, "the old pod's containers still run"
    assert netns.pids_in(old.netns), "its processes are alive"
    assert link_by_mac(old.netns, w.lab.nic2_mac) is None, "the old pod has no NIC2"
    new_sas = {str(sa.get("initiator-spi")) for _, sa in pod_sas(new)}
    for name in PEERS:
        site_sas = w.site_sas(w.sites[name])
        spis = {str(sa.get("initiator-spi")) for _, sa in site_sas if sa.get("state") == "ESTABLISHED"}
        assert spis and spis <= new_sas, f"{name}'s IKE_SAs are the new pod's only"
        assert not spis & old_sas, f"{name} still holds an IKE_SA of the old pod"
    events = w.cp.kubectl(
        "get", "events", "-n", TENANT, "--field-selector", "reason=PodForceDeleted", "-o", "json"
    )
    with kcm_log.open("rb") as f:
        f.seek(kcm_from)
        since_taint = f.read().decode(errors="replace")
    tl.deleter = force_deleter(json.loads(events.stdout)["items"], since_taint, HOME_NS, tl.old_pod)
    return tl


@pytest.fixture
def world_ab(controlplane: ControlPlane) -> Iterator[RealWorld]:
    with (
        tempfile.TemporaryDirectory(prefix="vg-real-") as d,
        RealWorld(controlplane, Path(d), nodes=("node-a", "node-b")) as w,
    ):
        run_ids = [n.kubelet.run_id for n in w.nodes.values()]
        yield w
    left = [n for n in netns.list_namespaces() if any(n.startswith(r) for r in run_ids)]
    assert left == [], f"namespaces left behind: {left}"


def test_a_partitioned_nodes_gateway_comes_back_on_another_node_with_its_tunnels_and_traffic(
    world_ab: RealWorld,
) -> None:
    tl = node_loss(world_ab)
    print(
        "node_loss.measured "
        + " ".join(f"{k}={v:.2f}" for k, v in tl.breakdown().items())
        + f" old_pod={tl.old_pod} new_pod={tl.new_pod} deleter={tl.deleter}"
    )
