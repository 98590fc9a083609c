"""`make demo`, shortened: the whole pipeline on live daemons, as a user sees it.

controller render (CRs -> plan) -> init-nat (policy routing + NAT in a pod-like namespace with NIC2 named
ens7) -> agent (charon over VICI) -> exporter, with two kill -9s of charon that the agent must recover
from by itself, and an exposure reached through the tunnels from both remote sites.

Then the demo as a script runs it: a background job (SIGINT ignored on entry, as POSIX shells start
them) stopped by SIGINT to its process group or by SIGTERM, and a pod process dying under it.
"""

from __future__ import annotations

import io
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import netns
from lab.demo import run
from lab.world import cleanup_stale

pytestmark = pytest.mark.lab
REPO = Path(__file__).resolve().parents[2]
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (INFO|WARNING|ERROR) lab\.demo demo\.\S+")


def test_demo_recovers_every_tunnel_after_charon_is_killed() -> None:
    out = io.StringIO()
    assert run(duration=16, kill_every=6, out=out) == 0, out.getvalue()
    text = out.getvalue()
    assert len(re.findall(r"every tunnel re-established by the agent", text)) >= 2, text
    assert "reachable from: s1, s2" in text, text
    assert re.search(r'strongswan_tunnel_up\{tunnel="s1"\} 1', text), text
    assert re.search(r"s1 +Established +in= *[1-9]\d* out= *[1-9]\d*", text), "counters move in the table"
    assert "counters refresh every 1.5 s" in text
    assert "demo-only-psk" not in text
    prefix = re.search(r"demo: lab (\S+) up", text).group(1)  # type: ignore[union-attr]
    left = [ns for ns in netns.list_namespaces() if ns.startswith(prefix)]  # others' runs may be live
    assert not left, f"the demo left namespaces behind: {left}"


class Demo:
    """``python -m lab demo ARGS`` as a script's background job (``sh -c 'demo & wait'``) in a session of
    its own; ``lines`` reads its output as it comes. Killed (the whole session) if a test leaves early."""

    def __init__(self, *args: str, shell_ignores_sigint: bool = True) -> None:
        trap = 'trap "" INT; ' if shell_ignores_sigint else ""
        script = (
            f'{trap}"$0" -m lab demo "$@" & echo "demo-pid=$!"; wait $!; code=$?; echo "demo-exit=$code"; '
            'exit "$code"'
        )
        self.proc = subprocess.Popen(
            ["sh", "-c", script, sys.executable, *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the shell leads a new process group, as a script run by cron would
        )
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        self._buf = b""
        self.text = ""
        self.demo_pid = int(self.until(r"demo-pid=(\d+)", 10).group(1))

    def _lines(self, deadline: float) -> Iterator[str]:
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            if not self._sel.select(timeout=max(0.0, deadline - time.monotonic())):
                continue
            chunk = self.proc.stdout.read(65536) or b""
            if not chunk:
                return
            self._buf += chunk
            *done, self._buf = self._buf.split(b"\n")
            for raw in done:
                line = raw.decode(errors="replace") + "\n"
                self.text += line
                yield line

    def until(self, pattern: str, timeout: float) -> re.Match[str]:
        for _ in self._lines(time.monotonic() + timeout):
            if m := re.search(pattern, self.text, re.MULTILINE):
                return m
        raise AssertionError(f"no {pattern!r} within {timeout} s; output so far:\n{self.text}")

    def finish(self, timeout: float = 60) -> int:
        for _ in self._lines(time.monotonic() + timeout):
            pass
        return self.proc.wait(timeout=5)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        cleanup_stale()  # what a SIGKILLed demo left, as the next start would


def pod_pids(text: str) -> dict[str, int]:
    m = re.search(r"demo: pod running in \S+: (.*); logs in", text)
    assert m, text
    return {name: int(pid) for name, pid in re.findall(r"([\w-]+) pid (\d+)", m.group(1))}


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize(
    "sig, to_group",
    [
        pytest.param(signal.SIGINT, True, id="sigint-to-the-process-group-of-a-background-job"),
        pytest.param(signal.SIGTERM, False, id="sigterm-to-the-demo"),
    ],
)
def test_a_stop_signal_tears_everything_down_and_exits_128_plus_its_number(
    sig: signal.Signals, to_group: bool
) -> None:
    """The newcomer's script: the demo as a background job (SIGINT ignored on entry). A SIGINT to the
    group used to kill the agent and exporter while the demo went on printing the dead agent's
    "Established" and exited 0 on SIGTERM. It also shows the default run's counters moving."""
    demo = Demo()
    try:
        shell_ignored = int(
            Path(f"/proc/{demo.proc.pid}/status").read_text().split("SigIgn:")[1].split()[0], 16
        )
        assert shell_ignored & (1 << (signal.SIGINT - 1)), "the job must start with SIGINT ignored"
        demo.until(r"demo: pod running in", 60)
        # The default run (charon killed every 20 s): counters reach the table before the first kill.
        demo.until(r"s1 +Established +in= *[1-9]\d* out= *[1-9]\d*", 15)
        pids = pod_pids(demo.text)
        prefix = re.search(r"demo: lab (\S+) up", demo.text).group(1)  # type: ignore[union-attr]
        if to_group:
            os.killpg(demo.proc.pid, sig)
        else:
            os.kill(demo.demo_pid, sig)
        code = demo.finish()
    finally:
        demo.kill()
    text = demo.text
    assert f"demo: stopped by {sig.name}, tearing the lab down" in text, text
    assert f"demo-exit={128 + sig}" in text and code == 128 + sig, text
    assert f"; stopped by {sig.name}; exit status {128 + sig}" in text
    assert all(gone(pid) for pid in pids.values()), pids
    assert not [ns for ns in netns.list_namespaces() if ns.startswith(prefix)]
    assert any(LOG_LINE.match(line) for line in text.splitlines()), "demo.* log lines in the one format"


def test_a_pod_process_that_exits_fails_the_demo_loudly() -> None:
    """A dead agent's status file still says Established: the demo must notice the process instead."""
    demo = Demo("--kill-every", "0", shell_ignores_sigint=False)
    try:
        demo.until(r"demo: pod running in", 60)
        pids = pod_pids(demo.text)
        prefix = re.search(r"demo: lab (\S+) up", demo.text).group(1)  # type: ignore[union-attr]
        os.kill(pids["agent"], signal.SIGKILL)
        code = demo.finish(timeout=30)
    finally:
        demo.kill()
    text = demo.text
    assert f"demo: FAILED: agent (pid {pids['agent']}) was killed by SIGKILL" in text, text
    assert code == 1 and "demo-exit=1" in text
    assert re.search(
        rf"ERROR lab\.demo demo\.process_exited name='agent' pid={pids['agent']} returncode=-9", text
    )
    assert "demo: tearing the lab down" in text and "exit status 1" in text
    assert all(gone(pid) for pid in pids.values()), pids
    assert not [ns for ns in netns.list_namespaces() if ns.startswith(prefix)]
