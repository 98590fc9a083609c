"""The project's Kubernetes client (gwkit.kube) against the real kube-apiserver (lab.controlplane): the
contracts of tests/kube_contract.py, which the API emulator passes too (tests/component)."""

from __future__ import annotations

import anyio
import pytest

from lab.controlplane import ControlPlane
from tests.kube_contract import metadata_watch_sees_a_new_secret

pytestmark = pytest.mark.lab


def test_a_metadata_only_watch_sees_a_new_secret_without_its_data(controlplane: ControlPlane) -> None:
    """Found here: the watch asked with the list's Accept (PartialObjectMetadataList first) and the real
    server ended it at the first event, so the controller never saw a tenant's Secret opted in."""
    try:
        obj = anyio.run(metadata_watch_sees_a_new_secret, controlplane.kubeconfig, "t-metadata-watch")
    finally:
        controlplane.kubectl("delete", "namespace", "t-metadata-watch", "--wait=false", check=False)
    assert obj["kind"] == "PartialObjectMetadata" and obj["metadata"]["name"] == "psk"
    assert "data" not in obj and "stringData" not in obj
