"""pytest fixtures of the real control plane (a pytest plugin: tests/conftest.py lists it in
``pytest_plugins``).

=================  ========  ================================================================================
fixture            scope     what
=================  ========  ================================================================================
``controlplane``   function  the session's one ``ControlPlane`` (etcd, kube-apiserver,
                             kube-controller-manager), started at the first test that asks for it,
                             stopped at the end of the session
=================  ========  ================================================================================

Tests using it must be marked ``@pytest.mark.lab`` (the fixture fails the test otherwise). Missing
binaries (scripts/setup_controlplane.sh not run) are an error, never a skip. Tests share the one
control plane: each works in namespaces (and nodes) of its own names.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lab.controlplane.cluster import ControlPlane, cleanup_stale


@pytest.fixture(scope="session")
def _controlplane_session() -> Iterator[ControlPlane]:
    cleanup_stale()  # the etcd data (tmpfs) and run directories of a SIGKILLed earlier session
    with ControlPlane() as cp:
        yield cp


@pytest.fixture
def controlplane(request: pytest.FixtureRequest, _controlplane_session: ControlPlane) -> ControlPlane:
    """The session's control plane (``url``, ``kubeconfig``, ``kubectl()``, ``client()``,
    ``service_account_kubeconfig()``, ``node_kubeconfig()``)."""
    if request.node.get_closest_marker("lab") is None:
        pytest.fail(f"{request.node.nodeid} uses the real control plane: mark it @pytest.mark.lab")
    return _controlplane_session
