"""A list-then-watch cache of one kind of object (what the lab kubelet and its Deployment loop read from),
relisting on 410 Gone and retrying with backoff on any API failure, forever."""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio

from gwkit.backoff import backoff
from gwkit.kube import Gone, KubeClient, KubeError, Obj
from gwkit.kube.client import Resource

log = logging.getLogger(__name__)

Key = tuple[str, str]


def key_of(obj: Obj) -> Key:
    md = obj.get("metadata") or {}
    return (str(md.get("namespace") or ""), str(md.get("name")))


class Cache:
    def __init__(
        self,
        kube: KubeClient,
        res: Resource,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        on_change: Callable[[Obj | None, Obj | None], None] | None = None,
    ) -> None:
        self.kube = kube
        self.res = res
        self.field_selector = field_selector
        self.label_selector = label_selector
        self.items: dict[Key, Obj] = {}
        self.synced = anyio.Event()
        self._changed = anyio.Event()
        self._on_change = on_change

    def get(self, namespace: str, name: str) -> Obj | None:
        return self.items.get((namespace, name))

    def values(self) -> list[Obj]:
        return list(self.items.values())

    async def changed(self) -> None:
        """Until the next change after this call."""
        await self._changed.wait()

    def _notify(self, old: Obj | None, new: Obj | None) -> None:
        ev, self._changed = self._changed, anyio.Event()
        ev.set()
        if self._on_change is not None:
            self._on_change(old, new)

    def _replace(self, items: list[Obj]) -> None:
        fresh = {key_of(o): o for o in items}
        for k in set(self.items) - set(fresh):
            self._notify(self.items.pop(k), None)
        for k, o in fresh.items():
            old = self.items.get(k)
            if old is None or old.get("metadata", {}).get("resourceVersion") != o["metadata"].get(
                "resourceVersion"
            ):
                self.items[k] = o
                self._notify(old, o)

    async def run(self) -> None:
        failures = 0
        # The informer's list-and-watch loop (a daemon's main loop, relisting with a back-off forever as
        # a real informer does; allowed in tests/unit/test_no_polling_loops.py).
        while True:
            try:
                items, rv = await self.kube.list(
                    self.res, field_selector=self.field_selector, label_selector=self.label_selector
                )
                self._replace(items)
                self.synced.set()
                failures = 0
                async for ev in self.kube.watch(
                    self.res,
                    resource_version=rv,
                    field_selector=self.field_selector,
                    label_selector=self.label_selector,
                    timeout_seconds=120,
                ):
                    if ev.type == "BOOKMARK":
                        continue
                    k = key_of(ev.object)
                    old = self.items.get(k)
                    if ev.type == "DELETED":
                        self.items.pop(k, None)
                        self._notify(old, None)
                    else:
                        self.items[k] = ev.object
                        self._notify(old, ev.object)
            except Gone:
                continue
            except KubeError as exc:
                failures += 1
                if failures in (1, 5) or failures % 30 == 0:
                    log.warning(
                        "kubelet.watch_failed resource=%s failures=%d error=%r", self.res, failures, str(exc)
                    )
                await anyio.sleep(backoff(failures, base=0.2, cap=5.0))
