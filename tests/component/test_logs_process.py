"""The log format in a process of its own (tests/unit/test_logs.py has the rest)."""

from __future__ import annotations

import subprocess
import sys


def test_the_time_is_utc_whatever_the_time_zone() -> None:
    """A process in another zone (TZ=Asia/Kolkata, +05:30) still writes UTC with a Z."""
    code = (
        "import logging, time; from gwkit.logs import UtcFormatter; "
        "r = logging.LogRecord('x', 20, '', 0, 'm', None, None); r.created = 0.5; "
        "print(UtcFormatter().format(r))"
    )
    env = {"TZ": "Asia/Kolkata", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1970-01-01T00:00:00.500Z INFO x m"
