"""List-then-watch caches of API objects (informers), one per resource kind the controller reads.

Each ``Informer`` lists its objects, then watches from the list's resourceVersion, with bookmarks so that
a quiet stream still moves its resourceVersion forward. A broken stream is re-watched from the last
version seen; a 410 Gone (the server compacted past it) relists, and the difference between the old
cache and the new list is reported as changes, so a handler never misses a deletion. Transport failures
back off (capped) and retry forever: an API server that is away for a minute is waited for, not fatal.

The controller never reads the API directly for decisions: reconciles read these caches, and every
change calls ``on_change(old, new)`` (either may be None), which only enqueues keys.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import anyio

from gwkit.backoff import backoff
from gwkit.kube import Gone, KubeClient, KubeError, NotFound, Obj, Resource

log = logging.getLogger(__name__)

ChangeHandler = Callable[[Obj | None, Obj | None], None]
ObjKey = tuple[str, str]


def metadata_only(obj: Obj) -> Obj:
    """``obj`` without its content: what the controller keeps of a Secret (it needs the name and labels,
    never the values)."""
    return {k: obj[k] for k in ("apiVersion", "kind", "metadata") if k in obj}


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def lean(obj: Obj) -> Obj:
    """``obj`` without what the controller never reads and each copy would hold: ``managedFields``
    (often larger than the spec) and kubectl's last-applied copy of the whole object."""
    md = obj.get("metadata")
    if not isinstance(md, Mapping) or (
        "managedFields" not in md and LAST_APPLIED not in (md.get("annotations") or {})
    ):
        return obj
    md = {k: v for k, v in md.items() if k != "managedFields"}
    annotations = md.get("annotations")
    if isinstance(annotations, Mapping) and LAST_APPLIED in annotations:
        md["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    return {**obj, "metadata": md}


def obj_key(obj: Mapping[str, Any]) -> ObjKey:
    md = obj.get("metadata") or {}
    return (str(md.get("namespace") or ""), str(md.get("name")))


class Informer:
    def __init__(
        self,
        kube: KubeClient,
        res: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        on_change: ChangeHandler | None = None,
        watch_seconds: tuple[int, int] = (240, 480),
        retry_cap: float = 5.0,
        on_error: Callable[[Resource, KubeError], None] | None = None,
        transform: Callable[[Obj], Obj] | None = None,
        metadata_only: bool = False,
        on_relist: Callable[[Resource], None] | None = None,
    ) -> None:
        self.kube = kube
        self.res = res
        self.namespace = namespace
        self.label_selector = label_selector
        self.on_change = on_change or (lambda old, new: None)
        self.on_error = on_error or (lambda res, exc: None)
        self.watch_seconds = watch_seconds
        self.retry_cap = retry_cap
        self.transform = transform or (lambda obj: obj)
        """Applied to every object before it is cached (``metadata_only`` keeps no Secret data)."""
        self.on_relist = on_relist or (lambda res: None)
        """Told of every list after the first (a 410 Gone, a resource not served): the relists metric."""
        self.metadata_only = metadata_only
        """Ask the server for the objects' metadata only (a Secret's values never cross the wire)."""
        self.last_error: str | None = None
        self.store: dict[ObjKey, Obj] = {}
        self.resource_version = ""
        self.synced = anyio.Event()
        self.relists = 0
        self.failures = 0
        self.served = False
        """The last list succeeded: the cache says what exists. False while the resource answers 404 (its
        CRD not installed, or not served yet: kube-apiserver answers 404 for custom resources until its
        CRD informer has synced), when an empty cache says nothing about what exists."""

    def get(self, namespace: str, name: str) -> Obj | None:
        return self.store.get((namespace, name))

    def items(self) -> Iterator[Obj]:
        return iter(list(self.store.values()))

    def _set(self, obj: Obj) -> None:
        obj = self.transform(obj)
        k = obj_key(obj)
        old = self.store.get(k)
        self.store[k] = obj
        self.on_change(old, obj)

    def _drop(self, obj: Obj) -> None:
        old = self.store.pop(obj_key(obj), None)
        self.on_change(old if old is not None else obj, None)

    async def _list(self) -> None:
        items, rv = await self.kube.list(
            self.res, self.namespace, label_selector=self.label_selector, metadata_only=self.metadata_only
        )
        fresh = {obj_key(o): o for o in items}
        for k in [k for k in self.store if k not in fresh]:
            self._drop(self.store[k])
        for k, o in fresh.items():
            old = self.store.get(k)
            if old is None or old.get("metadata", {}).get("resourceVersion") != o["metadata"].get(
                "resourceVersion"
            ):
                self._set(o)
        self.resource_version = rv
        if self.relists:
            self.on_relist(self.res)
        self.relists += 1
        self.last_error = None
        self.served = True
        self.synced.set()

    async def run(self) -> None:
        """Keep the cache current until cancelled."""
        need_list = True
        while True:
            try:
                if need_list:
                    await self._list()
                    need_list = False
                    self.failures = 0
                async for ev in self.kube.watch(
                    self.res,
                    self.namespace,
                    resource_version=self.resource_version,
                    label_selector=self.label_selector,
                    timeout_seconds=random.randint(*self.watch_seconds),  # noqa: S311 (spread, not secrecy)
                    metadata_only=self.metadata_only,
                ):
                    self.failures = 0
                    if ev.type == "BOOKMARK":
                        self.resource_version = ev.resource_version or self.resource_version
                        continue
                    if ev.type == "DELETED":
                        self._drop(ev.object)
                    else:
                        self._set(ev.object)
                    self.resource_version = ev.resource_version or self.resource_version
            except NotFound as exc:
                # The resource is not served (its CRD is not installed, e.g. no Multus yet): an empty cache,
                # looked at again every 30 s; writes of that kind fail and say so.
                if not self.synced.is_set() or self.failures == 0:
                    log.warning("informer.not_served resource=%s error=%r", self.res, str(exc))
                self.failures += 1
                self.served = False
                self.on_error(self.res, exc)
                self.synced.set()
                need_list = True
                await anyio.sleep(30.0)
            except Gone:
                log.info(
                    "informer.relist resource=%s reason=gone resource_version=%s",
                    self.res,
                    self.resource_version,
                )
                need_list = True
            except KubeError as exc:
                self.failures += 1
                self.last_error = str(exc)
                self.on_error(self.res, exc)
                delay = backoff(self.failures, base=0.2, cap=self.retry_cap)
                if self.failures in (1, 5) or self.failures % 50 == 0:
                    log.warning(
                        "informer.failed resource=%s failures=%d retry_in=%.1f error=%r",
                        self.res,
                        self.failures,
                        delay,
                        str(exc),
                    )
                await anyio.sleep(delay)
