"""Client contracts that run against the API emulator (tests/component) and the real kube-apiserver
(tests/integration): the same function, so a difference between the two shows as one test failing."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import anyio

from gwkit.kube.client import NAMESPACES, SECRETS, KubeClient
from gwkit.kube.config import from_kubeconfig
from gwkit.kube.errors import Conflict

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
