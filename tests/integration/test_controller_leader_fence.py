"""Leadership is fenced (issue 21, item 3), with two controller processes, the API emulator and a REAL
Neutron (lab/openstack):

The leader is in the middle of a gateway's first cloud steps (its Neutron writes slowed to 3 s each)
when the API stops answering it (every request of its user hangs 30 s; its Lease renewals too). It stops
leading at its renew deadline; its reconcile is cancelled, but openstacksdk's calls run in a worker
thread that a cancel cannot stop. Before each step that thread asks whether the replica still leads
(``LeaderElector.leads``, by the clock): after the deadline the old leader sends Neutron nothing and the
API server no write, while the standby takes over and finishes the gateway: one port, one floating IP.

The leader talks to Neutron through the lab's fault proxy (whose log is then the old leader's alone), the
standby directly.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from controller.cloudplan import tags
from controller.names import GatewayKey
from lab.cluster import Cluster, Controller, clouds_yaml, openstack_args, secrets_for
from lab.openstack.fixtures import OpenStackLab
from lab.openstack.proxy import Fault
from lab.wait import wait_for
from tests.integration.test_controller_openstack_sweep import NS, gateway_docs

pytestmark = pytest.mark.lab

WRITES = ("POST", "PUT", "DELETE")


def leading(ctl: Controller) -> bool:
    try:
        return bool(re.search(r"^vpngw_controller_leader 1\.0$", ctl.get("/metrics")[1], re.M))
    except OSError:
        return False


def test_a_deposed_leader_sends_no_cloud_step_and_no_write_after_its_deadline(
    openstack_lab: OpenStackLab, tmp_path: Path
) -> None:
    lab = openstack_lab
    net = lab.cloud
    conn = lab.connect(direct=True)
    args = openstack_args(net.gateway.network_id, net.gateway.subnet_id, net.external.network_id)
    via_proxy = clouds_yaml(tmp_path / "proxied.yaml", lab.network_url, lab.compute_url)
    direct = clouds_yaml(tmp_path / "direct.yaml", lab.neutron.endpoint, lab.nova.url)
    with Cluster(tmp_path / "k8s") as c:
        for n in net.nodes[:2]:
            c.add_node(n.name, provider_id=n.provider_id)

        def start(user: str, cfg: Path) -> Controller:
            token = c.kube.user_token(user, ("system:masters",))
            kubeconfig = c.kube.write_kubeconfig(tmp_path / f"{user}.kubeconfig", token, user=user)
            return c.start_controller(
                {}, *args, name=user, kubeconfig=kubeconfig, env={"OS_CLIENT_CONFIG_FILE": str(cfg)}
            )

        old = start("ctl-old", via_proxy)
        wait_for(lambda: leading(old), 30, "the first controller leading")
        new = start("ctl-new", direct)
        wait_for(new.ready, 30, "the standby ready")
        assert not leading(new)

        for m in WRITES:
            lab.neutron_proxy.add(m, r"^/v2\.0/", Fault.delay(3.0))
        docs = gateway_docs(7)
        c.apply(secrets_for(docs))
        c.apply(docs)
        wait_for(
            lambda: any(r.method == "POST" for r in lab.neutron_proxy.records()),
            30,
            "the leader's first Neutron write",
        )
        c.kube.inject_fault(count=-1, user="ctl-old", hang=30.0)  # the API stops answering it

        wait_for(lambda: not leading(old), 30, "the old leader stepping down")
        # A write sent just before the deadline is logged by the proxy when it is done (3 s later).
        time.sleep(3.5)
        mark = max((r.seq for r in lab.neutron_proxy.records()), default=0)
        deposed = time.time()
        gw_tags = ",".join(tags(GatewayKey("VPNGateway", NS, "gw7"), "vpngw"))

        def finished() -> Any:
            gw = c.get("vpn.bnerd.net/v1alpha1", "VPNGateway", "gw7", NS) or {}
            return (gw.get("status") or {}).get("publicIP")

        wait_for(lambda: leading(new), 30, "the standby leading")
        wait_for(finished, 60, "the new leader finishing the gateway")
        time.sleep(max(0.0, deposed + 12 - time.time()))  # long enough for the old thread's next steps

        late = [
            (r.method, r.path) for r in lab.neutron_proxy.records() if r.seq > mark and r.method in WRITES
        ]
        assert late == [], f"Neutron writes of the deposed leader: {late}\n{old.log()[-3000:]}"
        assert "cloud.not_leading call=" in old.log(), old.log()[-3000:]  # the thread was stopped, not done
        api_writes = [
            (r.verb, r.resource, r.name)
            for r in c.kube.requests(user="ctl-old", writes_only=True)
            if r.time > deposed
        ]
        assert api_writes == [], api_writes
        assert len(list(conn.network.ports(tags=gw_tags))) == 1
        assert len(list(conn.network.ips(tags=gw_tags))) == 1
        c.kube.clear_faults()
        lab.neutron_proxy.clear()
        c.kube.delete("vpn.bnerd.net/v1alpha1", "VPNGateway", "gw7", NS)
        wait_for(lambda: c.get("vpn.bnerd.net/v1alpha1", "VPNGateway", "gw7", NS) is None, 60, "gw7 gone")
        assert list(conn.network.ports(tags=gw_tags)) == []
