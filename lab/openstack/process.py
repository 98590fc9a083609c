"""Processes and run directories of the OpenStack lab: daemons in their own process group, stopped whole.

Every daemon (mariadbd, the uWSGI master and its worker) is started in a new session, so its process group
id is its pid and ``killpg`` reaches the workers it forks. Stopping is SIGTERM to the group, a grace
period, then SIGKILL to whatever is left of the group.

Every run directory is ``<tmp>/vpngw-os-<owner pid>-<random>/`` and records, in ``pgids``, the process
groups started for it. A later run (``cleanup_stale``) kills the groups of directories whose owner is gone
and removes the directories: the leftovers of a SIGKILLed test session. When the daemon is started from
the main thread it also gets ``PR_SET_PDEATHSIG`` = SIGTERM, so it shuts down by itself the moment its
owner dies (not from other threads: the kernel sends the signal when the *thread* that forked exits).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from lab.wait import WaitTimeout, wait_for

log = logging.getLogger(__name__)

RUN_PREFIX = "vpngw-os-"
_RUN_DIR = re.compile(rf"^{RUN_PREFIX}(\d+)-[0-9a-z_]+$")
_PR_SET_PDEATHSIG = 1


class LabOpenStackError(RuntimeError):
    """The OpenStack lab could not be set up, started or stopped; the message says what and where."""


def make_run_dir(purpose: str, root: Path | None = None) -> Path:
    """A fresh run directory owned by this process (``cleanup_stale`` can tell when the owner is gone)."""
    safe = re.sub(r"[^0-9a-z_]", "_", purpose.lower())
    base = root if root is not None else Path(tempfile.gettempdir())
    path = Path(tempfile.mkdtemp(prefix=f"{RUN_PREFIX}{os.getpid()}-{safe}_", dir=base))
    (path / "owner").write_text(f"{os.getpid()}\n")
    return path


def _record_pgid(run_dir: Path, pgid: int) -> None:
    with open(run_dir / "pgids", "a") as f:
        f.write(f"{pgid}\n")


def _pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() == 1:  # the owner died between fork and prctl
        os._exit(1)


def spawn(
    argv: Sequence[str],
    *,
    run_dir: Path,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session (its own process group), output to ``log_path``, recorded in
    ``run_dir`` for stale cleanup."""
    preexec: Callable[[], None] | None = None
    if threading.current_thread() is threading.main_thread():
        preexec = _pdeathsig
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=preexec,  # only prctl between fork and exec: no locks taken
        )
    _record_pgid(run_dir, proc.pid)
    return proc


def group_alive(pgid: int) -> bool:
    """True while a process of group ``pgid`` exists that is not a zombie (PID 1 reaps orphans late)."""
    return bool(group_members(pgid))


def group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def stop_group(
    proc: subprocess.Popen[bytes] | None,
    *,
    grace: float = 10.0,
    what: str = "process",
    sig: signal.Signals = signal.SIGTERM,
) -> None:
    """``sig`` (SIGTERM) to the process group of ``proc``, wait up to ``grace`` seconds, then SIGKILL what
    is left.

    Safe to call twice and on a process that already exited."""
    if proc is None:
        return
    pgid = proc.pid
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGCONT)  # a stopped group cannot act on SIGTERM
        os.killpg(pgid, sig)
    deadline = time.monotonic() + grace
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    with contextlib.suppress(WaitTimeout):  # a group still alive after the grace gets SIGKILL below
        _wait_group_gone([pgid], max(0.0, deadline - time.monotonic()), what)
    if proc.poll() is None or group_alive(pgid):
        log.warning("lab.openstack.kill what=%s pgid=%d reason=%r", what, pgid, "SIGTERM grace expired")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        proc.wait(timeout=10)
        with contextlib.suppress(WaitTimeout):  # as before: SIGKILL sent, nothing more to do but go on
            _wait_group_gone([pgid], 5, what)


def _wait_group_gone(pgids: list[int], timeout: float, what: str) -> None:
    """Until none of ``pgids`` has a live member; :class:`WaitTimeout` after ``timeout`` seconds."""
    wait_for(
        lambda: not any(group_alive(p) for p in pgids),
        timeout,
        f"the process groups {pgids} of {what} to exit",
        interval=0.02,
    )


def _owner_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def cleanup_stale(root: Path | None = None) -> list[Path]:
    """Kill the process groups of run directories whose owner process is gone, remove the directories.

    Returns the directories removed. A live run's directories are left alone."""
    base = root if root is not None else Path(tempfile.gettempdir())
    removed = []
    try:
        entries = list(base.iterdir())
    except FileNotFoundError:
        return []
    for path in entries:
        m = _RUN_DIR.match(path.name)
        if not m or not path.is_dir() or _owner_alive(int(m.group(1))):
            continue
        pgids_file = path / "pgids"
        pgids = [int(x) for x in pgids_file.read_text().split()] if pgids_file.exists() else []
        for pgid in pgids:
            if group_alive(pgid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(WaitTimeout):  # as before: remove the directory anyway
            _wait_group_gone(pgids, 5, f"the stale run {path.name}")
        shutil.rmtree(path, ignore_errors=True)
        log.info("lab.openstack.stale_removed dir=%s groups=%d", path, len(pgids))
        removed.append(path)
    return removed


def processes_under(path: Path) -> list[int]:
    """Live (non-zombie) processes whose command line mentions ``path``: a leak check for tests."""
    needle = str(path).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if needle in cmdline and state != "Z":
            found.append(int(entry))
    return found
