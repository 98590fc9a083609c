"""Test tiers and the lab fixtures.

* tests/unit: pure functions, no I/O.
* tests/component: shells against fakes, socketpairs, kmock (a real HTTP Kubernetes API emulator).
* tests/integration: marked ``lab``: root, network namespaces, live charon / wireguard-go / iptables /
  conntrack. They never skip silently: when the machine cannot run them the session FAILS, unless the run
  opts out explicitly with ``VPNGW_SKIP_LAB=1`` (then they are reported as skipped, by name). The summary
  says how many real-daemon tests ran.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from lab.world import Lab, cleanup_stale

REQUIRED_TOOLS = ("ip", "iptables", "iptables-restore", "conntrack", "swanctl", "wireguard-go", "wg", "ping")
_lab_outcomes: dict[str, int] = {"passed": 0, "failed": 0, "skipped": 0}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # pyroute2's async API is asyncio-based


def _lab_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "not root"
    missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    if not os.path.exists("/usr/lib/ipsec/charon"):
        missing.append("/usr/lib/ipsec/charon")
    if missing:
        return f"missing {', '.join(missing)} (run scripts/setup.sh)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    why = _lab_unavailable()
    if why is None:
        return
    lab_items = [i for i in items if i.get_closest_marker("lab")]
    if not lab_items:
        return
    if os.environ.get("VPNGW_SKIP_LAB") == "1":
        for item in lab_items:
            item.add_marker(pytest.mark.skip(reason=f"VPNGW_SKIP_LAB=1 and {why}"))
        return
    raise pytest.UsageError(
        f"{len(lab_items)} lab tests need root and real daemons, but {why}. "
        "Run as root after scripts/setup.sh, or opt out explicitly with VPNGW_SKIP_LAB=1."
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.geteuid() == 0 and shutil.which("ip"):
        cleanup_stale()  # leftovers of a run that was SIGKILLed; a live run's namespaces are kept


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "lab" not in report.keywords:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _lab_outcomes[report.outcome] = _lab_outcomes.get(report.outcome, 0) + 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    o = _lab_outcomes
    terminalreporter.write_line(
        f"real-daemon (lab) tests: {o.get('passed', 0)} passed, {o.get('failed', 0)} failed, "
        f"{o.get('skipped', 0)} skipped"
    )


@pytest.fixture
def lab() -> Iterator[Lab]:
    """A fresh lab world (no daemons yet); torn down even when the test fails."""
    with Lab() as world:
        yield world


@pytest.fixture
def pod_lab() -> Iterator[Lab]:
    """A lab whose gateway has a pod-like eth0 default route and a NIC2 not named net1."""
    with Lab(pod_mode=True, nic2_name="ens7") as world:
        yield world
