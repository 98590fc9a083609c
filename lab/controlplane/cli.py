"""``python -m lab controlplane up|down``: a real control plane (etcd, kube-apiserver,
kube-controller-manager built by scripts/setup_controlplane.sh) for poking at by hand or for scripts.

``up`` starts it, prints one line with the endpoints and the admin kubeconfig once everything is ready,
records itself in a state file and keeps the processes (its children) until SIGINT/SIGTERM or ``down``;
``--detach`` returns once ready and leaves a supervisor running in the background. ``down`` (from any
process) asks the state file's supervisor to stop, waits for its teardown, and kills whatever a
supervisor killed with -9 left. Logs go to stderr (``--detach``: next to the state file).
Exit codes: 0 ok (``up``: stopped by a signal or ``down``), 1 a failure (a component did not start or
died), 2 bad usage.
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
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from gwkit.logs import LEVELS, add_log_format_flag, setup_logging
from gwkit.version import add_version_flag
from lab.controlplane.cluster import ControlPlane, ControlPlaneError, cleanup_stale
from lab.controlplane.flags import NodeTimings
from lab.wait import WaitTimeout, wait_for

log = logging.getLogger("lab.controlplane")

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
DEFAULT_STATE = Path(tempfile.gettempdir()) / "vpngw-controlplane.json"
READY_PREFIX = "controlplane.up "


class Stopped(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _positive(value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not 0 < v < 3600:
        raise argparse.ArgumentTypeError(f"must be between 0 and 3600 seconds: {value!r}")
    return v


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lab controlplane",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="docs/controlplane.md: what is built, the flags and why, the measured start times.",
    )
    add_log_format_flag(p)
    add_version_flag(p)
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser(
        "up",
        help="start etcd, kube-apiserver, kube-controller-manager; print the endpoints when ready",
        description="Start the control plane, print `controlplane.up url=... kubeconfig=...` on stdout "
        "when the apiserver is ready, the controller manager healthy and the default ServiceAccount "
        "made, and keep it up until SIGINT/SIGTERM or `down`. Exit 0 when stopped so, 1 when a "
        "component fails, 2 on bad usage or when one is already up for the state file.",
    )
    up.add_argument("--state", type=Path, default=DEFAULT_STATE, help=f"state file (default {DEFAULT_STATE})")
    up.add_argument(
        "--kubeconfig", type=Path, default=None, help="also copy the admin kubeconfig here (0600)"
    )
    up.add_argument("--detach", action="store_true", help="return once ready; a supervisor keeps it up")
    up.add_argument(
        "--node-monitor-grace-period",
        type=_positive,
        default=NodeTimings().monitor_grace,
        metavar="S",
        help="seconds a node may be silent before it is NotReady (default %(default)s; production 50)",
    )
    up.add_argument("--ready-timeout", type=_positive, default=60.0, metavar="S", help="default 60")
    up.add_argument("--log-level", default="INFO", choices=LEVELS, help="(default: %(default)s)")
    up.add_argument("--supervise", action="store_true", help=argparse.SUPPRESS)  # what --detach runs
    down = sub.add_parser(
        "down",
        help="stop the control plane a state file names (from any process)",
        description="Stop what `up` started: SIGTERM to its supervisor, which stops etcd, kube-apiserver and "
        "kube-controller-manager and removes their directories; a supervisor gone without cleaning up is "
        "cleaned up after. Exit 0 when nothing is left (also when nothing was up), 1 otherwise.",
    )
    down.add_argument(
        "--state", type=Path, default=DEFAULT_STATE, help=f"state file (default {DEFAULT_STATE})"
    )
    down.add_argument(
        "--timeout", type=_positive, default=60.0, metavar="S", help="wait this long (default 60)"
    )
    down.add_argument("--log-level", default="INFO", choices=LEVELS, help="(default: %(default)s)")
    return p


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _is_supervisor(pid: int) -> bool:
    """``pid`` runs ``lab controlplane up`` (not a recycled pid)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"controlplane" in argv and b"up" in argv


def _is_component(pid: int, name: str) -> bool:
    """``pid`` runs the component binary ``name`` (not a recycled pid)."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    return os.path.basename(argv0) == name.encode()


def read_state(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _write_state(path: Path, info: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)


def ready_line(info: dict[str, Any]) -> str:
    keys = ("url", "kubeconfig", "etcd", "controller_manager", "run_dir", "seconds", "pid")
    return READY_PREFIX + " ".join(f"{k}={info[k]}" for k in keys if k in info)


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)  # the teardown runs once, uninterrupted
    raise Stopped(signum)


def up(args: argparse.Namespace) -> int:
    state = args.state.resolve()
    old = read_state(state)
    if old is not None and _alive(int(old.get("pid", 0))) and _is_supervisor(int(old["pid"])):
        print(f"controlplane: already up (pid {old['pid']}, {state}); run `down` first", file=sys.stderr)
        return EXIT_USAGE
    if args.detach:
        return _detach(args, state)
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _raise_stopped)
    removed = cleanup_stale()
    if removed:
        log.info("controlplane.cleanup removed=%d (left by killed runs)", len(removed))
    nodes = NodeTimings(monitor_grace=args.node_monitor_grace_period)
    cp = ControlPlane(nodes=nodes, ready_timeout=args.ready_timeout)
    try:
        try:
            cp.start()
            info = {**cp.describe(), "pid": os.getpid(), "state": str(state)}
            if args.kubeconfig is not None:
                shutil.copyfile(cp.kubeconfig, args.kubeconfig)
                os.chmod(args.kubeconfig, 0o600)
                info["kubeconfig"] = str(args.kubeconfig.resolve())
            state.parent.mkdir(parents=True, exist_ok=True)
            _write_state(state, info)
            print(ready_line(info), flush=True)
            if args.supervise:  # --detach's parent has read the line and is gone: nobody reads stdout
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.close(devnull)
            # Not a wait but the supervisor's main loop: it watches its components until one dies or it
            # is stopped (allowed in tests/unit/test_no_polling_loops.py).
            while True:
                for name, pid in info["pids"].items():
                    proc = cp.procs.get(name)
                    if proc is None or proc.poll() is not None:
                        log.error("controlplane.component_died component=%s pid=%d", name, pid)
                        return EXIT_FAIL
                time.sleep(0.5)
        finally:
            for s in (signal.SIGINT, signal.SIGTERM):
                signal.signal(s, signal.SIG_IGN)  # the teardown runs once, uninterrupted
            cp.stop()
            current = read_state(state)
            if current is not None and current.get("pid") == os.getpid():
                state.unlink(missing_ok=True)
    except Stopped as e:
        log.info("controlplane.stopped signal=%s", e)
        return EXIT_OK
    except ControlPlaneError as e:
        log.error("controlplane.failed error=%s", e)
        return EXIT_FAIL


def _detach(args: argparse.Namespace, state: Path) -> int:
    """Run ``up --supervise`` in its own session; return its ready line (or its failure)."""
    logfile = state.with_suffix(".log")
    state.parent.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "lab",
        "controlplane",
        "up",
        "--supervise",
        f"--state={state}",
        f"--node-monitor-grace-period={args.node_monitor_grace_period}",
        f"--ready-timeout={args.ready_timeout}",
        f"--log-level={args.log_level}",
    ]
    if args.kubeconfig is not None:
        argv.append(f"--kubeconfig={args.kubeconfig.resolve()}")
    with open(logfile, "ab") as err:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
            cwd=Path(__file__).resolve().parents[2],
            text=True,
        )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(READY_PREFIX):
            print(line.rstrip("\n"), flush=True)
            log.info("controlplane.detached pid=%d log=%s", proc.pid, logfile)
            return EXIT_OK
    code = proc.wait()
    print(f"controlplane: up failed (exit {code}); its log {logfile}:", file=sys.stderr)
    lines = logfile.read_text(errors="replace").splitlines()[-20:] if logfile.exists() else []
    print("\n".join(lines), file=sys.stderr)
    return EXIT_FAIL


def _wait_gone(pids: list[int], timeout: float, what: str, interval: float = 0.05) -> None:
    """Until none of ``pids`` is alive, at most ``timeout`` seconds; what is still alive then is the
    caller's to handle (kill it, or report it as left), so the timeout is no error here."""
    with contextlib.suppress(WaitTimeout):
        wait_for(lambda: not any(_alive(p) for p in pids), max(0.0, timeout), what, interval=interval)


def down(args: argparse.Namespace) -> int:
    state = args.state.resolve()
    info = read_state(state)
    if info is None:
        print(f"controlplane.down state={state} running=none", flush=True)
        cleanup_stale()
        return EXIT_OK
    pid = int(info.get("pid", 0))
    deadline = time.monotonic() + args.timeout
    if pid and _alive(pid) and _is_supervisor(pid):
        os.kill(pid, signal.SIGTERM)
        _wait_gone([pid], deadline - time.monotonic(), "the supervisor to exit after SIGTERM", 0.1)
        if _alive(pid):
            log.warning("controlplane.down_kill pid=%d reason=%r", pid, "no exit after SIGTERM")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait_gone([pid], deadline + 5 - time.monotonic(), "the supervisor to exit after SIGKILL")
    # A supervisor killed with -9 leaves its components (PR_SET_PDEATHSIG stops them, SIGTERM: they may
    # still be shutting down) and its directories: the groups are killed, the directories removed.
    for name, p in dict(info.get("pids", {})).items():
        if _alive(int(p)) and _is_component(int(p), name):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(p), signal.SIGKILL)
            log.info("controlplane.down_killed component=%s pgid=%s", name, p)
    cleanup_stale()
    _wait_gone([int(p) for p in dict(info.get("pids", {})).values()], 5, "the components to exit")
    left = [f"{name}={p}" for name, p in dict(info.get("pids", {})).items() if _alive(int(p)) and p != pid]
    left += [d for d in (info.get("run_dir"), info.get("data_dir")) if d and Path(d).exists()]
    state.unlink(missing_ok=True)
    if left:
        print(f"controlplane.down state={state} left={','.join(str(x) for x in left)}", flush=True)
        return EXIT_FAIL
    print(f"controlplane.down state={state} stopped pid={pid}", flush=True)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    setup_logging(args.log_level, fmt=args.log_format)
    if args.command == "up":
        return up(args)
    return down(args)
