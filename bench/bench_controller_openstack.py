"""Benchmark: the controller (a process, ``--cloud openstack``) against the Kubernetes API emulator and a
REAL Neutron (lab/openstack: neutron 29 on MariaDB) with the Nova os-interface emulator.

    .venv/bin/python bench/bench_controller_openstack.py [--gateways 100] [--peers 10]

Measures: cold start (every CR stored, then the controller started) until every gateway has its floating
IP in status.publicIP and its Deployment; Neutron and Nova calls per reconcile: cold (all gateways, per
gateway), a no-op resync (writes must be 0), one peer added (its rules). Numbers go to docs/controller.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.cluster import Cluster, clouds_yaml, openstack_args
from lab.openstack.cloud import Cloud, cloud_seed, declare_nodes
from lab.openstack.neutron import NeutronSettings, start_neutron
from lab.openstack.nova import NovaEmulator
from lab.openstack.proxy import FaultProxy
from lab.wait import wait_for

VPN = "vpn.bnerd.net/v1alpha1"


def docs(i: int, peers: int) -> list[dict[str, Any]]:
    ns, name = f"tenant-{i // 10}", f"gw{i}"
    out: list[dict[str, Any]] = [
        {
            "apiVersion": VPN,
            "kind": "VPNGateway",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "type": "ipsec",
                "serviceCIDR": f"100.{64 + i // 256}.{i % 256}.0/24",  # disjoint: one transit network
                "exposures": [{"name": "web", "target": {"address": "192.0.2.66"}, "ports": [{"port": 80}]}],
                "ipsec": {"localID": f"{name}.example", "pskSecretRef": {"name": "psk", "key": "psk"}},
            },
        }
    ]
    for p in range(peers):
        out.append(
            {
                "apiVersion": VPN,
                "kind": "VPNPeer",
                "metadata": {"name": f"{name}-p{p}", "namespace": ns},
                "spec": {
                    "gatewayRef": {"name": name},
                    "type": "site",
                    "endpoint": f"198.51.100.{p + 1}",
                    "ipsec": {"id": f"p{p}.{name}.example", "remoteSubnets": [f"10.{p}.{i % 250}.0/24"]},
                    "authorization": {"exposures": ["web"]},
                },
            }
        )
    return out


def tally(proxy: FaultProxy, since: int) -> tuple[int, int]:
    recs = [r for r in proxy.records() if r.seq > since]
    return len(recs), sum(1 for r in recs if r.write)


def last_seq(proxy: FaultProxy) -> int:
    recs = proxy.records()
    return recs[-1].seq if recs else 0


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateways", type=int, default=100)
    ap.add_argument("--peers", type=int, default=10)
    a = ap.parse_args()
    neutron = start_neutron(NeutronSettings(processes=2), seed=cloud_seed())
    try:
        assert neutron.seed_data is not None
        cloud = Cloud.from_dict(neutron.seed_data["cloud"])
        with (
            NovaEmulator(neutron.endpoint) as nova,
            FaultProxy(neutron.endpoint, error_style="neutron") as nproxy,
            FaultProxy(nova.url, error_style="nova") as cproxy,
            tempfile.TemporaryDirectory() as tmp,
            Cluster(Path(tmp), bookmark_interval=60.0) as c,
        ):
            declare_nodes(nova, cloud)
            # The lab's gateway subnet is a /26: room for ~60 ports. A /22 of the bench's own, on the
            # cloud's router (floating IPs need the port's subnet behind a router with the external gateway).
            admin = neutron.connect()
            net = admin.network.create_network(name="bench-gateways")
            sub = admin.network.create_subnet(
                network_id=net.id,
                ip_version=4,
                cidr="10.250.0.0/22",
                gateway_ip="10.250.0.1",
                name="bench-gateways",
            )
            admin.network.add_interface_to_router(cloud.router_id, subnet_id=sub.id)
            for n in cloud.nodes:
                c.add_node(n.name, provider_id=n.provider_id)
            for i in range(a.gateways):
                c.apply(docs(i, a.peers))
            cfg = clouds_yaml(Path(tmp) / "clouds.yaml", nproxy.url, cproxy.url)
            args = [
                *openstack_args(net.id, sub.id, cloud.external.network_id),
                "--workers",
                "8",
                "--resync-seconds",
                "30",
            ]
            t0 = time.monotonic()
            allow = {"allowances": {"default": {"exposureTargets": ["192.0.2.64/26"]}}}
            ctl = c.start_controller(allow, *args, env={"OS_CLIENT_CONFIG_FILE": str(cfg)})
            pending = {(f"tenant-{i // 10}", f"gw{i}") for i in range(a.gateways)}

            def done() -> bool:
                for ns, name in list(pending):
                    gw = c.get(VPN, "VPNGateway", name, ns) or {}
                    if (gw.get("status") or {}).get("publicIP") and c.get(
                        "apps/v1", "Deployment", f"vpngw-{name}", ns
                    ):
                        pending.discard((ns, name))
                return not pending

            wait_for(done, 1800, "every gateway converged", interval=0.5)
            cold = time.monotonic() - t0
            n_calls, n_writes = tally(nproxy, 0)
            c_calls, c_writes = tally(cproxy, 0)
            methods = Counter(
                (r.method, r.path.split("/")[2] if r.path.count("/") > 1 else r.path)
                for r in nproxy.records()
                if r.write
            )
            print(f"cold start to all {a.gateways} gateways converged (x {a.peers} peers): {cold:.1f} s")
            g = a.gateways
            print(
                f"cold: Neutron {n_calls} calls ({n_writes} writes), Nova {c_calls} calls ({c_writes} "
                f"writes); per gateway {n_calls / g:.1f} / {n_writes / g:.1f} and {c_calls / g:.1f}"
            )
            print("cold writes by kind:", dict(sorted(methods.items())))
            time.sleep(5)
            mark_n, mark_c = last_seq(nproxy), last_seq(cproxy)
            time.sleep(35)  # one full resync (every 30 s)
            rn, rw = tally(nproxy, mark_n)
            cn, cw = tally(cproxy, mark_c)
            print(
                f"no-op resync of {a.gateways}: Neutron {rn} calls ({rw} writes; {rn / a.gateways:.1f} reads "
                f"per gateway), Nova {cn} calls ({cw} writes)"
            )
            mark_n, mark_c = last_seq(nproxy), last_seq(cproxy)
            extra = docs(0, a.peers + 1)[-1]
            c.apply([extra])

            def ruled() -> bool:
                return any(
                    r.write and "security-group-rules" in r.path for r in nproxy.records() if r.seq > mark_n
                )

            t0 = time.monotonic()
            print(f"peer added at {time.time():.3f} (log: {tmp}/controller.log)")
            wait_for(ruled, 60, "the new peer's rules", interval=0.05)
            time.sleep(3)
            an, aw = tally(nproxy, mark_n)
            print(
                f"one peer added: its rules in Neutron after {time.monotonic() - t0 - 3:.2f} s; "
                f"Neutron {an} calls ({aw} writes)"
            )
            print(
                "controller RSS:",
                next(
                    x
                    for x in Path(f"/proc/{ctl.proc.pid}/status").read_text().splitlines()
                    if x.startswith("VmHWM")
                ),
            )
            ok = rw == 0 and cw == 0
            print("no-op writes nothing" if ok else "NO-OP WROTE")
            return 0 if ok else 1
    finally:
        neutron.close()


if __name__ == "__main__":
    sys.exit(main())
