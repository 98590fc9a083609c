"""How the gateway pod follows its plan: the status-agent watches the plan ConfigMap and the Secrets the
plan references through the API, and hands them to the pod's other containers as files.

Why: a kubelet refreshes ConfigMap and Secret volumes 60-90 s after a change, but a revoked grant must
reach the gateway's kernel within 2 s of the controller's write. And mounting one Secret volume per
referenced Secret would put the plan's Secret references into the pod spec, so adding a peer's PSK would
restart the pod. Instead::

    API: ConfigMap <gw> (plan.json)  ──watch──>  <live>/plan.json               (init-nat --watch, exporter,
    API: Secrets the plan names      ──watch──>  <live>/secrets/<name>/<key>     and this agent read these)
    mounted ConfigMap (kubelet)      ──at boot, and while the API never answered──> <live>/plan.json

``<live>`` is a memory emptyDir shared by the containers; its files are replaced atomically (temp file and
rename), as the consumers expect. Secret files are 0400, in 0700 directories; values never reach a log.
The mounted copy is the fallback at boot: copied at once when there is no live plan yet, and again when
the kubelet updates it, until the API has delivered the plan once (after that the API is ahead of it).
A deleted ConfigMap or Secret keeps its last content (as a kubelet's volume does); a Secret no longer
referenced by the plan is removed. API failures are retried with backoff, forever; the agent keeps
running on what it has.

What is taken, and what is not (the ConfigMap and Secrets are the API's, not the controller's alone):

* the plan ConfigMap (in the pod's own namespace, the operator's gateway namespace) holds exactly one
  plan key, ``data.plan.json`` or ``binaryData.plan.json`` (gzip), and nothing else: anything more (a
  second plan someone added in ``binaryData``, say) is never read, the last good plan stays, and the
  controller removes the extra keys at its next write;
* the Secrets are read in the gateway's own namespace (the plan's ``gateway.namespace``, the tenant's),
  and only those their owners opted in (``gwplan.SECRET_OPT_IN_LABEL``); a Secret that loses the label
  is removed from the live directory, as one the plan no longer references.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio

import gwplan
from agent.sources import stamp
from gwkit.backoff import backoff
from gwkit.kube import Gone, KubeClient, KubeError, Obj
from gwkit.kube.client import CONFIGMAPS, SECRETS, Resource

log = logging.getLogger(__name__)

PLAN_KEY = "plan.json"
_NAME_OK = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-.")


def plan_bytes(cm: Mapping[str, Any]) -> bytes | str:
    """The plan in a ConfigMap, or why there is none to take (pure): exactly one key, ``data.plan.json``
    or (gzip, large plans) ``binaryData.plan.json``, and no other."""
    data, binary = cm.get("data") or {}, cm.get("binaryData") or {}
    keys = [f"data.{k}" for k in sorted(data)] + [f"binaryData.{k}" for k in sorted(binary)]
    if keys == [f"binaryData.{PLAN_KEY}"]:
        try:
            return base64.b64decode(str(binary[PLAN_KEY]), validate=True)
        except ValueError:
            return f"binaryData.{PLAN_KEY} is not base64"
    if keys == [f"data.{PLAN_KEY}"] and isinstance(data[PLAN_KEY], str):
        return str(data[PLAN_KEY]).encode()
    if not keys:
        return f"no {PLAN_KEY}"
    return f"holds {', '.join(keys)}: exactly one {PLAN_KEY} in data or binaryData is the controller's"


def opted_in(secret: Mapping[str, Any]) -> bool:
    """Its owner meant it for gateways (``gwplan.SECRET_OPT_IN_LABEL``)."""
    return ((secret.get("metadata") or {}).get("labels") or {}).get(gwplan.SECRET_OPT_IN_LABEL) == "true"


def secret_files(secret: Mapping[str, Any]) -> dict[str, bytes]:
    """A Secret's keys and values (``data`` is base64; ``stringData`` never comes back from the API)."""
    out = {}
    for key, value in (secret.get("data") or {}).items():
        if not key or "/" in key or key in (".", ".."):
            continue
        try:
            out[str(key)] = base64.b64decode(str(value), validate=True)
        except ValueError:
            continue
    return out


def _atomic(path: Path, data: bytes, mode: int) -> bool:
    """Write ``data`` to ``path`` via a temp file and rename; False when it already holds it."""
    try:
        if path.read_bytes() == data:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


Sleep = Callable[[float], Awaitable[None]]


class PlanFollower:
    def __init__(
        self,
        kube: KubeClient,
        namespace: str,
        configmap: str,
        live_dir: Path,
        fallback: Path | None = None,
        *,
        poll_interval: float = 1.0,
        sleep: Sleep = anyio.sleep,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.configmap = configmap
        self.live_dir = live_dir
        self.fallback = fallback
        self.poll_interval = poll_interval
        self._sleep = sleep
        self.api_synced = False
        """The API has delivered the plan at least once (the mounted copy is no longer used)."""
        self.secrets_wanted: frozenset[str] = frozenset()
        self.secrets_namespace: str | None = None
        """Where the plan's Secrets are: the gateway's own namespace (the plan says which)."""
        self._secrets_changed = anyio.Event()
        self.writes = 0
        self.last_error: str | None = None

    @property
    def plan_path(self) -> Path:
        return self.live_dir / PLAN_KEY

    @property
    def secrets_dir(self) -> Path:
        return self.live_dir / "secrets"

    # --- the plan ---------------------------------------------------------------------------------

    def _take_plan(self, data: bytes, source: str) -> None:
        try:
            plan = gwplan.loads(data)
        except gwplan.PlanError as exc:
            # Written anyway: every consumer reports a bad plan and keeps its last good one.
            log.error("follow.plan_invalid source=%s error=%r", source, str(exc))
        else:
            wanted = frozenset(gwplan.secret_names(plan))
            if wanted != self.secrets_wanted or plan.gateway.namespace != self.secrets_namespace:
                self.secrets_wanted = wanted
                self.secrets_namespace = plan.gateway.namespace
                self._secrets_changed.set()
        if _atomic(self.plan_path, data, 0o644):
            self.writes += 1
            log.info(
                "follow.plan_written source=%s digest=%s bytes=%d",
                source,
                hashlib.sha256(data).hexdigest()[:16],
                len(data),
            )

    async def _watch(
        self,
        res: Resource,
        name: str,
        on: Callable[[Obj | None], None],
        what: str,
        namespace: str | None = None,
    ) -> None:
        """List-then-watch one object by name (``fieldSelector``: what a Role's resourceNames allows)."""
        selector = f"metadata.name={name}"
        ns = namespace or self.namespace
        failures = 0
        while True:
            try:
                items, rv = await self.kube.list(res, ns, field_selector=selector)
                on(items[0] if items else None)
                failures = 0
                self.last_error = None
                async for ev in self.kube.watch(res, ns, resource_version=rv, field_selector=selector):
                    if ev.type in ("ADDED", "MODIFIED"):
                        on(ev.object)
                    elif ev.type == "DELETED":
                        log.warning("follow.deleted %s=%s/%s kept=last", what, ns, name)
            except Gone:
                continue
            except KubeError as exc:
                failures += 1
                self.last_error = f"{what} {name}: {exc}"
                delay = backoff(failures, base=0.5, cap=10.0)
                if failures in (1, 5) or failures % 30 == 0:
                    log.warning(
                        "follow.failed %s=%s/%s failures=%d retry_in=%.1f error=%r",
                        what,
                        ns,
                        name,
                        failures,
                        delay,
                        str(exc),
                    )
                await self._sleep(delay)

    def _on_configmap(self, cm: Obj | None) -> None:
        if cm is None:
            return
        data = plan_bytes(cm)
        if isinstance(data, str):
            self.last_error = f"configmap {self.configmap}: {data} (the last good plan is kept)"
            log.error("follow.plan_refused configmap=%s/%s reason=%r", self.namespace, self.configmap, data)
            return
        self.api_synced = True
        self._take_plan(data, "api")

    async def _follow_fallback(self) -> None:
        """The mounted copy, until the API has answered once."""
        if self.fallback is None:
            return
        seen = None
        while not self.api_synced:
            try:
                st = stamp(self.fallback)
                if st != seen:
                    data = self.fallback.read_bytes()
                    seen = st
                    if not self.api_synced:
                        self._take_plan(data, "mounted")
            except OSError:
                pass
            await self._sleep(self.poll_interval)

    # --- secrets ----------------------------------------------------------------------------------

    def _on_secret(self, name: str) -> Callable[[Obj | None], None]:
        def on(secret: Obj | None) -> None:
            if secret is None:
                log.warning("follow.secret_missing secret=%s/%s", self.secrets_namespace, name)
                return
            d = self.secrets_dir / name
            if not opted_in(secret):
                label = f"{gwplan.SECRET_OPT_IN_LABEL}=true"
                self.last_error = f"secret {name}: not opted in for gateways (label {label}): not used"
                log.error(
                    "follow.secret_refused secret=%s/%s reason='not opted in'", self.secrets_namespace, name
                )
                with contextlib.suppress(OSError):
                    shutil.rmtree(d)
                return
            files = secret_files(secret)
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
            changed = [k for k, v in sorted(files.items()) if _atomic(d / k, v, 0o400)]
            for old in d.iterdir():
                if old.name not in files and not old.name.startswith("."):
                    old.unlink(missing_ok=True)
                    changed.append(old.name)
            if changed:
                self.writes += 1
                log.info("follow.secret_written secret=%s keys=%d changed=%d", name, len(files), len(changed))

        return on

    async def _follow_secrets(self) -> None:
        running: dict[tuple[str, str], anyio.CancelScope] = {}
        async with anyio.create_task_group() as tg:
            while True:
                changed = self._secrets_changed = anyio.Event()  # before reading: no change is missed
                ns = self.secrets_namespace
                wanted = {(ns, n) for n in self.secrets_wanted} if ns is not None else set()
                for key in sorted(set(running) - wanted):
                    running.pop(key).cancel()
                    with contextlib.suppress(OSError):
                        shutil.rmtree(self.secrets_dir / key[1])
                    log.info("follow.secret_dropped secret=%s/%s", *key)
                for key in sorted(wanted - set(running)):
                    namespace, name = key
                    if not set(name) <= _NAME_OK:
                        log.error("follow.secret_refused secret=%r reason='not a Secret name'", name)
                        continue
                    scope = anyio.CancelScope()
                    running[key] = scope

                    async def one(n: str = name, ns_: str = namespace, s: anyio.CancelScope = scope) -> None:
                        with s:
                            await self._watch(SECRETS, n, self._on_secret(n), "secret", ns_)

                    tg.start_soon(one)
                await changed.wait()

    async def run(self) -> None:
        """Until cancelled."""
        self.secrets_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._follow_fallback)
            tg.start_soon(self._follow_secrets)
            tg.start_soon(self._watch, CONFIGMAPS, self.configmap, self._on_configmap, "configmap")
