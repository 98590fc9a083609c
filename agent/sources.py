"""Where the agent's inputs come from: the plan file and the Secret volumes (shared by both backends).

The plan is a ConfigMap volume. A kubelet updates it by writing a new timestamped directory and swapping
the ``..data`` symlink; tests and humans replace it by atomic rename or edit it in place. All three are
noticed the same way: every ``poll_interval`` the file is ``stat``-ed through its symlinks (the resolved
path, inode, size and mtime form a *stamp*), and only a changed stamp makes us read and parse it. A new
plan is yielded only when its content hash differs from the last good one, so touching the file, or a
bad edit followed by a revert, yields nothing.

An unreadable or invalid plan is logged once per distinct content (``plan.rejected reason=...``) and kept
in ``last_error``; the last good plan keeps running. Secrets are read from ``<dir>/<name>/<key>`` on
demand; ``version`` is a salted digest, safe to log and compare, that changes with the value.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import secrets as _random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio

from agent.runtime import PlanSource, SecretError, Secrets
from gwplan import Plan, PlanError, SecretRef, dumps, loads, plan_hash

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class Stamp:
    """What identifies one version of a file without reading it."""

    target: str
    inode: int
    size: int
    mtime_ns: int


def stamp(path: Path) -> Stamp:
    """Raises OSError. Follows symlinks, so kubelet's ``..data`` swap changes ``target`` and ``inode``."""
    st = path.stat()
    return Stamp(os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)


def parse_plan(data: bytes) -> Plan:
    """The plan in ``data``; raises PlanError naming the field and the rule (pure). ``loads`` bounds its size
    (``gwplan.MAX_PLAN_BYTES``, stored and decompressed)."""
    return loads(data)


class FilePlanSource:
    """``runtime.PlanSource`` over a plan file. Iterate it again to restart from the current good plan
    (``__main__`` reads the first plan to choose the backend, then the backend iterates from the start)."""

    def __init__(self, path: Path, poll_interval: float = 0.5, *, sleep: Sleep = anyio.sleep) -> None:
        self.path = path
        self.poll_interval = poll_interval
        self._sleep = sleep
        self._stamp: Stamp | None = None
        self._current: Plan | None = None
        self._current_hash: str | None = None
        self._last_error: str | None = None
        self._rejected_digest: str | None = None

    @property
    def last_error(self) -> str | None:
        return self._last_error

    @property
    def current(self) -> Plan | None:
        """The last good plan, if any."""
        return self._current

    def poll(self) -> Plan | None:
        """Check the file once; return a plan only when a new good one appeared."""
        try:
            st = stamp(self.path)
        except OSError as exc:
            self._reject(f"cannot read {self.path}: {exc.strerror or exc}", digest=f"stat:{exc.errno}")
            self._stamp = None
            return None
        if st == self._stamp:
            return None
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            self._reject(f"cannot read {self.path}: {exc.strerror or exc}", digest=f"read:{exc.errno}")
            return None
        self._stamp = st
        digest = hashlib.sha256(data).hexdigest()
        try:
            plan = parse_plan(data)
        except PlanError as exc:
            self._reject(str(exc), digest=digest)
            return None
        if self._last_error is not None:
            log.info("plan.accepted after_error=yes")
        self._last_error = None
        self._rejected_digest = None
        h = plan_hash(plan)
        if h == self._current_hash:
            return None
        self._current, self._current_hash = plan, h
        log.info("plan.loaded hash=%s type=%s gateway=%s/%s", h[:19], plan.type, *_gw(plan))
        return plan

    def _reject(self, reason: str, *, digest: str) -> None:
        self._last_error = reason
        if digest != self._rejected_digest:  # once per distinct bad content, not once per poll
            self._rejected_digest = digest
            kept = self._current_hash[:19] if self._current_hash else "none"
            log.error("plan.rejected reason=%r kept=%s", reason, kept)

    async def _iterate(self) -> AsyncIterator[Plan]:
        if self._current is None:
            self.poll()
        if self._current is not None:
            yield self._current
        while True:
            await self._sleep(self.poll_interval)
            plan = self.poll()
            if plan is not None:
                yield plan

    def __aiter__(self) -> AsyncIterator[Plan]:
        return self._iterate()


COPY_GZIP_ABOVE = 1024 * 1024
"""A copy larger than this as JSON is written gzip-compressed (``gwplan.loads`` reads both): a plan
with thousands of peers is several MiB of JSON, and the copy lives in a memory emptyDir."""


def plan_copy(plan: Plan) -> bytes:
    """The bytes of ``plan``'s copy (pure): canonical JSON, compressed when large."""
    data = dumps(plan)
    return gzip.compress(data, mtime=0) if len(data) > COPY_GZIP_ABOVE else data


class CopiedPlans:
    """Passes plans through and writes each one to ``path`` (atomically, mode 0644) before the backend
    sees it: the exporter's copy in the read-only directory, so it mounts nothing else of the agent's
    (not the live directory with the Secrets). Only plans the backend accepts reach the exporter; a
    failed write is logged (once per reason) and never holds the backend up."""

    def __init__(self, inner: PlanSource, path: Path) -> None:
        self._inner = inner
        self.path = path
        self._error: str | None = None

    @property
    def last_error(self) -> str | None:
        return self._inner.last_error

    def _write(self, plan: Plan) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            tmp.write_bytes(plan_copy(plan))
            tmp.chmod(0o644)
            tmp.replace(self.path)
        except OSError as exc:
            if str(exc) != self._error:
                log.error("plan.copy_failed path=%s error=%r", self.path, str(exc))
            self._error = str(exc)
            return
        if self._error is not None:
            log.info("plan.copy_written path=%s after_error=yes", self.path)
        self._error = None

    async def _iterate(self) -> AsyncIterator[Plan]:
        async for plan in self._inner:
            self._write(plan)
            yield plan

    def __aiter__(self) -> AsyncIterator[Plan]:
        return self._iterate()


def _gw(plan: Plan) -> tuple[str, str]:
    return plan.gateway.namespace, plan.gateway.name


_SALT = _random.token_bytes(16)  # per process: versions are for change detection, not a guessable hash


class FileSecrets:
    """``runtime.Secrets`` over Secret volumes: ``<dir>/<name>/<key>``, read on every call.

    Values are returned byte-exact (a trailing newline is part of the key, as in Kubernetes); an empty
    file is an error. Error messages name the Secret and key, never the value.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def read(self, ref: SecretRef) -> bytes:
        _check_ref(ref)
        try:
            value = ref.path(self.directory).read_bytes()
        except FileNotFoundError:
            raise SecretError(f"secret {ref.name} key {ref.key}: not mounted") from None
        except OSError as exc:
            raise SecretError(f"secret {ref.name} key {ref.key}: {exc.strerror or 'unreadable'}") from None
        if not value:
            raise SecretError(f"secret {ref.name} key {ref.key}: empty")
        return value

    def version(self, ref: SecretRef) -> str:
        return "v" + hashlib.sha256(_SALT + self.read(ref)).hexdigest()[:16]


def _check_ref(ref: SecretRef) -> None:
    for part, what in ((ref.name, "name"), (ref.key, "key")):
        if not part or "/" in part or part in (".", ".."):
            raise SecretError(f"secret {ref.name!r} key {ref.key!r}: the {what} must be one path component")


_conforms_plans: PlanSource = FilePlanSource(Path("/nonexistent"))
_conforms_secrets: Secrets = FileSecrets(Path("/nonexistent"))
