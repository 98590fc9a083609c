"""Kubernetes ``Status`` failures, worded as k8s.io/apimachinery/pkg/api/errors words them (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lab.kubeapi.resources import ResourceType


@dataclass
class ApiError(Exception):
    """One failed request: HTTP code + the Status body the real API server would send."""

    code: int
    reason: str
    message: str
    details: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    plain: bool = False
    """Answered as Go's ``http.NotFound`` does: ``message`` as text/plain, no Status body."""

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(rtype: ResourceType | None, name: str, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if name:
        d["name"] = name
    if rtype is not None:
        if rtype.group:
            d["group"] = rtype.group
        d["kind"] = rtype.plural
    d.update(extra)
    return d


def not_found(rtype: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rtype.group_resource} "{name}" not found', _details(rtype, name))


def namespace_not_found(name: str) -> ApiError:
    return ApiError(404, "NotFound", f'namespaces "{name}" not found', {"name": name, "kind": "namespaces"})


def path_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def group_version_not_served() -> ApiError:
    """A request under an API group/version the server does not serve at all (no built-in kind, no
    CustomResourceDefinition: Multus' NetworkAttachmentDefinition without Multus). Every handler passes
    it on to the last one, k8s.io/apiserver pkg/util/notfoundhandler (``http.NotFound`` once discovery is
    complete): a text/plain 404 ``404 page not found``, no Status, so clients see no reason. Observed
    against kube-apiserver v1.35 (tests/integration/test_status_truth_real.py: the controller's create
    of a NetworkAttachmentDefinition without its CRD)."""
    return ApiError(404, "NotFound", "404 page not found\n", plain=True)


def already_exists(rtype: ResourceType, name: str) -> ApiError:
    return ApiError(
        409, "AlreadyExists", f'{rtype.group_resource} "{name}" already exists', _details(rtype, name)
    )


def conflict(rtype: ResourceType, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {rtype.group_resource} "{name}": {why}',
        _details(rtype, name),
    )


MODIFIED = "the object has been modified; please apply your changes to the latest version and try again"


def stale(rtype: ResourceType, name: str) -> ApiError:
    return conflict(rtype, name, MODIFIED)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def method_not_allowed() -> ApiError:
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource", {}
    )


def unsupported_media_type(content_type: str, accepted: Sequence[str]) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: "
        f"{', '.join(accepted)}",
    )


@dataclass(frozen=True)
class FieldError:
    """field.Error: ``<field>: <Type>: <detail>`` with the value rendered as Go's %#v would."""

    field: str
    type: str
    detail: str = ""
    value: Any = None
    has_value: bool = False
    raw: str = ""
    """A value already printed the Go way (e.g. ``0x0`` for a uint64 zero)."""

    REASONS = {
        "Invalid value": "FieldValueInvalid",
        "Required value": "FieldValueRequired",
        "Unsupported value": "FieldValueNotSupported",
        "Forbidden": "FieldValueForbidden",
        "Duplicate value": "FieldValueDuplicate",
        "Too long": "FieldValueTooLong",
        "Too many": "FieldValueTooMany",
        "Not found": "FieldValueNotFound",
    }

    def body(self) -> str:
        out = self.type
        if self.raw:
            out += f": {self.raw}"
        elif self.has_value:
            out += f": {go_value(self.value)}"
        if self.detail:
            out += f": {self.detail}"
        return out

    def __str__(self) -> str:
        return f"{self.field or '<nil>'}: {self.body()}"


def go_value(value: Any) -> str:
    """How field.Error prints a value (strings quoted, numbers bare, others as JSON-ish)."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return str(value)
    return '"' + str(value).replace('"', '\\"') + '"'


def invalid(rtype: ResourceType, name: str, errors: Sequence[FieldError]) -> ApiError:
    """422 Invalid: ``Kind.group "name" is invalid: <errors>`` (several errors in brackets)."""
    joined = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(str(e) for e in errors) + "]"
    causes = [
        {"reason": FieldError.REASONS.get(e.type, "FieldValueInvalid"), "message": e.body(), "field": e.field}
        for e in errors
    ]
    details: dict[str, Any] = {"name": name} if name else {}
    if rtype.group:
        details["group"] = rtype.group
    details["kind"] = rtype.kind
    details["causes"] = causes
    return ApiError(422, "Invalid", f'{rtype.group_kind} "{name}" is invalid: {joined}', details)


def patch_failed(message: str) -> ApiError:
    """A JSON patch that does not apply (e.g. a failed ``test``): what patch.go answers, a generic 422
    with empty details (handlers/patch.go applyJSPatch: errors.NewGenericServerResponse(422, ...,
    err.Error(), 0, false): the message is dropped, no causes; seen from kube-apiserver v1.35.4 as
    ``{"message":"the server rejected our request due to an error in our request","reason":"Invalid",
    "details":{},"code":422}``). ``message`` says why, for the emulator's log only."""
    del message
    return ApiError(422, "Invalid", "the server rejected our request due to an error in our request", {})


def forbidden(group: str, resource: str, name: str, message: str) -> ApiError:
    """NewForbidden: ``<resource.group> "<name>" is forbidden: <message>``."""
    gr = f"{resource}.{group}" if group else resource
    if not resource:
        text = f"forbidden: {message}"
    elif not name:
        text = f"{gr} is forbidden: {message}"
    else:
        text = f'{gr} "{name}" is forbidden: {message}'
    details: dict[str, Any] = {}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    if resource:
        details["kind"] = resource
    return ApiError(403, "Forbidden", text, details)


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def too_many_requests(retry_after: int) -> ApiError:
    return ApiError(
        429,
        "TooManyRequests",
        "Too many requests, please try again later.",
        {"retryAfterSeconds": retry_after},
        {"Retry-After": str(retry_after)},
    )


def internal(message: str) -> ApiError:
    return ApiError(
        500, "InternalError", f"Internal error occurred: {message}", {"causes": [{"message": message}]}
    )


def for_code(code: int, rtype: ResourceType | None, name: str, retry_after: int | None = None) -> ApiError:
    """The Status a real server sends with this code (for fault injection)."""
    if code == 409 and rtype is not None:
        return stale(rtype, name)
    if code == 429:
        return too_many_requests(retry_after or 1)
    if code == 404 and rtype is not None:
        return not_found(rtype, name)
    if code == 500:
        return internal("injected fault")
    if code == 503:
        err = ApiError(503, "ServiceUnavailable", "the server is currently unable to handle the request")
        if retry_after:
            err.headers["Retry-After"] = str(retry_after)
        return err
    if code == 504:
        return ApiError(504, "Timeout", "Timeout: request did not complete within the allowed duration")
    if code == 403:
        return forbidden(rtype.group if rtype else "", rtype.plural if rtype else "", name, "injected fault")
    if code == 401:
        return unauthorized()
    if code == 410:
        return gone("too old resource version")
    if code == 422 and rtype is not None:
        return invalid(rtype, name, [FieldError("metadata", "Invalid value", "injected fault")])
    return ApiError(code, "Unknown", f"the server responded with the status code {code} (injected fault)")
