"""`make demo`: the gateway pod's agents running against live daemons in the lab, until Ctrl-C.

What it does, in the order a real cluster would:
1. builds the lab in pod mode (the gateway's default route is a cluster eth0; NIC2 is ``ens7``, found by
   MAC), starts the gateway charon and two remote-site charons, and configures the sites by hand as a
   tenant's firewall would;
2. writes a VPNGateway and two VPNPeers as YAML and renders the plan with ``python -m controller render``;
3. runs ``python -m initnat`` (policy routing + NAT), then ``python -m agent`` and ``python -m exporter``
   inside the gateway namespace, exactly as the pod's containers;
4. prints the tunnels' status (from the agent's status file, counters refreshed every
   ``counter_period(--kill-every)`` seconds: a quarter of the kill interval, so they move between kills),
   a request through the tunnel to an exposure from every site (the traffic those counters count), and the
   exporter's view; every ``--kill-every`` seconds it kill -9s charon and restarts it, and shows how long
   the agent takes to bring every tunnel back.

The demo watches every process of the pod and the lab (init-nat --watch, agent, exporter, the charons,
the exposure's web server): one that exits is a failure, said at once with its name and exit status and
the end of its log, and the demo tears everything down and exits 1. SIGINT (Ctrl-C) and SIGTERM are
handled alike, whatever disposition the demo inherited (a script's background job starts with SIGINT
ignored): the first one tears everything down and the demo exits 128 + the signal number (130, 143).

Exit codes: 0 a ``--duration`` run that ended with every tunnel Established and every kill recovered;
1 a pod or lab process exited, a tunnel was not re-established, or the lab failed; 2 bad usage or not
root; 130 / 143 stopped by SIGINT / SIGTERM (after tearing everything down).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import anyio

from gwkit.logs import setup_logging
from gwkit.vici import ViciSession
from lab import netns
from lab.daemons import Charon
from lab.netns import LabError
from lab.peers import configure_site
from lab.world import GW_NIC2_ADDR, NIC2_PREFIX, RTR_NIC2_ADDR, SERVICE_CIDR, Host, Lab, cleanup_stale

log = logging.getLogger("lab.demo")

PSK = "demo-only-psk-0b7e"  # a lab value, never a real one
EXPORTER_PORT = 9814
HEALTH_PORT = 8081
WEB_PORT = 8080
EXPOSURE_TARGET = "192.0.2.66"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
RECOVERY_LIMIT = 30.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class DemoFailed(Exception):
    """A pod or lab process exited, or a step of the set-up failed: tear down, exit 1, say this."""


class Stopped(KeyboardInterrupt):
    """SIGINT or SIGTERM: tear everything down and exit 128 + ``signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_status(signum: int) -> int:
    """The exit status after a stop signal: 128 + its number, as a shell reports a job it killed."""
    return 128 + signum


def counter_period(kill_every: float) -> float:
    """Seconds between the agent's full status refreshes (``--resync-seconds``: how often counters alone
    reach the status file). The agent's 30 s default is longer than the demo's 20 s between kills, so the
    table showed ``in=0 out=0`` all along: a quarter of the kill interval shows counters moving three times
    per charon lifetime; 1 s at least (the agent's minimum), 30 s at most."""
    if kill_every <= 0:
        return 5.0
    return min(30.0, max(1.0, kill_every / 4))


def exit_text(returncode: int) -> str:
    """``exited with status 3`` / ``was killed by SIGKILL`` (Popen's negative return codes are signals)."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


@dataclass(frozen=True)
class Watched:
    """A process the demo needs alive: its name, how to get its current Popen (charon's changes at
    every restart), and its log."""

    name: str
    proc: Callable[[], subprocess.Popen[bytes] | None]
    log: Path | None = None


def _current(daemon: Charon) -> Callable[[], subprocess.Popen[bytes] | None]:
    """The daemon's process as it is now (a restart replaces it)."""
    return lambda: daemon.proc


def first_exit(watched: Sequence[Watched]) -> tuple[Watched, int, int] | None:
    """The first watched process that has exited: (it, pid, return code), or None."""
    for w in watched:
        p = w.proc()
        if p is not None and p.poll() is not None:
            return w, p.pid, p.returncode
    return None


def _tail(path: Path | None, lines: int = 15) -> str:
    if path is None:
        return ""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(f"    | {ln}" for ln in text.splitlines()[-lines:])


class StopSignals:
    """SIGINT and SIGTERM handled alike, whatever the demo inherited: the first raises ``Stopped`` in the
    main thread; later ones (during the teardown) are only recorded, so they cannot cut it short."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.armed = False

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)  # also replaces SIG_IGN, as a background job inherits it
        self.armed = True

    def disarm(self) -> None:
        """From here on (teardown) signals are recorded, not raised."""
        self.armed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)  # no I/O here: a print could re-enter the one interrupted
        if self.armed:
            self.armed = False
            raise Stopped(signum)


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


def _step(name: str, argv: list[str]) -> None:
    """Run a one-shot step of the set-up; its failure is the demo's, named."""
    res = subprocess.run(argv, capture_output=True, check=False)
    if res.returncode != 0:
        err = (res.stderr or res.stdout).decode(errors="replace").strip().splitlines()[-5:]
        raise DemoFailed(f"{name} {exit_text(res.returncode)}: " + " / ".join(err))


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


class Pod:
    """The processes the demo started and must keep alive: watched between every step, stopped (SIGTERM,
    then SIGKILL after 5 s) on every way out."""

    def __init__(self) -> None:
        self.watched: list[Watched] = []
        self.started: list[subprocess.Popen[bytes]] = []

    def spawn(self, name: str, argv: list[str], logfile: Path) -> subprocess.Popen[bytes]:
        proc = _spawn(argv, logfile)
        self.started.append(proc)
        self.watched.append(Watched(name, lambda: proc, logfile))
        return proc

    def watch(self, watched: Watched) -> None:
        self.watched.append(watched)

    def check(self) -> None:
        """Raise DemoFailed naming the first watched process that exited, with the end of its log."""
        gone = first_exit(self.watched)
        if gone is None:
            return
        w, pid, code = gone
        log.error("demo.process_exited name=%r pid=%d returncode=%d", w.name, pid, code)
        tail = _tail(w.log)
        raise DemoFailed(
            f"{w.name} (pid {pid}) {exit_text(code)}"
            + (f"; the end of its log ({w.log}):\n{tail}" if tail else "")
        )

    def pause(self, seconds: float) -> None:
        """Sleep, checking the processes every 0.1 s."""
        end = time.monotonic() + seconds
        while True:
            self.check()
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.1, left))

    def stop(self) -> None:
        for p in reversed(self.started):
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        for p in reversed(self.started):
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)


def _wait_recovered(
    pod: Pod, status_file: Path, names: list[str], since: float, limit: float = RECOVERY_LIMIT
) -> float | None:
    """Seconds until the status file shows every tunnel Established by an IKE_SA newer than ``since``
    (a dead agent's file never does: ``pod.check`` says so first)."""
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
        pod.pause(0.05)
    return None


@dataclass
class Outcome:
    """What a run saw, for its verdict."""

    names: list[str] = field(default_factory=list)
    status_file: Path | None = None
    recoveries: list[float] = field(default_factory=list)
    missed: int = 0
    failure: str | None = None
    stopped: Stopped | None = None
    final: dict[str, Any] = field(default_factory=dict)
    """The agent's status as the run ended, read before the teardown (the lab's directory goes with it)."""

    def record_final(self) -> None:
        if self.status_file is not None:
            self.final = _status(self.status_file)

    def established(self) -> bool:
        return bool(self.names) and _all_established(self.final, self.names)

    def exit_status(self, kill_every: float) -> int:
        if self.failure is not None:
            return EXIT_FAILED
        if self.stopped is not None:
            return stop_status(self.stopped.signum)
        ok = self.established() and not self.missed and (kill_every <= 0 or bool(self.recoveries))
        return EXIT_OK if ok else EXIT_FAILED


def run(
    duration: float | None,
    kill_every: float,
    out: TextIO = sys.stdout,
    signals: StopSignals | None = None,
) -> int:
    """The demo; returns its exit status. ``signals``: the installed stop handlers (``main``), disarmed
    before the teardown so that a second signal cannot cut it short."""

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    o = Outcome()
    try:
        with Lab(pod_mode=True, nic2_name="ens7") as lab:
            pod = Pod()
            try:
                _demo(lab, pod, o, duration, kill_every, say)
            except DemoFailed as exc:
                o.failure = str(exc)
            except LabError as exc:
                o.failure = f"lab: {exc}"
            except Stopped as exc:
                o.stopped = exc
            finally:
                if signals is not None:
                    signals.disarm()
                o.record_final()
                if o.stopped is not None:
                    say(f"\ndemo: stopped by {o.stopped}, tearing the lab down")
                    log.warning("demo.stopping signal=%s", o.stopped)
                elif o.failure is not None:
                    say(f"\ndemo: FAILED: {o.failure}\ndemo: tearing the lab down")
                pod.stop()
    except Stopped as exc:  # while the lab was being built: it tore itself down
        if signals is not None:
            signals.disarm()
        o.stopped = exc
        say(f"\ndemo: stopped by {exc} while building the lab; torn down")
    except LabError as exc:  # building or tearing down the lab
        o.failure = o.failure or f"lab: {exc}"
        say(f"\ndemo: FAILED: lab: {exc}")
    code = o.exit_status(kill_every)
    if o.stopped is not None:  # the stop signal may have reached the pod too: its last status says nothing
        verdict = f"stopped by {o.stopped}"
    else:
        verdict = "all tunnels Established" if o.established() else "NOT all tunnels Established"
    say(
        f"demo: done; recoveries after kill -9: {[round(r, 1) for r in o.recoveries]}"
        + (f", {o.missed} NOT recovered" if o.missed else "")
        + f"; {verdict}; exit status {code}"
    )
    return code


def _demo(
    lab: Lab, pod: Pod, o: Outcome, duration: float | None, kill_every: float, say: Callable[[str], None]
) -> None:
    sites = [lab.add_site() for _ in range(2)]
    o.names = [s.role for s in sites]
    gw_charon = lab.start_charon(lab.gw)
    for s in sites:
        lab.start_charon(s)
    for host in (lab.gw, *sites):
        c = host.charon
        assert c is not None
        pod.watch(Watched(f"charon ({host.role})", _current(c), c.log_path))
    anyio.run(_setup_sites, lab, sites)
    work = lab.dir / "pod"
    (work / "secrets" / "acme-psk").mkdir(parents=True)
    (work / "secrets" / "acme-psk" / "psk").write_text(PSK)
    (work / "crs.yaml").write_text(manifests(sites))
    plan = work / "plan.json"
    # The controller knows NIC2 from Neutron (the port's MAC, fixed IP and subnet gateway).
    nic = ["--nic-mac", lab.nic2_mac, "--nic-address", f"{GW_NIC2_ADDR}/{NIC2_PREFIX}"]
    render = _py("controller", "render", "-f", str(work / "crs.yaml"), "-o", str(plan), *nic)
    _step("controller render", [*render, "--nic-gateway", RTR_NIC2_ADDR])
    digest = json.loads(plan.read_text())["hash"][:19]
    say(f"demo: lab {lab.prefix} up; plan rendered ({digest}...)")
    _step("init-nat", lab.gw.argv(*_py("initnat", "--plan", str(plan), "--nic-mac", lab.nic2_mac)))
    say(f"demo: init-nat applied (NIC2 {lab.nic2_name} found by MAC {lab.nic2_mac})")
    logs = work / "logs"
    logs.mkdir()
    o.status_file = status_file = work / "status.json"
    period = counter_period(kill_every)
    vici = str(gw_charon.vici_socket)
    pod_argv = {
        "init-nat": _py("initnat", "--plan", str(plan), "--nic-mac", lab.nic2_mac, "--watch"),
        "agent": _py(
            "agent",
            *("--plan", str(plan), "--secrets-dir", str(work / "secrets"), "--vici-socket", vici),
            *("--status-file", str(status_file), "--health-listen", f"127.0.0.1:{HEALTH_PORT}"),
            *("--resync-seconds", f"{period:g}"),
        ),
        "exporter": _py(
            "exporter", "--listen", f"127.0.0.1:{EXPORTER_PORT}", "--vici-socket", vici, "--plan", str(plan)
        ),
    }
    procs = {
        name: pod.spawn(name, lab.gw.argv(*argv), logs / f"{name}.log") for name, argv in pod_argv.items()
    }
    web = lab.svc.argv("python3", "-m", "http.server", "-b", EXPOSURE_TARGET, str(WEB_PORT))
    procs["web"] = pod.spawn("web server (exposure target)", web, logs / "web.log")
    say(
        f"demo: pod running in {lab.gw.ns}: "
        + ", ".join(f"{name} pid {p.pid}" for name, p in procs.items())
        + f"; logs in {logs}"
    )
    log.info("demo.running lab=%s %s", lab.prefix, " ".join(f"{n}={p.pid}" for n, p in procs.items()))
    vip = _exposure_vip(plan)
    start = time.monotonic()
    next_kill = start + kill_every
    while duration is None or time.monotonic() - start < duration:
        pod.pause(2)
        status = _status(status_file)
        now = time.monotonic()
        reach = [s.role for s in sites if _fetch(s, vip)]  # also the traffic the counters count
        pod.check()  # a dead agent's status file still says Established: never show it as live
        say(
            f"\n[{now - start:5.0f}s] tunnels (agent's status file; counters refresh every {period:g} s):\n"
            f"{_table(status)}\n"
            f"  exposure web via {vip}:{WEB_PORT} reachable from: {', '.join(reach) or 'none'}\n"
            f"{_metrics_summary(lab.gw)}"
        )
        if kill_every > 0 and now >= next_kill:
            say("demo: kill -9 charon, then start it again (the agent must re-push everything)")
            killed_at = time.time()
            gw_charon.kill()
            gw_charon.start()
            took = _wait_recovered(pod, status_file, o.names, killed_at)
            if took is None:
                o.missed += 1
                say(f"demo: tunnels NOT re-established {RECOVERY_LIMIT:.0f} s after the kill; agent's log:")
                say((logs / "agent.log").read_text(errors="replace")[-4000:])
                say(f"status: {json.dumps(_status(status_file))}")
            else:
                o.recoveries.append(took)
                say(f"demo: every tunnel re-established by the agent {took:.2f}s after the kill")
            next_kill = time.monotonic() + kill_every
    pod.check()


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


def remove_stale_dirs(tmp: Path | None = None) -> list[Path]:
    """Work directories of lab runs whose process is gone (a SIGKILLed demo cannot remove its own)."""
    removed = []
    for d in Path(tmp or tempfile.gettempdir()).glob(f"{netns.PREFIX}*x*-*"):
        pid = netns.owner_pid(d.name)
        if d.is_dir() and pid is not None and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab",
        description=__doc__,
        epilog="Exit codes: 0 ok (demo: a --duration run ended with every tunnel Established and every kill "
        "recovered), 1 a pod or lab process exited, a tunnel was not re-established or the lab failed, "
        "2 bad usage or not root, 130/143 the demo was stopped by SIGINT/SIGTERM (everything torn down).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="run the agents against live daemons in the lab until Ctrl-C (or SIGTERM, or --duration)",
    )
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
        help="kill -9 and restart the gateway charon this often (0: never); the status counters refresh "
        "every quarter of it (1-30 s)",
    )
    demo.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    sub.add_parser("cleanup", help="remove namespaces and work directories left behind by killed lab runs")
    args = parser.parse_args(argv)
    setup_logging(getattr(args, "log_level", "INFO"))
    if os.geteuid() != 0:
        print("lab: needs root (network namespaces)", file=sys.stderr)
        return EXIT_USAGE
    signals = StopSignals()
    if args.command == "demo":
        signals.install()  # first thing: SIGINT may arrive ignored (a background job of a script)
    try:
        stale = cleanup_stale()
        dirs = remove_stale_dirs()
        if args.command == "cleanup":
            for ns in stale:
                print(f"removed {ns}")
            for d in dirs:
                print(f"removed {d}")
            return EXIT_OK
        if stale or dirs:
            log.info("demo.cleanup namespaces=%d dirs=%d (left by killed runs)", len(stale), len(dirs))
        return run(args.duration, args.kill_every, signals=signals)
    except Stopped as exc:
        print(f"demo: stopped by {exc} before the lab was built", file=sys.stderr)
        return stop_status(exc.signum)
