"""Plain HTTP JSON calls (http.client) for the lab's own plumbing: readiness checks, the Nova emulator's
calls to Neutron, fixtures that must see exact answers. Clients under test use openstacksdk instead."""

from __future__ import annotations

import http.client
import json
from typing import Any


class RestError(RuntimeError):
    """A lab-internal HTTP call failed: no answer (``status`` None) or an error status."""

    def __init__(self, method: str, path: str, status: int | None, body: Any) -> None:
        super().__init__(f"{method} {path}: {status if status is not None else 'no answer'} {body!r}"[:600])
        self.status = status
        self.body = body


def split_url(base: str) -> tuple[str, int]:
    host, _, port = base.removeprefix("http://").rstrip("/").partition(":")
    return host, int(port or 80)


def request_json(
    base: str,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> tuple[int, Any]:
    """``method path`` against ``base`` (``http://host:port``): (status, decoded JSON body or None).

    Raises RestError(status=None) when nothing answers (refused, reset, timed out)."""
    conn = http.client.HTTPConnection(*split_url(base), timeout=timeout)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        hdrs = {"Accept": "application/json", **(headers or {})}
        if payload is not None:
            hdrs["Content-Type"] = "application/json"
        conn.request(method, path, body=payload, headers=hdrs)
        resp = conn.getresponse()
        raw = resp.read()
    except (OSError, http.client.HTTPException) as e:
        raise RestError(method, path, None, str(e)) from e
    finally:
        conn.close()
    try:
        return resp.status, (json.loads(raw) if raw else None)
    except ValueError:
        return resp.status, raw.decode(errors="replace")


def call(base: str, method: str, path: str, body: Any = None, **kw: Any) -> Any:
    """``request_json`` that raises RestError on a status >= 400; returns the decoded body."""
    status, data = request_json(base, method, path, body, **kw)
    if status >= 400:
        raise RestError(method, path, status, data)
    return data


def http_status(base: str, path: str, timeout: float = 2.0) -> int | None:
    """The status of ``GET path`` (None when nothing answers)."""
    try:
        return request_json(base, "GET", path, timeout=timeout)[0]
    except RestError:
        return None
