"""Writes init-nat's status document (report.py) to a file: temp file + rename, only on change (I/O).

A status that cannot be written (the init container's plan directory is a read-only ConfigMap mount, a
full volume) never fails an apply: it is logged once per distinct error and tried again next time. A
read-only directory is what the init container has by default (its plan is the mounted ConfigMap; the
sidecar's is in the live directory): that is an info line, not a warning on every pod start.
"""

from __future__ import annotations

import errno
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from initnat import report

log = logging.getLogger("initnat")
_HINT = "--status-file names a writable place (in the pod: the live directory)"


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


@dataclass
class StatusFile:
    path: Path
    clock: Callable[[], float] = time.time
    last: bytes | None = field(default=None, repr=False)
    error: str | None = None
    writes: int = 0

    def write(self, doc: Mapping[str, Any]) -> None:
        content = report.render(doc)
        if content == self.last:
            return
        data = report.render({**doc, "updatedAt": _utc(self.clock())})
        try:
            _atomic_write(self.path, data)
        except OSError as exc:
            error = exc.strerror or str(exc)
            if error != self.error:
                level = logging.INFO if exc.errno == errno.EROFS else logging.WARNING
                log.log(level, "initnat.status_unwritten path=%s error=%r hint=%r", self.path, error, _HINT)
            self.error = error
            return
        self.error = None
        self.last = content
        self.writes += 1


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
