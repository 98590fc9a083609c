"""The project's Kubernetes client (gwkit.kube) against the real kube-apiserver (lab.controlplane): the
contracts of tests/kube_contract.py, which the API emulator passes too (tests/component)."""

from __future__ import annotations

import anyio
import pytest

from lab.controlplane import ControlPlane
from tests.kube_contract import a_stale_finalizer_write_is_requeued, metadata_watch_sees_a_new_secret

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


def test_a_stale_finalizer_write_is_requeued(controlplane: ControlPlane) -> None:
    """Found here: the finalizer was a JSON patch with a ``test`` of the resourceVersion, whose failure the
    real server answers with a bare 422 the controller could not tell from any other, so a stale read
    was an error with backoff instead of a requeue. The CRDs stay installed (other tests install them the
    same way, server-side)."""
    try:
        anyio.run(a_stale_finalizer_write_is_requeued, controlplane.kubeconfig, "t-finalizer")
    finally:
        controlplane.kubectl("delete", "namespace", "t-finalizer", "--wait=false", check=False)
