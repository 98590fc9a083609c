"""Test tiers and the lab fixtures.

* tests/unit: pure functions; they may read the repository's files and write tmp_path, but start no process
  and open no network connection (enforced while a unit test runs: ``_record_commands``).
* tests/component: shells against fakes, socketpairs, lab.kubeapi (a real HTTPS Kubernetes API emulator)
  with the controller and agents as real processes.
* tests/integration: marked ``lab``: root, network namespaces, live charon / wireguard-go / iptables /
  conntrack. They never skip silently: when the machine cannot run them the session FAILS, unless the run
  opts out explicitly with ``VPNGW_SKIP_LAB=1`` (then they are reported as skipped, by name). The summary
  says how many real-daemon tests ran.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.kubelet import cleanup_stale as cleanup_stale_kubelet
from lab.openstack.process import cleanup_stale as cleanup_stale_openstack
from lab.world import Lab, cleanup_stale
from tests.commands import declared, started

pytest_plugins = ("lab.openstack.fixtures", "lab.controlplane.fixtures")

REQUIRED_TOOLS = ("ip", "iptables", "iptables-restore", "conntrack", "swanctl", "wireguard-go", "wg", "ping")
_lab_outcomes: dict[str, int] = {"passed": 0, "failed": 0, "skipped": 0}


HOST_SYSCTLS = ("net/ipv4/ip_forward", "net/ipv4/conf/all/rp_filter", "net/ipv4/conf/default/rp_filter")


def _host_sysctls() -> dict[str, str]:
    return {k: (Path("/proc/sys") / k).read_text().strip() for k in HOST_SYSCTLS}


@pytest.fixture(autouse=True, scope="session")
def host_sysctls_untouched() -> Iterator[None]:
    """The machine's own forwarding settings are not the tests' to change: a test that drove init-nat's
    Gateway from outside a namespace without the namespace's sysctls would write the host's (and a host
    that forwards hides the very bug a fresh one shows: init-nat not making its namespace forward)."""
    before = _host_sysctls()
    yield
    after = _host_sysctls()
    assert after == before, f"the tests changed the host's sysctls: {before} -> {after}"


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
        cleanup_stale_openstack()  # ... and its MariaDB/Neutron run directories
        cleanup_stale_kubelet(containers=False)  # ... and its lab kubelets' pods (mounts, directories)


_commands_run: dict[str, str] = {}
"""Every command this session started (name -> one argv that started it), for the install-drift check."""


UNIT = Path(__file__).parent / "unit"
_NO_PROCESSES = (
    "subprocess.Popen",
    "os.system",
    "os.posix_spawn",
    "os.spawn",
    "os.exec",
    "os.fork",
    "os.forkpty",
)
_NO_NETWORK = ("socket.connect", "socket.bind")
_in_unit_test: dict[int, str] = {}
"""The unit test running now: its thread's id -> its node id (the tier's rules apply in that thread; other
threads belong to fixtures of other tiers, which may run in the same session)."""


def _record_commands(event: str, args: tuple[Any, ...]) -> None:
    unit_test = _in_unit_test.get(threading.get_ident()) if _in_unit_test else None
    if unit_test is not None and (event in _NO_PROCESSES or event in _NO_NETWORK):
        raise RuntimeError(
            f"{unit_test}: a unit test starts no process and opens no network connection "
            f"({event} {args[:2]!r}); it belongs in tests/component"
        )
    if event != "subprocess.Popen":
        return
    argv = args[1]
    words = [os.fsdecode(a) for a in ([argv] if isinstance(argv, str | bytes | os.PathLike) else argv)]
    if len(words) == 1 and " " in words[0]:  # shell=True
        words = ["sh"]
    for name in started(words):
        _commands_run.setdefault(name, " ".join(words)[:200])


sys.addaudithook(_record_commands)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """The unit tier's rules hold while a unit test runs (setup, call and teardown)."""
    if item.path.is_relative_to(UNIT):
        _in_unit_test[threading.get_ident()] = item.nodeid
    try:
        return (yield)
    finally:
        _in_unit_test.clear()


_undeclared_of_workers: dict[str, str] = {}
"""Under pytest-xdist (``make test`` runs workers): what each worker started but tests/commands.py does not
declare, sent back to the controlling process (a worker's exit status and terminal are not the run's)."""


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:  # pytest-xdist's hook, in the controlling process
    _undeclared_of_workers.update(getattr(node, "workeroutput", {}).get("undeclared_commands", {}))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    undeclared = {n: argv for n, argv in _commands_run.items() if n not in declared()}
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: the controlling process reports it
        workeroutput["undeclared_commands"] = undeclared
        return
    undeclared.update(_undeclared_of_workers)
    if undeclared:
        lines = "\n".join(f"  {n}: {argv}" for n, argv in sorted(undeclared.items()))
        session.config.get_terminal_writer().line(
            "commands started by this session but not declared in tests/commands.py (a fresh machine or "
            f"the gateway image may lack them; declare each, and install it):\n{lines}",
            red=True,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
