"""Metadata-only lists and watches (the controller's opted-in Secrets) against the API emulator; the same
contract runs against the real kube-apiserver in tests/integration/test_real_kube_client.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from lab.kubeapi import KubeAPIThread
from tests.kube_contract import a_stale_finalizer_write_is_requeued, metadata_watch_sees_a_new_secret


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeAPIThread]:
    with KubeAPIThread(kubeconfig=tmp_path / "kubeconfig") as a:
        yield a


def test_a_metadata_only_watch_sees_a_new_secret_without_its_data(api: KubeAPIThread) -> None:
    obj = anyio.run(metadata_watch_sees_a_new_secret, api.kubeconfig, "tenant-a")
    assert obj["kind"] == "PartialObjectMetadata" and obj["metadata"]["name"] == "psk"
    assert "data" not in obj and "stringData" not in obj


def test_a_watch_negotiated_as_a_metadata_list_ends_without_its_events(api: KubeAPIThread) -> None:
    """The rule the emulator models from kube-apiserver (a watch's events are single objects; one that
    must be encoded as PartialObjectMetadataList ends the stream unsent): the Accept a list uses is
    wrong for a watch."""
    anyio.run(metadata_watch_sees_a_new_secret, api.kubeconfig, "tenant-b")  # a Secret exists now
    list_first = (
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,"
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
    )
    with httpx.Client(base_url=api.url, verify=str(api.ca_file), timeout=10) as c:
        headers = {"Authorization": f"Bearer {api.admin_token}"}
        for accept, events in (
            (list_first, 0),
            ("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1", 1),
        ):
            res = c.get(
                "/api/v1/namespaces/tenant-b/secrets",
                params={"watch": "1", "resourceVersion": "0", "timeoutSeconds": "2"},
                headers={**headers, "Accept": accept},
            )
            assert res.status_code == 200
            assert len([line for line in res.text.splitlines() if line.strip()]) == events, (accept, res.text)


def test_a_stale_finalizer_write_is_requeued(api: KubeAPIThread) -> None:
    anyio.run(a_stale_finalizer_write_is_requeued, api.kubeconfig, "tenant-c")
