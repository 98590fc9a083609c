"""Errors of the Kubernetes boundary: translated once, from an HTTP answer or a transport failure.

::

    KubeError                       talking to the API server failed
    ├── ApiError(code, reason)      the server answered with a Status (4xx/5xx)
    │   ├── NotFound        404
    │   ├── Conflict        409     a stale resourceVersion (or AlreadyExists: ``reason``)
    │   ├── Gone            410     a watch or list from a resourceVersion the server no longer has
    │   ├── Forbidden       403
    │   └── Invalid         422
    ├── Unreachable                 no answer (connection refused or reset, timeout, TLS)
    └── Unauthenticated             no credential to send (a token file unreadable, an exec plugin failed)

    ConfigError                     no usable cluster configuration (not a KubeError: nothing was sent)

``retryable`` says whether the same request can succeed later without changing it: 409, 429, 5xx and
no answer at all. Messages carry the server's own message (it names the object and the rule), never a
request body (which may hold a Secret).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class KubeError(Exception):
    """A Kubernetes API call failed."""

    retryable = True


class ConfigError(Exception):
    """No usable cluster configuration; the message says which file and which field."""


class Unauthenticated(KubeError):
    """No credential could be had for a request (the exec plugin failed, the token file is unreadable);
    the message is the ``ConfigError``'s. Retryable: a plugin's network or a rewritten file may be back."""


class Unreachable(KubeError):
    """No answer: the API server is down, unreachable, or too slow."""


class Fenced(KubeError):
    """A write the client's own guard refused before sending it (this replica no longer leads)."""


class ApiError(KubeError):
    def __init__(self, code: int, reason: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"HTTP {code} {reason}: {message}" if message else f"HTTP {code} {reason}")
        self.code = code
        self.reason = reason
        self.message = message
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:  # type: ignore[override]
        return self.code in (409, 429) or self.code >= 500


class NotFound(ApiError):
    pass


class Conflict(ApiError):
    @property
    def already_exists(self) -> bool:
        return self.reason == "AlreadyExists"


class Gone(ApiError):
    pass


class Forbidden(ApiError):
    pass


class Invalid(ApiError):
    pass


_BY_CODE: dict[int, type[ApiError]] = {404: NotFound, 409: Conflict, 410: Gone, 403: Forbidden, 422: Invalid}


def from_status(code: int, body: Any, retry_after: float | None = None) -> ApiError:
    """The error for an HTTP answer ``code`` whose body is (usually) a ``Status``."""
    reason, message = "", ""
    if isinstance(body, Mapping):
        reason = str(body.get("reason") or "")
        message = str(body.get("message") or "")
    if not reason:
        reason = {400: "BadRequest", 401: "Unauthorized", 429: "TooManyRequests"}.get(code, "Error")
    return _BY_CODE.get(code, ApiError)(code, reason, message, retry_after)
