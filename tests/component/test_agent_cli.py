"""``python -m agent`` as a user runs it: --help, bad usage (exit 2), and a clean stop on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

AGENT = [sys.executable, "-m", "agent"]


def test_help_documents_every_option() -> None:
    out = subprocess.run([*AGENT, "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    for opt in (
        "--plan",
        "--secrets-dir",
        "--vici-socket",
        "--status-file",
        "--health-listen",
        "--kube-status",
    ):
        assert opt in out.stdout
    assert "Exit codes" in out.stdout


def test_bad_usage_exits_2_naming_the_option(tmp_path: Path) -> None:
    missing = subprocess.run([*AGENT, "--plan", "x"], capture_output=True, text=True, timeout=30)
    assert missing.returncode == 2 and "--secrets-dir" in missing.stderr
    bad = subprocess.run(
        [*AGENT, "--plan", "x", "--secrets-dir", str(tmp_path), "--health-listen", "localhost"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "--health-listen" in bad.stderr and "HOST:PORT" in bad.stderr


def test_waits_live_for_a_valid_plan_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text("{not json")
    proc = subprocess.Popen(
        [*AGENT, "--plan", str(plan), "--secrets-dir", str(tmp_path), "--poll-interval", "0.05"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.0)
        assert proc.poll() is None, "an invalid first plan is reported, not fatal"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert "plan.rejected" in err and "not JSON" in err
