"""lab.demo.StopSignals in a real process: SIGINT and SIGTERM are handled alike whatever disposition the
process inherited (a script's background job starts with SIGINT ignored), and only the first one
interrupts: later ones, during the teardown, are recorded. No root needed: no lab is built."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHILD = """
import os, signal, sys, time
from lab.demo import StopSignals, Stopped
s = StopSignals()
s.install()
try:
    print("ready", flush=True)  # inside the try: the signal may land before print returns
    time.sleep(30)
    print("not interrupted", flush=True)
except Stopped as exc:
    s.disarm()  # the teardown: more signals must not cut it short
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    print(f"stopped by {exc}; later {[signal.Signals(n).name for n in s.received[1:]]}", flush=True)
    sys.exit(128 + exc.signum)
"""


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as sh does for a background job


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_the_first_stop_signal_interrupts_later_ones_are_recorded(sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD], cwd=REPO, stdout=subprocess.PIPE, text=True, preexec_fn=_ignore_sigint
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        sig_ign = Path(f"/proc/{proc.pid}/status").read_text().split("SigIgn:")[1].split()[0]
        assert not int(sig_ign, 16) & (1 << (signal.SIGINT - 1)), "the inherited SIG_IGN is replaced"
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out == f"stopped by {sig.name}; later ['SIGINT', 'SIGTERM']\n"
    assert proc.returncode == 128 + sig
