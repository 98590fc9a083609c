"""``python -m lab.openstack up``: the OpenStack lab standing, until Ctrl-C (for poking at it by hand).

Starts the real Neutron (MariaDB, noauth) with the test cloud, a fault proxy in front of it, the Nova
os-interface EMULATOR with the cloud's nodes and a proxy in front of that, prints the endpoints and the
openstacksdk settings as one structured line each, and tears everything down on SIGINT/SIGTERM.
Exit codes: 0 stopped on a signal, 1 the lab could not start, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from gwkit.logs import add_log_format_flag, setup_logging
from gwkit.version import add_version_flag
from lab.openstack.cloud import Cloud, cloud_seed, declare_nodes
from lab.openstack.neutron import NeutronSettings, start_neutron
from lab.openstack.nova import NovaEmulator
from lab.openstack.process import LabOpenStackError
from lab.openstack.proxy import FaultProxy

log = logging.getLogger("lab.openstack")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if not 0 <= args.clusters <= 4 or args.nodes < 0:
        p.error("--clusters must be 0..4 and --nodes >= 0")
    return args


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab.openstack", description=__doc__.split("\n\n")[0])
    add_log_format_flag(p)
    add_version_flag(p)
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the lab and keep it up until SIGINT/SIGTERM")
    up.add_argument("--clusters", type=int, default=2, help="customer cluster networks/routers (0-4)")
    up.add_argument("--nodes", type=int, default=3, help="Nova servers standing for Kubernetes nodes")
    up.add_argument("--debug", action="store_true", help="Neutron's debug log (in its run directory)")
    up.add_argument("--print-cloud", action="store_true", help="print the topology's ids as JSON")
    return p


def up(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        neutron = start_neutron(
            NeutronSettings(debug=args.debug), seed=cloud_seed(clusters=args.clusters, nodes=args.nodes)
        )
    except LabOpenStackError as e:
        log.error("lab.openstack.start_failed error=%r", str(e))
        return 1
    try:
        assert neutron.seed_data is not None
        cloud = Cloud.from_dict(neutron.seed_data["cloud"])
        with (
            FaultProxy(neutron.endpoint, name="neutron") as nproxy,
            NovaEmulator(neutron.endpoint) as nova,
            FaultProxy(nova.url, error_style="nova", name="nova") as cproxy,
        ):
            declare_nodes(nova, cloud)
            log.info(
                "lab.openstack.up neutron=%s neutron_proxy=%s nova=%s nova_proxy=%s seconds=%.2f run_dir=%s",
                neutron.endpoint,
                nproxy.url,
                nova.url,
                cproxy.url,
                neutron.timings.get("total", 0.0),
                neutron.run_dir,
            )
            log.info(
                "lab.openstack.sdk auth_type=none auth.endpoint=%s network_endpoint_override=%s "
                "compute_endpoint_override=%s/v2.1",
                nproxy.url,
                nproxy.url,
                cproxy.url,
            )
            if args.print_cloud:
                print(json.dumps(cloud.to_dict(), indent=1, sort_keys=True), flush=True)
            stop.wait()
            log.info("lab.openstack.stopping")
    finally:
        neutron.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    setup_logging("INFO", fmt=args.log_format)
    if args.command == "up":
        return up(args)
    return 2  # pragma: no cover - argparse refuses other commands


if __name__ == "__main__":
    sys.exit(main())
