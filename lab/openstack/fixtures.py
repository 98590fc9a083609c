"""pytest fixtures of the OpenStack lab (a pytest plugin: ``pytest_plugins = ("lab.openstack.fixtures",)``).

=====================  ========  ==========================================================================
fixture                scope     what
=====================  ========  ==========================================================================
``openstack_neutron``  session   the real Neutron (``Neutron``), started once with the cloud seeded
``openstack_cloud``    function  the topology (``Cloud``); after the test Neutron is brought back if a
                                 test stopped it, and swept back to the baseline (``Baseline.sweep``)
``openstack_nova``     function  a fresh Nova os-interface EMULATOR (``NovaEmulator``), the cloud's
                                 nodes declared as servers, calling Neutron directly
``neutron_proxy``      function  a ``FaultProxy`` in front of Neutron (Neutron-style error bodies)
``nova_proxy``         function  a ``FaultProxy`` in front of the Nova emulator (Nova-style error bodies)
``openstack_lab``      function  all of the above as one ``OpenStackLab``; ``lab.connect()`` gives an
                                 openstacksdk Connection whose network AND compute calls go through the
                                 proxies
=====================  ========  ==========================================================================

Tests using them must be marked ``@pytest.mark.lab`` (the fixtures fail the test otherwise): they start
real daemons. Missing set-up (``scripts/setup_openstack.sh``) is an error, never a skip.

The session's Neutron is shared even when a module imports these fixtures and conftest loads the plugin
too (two fixture definitions, one Neutron): ``acquire_session``/``release_session`` count users.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openstack.connection
import pytest

from lab.openstack.cloud import Baseline, Cloud, cloud_seed, declare_nodes
from lab.openstack.neutron import Neutron, start_neutron
from lab.openstack.nova import NovaEmulator
from lab.openstack.proxy import FaultProxy
from lab.openstack.sdk import connect


@dataclass
class SessionLab:
    """The session-wide part: one Neutron, the cloud in it, the baseline to sweep back to."""

    neutron: Neutron
    cloud: Cloud
    baseline: Baseline
    users: int = 0


_session: SessionLab | None = None
_session_lock = threading.Lock()


def acquire_session() -> SessionLab:
    """The session's Neutron and cloud, started on first use (``release_session`` when done)."""
    global _session
    with _session_lock:
        if _session is None:
            neutron = start_neutron(seed=cloud_seed())
            try:
                assert neutron.seed_data is not None
                cloud = Cloud.from_dict(neutron.seed_data["cloud"])
                _session = SessionLab(neutron, cloud, Baseline.capture(neutron.endpoint))
            except BaseException:
                neutron.close()
                raise
        _session.users += 1
        return _session


def release_session() -> None:
    global _session
    with _session_lock:
        if _session is None:
            return
        _session.users -= 1
        if _session.users <= 0:
            _session.neutron.close()
            _session = None


def _require_lab_marker(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("lab") is None:
        pytest.fail(f"{request.node.nodeid} uses the OpenStack lab (real Neutron): mark it @pytest.mark.lab")


@pytest.fixture(scope="session")
def _openstack_session() -> Iterator[SessionLab]:
    lab = acquire_session()
    try:
        yield lab
    finally:
        release_session()


@pytest.fixture(scope="session")
def openstack_neutron(_openstack_session: SessionLab) -> Neutron:
    """The session's real Neutron (``Neutron``: ``endpoint``, ``connect()``, ``stop()``/``start()``)."""
    return _openstack_session.neutron


@pytest.fixture
def openstack_cloud(request: pytest.FixtureRequest, _openstack_session: SessionLab) -> Iterator[Cloud]:
    """The cloud topology; after the test Neutron is running again and back at the baseline."""
    _require_lab_marker(request)
    neutron = _openstack_session.neutron
    if not neutron.running:
        neutron.start()  # a previous test's teardown could not (it failed before its restart)
    try:
        yield _openstack_session.cloud
    finally:
        if not neutron.running:
            neutron.start()
        _openstack_session.baseline.sweep(neutron.endpoint)


@pytest.fixture
def openstack_nova(openstack_neutron: Neutron, openstack_cloud: Cloud) -> Iterator[NovaEmulator]:
    """A fresh Nova os-interface EMULATOR with the cloud's nodes declared as servers."""
    with NovaEmulator(openstack_neutron.endpoint) as nova:
        declare_nodes(nova, openstack_cloud)
        yield nova


@pytest.fixture
def neutron_proxy(request: pytest.FixtureRequest, openstack_neutron: Neutron) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of the session's Neutron (rules and log fresh per test)."""
    _require_lab_marker(request)
    with FaultProxy(openstack_neutron.endpoint, error_style="neutron", name="neutron") as proxy:
        yield proxy


@pytest.fixture
def nova_proxy(openstack_nova: NovaEmulator) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of this test's Nova emulator."""
    with FaultProxy(openstack_nova.url, error_style="nova", name="nova") as proxy:
        yield proxy


@dataclass
class OpenStackLab:
    """Everything a controller test needs: real Neutron, Nova emulator, a proxy in front of each."""

    neutron: Neutron
    cloud: Cloud
    nova: NovaEmulator
    neutron_proxy: FaultProxy
    nova_proxy: FaultProxy

    @property
    def network_url(self) -> str:
        """What clients should use as Neutron's endpoint (the proxy)."""
        return self.neutron_proxy.url

    @property
    def compute_url(self) -> str:
        """What clients should use as Nova's root (the proxy; the SDK's endpoint is this + ``/v2.1``)."""
        return self.nova_proxy.url

    def connect(self, *, direct: bool = False, timeout: float | None = 30.0, **kwargs: Any) -> Any:
        """An openstacksdk Connection: network and compute through the proxies (``direct``: not)."""
        conn: openstack.connection.Connection = connect(
            self.neutron.endpoint if direct else self.network_url,
            compute=self.nova.url if direct else self.compute_url,
            timeout=timeout,
            **kwargs,
        )
        return conn

    def clear_faults(self) -> None:
        self.neutron_proxy.clear()
        self.nova_proxy.clear()


@pytest.fixture
def openstack_lab(
    openstack_neutron: Neutron,
    openstack_cloud: Cloud,
    openstack_nova: NovaEmulator,
    neutron_proxy: FaultProxy,
    nova_proxy: FaultProxy,
) -> OpenStackLab:
    """The whole OpenStack lab for one test (see ``OpenStackLab``)."""
    return OpenStackLab(openstack_neutron, openstack_cloud, openstack_nova, neutron_proxy, nova_proxy)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "lab: needs root and real daemons (here: Neutron, MariaDB)")
