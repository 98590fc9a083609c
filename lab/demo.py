"""`make demo`: the operator flow, as a user meets it, until Ctrl-C.

What it does, step by step, each step printed with its time:

1. builds the world (``lab.kubelet.world.E2EWorld``): the network-namespace lab (the node, its NIC2, the
   cloud's router, the fabric with the exposure targets), the Kubernetes API **emulator**, the real
   controller (``python -m controller run``, a process) and the **lab kubelet** (an emulator of a node's
   kubelet that runs the pods the controller's Deployments describe: containers as processes, or from the
   built images with ``--runtime podman``);
2. starts the remote sites of ``docs/examples/ipsec.yaml`` (their own charon each) and configures them by
   hand, as the tenants' firewalls would be, with PSKs it draws at random (never printed); creates the
   Secrets the example references with the same values; prints the kubeconfig and kubectl commands to
   paste in another terminal;
3. ``kubectl apply -f docs/examples/ipsec.yaml``; shows the controller reconciling (its log lines), the
   pod's containers starting (its status), the tunnels Established and the gateway Ready (``kubectl get
   vpngateways,vpnpeers``);
4. a third site, s3, whose firewall was given another PSK than the Secret its VPNPeer references (both
   random, never printed): ``kubectl get vpnpeers -A`` shows s1 and s2 Established and s3 AuthFailed;
   ``kubectl vpngw diagnose`` (scripts/kubectl-vpngw, the kubectl plugin that runs ``python -m controller
   diagnose``) names the cause (``PSKMismatch``, exit 1); the Secret replaced with the site's PSK, s3 is
   Established in seconds (the status-agent follows its Secrets through the API) and a site like the
   others from here on;
5. traffic from each site to every exposure: the granted ones reached, the others refused;
6. ``kubectl patch`` revoking a grant while a flow under it runs: the flow cut, with the measured time;
7. charon's container killed (SIGKILL), restarted by the lab kubelet, every tunnel Established again;
8. then it keeps running (until Ctrl-C, SIGTERM, ``--duration`` or ``--kills``): a short status table
   every few seconds (tunnel state from the CR, bytes from the pod's exporter, a request through each
   tunnel: the counters move), and the charon kill again every ``--kill-every`` seconds.

The demo watches what it runs (the controller, the sites' charons, the exposure targets, the lab kubelet
and the API emulator): one that stops is a failure, said at once with its name, exit status and the end of
its log, and everything is torn down (exit 1); so is a step that does not happen in time (named). The pod's
containers are the lab kubelet's: it restarts them, and the demo prints what the pod's status says. SIGINT
(Ctrl-C) and SIGTERM are handled alike whatever disposition the demo inherited (a script's background job
starts with SIGINT ignored): the first one tears everything down and the demo exits 128 + its number.

Logs (the controller's, every pod container's, the sites' charons', this process's: the demo, the lab
kubelet, the API emulator; the emulator's request log at the end) go to a directory that is kept after the
run (``--log-dir``, default ``/var/tmp/vpngw-demo-<time>``), or deleted at the end with ``--clean-logs``.

Exit codes: 0 a ``--duration`` or ``--kills`` run that ended with every tunnel Established; 1 a failure
(a process that stopped, a step that did not happen in time, the teardown leaving something); 2 bad
usage or not root; 130 / 143 stopped by SIGINT / SIGTERM (after tearing everything down).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

import yaml

from gwkit.logs import LEVELS, UtcFormatter, add_log_format_flag, rfc3339, setup_logging
from gwkit.version import add_version_flag
from lab import netns
from lab.netns import LabError
from lab.wait import WaitTimeout, wait_for

if TYPE_CHECKING:
    from lab.kubelet.world import E2EWorld

log = logging.getLogger("lab.demo")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "ipsec.yaml"
KUBECTL_DIR = ROOT / ".tools" / "bin"
NS = "tenant-acme"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
STATUS_EVERY = 3.0
"""Seconds between two status tables of the running phase."""
RECOVERY_LIMIT = 30.0
"""Seconds a killed charon has to be running again, and every tunnel Established on the CR, after the
kill (plus the restart back-off the pod's status announces)."""
MIN_KILL_EVERY = 5.0
API_CHOICE = (
    "demo: the API is the Kubernetes API emulator (lab.kubeapi); the real control plane starts in 7.5 s "
    "here, the emulator in 0.02 s: docs/controlplane.md"
)
"""Which API the demo runs, and why (start to ready, medians measured 2026-12-03 at load average 5:
docs/controlplane.md, "Which the demo runs")."""
PLUGIN_DIR = ROOT / "scripts"
"""Where ``kubectl-vpngw`` (the kubectl plugin: ``kubectl vpngw diagnose``) is."""
SOCKET_ROOM = len("/lab/s60/charon/charon.vici")
"""The longest path below the log directory that must fit an AF_UNIX socket address (108 bytes)."""
T = TypeVar("T")


class DemoFailed(Exception):
    """A process or thread the demo runs stopped, or a step did not happen in time: tear down, exit 1."""


class Stopped(KeyboardInterrupt):
    """SIGINT or SIGTERM: tear everything down and exit 128 + ``signum``."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# --- pure decisions -------------------------------------------------------------------------------------


def stop_status(signum: int) -> int:
    """The exit status after a stop signal: 128 + its number, as a shell reports a job it killed."""
    return 128 + signum


def exit_text(returncode: int) -> str:
    """``exited with status 3`` / ``was killed by SIGKILL`` (Popen's negative return codes are signals)."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


@dataclass(frozen=True)
class Options:
    """The demo's command line, checked."""

    duration: float | None = None
    """Stop after this many seconds from the start (the steps always complete first); None: until a signal."""
    kill_every: float = 20.0
    """Seconds between two kills of charon's container in the running phase (0: no kills after the step)."""
    kills: int | None = None
    """Stop once the running phase killed charon this many times (each one recovered), whatever the time it
    took (a loaded machine's slow set-up does not eat into it as into ``duration``); None: no such end."""
    runtime: str = "process"
    log_dir: Path | None = None
    """None: ``default_log_dir`` at the start."""
    clean_logs: bool = False
    real_backoff: bool = False
    """Keep the lab kubelet's restart back-off as a kubelet's (reset after 10 minutes of running)."""
    log_level: str = "INFO"


def check_options(o: Options) -> str | None:
    """What is wrong with the options (exit 2), or None."""
    if o.duration is not None and o.duration <= 0:
        return "--duration must be positive"
    if o.kills is not None and (o.kills <= 0 or o.kill_every <= 0):
        return "--kills must be positive, with a --kill-every above 0"
    if o.kill_every < 0 or 0 < o.kill_every < MIN_KILL_EVERY:
        return f"--kill-every must be 0 (no kills) or at least {MIN_KILL_EVERY:g} seconds"
    if o.runtime not in ("process", "podman"):
        return "--runtime must be process or podman"
    if o.log_dir is not None and len(str(o.log_dir.absolute())) + SOCKET_ROOM >= 108:
        return (
            f"--log-dir {str(o.log_dir)!r} is too long: the sites' VICI sockets live below it "
            "(AF_UNIX: 108 bytes)"
        )
    return None


def default_log_dir(now: float, base: Path = Path("/var/tmp")) -> Path:
    """``/var/tmp/vpngw-demo-20261201T124343Z``: kept across the run (and reboots), named by its start."""
    return base / f"vpngw-demo-{datetime.fromtimestamp(now, UTC):%Y%m%dT%H%M%SZ}"


def kubelet_options(kill_every: float, real_backoff: bool) -> dict[str, Any]:
    """The lab kubelet's settings for the demo. A kubelet restarts a crashed container at once the first
    time, then after 10 s, 20 s, 40 s ... up to 5 min, and forgets the crashes after 10 minutes of running:
    with a kill every 20 s, charon would spend most of the demo in CrashLoopBackOff. Unless
    ``real_backoff``, the back-off is forgotten after half the kill interval of running, so every kill is
    a first crash (restarted at once)."""
    if real_backoff or kill_every <= 0:
        return {}
    return {"backoff_reset": kill_every / 2}


def stamp(wall: float, elapsed: float) -> str:
    """``[12:43:44Z +3.2s]``: the time a step was seen (UTC, as in every log) and since the start."""
    return f"[{datetime.fromtimestamp(wall, UTC):%H:%M:%S}Z {elapsed:+6.1f}s]"


@dataclass(frozen=True)
class Site:
    """A remote site of the example: what its firewall is told."""

    name: str
    endpoint: str
    id: str
    subnets: tuple[str, ...]
    psk_secret: tuple[str, str]
    """(Secret name, key) of the PSK the gateway uses for it."""
    grants: tuple[str, ...]


WRONG_PSK = Site(
    name="s3",
    endpoint="198.51.100.10",
    id="s3.lab.example",
    subnets=("203.0.113.32/28",),
    psk_secret=("s3-psk", "psk"),
    grants=("web",),
)
"""The site the demo adds with a PSK mismatch (the lab's third site: lab/world.py addresses it)."""


@dataclass(frozen=True)
class Example:
    """What the demo needs to know of the example it applies."""

    gateway: str
    namespace: str
    gateway_id: str
    exposures: dict[str, int]
    """Exposure name -> its first port."""
    sites: tuple[Site, ...]

    @property
    def secrets(self) -> list[tuple[str, str]]:
        """The (name, key) of every PSK Secret the example references, in order, once each."""
        return list(dict.fromkeys(s.psk_secret for s in self.sites))


def read_example(docs: Sequence[Mapping[str, Any]]) -> Example:
    """The VPNGateway (IPsec, PSK) and its site peers of an example file; ValueError if it is not one."""
    gws = [d for d in docs if d.get("kind") == "VPNGateway"]
    if len(gws) != 1 or gws[0]["spec"].get("type") != "ipsec":
        raise ValueError("the example must hold exactly one IPsec VPNGateway")
    gw = gws[0]
    name, ns = str(gw["metadata"]["name"]), str(gw["metadata"].get("namespace", "default"))
    ipsec = gw["spec"]["ipsec"]
    default_ref = ipsec.get("pskSecretRef")
    if not default_ref:
        raise ValueError("the example's gateway must authenticate with a PSK (pskSecretRef)")
    exposures = {str(e["name"]): int(e["ports"][0]["port"]) for e in gw["spec"].get("exposures") or []}
    sites = []
    for d in docs:
        spec = d.get("spec") or {}
        if d.get("kind") != "VPNPeer" or (spec.get("gatewayRef") or {}).get("name") != name:
            continue
        if spec.get("type") != "site":
            continue
        ref = spec["ipsec"].get("pskSecretRef") or default_ref
        sites.append(
            Site(
                name=str(d["metadata"]["name"]),
                endpoint=str(spec["endpoint"]),
                id=str(spec["ipsec"]["id"]),
                subnets=tuple(spec["ipsec"]["remoteSubnets"]),
                psk_secret=(str(ref["name"]), str(ref.get("key", "psk"))),
                grants=tuple((spec.get("authorization") or {}).get("exposures") or []),
            )
        )
    if not sites:
        raise ValueError("the example has no site peer")
    return Example(name, ns, str(ipsec["localID"]), exposures, tuple(sites))


def revocation(example: Example) -> tuple[Site, str] | None:
    """The grant the demo revokes: the last one of the first site granted two exposures or more (so that
    a flow under another grant of the same site keeps running); None if no site has two."""
    for s in example.sites:
        if len(s.grants) >= 2:
            return s, s.grants[-1]
    return None


def peer_doc(example: Example, site: Site) -> dict[str, Any]:
    """The VPNPeer of ``site`` on the example's gateway, as a tenant writes it."""
    return {
        "apiVersion": "vpn.bnerd.net/v1alpha1",
        "kind": "VPNPeer",
        "metadata": {"name": site.name, "namespace": example.namespace},
        "spec": {
            "gatewayRef": {"name": example.gateway},
            "type": "site",
            "endpoint": site.endpoint,
            "ipsec": {
                "id": site.id,
                "remoteSubnets": list(site.subnets),
                "pskSecretRef": {"name": site.psk_secret[0], "key": site.psk_secret[1]},
            },
            "authorization": {"exposures": list(site.grants)},
        },
    }


def diagnose_problem(returncode: int, output: str, code: str, about: str) -> str | None:
    """What is wrong with diagnose's answer about a known fault (exit 1 and the finding ``code`` about
    ``about`` in its text), or None when it named it."""
    named = re.search(rf"^\d+\. \[error\] {re.escape(code)}: .*\b{re.escape(about)}\b", output, re.MULTILINE)
    if returncode != 1 or named is None:
        return f"exit status {returncode}, {'naming' if named else 'not naming'} {code} for {about}"
    return None


def controller_line(line: str) -> str | None:
    """A line of the controller's log worth showing (the objects it writes, its reconciles that wrote
    more than a status, its warnings), shortened to ``<time> <event ...>``; None for the rest."""
    parts = line.rstrip("\n").split(" ", 3)
    if len(parts) < 4 or "T" not in parts[0]:
        return None
    when, level, _logger, rest = parts
    event = rest.split(" ", 1)[0]
    writes = re.search(r"\bwrites=(\d+)", rest)
    show = (
        level in ("WARNING", "ERROR", "CRITICAL")
        or event.startswith("object.")
        or event in ("operator.leading", "gateway.failed")
        or (event == "gateway.reconciled" and writes is not None and int(writes.group(1)) > 1)
    )
    if not show:
        return None
    short = when.split("T", 1)[1]
    return f"{short} {rest}" if level == "INFO" else f"{short} {level} {rest}"


def _container_key(c: Mapping[str, Any]) -> tuple[str, str, bool, int]:
    state = c.get("state") or {}
    kind = next(iter(state), "unknown")
    detail = state.get(kind) or {}
    reason = str(detail.get("reason") or "")
    if kind == "terminated":
        reason = f"{reason}, exit {detail.get('exitCode')}"
    return kind, reason, bool(c.get("ready")), int(c.get("restartCount") or 0)


QUIET_WAITING = ("ContainerCreating", "PodInitializing")


def container_changes(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What changed in a pod's container statuses between two of its ``status`` objects, as (container,
    text) for a reader: ``init container init-nat: terminated (Completed, exit 0)``, ``container charon:
    restarted by the kubelet (restartCount 1; last exit 137, Error)``, ``container status-agent: ready``."""
    out: list[tuple[str, str]] = []
    for key, what in (("initContainerStatuses", "init container"), ("containerStatuses", "container")):
        before = {c["name"]: c for c in (old or {}).get(key) or []}
        for c in new.get(key) or []:
            name = str(c["name"])
            prev = before.get(name)
            now_key = _container_key(c)
            if prev is not None and _container_key(prev) == now_key:
                continue
            kind, reason, ready, restarts = now_key
            was_kind, _, _, was_restarts = _container_key(prev) if prev is not None else ("", "", False, 0)
            was_running = was_kind == "running"
            if kind == "waiting":
                if reason in QUIET_WAITING:
                    continue
                message = str((c.get("state") or {}).get("waiting", {}).get("message") or "")
                text = f"waiting ({reason}{': ' + message if message else ''})"
            elif kind == "terminated":
                text = f"terminated ({reason})"
            elif kind == "running" and restarts > 0 and (restarts > was_restarts or not was_running):
                last = (c.get("lastState") or {}).get("terminated") or {}
                text = (
                    f"restarted by the kubelet (restartCount {restarts}; last exit "
                    f"{last.get('exitCode')}, {last.get('reason')})"
                )
            elif kind == "running" and what == "init container":
                text = "running"
            elif kind == "running":
                if was_running:
                    text = "ready" if ready else "not ready"
                else:
                    text = "running" + ("" if ready else " (not ready yet)")
            else:
                text = kind
            out.append((name, f"{what} {name}: {text}"))
    return out


def backoff_seconds(message: str) -> float:
    """The restart delay a ``CrashLoopBackOff`` message announces (``back-off 10s restarting ...``), or 0."""
    m = re.search(r"back-off (\d+(?:\.\d+)?)s", message)
    return float(m.group(1)) if m else 0.0


def tunnel_bytes(metrics: str) -> dict[str, tuple[int, int]]:
    """``strongswan_tunnel_bytes_total`` of an exporter's /metrics: tunnel -> (in, out)."""
    seen: dict[str, dict[str, int]] = {}
    pattern = r'^strongswan_tunnel_bytes_total\{tunnel="([^"]+)",direction="(in|out)"\} (\S+)$'
    for m in re.finditer(pattern, metrics, re.MULTILINE):
        seen.setdefault(m.group(1), {})[m.group(2)] = int(float(m.group(3)))
    return {t: (d.get("in", 0), d.get("out", 0)) for t, d in seen.items()}


def status_table(
    tunnels: Sequence[Mapping[str, Any]],
    counters: Mapping[str, tuple[int, int]] | None,
    traffic: Mapping[str, tuple[str, bool]],
) -> str:
    """The running phase's short table: per tunnel its state and ``establishedAt`` (the CR's
    ``status.tunnels``), the bytes through it (the exporter's counters, live from charon), and this round's
    request through it (site -> exposure)."""
    rows = [
        f"  {'tunnel':<8} {'state (CR)':<12} {'established':<11} {'bytes in':>9} {'bytes out':>9}  traffic",
    ]
    for t in tunnels:
        name = str(t.get("name", "?"))
        since = str(t.get("establishedAt") or "-")
        since = since.split("T", 1)[1] if "T" in since else since
        if counters is None:
            b_in = b_out = "(exporter?)"
        else:
            got = counters.get(name)
            b_in, b_out = (str(got[0]), str(got[1])) if got else ("-", "-")
        exposure, ok = traffic.get(name, ("", False))
        req = f"{name} -> {exposure}: {'reached' if ok else 'NOT reached'}" if exposure else "-"
        rows.append(f"  {name:<8} {t.get('state', '?')!s:<12} {since:<11} {b_in:>9} {b_out:>9}  {req}")
    if len(rows) == 1:
        rows.append("  (no tunnels in the gateway's status yet)")
    return "\n".join(rows)


def user_commands(kubeconfig: Path, kubectl_dir: Path, example: Example, log_dir: Path) -> str:
    """What the user can paste in another terminal while the demo runs."""
    from lab.cluster import GATEWAY_NAMESPACE

    ns, gw = example.namespace, example.gateway
    last = example.sites[-1].name
    patch = shlex.quote(json.dumps({"spec": {"authorization": {"exposures": []}}}))
    return "\n".join(
        [
            "demo: kubectl against the emulated cluster, from another terminal while the demo runs:",
            f"    export KUBECONFIG={kubeconfig} PATH={kubectl_dir}:{PLUGIN_DIR}:$PATH",
            f"    kubectl get vpngateways,vpnpeers -n {ns}",
            "    kubectl get vpnpeers -A                              # each peer's STATE",
            f"    kubectl vpngw diagnose {ns}/{gw} --readyz-timeout 0   # scripts/kubectl-vpngw",
            f"    kubectl get pods -n {GATEWAY_NAMESPACE} -w             # gateway pods run there",
            f"    kubectl get vpngateway {gw} -n {ns} -o yaml        # status.tunnels, conditions",
            f"    kubectl get deployments,configmaps,networkpolicies -n {GATEWAY_NAMESPACE}",
            f"    kubectl patch vpnpeer {last} -n {ns} --type=merge -p {patch}   # revoke {last}'s grants",
            f"    tail -f {log_dir}/pods/*/status-agent-0.log",
        ]
    )


@dataclass
class Outcome:
    """What a run saw, for its verdict and its last line."""

    recoveries: list[float] = field(default_factory=list)
    """Seconds from each kill of charon to every tunnel Established again on the CR."""
    cut: float | None = None
    """Seconds from the grant's revocation to the cut of the flow under it."""
    first_established: float | None = None
    """Seconds from the start to every tunnel Established on the CR."""
    wrong_psk: float | None = None
    """Seconds of the wrong-PSK step (site s3 added, AuthFailed, diagnosed, fixed, Established)."""
    failure: str | None = None
    stopped: Stopped | None = None
    final: list[dict[str, Any]] = field(default_factory=list)
    """The gateway's ``status.tunnels`` as the run ended (read before the teardown)."""
    leftovers: list[str] = field(default_factory=list)

    def established(self) -> bool:
        return bool(self.final) and all(t.get("state") == "Established" for t in self.final)

    def exit_status(self) -> int:
        if self.failure is not None or self.leftovers:
            return EXIT_FAILED
        if self.stopped is not None:
            return stop_status(self.stopped.signum)
        return EXIT_OK if self.established() else EXIT_FAILED

    def summary(self) -> str:
        if self.stopped is not None:
            verdict = f"stopped by {self.stopped}"
        elif self.failure is not None:
            verdict = "FAILED"
        else:
            verdict = "all tunnels Established" if self.established() else "NOT all tunnels Established"
        parts = [
            "first Established "
            + (f"{self.first_established:.1f} s after the start" if self.first_established else "never"),
            "mistyped PSK -> AuthFailed, diagnosed, fixed, Established "
            + (f"{self.wrong_psk:.1f} s" if self.wrong_psk is not None else "not measured"),
            "grant revoked -> flow cut " + (f"{self.cut:.2f} s" if self.cut is not None else "not measured"),
            f"charon killed -> tunnels back on the CR {[round(r, 1) for r in self.recoveries]} s",
        ]
        if self.leftovers:
            parts.append(f"teardown LEFT {self.leftovers}")
        return f"demo: done; {'; '.join(parts)}; {verdict}; exit status {self.exit_status()}"


# --- signals ----------------------------------------------------------------------------------------------


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


# --- the shell ----------------------------------------------------------------------------------------------


def _tail(path: Path | None, lines: int = 15) -> str:
    if path is None:
        return ""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(f"    | {ln}" for ln in text.splitlines()[-lines:])


class LogTail:
    """The lines a log file gained since the last call (complete lines only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self._partial = b""

    def lines(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += len(data)
        data = self._partial + data
        *done, self._partial = data.split(b"\n")
        return [d.decode(errors="replace") for d in done]


class Demo:
    """One run: the world, what it prints, what it watches."""

    def __init__(self, world: E2EWorld, example: Example, out: TextIO, t0: float, wall0: float) -> None:
        self.w = world
        self.example = example
        self.out = out
        self.t0 = t0
        self.wall0 = wall0
        self.pod_status: dict[str, Any] | None = None
        self.pod_name: str | None = None
        self.controller_log: LogTail | None = None
        self.sites: dict[str, Any] = {}
        self.psk: dict[tuple[str, str], str] = {}
        self.show_controller = True
        self.show_pod = False
        """Report the gateway pod (from the step that waits for it on)."""

    # --- output --------------------------------------------------------------------------------------------

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def step(self, text: str) -> None:
        self.say(f"{stamp(time.time(), time.monotonic() - self.t0)} {text}")

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def kubectl(self, *args: str, input: str | None = None, shown: str | None = None) -> str:
        """Run kubectl as a user would, print the command and its output; a failure is the demo's."""
        self.say(f"$ kubectl {shown or ' '.join(shlex.quote(a) for a in args)}")
        try:
            p = self.w.kubectl(*args, input=input, check=False)
        except (OSError, subprocess.TimeoutExpired, AssertionError) as exc:
            raise DemoFailed(f"kubectl {args[0]}: {exc}") from None
        text = (p.stdout + p.stderr).rstrip()
        if text:
            self.say("\n".join(f"  {line}" for line in text.splitlines()))
        if p.returncode != 0:
            raise DemoFailed(f"kubectl {args[0]} {exit_text(p.returncode)}")
        return p.stdout

    # --- watching ------------------------------------------------------------------------------------------

    def check(self) -> None:
        """Raise DemoFailed naming the first process or thread of the world that stopped."""
        for name, proc, logfile in self.w.processes():
            if proc is not None and proc.poll() is not None:
                log.error("demo.process_exited name=%r pid=%d returncode=%d", name, proc.pid, proc.returncode)
                tail = _tail(logfile)
                raise DemoFailed(
                    f"{name} (pid {proc.pid}) {exit_text(proc.returncode)}"
                    + (f"; the end of its log ({logfile}):\n{tail}" if tail else "")
                )
        stopped = self.w.stopped_thread()
        if stopped:
            log.error("demo.thread_stopped what=%r", stopped)
            raise DemoFailed(stopped)

    def pump(self) -> None:
        """Print what happened since the last call (controller lines, the pod's container changes), then
        check that everything runs."""
        if self.controller_log is not None:
            for line in self.controller_log.lines():
                shown = controller_line(line)
                if shown and self.show_controller:
                    self.say(f"  controller | {shown}")
        worker = self.w.pod(self.example.gateway, self.example.namespace) if self.show_pod else None
        if worker is not None:
            if worker.name != self.pod_name:
                self.pod_name = worker.name
                self.pod_status = None
                self.step(
                    f"pod {worker.namespace}/{worker.name} created by the Deployment (in the operator's "
                    f"gateway namespace, not the tenant's); the lab kubelet of node node-a runs it (network "
                    f"namespace {worker.netns})"
                )
                self._link_pod_logs(worker)
            pod = self.w.c.get("v1", "Pod", worker.name, worker.namespace)
            status = (pod or {}).get("status") or {}
            for container, text in container_changes(self.pod_status, status):
                inst = worker.instances.get(container)
                pid = inst.running.pid if inst is not None else None
                running = "running" in (self._status_of(status, container).get("state") or {})
                self.step(f"pod: {text}" + (f" (pid {pid})" if pid and running else ""))
            self.pod_status = status
        self.check()

    @staticmethod
    def _status_of(status: Mapping[str, Any], container: str) -> dict[str, Any]:
        for key in ("initContainerStatuses", "containerStatuses"):
            for c in status.get(key) or []:
                if c.get("name") == container:
                    return dict(c)
        return {}

    def _link_pod_logs(self, worker: Any) -> None:
        """``<log dir>/pods/<pod>`` -> the pod's live log directory while it runs (the kubelet copies the
        logs into the log directory when the pod stops; ``finish_logs`` puts them at the same path)."""
        pods = self.w.workdir / "pods"
        pods.mkdir(exist_ok=True)
        link = pods / worker.name
        with contextlib.suppress(OSError):
            link.unlink(missing_ok=True)
            link.symlink_to(worker.dir / "logs", target_is_directory=True)

    def pause(self, seconds: float) -> None:
        # A deliberate fixed pause that keeps pumping the demo's output, not a wait for a condition
        # (allowed in tests/unit/test_no_polling_loops.py).
        end = time.monotonic() + seconds
        while True:
            self.pump()
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.1, left))

    def wait(self, cond: Callable[[], T | None], timeout: float, what: str) -> T:
        """``cond()``'s first truthy result, pumping and checking meanwhile; DemoFailed naming ``what``."""

        def pumped() -> T | None:
            self.pump()
            return cond()

        try:
            return wait_for(pumped, timeout, what, interval=0.1)
        except WaitTimeout as e:
            log.error("demo.step_timeout what=%r seconds=%g", what, timeout)
            raise DemoFailed(f"{what}: did not happen within {timeout:g} s (last seen: {e.last!r})") from None

    def _wait_until(self, cond: Callable[[], bool], deadline: Callable[[], float], failure: str) -> None:
        """Until ``cond()``, pumping meanwhile, by the monotonic time ``deadline()``, which ``cond`` may
        move later (a back-off the kubelet announced); ``DemoFailed(failure)`` when it passes."""

        def pumped() -> bool:
            self.pump()
            return cond()

        # Not a polling loop: one wait_for per deadline, again only if the condition moved the deadline.
        while True:
            try:
                wait_for(pumped, max(0.0, deadline() - time.monotonic()), failure, interval=0.1)
                return
            except WaitTimeout as e:
                if time.monotonic() < deadline():
                    continue
                raise DemoFailed(failure) from e

    # --- the cluster, read --------------------------------------------------------------------------------

    def tunnels(self) -> list[dict[str, Any]]:
        gw = self.w.gateway(self.example.gateway, self.example.namespace)
        return list((gw.get("status") or {}).get("tunnels") or [])

    def ready(self) -> bool:
        gw = self.w.gateway(self.example.gateway, self.example.namespace)
        conds = (gw.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)

    def all_established(self, names: Sequence[str]) -> bool:
        states = {t.get("name"): t.get("state") for t in self.tunnels()}
        return bool(names) and all(states.get(n) == "Established" for n in names)

    def charon(self) -> dict[str, Any]:
        return self._status_of(self.pod_status or {}, "charon")

    def counters(self) -> dict[str, tuple[int, int]] | None:
        """The exporter's tunnel byte counters, scraped from the node as Prometheus would (pod IP)."""
        ip = (self.pod_status or {}).get("podIP")
        if not ip:
            return None
        res = self.w.lab.gw.run(
            "curl", "-s", "-m", "2", f"http://{ip}:{self._metrics_port()}/metrics", check=False, timeout=5
        )
        return tunnel_bytes(res.stdout.decode(errors="replace")) if res.returncode == 0 else None

    def _metrics_port(self) -> int:
        worker = self.w.pod(self.example.gateway, self.example.namespace)
        for c in (worker.spec.get("containers") if worker else None) or []:
            for p in c.get("ports") or []:
                if p.get("name") == "metrics":
                    return int(p["containerPort"])
        return 9100

    def reaches(self, site: str, exposure: str) -> bool:
        return self.w.reaches(
            self.sites[site],
            self.w.vip(exposure, self.example.gateway, self.example.namespace),
            self.example.exposures[exposure],
        )

    def peer_state(self, name: str) -> str | None:
        """``status.state`` of the VPNPeer ``name`` in the example's namespace (kubectl's STATE column)."""
        from lab.kubelet.world import VPN

        peer = self.w.c.get(VPN, "VPNPeer", name, self.example.namespace) or {}
        state = (peer.get("status") or {}).get("state")
        return str(state) if state is not None else None

    # --- the steps ----------------------------------------------------------------------------------------

    def start_sites(self) -> None:
        from lab.world import GW_NIC2_ADDR

        for s in self.example.sites:
            site = self.w.add_ipsec_site(list(s.subnets))
            if site.addresses[0] != s.endpoint:
                raise DemoFailed(
                    f"the example's site {s.name} is at {s.endpoint}, the lab's at {site.addresses[0]}: "
                    f"{EXAMPLE} is addressed like the lab (lab/world.py)"
                )
            self.sites[s.name] = site
        for ref in self.example.secrets:
            self.psk[ref] = secrets.token_urlsafe(24)  # never printed, never logged
        for s in self.example.sites:
            self.w.configure_ipsec_site(
                self.sites[s.name],
                psk=self.psk[s.psk_secret],
                site_id=s.id,
                gateway_id=self.example.gateway_id,
            )
            charon = self.sites[s.name].charon
            self.step(
                f"site {s.name}: its own charon (pid {charon.pid if charon else '?'}) at {s.endpoint}, LANs "
                f"{', '.join(s.subnets)}; configured by hand over VICI as the tenant's firewall would be: "
                f"{s.id} <-> {self.example.gateway_id} at {GW_NIC2_ADDR}, the PSK of Secret "
                f"{s.psk_secret[0]} (a random value, not shown)"
            )

    def create_secrets(self) -> None:
        import gwplan
        from controller.names import LABEL_TENANT, TENANT_ENABLED
        from lab.cluster import gateway_secret

        ns = self.example.namespace
        # The platform opts the namespace in (its label; the controller's Secret read there comes with the
        # lab's admin rights), and the tenant its Secrets (their label): docs/install.md.
        docs: list[dict[str, Any]] = [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": ns, "labels": {LABEL_TENANT: TENANT_ENABLED}},
            }
        ]
        by_name: dict[str, dict[str, str]] = {}
        for (name, key), value in self.psk.items():
            by_name.setdefault(name, {})[key] = value
        docs += [gateway_secret(ns, n, d) for n, d in by_name.items()]
        names = ", ".join(by_name)
        self.step(
            f"the namespace (labelled {LABEL_TENANT}={TENANT_ENABLED}) and the PSK Secrets the example "
            f"references ({names}, labelled {gwplan.SECRET_OPT_IN_LABEL}=true), with the sites' values"
        )
        # create, not apply: apply would keep the values in the last-applied-configuration annotation
        self.kubectl(
            "create", "-f", "-", input=yaml.safe_dump_all(docs), shown="create -f -   # values not shown"
        )

    def apply(self) -> float:
        self.step(f"the example custom resources: {EXAMPLE.relative_to(ROOT)}")
        applied = time.monotonic()
        self.kubectl("apply", "-f", str(EXAMPLE), shown=f"apply -f {EXAMPLE.relative_to(ROOT)}")
        return applied

    def bring_up(self, applied: float, o: Outcome) -> None:
        ex = self.example
        names = [s.name for s in ex.sites]
        from lab.cluster import home_of

        key, home = home_of(ex.gateway, ex.namespace)
        self.wait(
            lambda: self.w.c.get("apps/v1", "Deployment", key, home),
            30,
            "the controller's Deployment",
        )
        self.step(
            f"the controller wrote Deployment {home}/{key} (and the objects above) in the operator's gateway "
            f"namespace; in {ex.namespace} only the pod's Role for its CR's status and its Secrets"
        )
        self.show_pod = True
        self.wait(
            lambda: self.w.pod(ex.gateway, ex.namespace), 30, "the gateway pod, created from the Deployment"
        )
        self.wait(
            lambda: self.all_established(names), 30, "every tunnel Established on the VPNGateway's status"
        )
        o.first_established = self.elapsed()
        log.info("demo.measured what=start_to_established seconds=%.3f", o.first_established)
        self.step(
            f"every tunnel Established on the CR ({', '.join(names)}), "
            f"{time.monotonic() - applied:.1f} s after the apply"
        )
        self.wait(self.ready, 60, "the VPNGateway's Ready condition True")
        self.step("the VPNGateway is Ready (its pod Ready: the status-agent's readiness probe passed)")
        self.kubectl("get", "vpngateways,vpnpeers", "-n", ex.namespace)
        columns = (
            'NAME:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status,'
            "TUNNELS:.status.tunnels[*].name,STATES:.status.tunnels[*].state,"
            "ESTABLISHED:.status.tunnels[*].establishedAt"
        )
        self.kubectl("get", "vpngateway", ex.gateway, "-n", ex.namespace, "-o", f"custom-columns={columns}")
        from lab.cluster import GATEWAY_NAMESPACE

        self.kubectl("get", "pods", "-n", GATEWAY_NAMESPACE, "-l", f"vpn.bnerd.net/gateway={ex.gateway}")

    def wrong_psk(self) -> float:
        """Step 4: a site whose firewall has another PSK than its Secret; ``kubectl get vpnpeers`` and
        ``kubectl vpngw diagnose`` say so; the Secret fixed, the site is one like the others. Returns the
        step's seconds."""
        from lab.cluster import gateway_secret

        ex, s = self.example, WRONG_PSK
        began = time.monotonic()
        site = self.w.add_ipsec_site(list(s.subnets))
        self.sites[s.name] = site
        if site.addresses[0] != s.endpoint:
            raise DemoFailed(f"the demo's site {s.name} is at {s.endpoint}, the lab's at {site.addresses[0]}")
        theirs, ours = secrets.token_urlsafe(24), secrets.token_urlsafe(24)  # never printed, never logged
        self.w.configure_ipsec_site(site, psk=theirs, site_id=s.id, gateway_id=ex.gateway_id)
        charon = site.charon
        secret_name, key = s.psk_secret
        self.step(
            f"site {s.name}: its own charon (pid {charon.pid if charon else '?'}) at {s.endpoint}, LAN "
            f"{', '.join(s.subnets)}; its firewall was given another PSK than the one the tenant puts in "
            f"Secret {secret_name} (both random, not shown): a mistyped key, as happens"
        )
        self.kubectl(
            "create",
            "-f",
            "-",
            input=yaml.safe_dump(gateway_secret(ex.namespace, secret_name, {key: ours})),
            shown=f"create -f -   # Secret {secret_name}, value not shown",
        )
        applied = time.monotonic()
        self.kubectl(
            "apply",
            "-f",
            "-",
            input=yaml.safe_dump(peer_doc(ex, s)),
            shown=f"apply -f -   # VPNPeer {s.name}: site {s.endpoint}, id {s.id}, PSK: Secret {secret_name}",
        )
        others = [p.name for p in ex.sites]
        self.wait(
            lambda: (
                self.peer_state(s.name) == "AuthFailed"
                and all(self.peer_state(n) == "Established" for n in others)
            ),
            30,
            f"VPNPeer {s.name} AuthFailed, the others Established",
        )
        self.step(
            f"VPNPeer {s.name} is AuthFailed {time.monotonic() - applied:.1f} s after the apply (the "
            "gateway's status-agent writes each peer's state); the others stay Established"
        )
        self.kubectl("get", "vpnpeers", "-A")
        self.diagnose(ex, "PSKMismatch", f"tunnel {s.name}")
        self.step(
            f"the fix diagnose names: Secret {secret_name} replaced with the PSK the site has (the "
            "status-agent follows its Secrets through the API and loads the key into charon)"
        )
        fixed = time.monotonic()
        self.kubectl(
            "replace",
            "-f",
            "-",
            input=yaml.safe_dump(gateway_secret(ex.namespace, secret_name, {key: theirs})),
            shown=f"replace -f -   # Secret {secret_name} with the site's PSK, value not shown",
        )
        names = [*others, s.name]
        self.wait(
            lambda: self.all_established(names) and all(self.peer_state(n) == "Established" for n in names),
            30,
            f"VPNPeer {s.name} and its tunnel Established after the fix",
        )
        self.step(f"VPNPeer {s.name} is Established {time.monotonic() - fixed:.1f} s after the Secret's fix")
        self.kubectl("get", "vpnpeers", "-A")
        self.example = Example(ex.gateway, ex.namespace, ex.gateway_id, ex.exposures, (*ex.sites, s))
        took = time.monotonic() - began
        log.info("demo.measured what=wrong_psk_step seconds=%.3f", took)
        return took

    def diagnose(self, ex: Example, code: str, about: str) -> None:
        """``kubectl vpngw diagnose NS/NAME`` as a user runs it (the plugin on the PATH, $KUBECONFIG); its
        answer printed; DemoFailed unless it exits 1 naming ``code`` about ``about``."""
        target = f"{ex.namespace}/{ex.gateway}"
        # --readyz-timeout 0: the pods' addresses are the lab node's (its network namespace), not this one's;
        # from here a request to one leaves the machine, and whatever answers there is not the status-agent.
        args = ["diagnose", target, "--readyz-timeout", "0"]
        self.say(
            f"$ kubectl vpngw {' '.join(args)}   # scripts/kubectl-vpngw, the kubectl plugin: python -m "
            "controller diagnose; /readyz not asked: the pod's address is the lab node's, not reachable here"
        )
        env = {
            **os.environ,
            "KUBECONFIG": str(self.w.c.kubeconfig),
            "PATH": f"{PLUGIN_DIR}{os.pathsep}{KUBECTL_DIR}{os.pathsep}{os.environ.get('PATH', '')}",
            "VPNGW_PYTHON": sys.executable,
        }
        try:
            p = subprocess.run(
                [str(KUBECTL_DIR / "kubectl"), "vpngw", *args],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DemoFailed(f"kubectl vpngw diagnose: {exc}") from None
        text = p.stdout.rstrip() or p.stderr.rstrip()
        if text:
            self.say("\n".join(f"  {line}" for line in text.splitlines()))
        self.say(f"  (exit status {p.returncode}{': a problem found' if p.returncode == 1 else ''})")
        problem = diagnose_problem(p.returncode, p.stdout, code, about)
        if problem is not None:
            raise DemoFailed(f"kubectl vpngw diagnose {target}: {problem}")

    def traffic(self) -> None:
        self.step("traffic from each site's LAN through its tunnel to every exposure (TCP, one round trip)")
        for s in self.example.sites:
            for exposure, port in self.example.exposures.items():
                granted = exposure in s.grants
                ok = self.reaches(s.name, exposure)
                vip = self.w.vip(exposure, self.example.gateway, self.example.namespace)
                self.say(
                    f"  {s.name} -> {exposure} ({vip}:{port}): {'reached' if ok else 'refused'} "
                    f"({'granted' if granted else 'not granted'})"
                )
                if ok != granted:
                    raise DemoFailed(
                        f"traffic {s.name} -> {exposure}: {'reached' if ok else 'refused'} although it is "
                        f"{'granted' if granted else 'not granted'}"
                    )
                self.pump()

    def revoke(self, o: Outcome) -> None:
        choice = revocation(self.example)
        if choice is None:
            self.step("no site has two grants: the revocation step is skipped")
            return
        site, exposure = choice
        kept = [g for g in site.grants if g != exposure]
        ex = self.example
        vip = self.w.vip(exposure, ex.gateway, ex.namespace)
        self.step(
            f"revoking {site.name}'s grant to {exposure} while a TCP flow {site.name} -> {exposure} "
            "echoes every 50 ms"
        )
        flow = self.w.long_client(
            self.sites[site.name], vip, ex.exposures[exposure], f"flow-{site.name}-{exposure}"
        )
        self.wait(flow.alive, 15, f"the flow {site.name} -> {exposure}")
        patch = json.dumps({"spec": {"authorization": {"exposures": kept}}})
        t_edit = time.time()
        self.kubectl("patch", "vpnpeer", site.name, "-n", ex.namespace, "--type=merge", "-p", patch)
        self.wait(flow.cut_at, 15, f"the flow {site.name} -> {exposure} cut after the revocation")
        at = flow.cut_at()
        assert at is not None
        o.cut = at - t_edit
        log.info("demo.measured what=grant_revoked_to_flow_cut seconds=%.3f", o.cut)
        self.step(
            f"the flow {site.name} -> {exposure} was cut {o.cut:.2f} s after the patch (controller -> "
            "plan ConfigMap -> the status-agent's plan follower -> init-nat -> conntrack; the kubelet's "
            "refresh of the mounted ConfigMap is 60 s away)"
        )
        refused = not self.reaches(site.name, exposure)
        still = [g for g in kept if self.reaches(site.name, g)]
        self.say(
            f"  a new connection {site.name} -> {exposure}: {'refused' if refused else 'REACHED'}; "
            + (f"{site.name} -> {', '.join(still)}: reached" if still else "")
        )
        if not refused or len(still) != len(kept):
            raise DemoFailed(f"after the revocation: {site.name}'s grants are not what the VPNPeer says")
        self.example = Example(
            ex.gateway,
            ex.namespace,
            ex.gateway_id,
            ex.exposures,
            tuple(
                Site(s.name, s.endpoint, s.id, s.subnets, s.psk_secret, tuple(kept)) if s is site else s
                for s in ex.sites
            ),
        )

    def kill_charon(self, o: Outcome) -> None:
        ex = self.example
        worker = self.w.pod(ex.gateway, ex.namespace)
        if worker is None:
            raise DemoFailed("the gateway pod is gone")
        before = {str(t.get("name")): t.get("establishedAt") for t in self.tunnels()}
        restarts = int(self.charon().get("restartCount") or 0)
        inst = worker.instances.get("charon")
        pid = inst.running.pid if inst is not None else None
        self.step(f"kill -9 of charon's container (pid {pid}), as a crash would; the lab kubelet restarts it")
        killed = time.time()
        killed_second = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(killed))
        t_kill = time.monotonic()
        if not self.w.k.kill(worker.namespace, worker.name, "charon"):
            raise DemoFailed("charon's container was not running when the demo killed it")
        deadline = t_kill + RECOVERY_LIMIT

        def restarted() -> bool:
            nonlocal deadline
            c = self.charon()
            waiting = (c.get("state") or {}).get("waiting") or {}
            delay = backoff_seconds(str(waiting.get("message") or ""))
            if delay:
                deadline = max(deadline, time.monotonic() + delay + RECOVERY_LIMIT)
            return int(c.get("restartCount") or 0) > restarts and "running" in (c.get("state") or {})

        self._wait_until(
            restarted,
            lambda: deadline,
            f"charon's container not running again {RECOVERY_LIMIT:g} s after the kill",
        )
        self.step(f"the kubelet restarted charon {time.monotonic() - t_kill:.1f} s after the kill")

        def back() -> bool:
            ts = self.tunnels()
            return bool(ts) and all(
                t.get("state") == "Established"
                and str(t.get("establishedAt") or "") >= killed_second
                and t.get("establishedAt") != before.get(str(t.get("name")))
                for t in ts
            )

        self._wait_until(
            back,
            lambda: deadline,
            f"the tunnels not Established again on the CR {RECOVERY_LIMIT:g} s after the kill",
        )
        took = time.monotonic() - t_kill
        o.recoveries.append(took)
        log.info("demo.measured what=charon_killed_to_established seconds=%.3f", took)
        self.step(
            f"every tunnel Established again on the CR {took:.1f} s after the kill (the same status-agent "
            "reconnected to the new charon and pushed its connections again)"
        )

    def table(self) -> None:
        traffic: dict[str, tuple[str, bool]] = {}
        for s in self.example.sites:
            if s.grants:
                traffic[s.name] = (s.grants[0], self.reaches(s.name, s.grants[0]))
        rows = status_table(self.tunnels(), self.counters(), traffic)
        self.say(f"{stamp(time.time(), self.elapsed())} status\n{rows}")


def _load_example() -> Example:
    try:
        docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
        return read_example(docs)
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as exc:
        raise DemoFailed(f"{EXAMPLE}: {exc}") from None


def _build_images(d: Demo, log_dir: Path) -> None:
    missing = [t for t in ("podman", "buildah", "skopeo") if shutil.which(t) is None]
    if missing:
        raise DemoFailed(f"--runtime podman needs {', '.join(missing)}: run scripts/setup_images.sh first")
    build_log = log_dir / "images-build.log"
    d.step(
        f"building the images (images/build.sh: a few seconds when current, 2-3 min from an empty store; "
        f"log {build_log})"
    )
    with build_log.open("wb") as f:
        res = subprocess.run(
            ["bash", str(ROOT / "images" / "build.sh")],
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            check=False,
        )
    if res.returncode != 0:
        raise DemoFailed(f"images/build.sh {exit_text(res.returncode)}; its log:\n{_tail(build_log)}")
    d.step("images current")


def _write_request_log(world: E2EWorld, path: Path) -> None:
    """The API emulator's request log, one line per request (who, verb, path, status)."""
    with contextlib.suppress(Exception), path.open("w") as f:
        for r in world.c.kube.requests():
            f.write(
                f"{rfc3339(r.time)} user={r.user} verb={r.verb} code={r.code} path={r.path!r} "
                f"agent={r.user_agent!r}\n"
            )


def finish_logs(log_dir: Path) -> None:
    """After the teardown: the pods' log directories where their links were (``pods/<pod>``), the
    kubectl cache gone."""
    pods = log_dir / "pods"
    if pods.is_dir():
        for link in pods.iterdir():
            if link.is_symlink():
                link.unlink()
    kept = log_dir / "kubelet-logs"
    if kept.is_dir():
        pods.mkdir(exist_ok=True)
        for d in kept.iterdir():
            target = pods / d.name
            if not target.exists():
                d.rename(target)
        shutil.rmtree(kept, ignore_errors=True)
    shutil.rmtree(log_dir / "kubectl-cache", ignore_errors=True)


def _setup_file_logging(path: Path, level: str) -> logging.Handler:
    """Every log line of this process (the demo, the lab kubelet, the API emulator) to ``path``; stderr
    keeps the demo's own lines and the others' errors."""
    root = logging.getLogger()
    for h in root.handlers:
        h.addFilter(lambda r: r.name.startswith("lab.demo") or r.levelno >= logging.ERROR)
    handler = logging.FileHandler(path)
    handler.setFormatter(UtcFormatter())
    handler.setLevel(level)
    root.addHandler(handler)
    return handler


def run(opts: Options, out: TextIO = sys.stdout, signals: StopSignals | None = None) -> int:
    """The demo; returns its exit status. ``signals``: the installed stop handlers (``main``), disarmed
    before the teardown so that a second signal cannot cut it short."""
    from lab.kubelet.world import E2EWorld

    wall0, t0 = time.time(), time.monotonic()
    log_dir = (opts.log_dir or default_log_dir(wall0)).absolute()
    log_dir.mkdir(parents=True, exist_ok=True)
    handler = _setup_file_logging(log_dir / "lab.log", opts.log_level)
    o = Outcome()
    world = E2EWorld(
        log_dir, runtime=opts.runtime, kubelet=kubelet_options(opts.kill_every, opts.real_backoff)
    )
    d = Demo(world, Example("", "", "", {}, ()), out, t0, wall0)
    kept = "deleted at the end (--clean-logs)" if opts.clean_logs else "kept after the run"
    d.say(
        f"demo: logs in {log_dir} ({kept}):"
        "\n    k8s/controller.log               the controller"
        "\n    pods/<pod>/<container>-<n>.log   each container of the gateway pod (one file per restart)"
        "\n    lab/<site>/charon/charon.log     the remote sites' charons"
        "\n    lab.log                          this process: the demo, the lab kubelet, the API emulator"
        "\n    api-requests.log                 the API emulator's request log (written at the end)"
    )
    d.say(API_CHOICE)
    built = False
    try:
        d.example = _load_example()
        if opts.runtime == "podman":
            _build_images(d, log_dir)
        d.step(
            "building the world: network namespaces (node, NIC2, router, sites, fabric), the Kubernetes API "
            f"emulator, the controller, the lab kubelet (runtime {opts.runtime})"
        )
        with world:
            built = True
            try:
                _demo(d, o, opts)
            except DemoFailed as exc:
                o.failure = str(exc)
            except (LabError, AssertionError, OSError, subprocess.SubprocessError) as exc:
                o.failure = f"{type(exc).__name__}: {exc}"
            except Stopped as exc:
                o.stopped = exc
            finally:
                if signals is not None:
                    signals.disarm()
                with contextlib.suppress(Exception):
                    o.final = d.tunnels()
                _write_request_log(world, log_dir / "api-requests.log")
                if o.stopped is not None:
                    d.say(f"\ndemo: stopped by {o.stopped}, tearing the lab down")
                    log.warning("demo.stopping signal=%s", o.stopped)
                elif o.failure is not None:
                    d.say(f"\ndemo: FAILED: {o.failure}\ndemo: tearing the lab down")
                    log.error("demo.failed reason=%r", o.failure.splitlines()[0])
                else:
                    d.say("\ndemo: tearing the lab down")
    except Stopped as exc:  # while the world was being built: it tore itself down
        if signals is not None:
            signals.disarm()
        o.stopped = exc
        d.say(f"\ndemo: stopped by {exc} while building the world; torn down")
    except DemoFailed as exc:
        o.failure = str(exc)
        d.say(f"\ndemo: FAILED: {exc}")
    except (LabError, AssertionError, OSError, subprocess.SubprocessError) as exc:
        o.failure = o.failure or f"{type(exc).__name__}: {exc}"
        d.say(f"\ndemo: FAILED: {'tearing down' if built else 'building the world'}: {exc}")
    if signals is not None:
        signals.disarm()
    o.leftovers = _leftovers(world)
    d.say(
        "demo: torn down: no namespace, veth, mount, container or process of the run is left"
        if not o.leftovers
        else f"demo: FAILED: the teardown left {o.leftovers}"
    )
    logging.getLogger().removeHandler(handler)
    handler.close()
    finish_logs(log_dir)
    if opts.clean_logs:
        shutil.rmtree(log_dir, ignore_errors=True)
        d.say(f"demo: logs deleted ({log_dir}, --clean-logs)")
    else:
        d.say(f"demo: logs kept in {log_dir}")
    d.say(o.summary())
    return o.exit_status()


def _leftovers(world: E2EWorld) -> list[str]:
    out: list[str] = []
    with contextlib.suppress(Exception):
        if world.kubelet is not None:
            out += world.kubelet.leftovers()
    prefix = world.lab.prefix
    out += [f"netns {n}" for n in netns.list_namespaces() if n.startswith(prefix)]
    with contextlib.suppress(Exception):
        for name, proc, _ in world.processes():
            if proc is not None and proc.poll() is None:
                out.append(f"process {name} (pid {proc.pid})")
    return out


def _demo(d: Demo, o: Outcome, opts: Options) -> None:
    w = d.w
    assert w.controller is not None
    d.controller_log = LogTail(w.controller.log_path)
    d.step(
        f"world up: API emulator at {w.c.kube.url}; controller pid {w.controller.proc.pid}; lab kubelet for "
        f"node node-a; lab namespaces {w.lab.prefix}-*, pod namespaces {w.k.run_id}-p*"
    )
    d.say(user_commands(w.c.kubeconfig, KUBECTL_DIR, d.example, w.workdir))
    if not opts.real_backoff and opts.kill_every > 0:
        d.say(
            f"demo: the lab kubelet forgets a container's crashes after {opts.kill_every / 2:g} s of running "
            "(a kubelet: 10 min), so each kill of charon is restarted at once; --real-backoff shows "
            "CrashLoopBackOff (10 s, 20 s, 40 s ...) instead"
        )
    d.start_sites()
    d.create_secrets()
    applied = d.apply()
    d.bring_up(applied, o)
    o.wrong_psk = d.wrong_psk()
    d.traffic()
    d.revoke(o)
    d.kill_charon(o)
    d.show_controller = False  # from here on its lines are status writes; its log has them all
    left = "until Ctrl-C" if opts.duration is None else f"until {opts.duration:g} s after the start"
    if opts.kills is not None:
        left += f"{' or' if opts.duration is not None else ','} until {opts.kills} more kills of charon"
    d.step(
        f"running {left}: a status table every {STATUS_EVERY:g} s"
        + (f", charon killed every {opts.kill_every:g} s" if opts.kill_every > 0 else "")
    )
    log.info("demo.running pod=%s controller_pid=%d", d.pod_name, w.controller.proc.pid)
    next_table = time.monotonic()
    next_kill = time.monotonic() + opts.kill_every
    killed = 0
    # The demo's main loop (tables and kills on a schedule until Ctrl-C, --duration or --kills), not a
    # wait for a condition (allowed in tests/unit/test_no_polling_loops.py).
    while (opts.duration is None or d.elapsed() < opts.duration) and (
        opts.kills is None or killed < opts.kills
    ):
        now = time.monotonic()
        if now >= next_table:
            d.table()
            next_table = now + STATUS_EVERY
        if opts.kill_every > 0 and now >= next_kill:
            d.kill_charon(o)
            killed += 1
            next_kill = time.monotonic() + opts.kill_every
        d.pause(0.1)
    d.table()


# --- leftovers of killed runs ------------------------------------------------------------------------------


def is_stale_controller(argv: Sequence[str], parent_alive: bool, emulator_owner_alive: bool | None) -> bool:
    """A ``python -m controller run`` of a lab run that was killed: started against an API emulator's
    kubeconfig in the temporary directory (``kubeapi-*``), whose owner is gone (``emulator_owner_alive``
    False; None when its directory is gone) and whose own parent is gone too (reparented)."""
    joined = " ".join(argv)
    if "-m controller run" not in joined:
        return False
    kc = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--kubeconfig"), "")
    if "/kubeapi-" not in kc:
        return False
    return not parent_alive and emulator_owner_alive is not True


def stale_controllers() -> list[int]:
    """Kill (SIGKILL) the controllers killed lab runs left running; their pids."""
    killed = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if "controller" not in argv:
            continue
        kc = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--kubeconfig"), "")
        owner_file = Path(kc).parent / "pid"
        owner: bool | None = None
        with contextlib.suppress(OSError, ValueError):
            owner = Path(f"/proc/{int(owner_file.read_text())}").exists()
        parent_alive = ppid > 1 and Path(f"/proc/{ppid}").exists()
        if is_stale_controller(argv, parent_alive, owner):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(int(proc.name))
    return killed


def remove_stale_dirs(tmp: Path | None = None) -> list[Path]:
    """Work directories of lab runs whose process is gone (a SIGKILLed run cannot remove its own)."""
    removed = []
    for d in Path(tmp or tempfile.gettempdir()).glob(f"{netns.PREFIX}*x*-*"):
        pid = netns.owner_pid(d.name)
        if d.is_dir() and pid is not None and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def cleanup_stale() -> list[str]:
    """Everything killed lab runs left: the lab kubelet's (pod namespaces and their processes, tmpfs
    mounts, directories, podman containers), the lab's namespaces and directories, the API emulators'
    directories, orphaned controllers."""
    from lab.kubeapi.emulator import cleanup_stale as stale_emulators
    from lab.kubelet.kubelet import cleanup_stale as stale_kubelets

    removed = [f"controller pid {p}" for p in stale_controllers()]
    removed += stale_kubelets()
    removed += [f"directory {d}" for d in remove_stale_dirs()]
    removed += [f"directory {d}" for d in stale_emulators()]
    return removed


# --- the command line ---------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lab",
        description=__doc__,
        epilog="Exit codes: 0 ok (demo: a --duration or --kills run that ended with every tunnel "
        "Established), 1 a failure (a process that stopped, a step that did not happen in time, the "
        "teardown leaving something), 2 bad usage or not root, 130/143 the demo was stopped by "
        "SIGINT/SIGTERM (everything torn down).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_log_format_flag(p)
    add_version_flag(p)
    sub = p.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="the operator flow: kubectl apply of the example, the controller, the lab kubelet, live "
        "tunnels, until Ctrl-C (or SIGTERM, or --duration)",
        description="The operator flow in the lab, step by step (docs/demo.md): the emulated API, the "
        "controller, the lab kubelet and remote sites; kubectl apply of docs/examples/ipsec.yaml; tunnels "
        "up, traffic, a grant revoked, charon killed and recovering; then a status table every few seconds "
        "until Ctrl-C.",
    )
    demo.add_argument(
        "--duration",
        type=float,
        default=None,
        help="stop this many seconds after the start (the steps always complete first); exit 0 only if "
        "every tunnel is Established then (default: run until Ctrl-C or SIGTERM)",
    )
    demo.add_argument(
        "--kill-every",
        type=float,
        default=20.0,
        help="after the steps, kill -9 charon's container this often (0: never; else at least 5 s; "
        "default 20)",
    )
    demo.add_argument(
        "--kills",
        type=int,
        default=None,
        help="stop once charon was killed this many times after the steps (each one recovered); exit 0 "
        "only if every tunnel is Established then (with --duration: whichever comes first)",
    )
    demo.add_argument(
        "--runtime",
        choices=("process", "podman"),
        default="process",
        help="how the lab kubelet runs the pod's containers: processes from the project's environment "
        "(default), or podman from the built images (images/build.sh runs first)",
    )
    demo.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="where the logs go (default /var/tmp/vpngw-demo-<start time>); kept after the run",
    )
    demo.add_argument("--clean-logs", action="store_true", help="delete the log directory at the end")
    demo.add_argument(
        "--real-backoff",
        action="store_true",
        help="the lab kubelet's restart back-off as a kubelet's (crashes forgotten after 10 min): repeated "
        "kills meet CrashLoopBackOff (10 s, 20 s, 40 s ...); default: forgotten after half --kill-every",
    )
    demo.add_argument("--log-level", default="INFO", choices=LEVELS, help="of lab.log and the demo's stderr")
    sub.add_parser(
        "cleanup",
        help="remove what killed lab runs left: namespaces, mounts, directories, containers, controllers",
    )
    # Run by lab/__main__.py before this parser sees it; listed here so that --help shows it.
    sub.add_parser(
        "controlplane",
        help="up|down: a real etcd, kube-apiserver and kube-controller-manager (python -m lab controlplane "
        "--help; docs/controlplane.md)",
        add_help=False,
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    setup_logging(getattr(args, "log_level", "INFO"), fmt=args.log_format)
    opts = Options()
    if args.command == "demo":
        opts = Options(
            duration=args.duration,
            kill_every=args.kill_every,
            kills=args.kills,
            runtime=args.runtime,
            log_dir=args.log_dir,
            clean_logs=args.clean_logs,
            real_backoff=args.real_backoff,
            log_level=args.log_level,
        )
        problem = check_options(opts)
        if problem:
            print(f"python -m lab demo: error: {problem}", file=sys.stderr)
            return EXIT_USAGE
    if os.geteuid() != 0:
        print("lab: needs root (network namespaces)", file=sys.stderr)
        return EXIT_USAGE
    signals = StopSignals()
    if args.command == "demo":
        signals.install()  # first thing: SIGINT may arrive ignored (a background job of a script)
    try:
        removed = cleanup_stale()
        if args.command == "cleanup":
            for what in removed:
                print(f"removed {what}")
            return EXIT_OK
        if removed:
            log.info(
                "demo.cleanup removed=%d what=%r (left by killed runs)",
                len(removed),
                ", ".join(removed)[:500],
            )
        return run(opts, signals=signals)
    except Stopped as exc:
        print(f"demo: stopped by {exc} before the world was built", file=sys.stderr)
        return stop_status(exc.signum)
