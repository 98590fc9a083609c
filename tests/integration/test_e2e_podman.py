"""End to end from the built images: the IPsec scenario with the lab kubelet's podman runtime. Each
container of the gateway pod runs from ``localhost/vpngw-gateway`` (images/build.sh) in the pod's network
namespace with the pod spec's user, ``--cap-drop all`` plus the spec's capabilities, no new privileges and
a read-only root, and the volumes the kubelet made; podman enforces them, as a real runtime does.

charon runs with the lab's adaptation (lab/kubelet/adapt.py): the image's strongswan.conf with
kernel-libipsec loaded first, the host's kernel-libipsec plugin bound in read-only, ``/dev/net/tun``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import netns
from lab.kubelet.runtime import podman_sync
from lab.kubelet.world import E2EWorld
from tests.integration.test_e2e_ipsec import bring_up, charon_status, measured
from tests.integration.test_images_run import build_images, cap_mask

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]  # the images are built first when they are stale

EXPECTED = {
    "init-nat-watch": ("0", ["NET_ADMIN", "NET_RAW"]),
    "charon": ("0", ["NET_ADMIN", "NET_RAW", "NET_BIND_SERVICE", "SETGID", "CHOWN"]),
    "status-agent": ("65532", []),
    "exporter": ("65532", []),
}


@pytest.fixture
def world(tmp_path: Path) -> Iterator[E2EWorld]:
    build_images()
    with E2EWorld(tmp_path, runtime="podman") as w:
        run_id = w.k.run_id
        yield w
    assert [n for n in netns.list_namespaces() if n.startswith(run_id)] == []
    left = podman_sync("ps", "-a", "-q", "--filter", f"label=net.bnerd.vpn.test={run_id}").stdout.split()
    assert left == [], f"containers left behind: {left}"


def proc_status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def container_pids(world: E2EWorld) -> dict[str, int]:
    pod = world.pod()
    assert pod is not None
    out = {}
    for name, inst in pod.instances.items():
        pid = inst.running.pid
        if pid:
            out[name] = pid
    return out


def test_the_ipsec_scenario_from_the_images_with_the_specs_users_and_capabilities(world: E2EWorld) -> None:
    sites, seconds = bring_up(world)
    measured("podman_apply_to_established", seconds)
    world.wait(
        lambda: (
            world.gateway().get("status", {}).get("conditions")
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in world.gateway()["status"]["conditions"]
            )
        ),
        60,
        "Ready",
    )
    pod = world.pod_object()
    assert pod is not None
    assert all(c["containerID"].startswith("podman://") for c in pod["status"]["containerStatuses"])
    pids = container_pids(world)
    assert set(pids) == set(EXPECTED), pids
    for name, (uid, caps) in EXPECTED.items():
        st = proc_status(pids[name])
        assert st["Uid"].split()[0] == uid, (name, st["Uid"])
        assert int(st["CapBnd"], 16) == cap_mask(caps), (name, st["CapBnd"])
        assert st["NoNewPrivs"] == "1", (name, st["NoNewPrivs"])
    worker = world.pod()
    assert worker is not None
    inspect: list[dict[str, Any]] = json.loads(
        podman_sync("inspect", *(f"{worker.netns}-{n}-0" for n in EXPECTED)).stdout
    )
    assert all(i["HostConfig"]["ReadonlyRootfs"] for i in inspect)
    assert world.reaches(sites["s1"], world.vip("db"), 5432) and not world.reaches(
        sites["s2"], world.vip("db"), 5432
    )
    t0 = time.monotonic()
    assert world.k.kill(worker.namespace, worker.name, "charon")
    world.wait(
        lambda: (c := charon_status(world)) and c["restartCount"] == 1 and "running" in c["state"],
        60,
        "podman's charon restarted by the kubelet",
    )
    world.wait(lambda: world.reaches(sites["s1"], world.vip("web"), 80), 60, "traffic through the new charon")
    measured("podman_charon_killed_to_traffic", time.monotonic() - t0)
