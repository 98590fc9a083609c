"""``python -m controller``: the operator, and its offline tools. Wiring only.

* ``run``: the operator: reconciles VPNGateways (and legacy IPsecGateways) into their plan ConfigMap,
  Deployment, NAD, ServiceAccount, Role, RoleBinding and NetworkPolicy (``controller.run``).
* ``crds``: print the CustomResourceDefinitions (multi-document YAML).
* ``diagnose NAMESPACE/NAME``: why a gateway is not Ready, each problem with its cause and fix
  (``controller.diagnosecli``; exit 1 when there is a problem).
* ``render -f FILE ...``: validate one gateway and its peers and write the gateway plan (JSON) or an
  equivalent swanctl.conf.

Exit codes: 0 ok (``run``: stopped by SIGTERM/SIGINT), 1 runtime failure (e.g. the output cannot be
written), 2 bad usage, bad settings or invalid input (every problem on stderr, nothing written).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

import gwplan
from controller.api.crds import crds_yaml
from controller.api.resources import CIDR, IPV4
from controller.api.schema import show
from controller.api.validate import InvalidInput, parse_cidrs
from controller.diagnosecli import add_diagnose_parser, diagnose_command
from controller.plan.render import RenderOptions, render_documents
from controller.plan.swanctl import render_swanctl
from controller.runcli import RunFailed, add_adopt_parser, add_run_parser, adopt_command, run_command
from controller.settings import SettingsError
from gwkit.logs import LEVELS, add_log_format_flag, setup_logging
from gwkit.version import add_version_flag

log = logging.getLogger("controller")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
INTERNAL_CIDRS_ENV = "IPSEC_INTERNAL_SOURCE_CIDRS"
MAC = r"[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}"


class UsageError(Exception):
    """Bad command line or unreadable input: exit 2."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m controller",
        description="VPN gateway controller: run the operator, diagnose a gateway, print the CRDs, render a "
        "gateway's plan offline.",
        epilog="Exit codes: 0 ok, 1 runtime failure, 2 bad usage or invalid input.",
    )
    p.add_argument("--log-level", default="INFO", choices=LEVELS, help="(default: %(default)s)")
    add_log_format_flag(p)
    add_version_flag(p)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_run_parser(sub)
    add_adopt_parser(sub)
    add_diagnose_parser(sub)
    sub.add_parser(
        "crds",
        help="print the CustomResourceDefinitions as multi-document YAML",
        description="Print the CRDs (VPNGateway, VPNPeer, IPsecGateway, ClusterLink) as multi-document YAML, "
        "generated from the same rules the controller validates with.",
    )
    sub.add_parser(
        "rbac",
        help="print the rights the controller needs, per scope (the chart's Roles are generated from it)",
        description="Print, as YAML, the rules of each of the controller's Roles and ClusterRoles and where "
        "each is bound: cluster-wide, the gateway namespace, each opted-in tenant namespace, the migration "
        "from tenant namespaces, its own namespace (controller/rbac.py, where each right says which code "
        "uses it).",
    )
    ch = sub.add_parser(
        "chart",
        help="write the chart's generated files (CRDs, the controller's RBAC rules) into a chart directory",
        description="Write the files of the Helm chart that are generated from the code "
        "(controller/chartgen.py): "
        "the CRDs and the controller's ClusterRole and leader-election Role rules. A test fails when the "
        "committed chart differs.",
    )
    ch.add_argument(
        "directory", nargs="?", type=Path, default=Path("helm/vpngw"), help="(default: %(default)s)"
    )
    r = sub.add_parser(
        "render",
        help="render a gateway and its peers to the gateway plan (or swanctl.conf)",
        description="Read YAML documents (one VPNGateway and its VPNPeers, or one legacy IPsecGateway; "
        "ClusterLinks are validated and otherwise ignored), validate them, and write the gateway plan as "
        "canonical JSON. Invalid input: every problem on stderr, exit 2, nothing written.",
        epilog="Exit codes: 0 ok, 1 the output cannot be written, 2 bad usage or invalid input.",
    )
    r.add_argument(
        "-f",
        "--file",
        dest="files",
        action="append",
        required=True,
        metavar="FILE",
        help="YAML file with one or more documents; '-' reads stdin; repeatable",
    )
    r.add_argument(
        "--internal-source-cidrs",
        metavar="CIDR[,CIDR]",
        default=os.environ.get(INTERNAL_CIDRS_ENV, ""),
        help=f"fabric-side sources allowed to reach reverse exposures (default: ${INTERNAL_CIDRS_ENV})",
    )
    r.add_argument(
        "--previous",
        type=Path,
        metavar="PLAN",
        help="the currently deployed plan: its virtual IPs and conntrack marks are kept where still valid",
    )
    r.add_argument(
        "-o", "--output", type=Path, metavar="PLAN", help="write here (atomically) instead of stdout"
    )
    r.add_argument(
        "--format", choices=("plan", "swanctl"), default="plan", help="output format (default: plan)"
    )
    r.add_argument("--nic-mac", metavar="MAC", help="NIC2's MAC address (the Neutron port's)")
    r.add_argument("--nic-address", metavar="ADDR/PREFIX", help="NIC2's fixed IP with prefix")
    r.add_argument("--nic-gateway", metavar="ADDR", help="the router on NIC2's subnet")
    r.add_argument(
        "--wireguard-interface", metavar="IF", default="wg0", help="WireGuard interface name (default: wg0)"
    )
    return p


def _load_documents(files: Sequence[str]) -> list[Any]:
    docs: list[Any] = []
    for name in files:
        try:
            raw = sys.stdin.buffer.read() if name == "-" else Path(name).read_bytes()
        except OSError as exc:
            raise UsageError(f"{name}: cannot read: {exc.strerror or exc}") from exc
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UsageError(
                f"{name}: not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start} ({exc.reason})"
            ) from exc
        try:
            docs += [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as exc:
            raise UsageError(f"{name}: not YAML: {exc}") from exc
        except ValueError as exc:  # a value YAML's resolver accepts but Python cannot hold: x: 2026-02-30
            raise UsageError(f"{name}: not YAML: a value out of range: {exc}") from exc
        except RecursionError as exc:
            raise UsageError(f"{name}: not YAML: nested too deeply") from exc
    if not docs:
        raise UsageError("no documents in the input")
    return docs


def _options(args: argparse.Namespace) -> RenderOptions:
    cidrs = tuple(c.strip() for c in args.internal_source_cidrs.split(",") if c.strip())
    problems = parse_cidrs(cidrs, "--internal-source-cidrs")
    if problems:
        raise InvalidInput(problems)
    previous = None
    if args.previous is not None:
        try:
            previous = gwplan.loads(args.previous.read_bytes())
        except OSError as exc:
            raise UsageError(f"--previous {args.previous}: cannot read: {exc.strerror or exc}") from exc
        except gwplan.PlanError as exc:
            raise UsageError(f"--previous {args.previous}: {exc}") from exc
    for flag, value, pattern, rule in (
        ("--nic-mac", args.nic_mac, MAC, "is not a MAC address (six hex pairs separated by ':')"),
        ("--nic-address", args.nic_address, CIDR, "is not an IPv4 address with prefix (ADDR/PREFIX)"),
        ("--nic-gateway", args.nic_gateway, IPV4, "is not an IPv4 address"),
    ):
        if value is not None and re.fullmatch(pattern, value) is None:
            raise UsageError(f"{flag}: {show(value)} {rule}")
    if args.wireguard_interface is not None and not gwplan.is_device_name(args.wireguard_interface):
        raise UsageError(
            f"--wireguard-interface: {show(args.wireguard_interface)} is not an interface name "
            f"({gwplan.DEVICE_NAME_RULE})"
        )
    nic = gwplan.Nic(mac=args.nic_mac, address=args.nic_address, gateway=args.nic_gateway)
    return RenderOptions(
        internal_source_cidrs=cidrs, previous=previous, nic=nic, wireguard_interface=args.wireguard_interface
    )


def _write(data: bytes, output: Path | None) -> None:
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    fd, tmp = tempfile.mkstemp(dir=output.parent or Path("."), prefix=f".{output.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def render_command(args: argparse.Namespace) -> int:
    options = _options(args)
    docs = _load_documents(args.files)
    plan = render_documents(docs, options)
    if options.previous is not None and options.previous.gateway != plan.gateway:
        log.warning(
            "render.previous_ignored previous=%s/%s/%s",
            options.previous.gateway.kind,
            options.previous.gateway.namespace,
            options.previous.gateway.name,
        )
    try:
        data = render_swanctl(plan).encode() if args.format == "swanctl" else gwplan.dumps(plan)
    except ValueError as exc:
        raise UsageError(f"--format {args.format}: {exc}") from exc
    _write(data, args.output)
    g = plan.gateway
    log.info(
        "render.done gateway=%s/%s/%s type=%s tunnels=%d wg_peers=%d exposures=%d reverse=%d grants=%d "
        "format=%s hash=%s",
        g.kind,
        g.namespace,
        g.name,
        plan.type,
        len(plan.ipsec.tunnels) if plan.ipsec else 0,
        len(plan.wireguard.peers) if plan.wireguard else 0,
        len(plan.nat.exposures),
        len(plan.nat.reverse_exposures),
        len(plan.nat.grants),
        args.format,
        gwplan.plan_hash(plan),
    )
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level, fmt=args.log_format)
    try:
        if args.command == "crds":
            sys.stdout.write(crds_yaml())
            return EXIT_OK
        if args.command == "rbac":
            from controller.rbac import SCOPES, rules

            doc = {
                s.name: {"kind": s.kind, "bound": s.bound, "what": s.what, "rules": rules(s)} for s in SCOPES
            }
            sys.stdout.write(yaml.safe_dump(doc, sort_keys=False))
            return EXIT_OK
        if args.command == "run":
            return run_command(args)
        if args.command == "adopt":
            return adopt_command(args)
        if args.command == "diagnose":
            return diagnose_command(args)
        if args.command == "chart":
            from controller.chartgen import generated_files

            for rel, text in generated_files().items():
                target = args.directory / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                _write(text.encode(), target)
                log.info("chart.written path=%s", target)
            return EXIT_OK
        return render_command(args)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        log.error("controller.bad_settings error=%r", str(exc))
        return EXIT_USAGE
    except RunFailed as exc:
        log.error("controller.failed error=%r", str(exc))
        return EXIT_FAILURE
    except InvalidInput as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        log.error(
            "render.invalid problems=%d reasons=%s",
            len(exc.problems),
            ",".join(sorted({p.reason for p in exc.problems})),
        )
        return EXIT_USAGE
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        where = args.output if getattr(args, "output", None) is not None else "stdout"
        print(f"error: cannot write {where}: {exc.strerror or exc}", file=sys.stderr)
        log.error("render.write_failed path=%s error=%r", where, str(exc.strerror or exc))
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
