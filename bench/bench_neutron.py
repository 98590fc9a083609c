"""Benchmark of the OpenStack lab: Neutron start times, memory, and per-call latency through openstacksdk.

Measures (numbers go to docs/openstack-lab.md):

* start: cold (no cache: mariadb-install-db + all migrations), from the migrated template, from the
  template with the test cloud seeded; ``stop()``/``start()`` of the API alone; ``close()``.
* RSS of mariadbd, the uWSGI master and its worker, idle and after the call workload.
* per-call latency (median and 90th percentile of ``--iterations`` calls) of the calls a gateway
  controller makes, through openstacksdk, direct and through the fault proxy; Nova emulator attach/detach.

Usage: .venv/bin/python bench/bench_neutron.py [--iterations N] [--skip-cold]
Exit codes: 0 ok, 1 the lab failed, 2 bad usage.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.openstack import process
from lab.openstack.cloud import Cloud, cloud_seed, declare_nodes
from lab.openstack.neutron import Neutron, NeutronSettings, start_neutron
from lab.openstack.nova import NovaEmulator
from lab.openstack.process import LabOpenStackError
from lab.openstack.proxy import FaultProxy
from lab.openstack.sdk import connect

log = logging.getLogger("bench.neutron")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def memory(n: Neutron) -> dict[str, float]:
    out = {}
    if n.db.proc is not None:
        out["mariadbd"] = rss_mb(n.db.proc.pid)
    if n.proc is not None:
        for pid in process.group_members(n.proc.pid):
            out["uwsgi-master" if pid == n.proc.pid else f"uwsgi-worker-{pid}"] = rss_mb(pid)
    return out


def timed(fn: Callable[[], Any], iterations: int) -> tuple[float, float]:
    samples = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    return statistics.median(samples), samples[max(0, int(len(samples) * 0.9) - 1)]


def workload(
    conn: Any, cloud: Cloud, nova: NovaEmulator | None, iterations: int
) -> dict[str, tuple[float, float]]:
    net = conn.network
    res: dict[str, tuple[float, float]] = {}
    port = net.create_port(network_id=cloud.gateway.network_id, name="bench")
    res["GET port"] = timed(lambda: net.get_port(port.id), iterations)
    res["list ports by tag"] = timed(lambda: list(net.ports(tags=["lab-baseline"])), iterations)
    res["list networks"] = timed(lambda: list(net.networks()), iterations)
    created: list[Any] = []
    res["create port (fixed IP from pool)"] = timed(
        lambda: created.append(net.create_port(network_id=cloud.gateway.network_id)), iterations
    )

    def update_if_match() -> None:
        p = net.get_port(port.id)
        net.update_port(
            p, if_revision=p.revision_number, allowed_address_pairs=[{"ip_address": "198.18.0.1"}]
        )

    res["GET + PUT port with If-Match"] = timed(update_if_match, iterations)
    hop = cloud.clusters[0].transit_ip
    i = [0]

    def add_remove_route() -> None:
        i[0] += 1
        route = {"destination": f"198.18.{i[0] % 200}.0/24", "nexthop": hop}
        net.add_extra_routes_to_router(cloud.router_id, {"router": {"routes": [route]}})
        net.remove_extra_routes_from_router(cloud.router_id, {"router": {"routes": [route]}})

    res["add_extraroutes + remove_extraroutes"] = timed(add_remove_route, iterations)

    def fip_cycle() -> None:
        fip = net.create_ip(floating_network_id=cloud.external.network_id, port_id=port.id)
        net.delete_ip(fip)

    res["create + delete floating IP (1:1)"] = timed(fip_cycle, iterations)
    sg = net.create_security_group(name="bench-sg")
    j = [0]

    def sg_rule() -> None:
        j[0] += 1
        net.create_security_group_rule(
            security_group_id=sg.id,
            direction="ingress",
            protocol="udp",
            port_range_min=1 + j[0],
            port_range_max=1 + j[0],
            remote_ip_prefix="198.51.100.7/32",
        )

    res["create SG rule"] = timed(sg_rule, iterations)
    res["set tags (PUT .../tags)"] = timed(lambda: net.set_tags(port, ["lab-bench", "a"]), iterations)
    if nova is not None:
        node = cloud.nodes[0]
        gw = net.create_port(network_id=cloud.gateway.network_id, name="bench-attach")

        def attach_detach() -> None:
            conn.compute.create_server_interface(node.server_id, port_id=gw.id)
            conn.compute.delete_server_interface(gw.id, server=node.server_id)
            nova.wait_idle()

        res["Nova emulator attach + detach (3+2 Neutron calls)"] = timed(attach_detach, iterations)
        res["Nova emulator list interfaces"] = timed(
            lambda: list(conn.compute.server_interfaces(node.server_id)), iterations
        )
    for p in created:
        net.delete_port(p)
    net.delete_security_group(sg)
    net.delete_port(port)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=20, help="calls per latency measurement (default 20)")
    p.add_argument("--skip-cold", action="store_true", help="skip the cold start (no cache, ~10 s)")
    args = p.parse_args(argv)
    if args.iterations < 2:
        p.error("--iterations must be >= 2")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    print("| what | seconds |\n|---|---|")
    try:
        if not args.skip_cold:
            t0 = time.monotonic()
            with start_neutron(NeutronSettings(use_cache=False)) as n:
                print(
                    f"| cold start (install-db, migrations, API) | {time.monotonic() - t0:.2f} "
                    f"(database {n.timings['database']:.2f}, API {n.timings['api']:.2f}) |"
                )
        start_neutron().close()  # make sure the template exists
        t0 = time.monotonic()
        n = start_neutron()
        print(
            f"| start from the migrated template | {time.monotonic() - t0:.2f} "
            f"(database {n.timings['database']:.2f}, API {n.timings['api']:.2f}) |"
        )
        t0 = time.monotonic()
        n.close()
        print(f"| close (Neutron SIGKILL, MariaDB SIGTERM, rm) | {time.monotonic() - t0:.2f} |")
        start_neutron(seed=cloud_seed()).close()  # make sure the seeded template exists
        t0 = time.monotonic()
        n = start_neutron(seed=cloud_seed())
        print(f"| start from the template with the cloud seeded | {time.monotonic() - t0:.2f} |")
        try:
            t0 = time.monotonic()
            n.stop()
            stop_s = time.monotonic() - t0
            t0 = time.monotonic()
            n.start()
            print(
                f"| Neutron API stop / start (database kept) | {stop_s:.2f} / {time.monotonic() - t0:.2f} |"
            )
            idle = memory(n)
            assert n.seed_data is not None
            cloud = Cloud.from_dict(n.seed_data["cloud"])
            with FaultProxy(n.endpoint) as proxy, NovaEmulator(n.endpoint) as nova:
                declare_nodes(nova, cloud)
                direct = connect(n.endpoint, compute=nova.url)
                via = connect(proxy.url)
                list(direct.network.networks())
                list(via.network.networks())
                results = {
                    "direct": workload(direct, cloud, nova, args.iterations),
                    "proxy": workload(via, cloud, None, args.iterations),
                }
            busy = memory(n)
        finally:
            n.close()
    except LabOpenStackError as e:
        log.error("bench.neutron.failed error=%r", str(e))
        return 1
    print("\n| process | RSS idle MB | RSS after the workload MB |\n|---|---|---|")
    for name in idle:
        print(
            f"| {name.rsplit('-', 1)[0] if name.startswith('uwsgi-worker') else name} | {idle[name]:.0f} | "
            f"{busy.get(name, 0):.0f} |"
        )
    print(f"\n| call ({args.iterations} each) | direct median / p90 ms | through the proxy median / p90 ms |")
    print("|---|---|---|")
    for call, (med, p90) in results["direct"].items():
        via_s = results["proxy"].get(call)
        via_txt = f"{via_s[0]:.1f} / {via_s[1]:.1f}" if via_s else "-"
        print(f"| {call} | {med:.1f} / {p90:.1f} | {via_txt} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
