"""Client contracts that run against the API emulator (tests/component) and the real kube-apiserver
(tests/integration): the same function, so a difference between the two shows as one test failing."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import anyio
import pytest

from controller import execute
from controller.api.crds import crds
from controller.execute import Requeue
from controller.names import FINALIZER, key_of
from gwkit.kube.client import NAMESPACES, SECRETS, VPNGATEWAYS, KubeClient
from gwkit.kube.config import from_kubeconfig
from gwkit.kube.errors import Conflict
from tests.examples import example_docs
from tests.helpers import create_when_served

SELECTOR = "vpn.bnerd.net/gateway-secret=true"


async def metadata_watch_sees_a_new_secret(kubeconfig: Path, namespace: str) -> dict[str, Any]:
    """The controller's Secret informer, in short: a metadata-only list of the opted-in Secrets, one
    created after it, and the metadata-only watch from the list's version: the event it returns."""
    async with KubeClient(from_kubeconfig(kubeconfig)) as kube:
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        with contextlib.suppress(Conflict):  # already there
            await kube.create(NAMESPACES, ns)
        items, rv = await kube.list(SECRETS, namespace, label_selector=SELECTOR, metadata_only=True)
        assert items == []
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "psk", "namespace": namespace, "labels": {SELECTOR.split("=")[0]: "true"}},
            "stringData": {"psk": "not-a-real-key"},
        }
        await kube.create(SECRETS, secret, namespace)
        events = []
        with anyio.move_on_after(10):
            async for ev in kube.watch(
                SECRETS,
                namespace,
                resource_version=rv,
                label_selector=SELECTOR,
                timeout_seconds=5,
                metadata_only=True,
            ):
                if ev.type != "BOOKMARK":
                    events.append(ev)
                    break
        assert events, "the metadata-only watch delivered no event"
        assert events[0].type == "ADDED"
        return dict(events[0].object)


CRDS_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


async def _with_crds(kube: KubeClient) -> None:
    """Our CRDs installed (idempotent; their endpoints serve a moment after: the caller retries a 404)."""
    for crd in crds():
        with contextlib.suppress(Conflict):
            await kube.request("POST", CRDS_PATH, body=crd)


async def a_stale_finalizer_write_is_requeued(kubeconfig: Path, namespace: str) -> None:
    """The controller adds and removes its finalizer on the version of the CR it read: when the CR moved
    on meanwhile the write must fail as a Requeue (decide again), never as an error nor a blind write."""
    async with KubeClient(from_kubeconfig(kubeconfig)) as kube:
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        with contextlib.suppress(Conflict):
            await kube.create(NAMESPACES, ns)
        await _with_crds(kube)
        created = await create_when_served(kube, VPNGATEWAYS, example_docs("wireguard.yaml")[0], namespace)
        key = key_of(created)
        name = key.name

        async def moved() -> None:
            await kube.patch(
                VPNGATEWAYS, name, {"metadata": {"labels": {"touched": str(anyio.current_time())}}}, namespace
            )

        await moved()
        with pytest.raises(Requeue):
            await execute.add_finalizer(kube, key, created)
        fresh = await kube.get(VPNGATEWAYS, name, namespace)
        await execute.add_finalizer(kube, key, fresh)
        fresh = await kube.get(VPNGATEWAYS, name, namespace)
        assert FINALIZER in fresh["metadata"]["finalizers"]
        await moved()
        with pytest.raises(Requeue):
            await execute.remove_finalizer(kube, key, fresh)
        await execute.remove_finalizer(kube, key, await kube.get(VPNGATEWAYS, name, namespace))
        after = await kube.get(VPNGATEWAYS, name, namespace)
        assert FINALIZER not in (after["metadata"].get("finalizers") or [])
        await kube.delete(VPNGATEWAYS, name, namespace)
