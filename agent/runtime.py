"""The seams between the agent's shared runtime and its two backends (IPsec over VICI, WireGuard).

``agent/__main__.py`` parses ``Settings``, builds the concrete sources and sinks, and hands them to the
backend the plan's ``type`` names. Backends depend only on these Protocols, so each can be tested with the
small fakes in tests, and the concrete pieces (file watching, status file, Kubernetes status writer,
health server) are written once for both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from gwplan import Plan, SecretRef


@dataclass(frozen=True)
class Settings:
    """The agent's command line, parsed once."""

    plan: Path
    """The rendered plan file (a ConfigMap volume: replaced by atomic rename or kubelet's symlink swap)."""
    secrets_dir: Path
    """Secret volumes: a value lives at ``<secrets_dir>/<secret-name>/<key>``."""
    vici_socket: Path = Path("/var/run/charon/charon.vici")
    """charon's VICI socket, shared with the strongswan container through an emptyDir."""
    status_file: Path | None = None
    """Write the status JSON here (atomically, on change)."""
    initnat_status: Path | None = None
    """init-nat's status file: what it left out is published as ``status.initNat``."""
    kube_status: bool = False
    """Patch the owning CR's status subresource through the Kubernetes API."""
    health_listen: str | None = None
    """HOST:PORT for /healthz and /readyz."""
    follow_configmap: str | None = None
    """Watch this ConfigMap (the plan) and the Secrets its plan references through the API and write them
    to ``live_dir`` (``agent.follow``): the pod then follows its plan within a second, not the kubelet's
    60-90 s."""
    live_dir: Path | None = None
    plan_fallback: Path | None = None
    """The mounted plan ConfigMap: copied to ``live_dir`` at boot, until the API answers."""
    kubeconfig: Path | None = None
    """For running outside a pod (default: in-cluster, else $KUBECONFIG)."""
    kube_context: str | None = None
    """The kubeconfig context (``--context``); None: its current-context. Set, it means a kubeconfig."""
    wireguard_uapi_dir: Path | None = None
    """Where wireguard-go's UAPI sockets are, when not /var/run/wireguard."""
    readonly_dir: Path | None = None
    """Serve the exporter's read-only view here: ``plan.json`` (a copy of every plan the agent accepts),
    ``ha-role`` (the pod's HA role, ``agent.sink.CopiedRole``) and a socket that can only read the
    daemon: ``charon.vici`` (a VICI relay passing queries only, ``agent.ipsec.relay``) or
    ``<interface>.sock`` (a UAPI socket answering ``get=1`` without keys, ``agent.wireguard.readonly``)."""
    poll_interval: float = 0.5
    """How often the plan and secret files are checked for changes (changes apply within 2 s)."""
    resync_seconds: float = 30.0
    """Full status resync even without events, because events can be lost across reconnects."""
    ha_identity: str | None = None
    """This pod's name in the HA Lease (``agent.ha``); None: ``$POD_NAME``, else the hostname."""


class SecretError(Exception):
    """A secret file is missing or unusable. The message names the Secret and key, never the value."""


class Secrets(Protocol):
    def read(self, ref: SecretRef) -> bytes:
        """The current value; raises SecretError."""
        ...

    def version(self, ref: SecretRef) -> str:
        """A digest that changes when the value changes (safe to log and compare; not the value)."""
        ...


class PlanSource(Protocol):
    def __aiter__(self) -> AsyncIterator[Plan]:
        """Yields the current plan, then each new valid plan when the file changes. An unreadable or
        invalid file is reported (log + ``last_error``) and NOT yielded: the last good plan stays."""
        ...

    @property
    def last_error(self) -> str | None: ...


class StatusSink(Protocol):
    async def publish(self, status: Mapping[str, Any]) -> None:
        """Replace the gateway's status (``tunnels`` or ``peers``, ``conditions``...). Callers publish only
        on change; the sink must not block its caller for long (coalesce and retry inside)."""
        ...


class Health(Protocol):
    def beat(self) -> None:
        """The agent's loop is alive (liveness). A daemon being down is NOT a liveness failure."""
        ...

    def set_ready(self, ready: bool, reason: str) -> None:
        """Readiness: connected to the daemon and the plan pushed."""
        ...


Role = Literal["active", "standby"]
"""Whether this pod serves its gateway (warm-standby HA, docs/ha.md): ``active`` initiates and answers its
peers; ``standby`` holds its configuration loaded, never initiates and never answers, and a fenced
active (it could not renew its Lease in time) goes back to ``standby`` by itself."""


class RoleSource(Protocol):
    """Who this pod is in its gateway's HA pair, decided through the API (``agent.ha``: the gateway's Lease).
    Without HA every pod is ``active`` (``ALWAYS_ACTIVE``)."""

    @property
    def current(self) -> Role: ...

    def __aiter__(self) -> AsyncIterator[Role]:
        """Yields the current role, then each change (never the same role twice in a row)."""
        ...


class AlwaysActive:
    """The role of a gateway without HA: active, forever."""

    @property
    def current(self) -> Role:
        return "active"

    async def _iterate(self) -> AsyncIterator[Role]:
        yield "active"

    def __aiter__(self) -> AsyncIterator[Role]:
        return self._iterate()


ALWAYS_ACTIVE: RoleSource = AlwaysActive()


class Backend(Protocol):
    async def __call__(
        self,
        settings: Settings,
        plans: PlanSource,
        secrets: Secrets,
        sink: StatusSink,
        health: Health,
        role: RoleSource = ALWAYS_ACTIVE,
    ) -> None:
        """Run until cancelled. Never returns on daemon faults: it reconnects and re-applies. ``role``: serve
        only while it says ``active`` (a backend that has not learnt HA yet ignores it)."""
        ...
