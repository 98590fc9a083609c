"""`make demo`: the gateway pod's agents running against live daemons in the lab, until Ctrl-C.

What it does, in the order a real cluster would:
1. builds the lab in pod mode (the gateway's default route is a cluster eth0; NIC2 is ``ens7``, found by
   MAC), starts the gateway charon and two remote-site charons, and configures the sites by hand as a
   tenant's firewall would;
2. writes a VPNGateway and two VPNPeers as YAML and renders the plan with ``python -m controller render``;
3. runs ``python -m initnat`` (policy routing + NAT), then ``python -m agent`` and ``python -m exporter``
   inside the gateway namespace, exactly as the pod's containers;
4. prints the tunnels' status (from the agent's status file), a request through the tunnel to an
   exposure, and the exporter's view; every ``--kill-every`` seconds it kill -9s charon and restarts it,
   and shows how long the agent takes to bring every tunnel back.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio

from gwkit.vici import ViciSession
from lab.peers import configure_site
from lab.world import GW_NIC2_ADDR, NIC2_PREFIX, RTR_NIC2_ADDR, SERVICE_CIDR, Host, Lab

log = logging.getLogger("lab.demo")

PSK = "demo-only-psk-0b7e"  # a lab value, never a real one
EXPORTER_PORT = 9814
HEALTH_PORT = 8081
WEB_PORT = 8080
EXPOSURE_TARGET = "192.0.2.66"


def manifests(sites: list[Host]) -> str:
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "vpn.bnerd.net/v1alpha1",
            "kind": "VPNGateway",
            "metadata": {"name": "acme", "namespace": "tenant-acme"},
            "spec": {
                "type": "ipsec",
                "serviceCIDR": SERVICE_CIDR,
                "exposures": [
                    {
                        "name": "web",
                        "target": {"address": EXPOSURE_TARGET},
                        "ports": [{"port": WEB_PORT, "protocol": "TCP"}],
                    }
                ],
                "ipsec": {
                    "localID": "gw.acme.example",
                    "ike": {"proposals": ["aes256-sha256-modp2048"]},
                    "esp": {"proposals": ["aes256gcm16-modp2048"]},
                    "pskSecretRef": {"name": "acme-psk", "key": "psk"},
                },
            },
        }
    ]
    for s in sites:
        docs.append(
            {
                "apiVersion": "vpn.bnerd.net/v1alpha1",
                "kind": "VPNPeer",
                "metadata": {"name": s.role, "namespace": "tenant-acme"},
                "spec": {
                    "gatewayRef": {"name": "acme"},
                    "type": "site",
                    "endpoint": s.addresses[0],
                    "ipsec": {"id": f"{s.role}.acme.example", "remoteSubnets": s.lans},
                    "authorization": {"exposures": ["web"]},
                },
            }
        )
    return "\n---\n".join(json.dumps(d) for d in docs) + "\n"  # JSON is YAML


def _py(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


def _spawn(argv: list[str], logfile: Path) -> subprocess.Popen[bytes]:
    with open(logfile, "wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _status(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def _table(status: dict[str, Any]) -> str:
    rows = []
    for t in status.get("tunnels", []):
        rows.append(
            f"  {t.get('name', '?'):<6} {t.get('state', '?'):<12} in={t.get('bytesIn', 0):>8} "
            f"out={t.get('bytesOut', 0):>8} rekeyAt={t.get('rekeyAt', '-')} {t.get('lastError') or ''}"
        )
    return "\n".join(rows) or "  (no status yet)"


def _wait_recovered(status_file: Path, names: list[str], since: float, limit: float = 30.0) -> float | None:
    """Seconds until the status file shows every tunnel Established by an IKE_SA newer than ``since``."""
    while time.time() - since < limit:
        tunnels = {t.get("name"): t for t in _status(status_file).get("tunnels", [])}
        fresh = [
            n
            for n in names
            if tunnels.get(n, {}).get("state") == "Established"
            # charon counts `established` in whole seconds and RFC 3339 drops the fraction: allow 2 s
            and _epoch(tunnels[n].get("establishedAt")) >= since - 2.0
        ]
        if len(fresh) == len(names):
            return time.time() - since
        time.sleep(0.05)
    return None


def _epoch(rfc3339: str | None) -> float:
    if not rfc3339:
        return 0.0
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def _all_established(status: dict[str, Any], names: list[str]) -> bool:
    states = {t.get("name"): t.get("state") for t in status.get("tunnels", [])}
    return all(states.get(n) == "Established" for n in names)


def _metrics_summary(gw: Host) -> str:
    res = gw.run("curl", "-s", "-m", "3", f"http://127.0.0.1:{EXPORTER_PORT}/metrics", check=False)
    if res.returncode != 0:
        return f"  exporter: not answering (curl exit {res.returncode})"
    text = res.stdout.decode(errors="replace")
    keep = [
        ln
        for ln in text.splitlines()
        if ln.startswith(("strongswan_up", "strongswan_tunnel_up", "strongswan_tunnel_bytes_total"))
    ]
    return "\n".join(f"  {ln}" for ln in keep)


async def _setup_sites(lab: Lab, sites: list[Host]) -> None:
    for s in sites:
        assert s.charon is not None
        async with await ViciSession.connect(s.charon.vici_socket) as v:
            await configure_site(
                v,
                name="acme",
                psk=PSK,
                local_addr=s.addresses[0],
                remote_addr=GW_NIC2_ADDR,
                local_id=f"{s.role}.acme.example",
                remote_id="gw.acme.example",
                local_ts=s.lans,
                remote_ts=[SERVICE_CIDR],
            )


def run(duration: float | None, kill_every: float, out: Any = sys.stdout) -> int:
    def say(text: str) -> None:
        print(text, file=out, flush=True)

    with Lab(pod_mode=True, nic2_name="ens7") as lab:
        sites = [lab.add_site() for _ in range(2)]
        gw_charon = lab.start_charon(lab.gw)
        for s in sites:
            lab.start_charon(s)
        anyio.run(_setup_sites, lab, sites)
        work = lab.dir / "pod"
        (work / "secrets" / "acme-psk").mkdir(parents=True)
        (work / "secrets" / "acme-psk" / "psk").write_text(PSK)
        (work / "crs.yaml").write_text(manifests(sites))
        plan = work / "plan.json"
        # The controller knows NIC2 from Neutron (the port's MAC, fixed IP and subnet gateway).
        render = _py(
            "controller",
            "render",
            "-f",
            str(work / "crs.yaml"),
            "-o",
            str(plan),
            "--nic-mac",
            lab.nic2_mac,
            "--nic-address",
            f"{GW_NIC2_ADDR}/{NIC2_PREFIX}",
            "--nic-gateway",
            RTR_NIC2_ADDR,
        )
        subprocess.run(render, check=True)
        say(f"demo: lab {lab.prefix} up; plan rendered ({json.loads(plan.read_text())['hash'][:19]}...)")

        subprocess.run(
            lab.gw.argv(*_py("initnat", "--plan", str(plan), "--nic-mac", lab.nic2_mac)), check=True
        )
        say(f"demo: init-nat applied (NIC2 {lab.nic2_name} found by MAC {lab.nic2_mac})")
        logs = work / "logs"
        logs.mkdir()
        status_file = work / "status.json"
        pod = {
            "initnat": _py("initnat", "--plan", str(plan), "--nic-mac", lab.nic2_mac, "--watch"),
            "agent": _py(
                "agent",
                "--plan",
                str(plan),
                "--secrets-dir",
                str(work / "secrets"),
                "--vici-socket",
                str(gw_charon.vici_socket),
                "--status-file",
                str(status_file),
                "--health-listen",
                f"127.0.0.1:{HEALTH_PORT}",
            ),
            "exporter": _py(
                "exporter",
                "--listen",
                f"127.0.0.1:{EXPORTER_PORT}",
                "--vici-socket",
                str(gw_charon.vici_socket),
                "--plan",
                str(plan),
            ),
        }
        procs = [_spawn(lab.gw.argv(*argv), logs / f"{name}.log") for name, argv in pod.items()]
        procs.append(
            _spawn(
                lab.svc.argv("python3", "-m", "http.server", "-b", EXPOSURE_TARGET, str(WEB_PORT)),
                logs / "web.log",
            )
        )
        say(f"demo: agent, exporter, init-nat --watch running in {lab.gw.ns}; logs in {logs}")
        names = [s.role for s in sites]
        vip = _exposure_vip(plan)
        start = time.monotonic()
        next_kill = start + kill_every
        recoveries: list[float] = []
        try:
            while duration is None or time.monotonic() - start < duration:
                time.sleep(2)
                status = _status(status_file)
                now = time.monotonic()
                reach = [s.role for s in sites if _fetch(s, vip)]
                say(
                    f"\n[{now - start:5.0f}s] tunnels (agent's status file; counters refresh every 30 s):\n"
                    f"{_table(status)}\n"
                    f"  exposure web via {vip}:{WEB_PORT} reachable from: {', '.join(reach) or 'none'}\n"
                    f"{_metrics_summary(lab.gw)}"
                )
                if kill_every > 0 and now >= next_kill:
                    say("demo: kill -9 charon, then start it again (the agent must re-push everything)")
                    killed_at = time.time()
                    gw_charon.kill()
                    gw_charon.start()
                    took = _wait_recovered(status_file, names, killed_at)
                    if took is None:
                        say("demo: tunnels NOT re-established within 30 s of the kill; the agent's log ends:")
                        say((logs / "agent.log").read_text(errors="replace")[-4000:])
                        say(f"status: {json.dumps(_status(status_file))}")
                    else:
                        recoveries.append(took)
                        say(f"demo: every tunnel re-established by the agent {took:.2f}s after the kill")
                    next_kill = time.monotonic() + kill_every
        except KeyboardInterrupt:
            say("\ndemo: interrupted, tearing the lab down")
        finally:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=5)
        ok = _all_established(_status(status_file), names) and (kill_every <= 0 or bool(recoveries))
        say(
            f"demo: done; recoveries after kill -9: {[round(r, 1) for r in recoveries]}; "
            f"{'all tunnels Established' if ok else 'NOT all tunnels Established'}"
        )
        return 0 if ok else 1


def _exposure_vip(plan: Path) -> str:
    doc = json.loads(plan.read_text())
    return str(doc["nat"]["exposures"][0]["virtualIp"])


def _fetch(site: Host, vip: str) -> bool:
    res = site.run(
        "curl",
        "-s",
        "-o",
        "/dev/null",
        "-m",
        "2",
        "--interface",
        site.lan_host,
        f"http://{vip}:{WEB_PORT}/",
        check=False,
    )
    return res.returncode == 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM tears the lab down like Ctrl-C


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab",
        description=__doc__,
        epilog="Exit codes: 0 ok (demo: every tunnel Established at the end), 1 a tunnel was not Established "
        "or the lab failed, 2 bad usage or not root.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the agents against live daemons in the lab until Ctrl-C")
    demo.add_argument(
        "--duration",
        type=float,
        default=None,
        help="stop after this many seconds (exit 0 only if every tunnel is Established)",
    )
    demo.add_argument(
        "--kill-every",
        type=float,
        default=20.0,
        help="kill -9 and restart the gateway charon this often (0: never)",
    )
    sub.add_parser("cleanup", help="remove namespaces left behind by lab runs that were killed")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if os.geteuid() != 0:
        print("lab: needs root (network namespaces)", file=sys.stderr)
        return 2
    if args.command == "cleanup":
        from lab.world import cleanup_stale

        for ns in cleanup_stale():
            print(f"removed {ns}")
        return 0
    signal.signal(signal.SIGTERM, _interrupt)
    return run(args.duration, args.kill_every)
