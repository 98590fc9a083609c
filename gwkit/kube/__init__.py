"""The Kubernetes boundary the controller and the gateway pod's agent share: config discovery, a small
async client on httpx, and its errors (``client``, ``config``, ``errors``)."""

from gwkit.kube.client import JSON_PATCH, MERGE, KubeClient, Obj, Resource, WatchEvent
from gwkit.kube.config import ClusterConfig, ConfigError, load
from gwkit.kube.errors import (
    ApiError,
    Conflict,
    Fenced,
    Forbidden,
    Gone,
    Invalid,
    KubeError,
    NotFound,
    Unauthenticated,
    Unreachable,
)

__all__ = [
    "JSON_PATCH",
    "MERGE",
    "ApiError",
    "ClusterConfig",
    "ConfigError",
    "Conflict",
    "Fenced",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeClient",
    "KubeError",
    "NotFound",
    "Obj",
    "Resource",
    "Unauthenticated",
    "Unreachable",
    "WatchEvent",
    "load",
]
