"""A read-only UAPI socket for the exporter: ``get=1`` answered without keys, ``set=1`` refused.

Neither way of reading a WireGuard device is open to an unprivileged process: wireguard-go's UAPI
socket is mode 0700, owner root (and whoever may connect may also ``set=1``), and the kernel's generic
netlink ``WG_CMD_GET_DEVICE`` needs CAP_NET_ADMIN (``GENL_UNS_ADMIN_PERM`` in
drivers/net/wireguard/netlink.c; the same capability lets a process ``WG_CMD_SET_DEVICE``, and the dump
carries the private key). The agent holds that access anyway, so it serves ``<dir>/<interface>.sock``
(``--readonly-dir``) in the text format wireguard-go speaks, which the exporter already reads:

* ``get=1``: the device read through the agent's kind of backend (``gwkit.wireguard.backend.detect``):
  wireguard-go's reply with only the ``uapi.READ_ONLY_KEYS`` lines (``uapi.redact_get``), or the kernel
  device's state written out the same way (``uapi.format_get``). No private key, no preshared key;
* ``set=1``: ``errno=1`` (EPERM), nothing forwarded;
* anything else: closed without a reply, as the daemon does.

One request per connection, with deadlines on reading it, on reading the device and on writing the
reply; at most ``Limits.max_clients`` connections at once (one more is closed at once). When the device
does not answer, the connection is closed without a reply (the exporter reports ``wireguard_up 0``, as
for a dead daemon); when the agent is down the socket refuses connections (the same).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterable, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio
import anyio.abc

from gwkit import sockio
from gwkit.wireguard import uapi
from gwkit.wireguard.backend import UapiBackend, WireGuardBackend, WireGuardError, detect

log = logging.getLogger(__name__)

SOCKET_MODE = 0o666
"""Inside an emptyDir only the agent and the exporter mount: the WireGuard agent is root without
CAP_CHOWN, the exporter 65532, so the socket cannot be handed to the exporter's user or group."""
MAX_REQUEST = 64 * 1024
"""A get is 7 bytes; a set is read up to this much (then refused either way)."""


@dataclass(frozen=True)
class Limits:
    max_clients: int = 4
    request_timeout: float = 2.0
    """To read the request (its first line; a set until its blank line)."""
    device_timeout: float = 5.0
    """To read the device."""
    send_timeout: float = 10.0
    """To write the reply (3.4 MB at 10,000 peers)."""


class DeviceText(Protocol):
    name: str
    """``uapi`` or ``netlink``: how the device is read."""

    async def get_text(self, interface: str, timeout: float) -> str:
        """The device as a ``get=1`` reply without keys. Raises WireGuardError or UapiError."""
        ...

    async def aclose(self) -> None: ...


class UapiText:
    """wireguard-go / boringtun: its own reply, redacted."""

    name = "uapi"

    def __init__(self, backend: UapiBackend) -> None:
        self.backend = backend

    async def get_text(self, interface: str, timeout: float) -> str:
        return uapi.redact_get(await uapi.get_text(self.backend.socket(interface), timeout))

    async def aclose(self) -> None:
        await self.backend.aclose()


class BackendText:
    """Any other backend (the kernel's netlink): its DeviceState written out as a reply, one read at a
    time (one netlink socket)."""

    def __init__(self, backend: WireGuardBackend) -> None:
        self.backend = backend
        self.name = backend.name
        self._lock = anyio.Lock()

    async def get_text(self, interface: str, timeout: float) -> str:
        async with self._lock:
            with anyio.fail_after(timeout):
                state = await self.backend.get(interface)
        try:
            return uapi.format_get(state)
        except ValueError as exc:  # a key the device reported is not one: names the role, not the value
            raise WireGuardError(f"{interface}: {exc}") from exc

    async def aclose(self) -> None:
        await self.backend.aclose()


Opener = Callable[[str], Awaitable[DeviceText]]


def opener(uapi_dir: Path | None) -> Opener:
    """Open the device's reader as the agent's own loop chooses its backend (``detect``)."""

    async def open_(interface: str) -> DeviceText:
        backend = await detect(interface, uapi_dir)
        return UapiText(backend) if isinstance(backend, UapiBackend) else BackendText(backend)

    return open_


class ReadOnlyServer:
    """Serves one interface's read-only socket."""

    def __init__(self, interface: str, open_device: Opener, limits: Limits | None = None) -> None:
        self.interface = interface
        self.open_device = open_device
        self.limits = limits or Limits()
        self.clients = 0
        self.refused: set[str] = set()
        self._device: DeviceText | None = None
        self._device_down: str | None = None
        self._full_logged = False

    async def _request(self, sock: socket.socket) -> tuple[uapi.Operation, bytes]:
        """The operation and what was read; "invalid" for a request not complete before the deadline."""
        data = b""
        with anyio.move_on_after(self.limits.request_timeout):
            while len(data) <= MAX_REQUEST:
                line, newline, _ = data.partition(b"\n")
                if newline:
                    op = uapi.operation(line)
                    # A set is read to its blank line (or the limit), so the refusal is not answered to
                    # a client still writing; a get is answered at once, as the daemon does.
                    if op != "set" or b"\n\n" in data:
                        return op, data
                more = await sockio.receive(sock)
                if not more:
                    break
                data += more
        op = uapi.operation(data.partition(b"\n")[0]) if b"\n" in data else "invalid"
        return ("set", data) if op == "set" else ("invalid", data)

    async def _device_text(self) -> str | None:
        try:
            with anyio.fail_after(self.limits.device_timeout):
                if self._device is None:
                    self._device = await self.open_device(self.interface)
                text = await self._device.get_text(self.interface, self.limits.device_timeout)
        except (WireGuardError, uapi.UapiError, OSError) as exc:  # TimeoutError is an OSError
            why = str(exc) or type(exc).__name__
            if self._device is not None:  # re-detect next time (daemon restarted, module loaded)
                device, self._device = self._device, None
                with anyio.CancelScope(shield=True):
                    await device.aclose()
            if self._device_down is None:
                log.warning("wireguard.readonly.device_down interface=%s error=%r", self.interface, why)
            self._device_down = why
            return None
        if self._device_down is not None:
            log.info("wireguard.readonly.device_up interface=%s", self.interface)
            self._device_down = None
        return text

    async def handle(self, stream: anyio.abc.SocketStream) -> None:
        async with stream:
            sock = sockio.raw(stream)
            try:
                op, _ = await self._request(sock)
            except OSError:
                return  # the client reset the connection
            if op == "get":
                text = await self._device_text()
                reply = text.encode() if text is not None else None
            elif op == "set":
                reply = uapi.EPERM_REPLY
            else:
                reply = None
            if op != "get" and op not in self.refused:
                self.refused.add(op)
                log.warning("wireguard.readonly.refused interface=%s operation=%s", self.interface, op)
            if reply is None:
                return
            try:
                with anyio.fail_after(self.limits.send_timeout):
                    await sockio.send_all(sock, reply)
            except OSError:  # TimeoutError included
                return  # the client went away or stopped reading: its loss alone

    async def serve(self, listener: anyio.abc.SocketListener) -> None:
        """Accept until cancelled."""
        try:
            async with listener, anyio.create_task_group() as tg:
                while True:
                    try:
                        client = await listener.accept()
                    except OSError as exc:  # EMFILE and the like: the server stays, the agent too
                        log.error("wireguard.readonly.accept_failed error=%r", str(exc))
                        await anyio.sleep(1.0)
                        continue
                    if self.clients >= self.limits.max_clients:
                        if not self._full_logged:
                            log.warning(
                                "wireguard.readonly.full clients=%d action=close-new-connection", self.clients
                            )
                            self._full_logged = True
                        with anyio.CancelScope(shield=True):
                            await client.aclose()
                        continue
                    self._full_logged = False
                    self.clients += 1
                    tg.start_soon(self._one, client)
        finally:
            if self._device is not None:
                with anyio.CancelScope(shield=True):
                    await self._device.aclose()

    async def _one(self, client: anyio.abc.SocketStream) -> None:
        try:
            await self.handle(client)
        except Exception as exc:  # one client must never take the server (or the agent) down
            log.error("wireguard.readonly.failed error=%r", f"{type(exc).__name__}: {exc}", exc_info=True)
        finally:
            self.clients -= 1


async def serve_interface(
    directory: Path,
    interface: str,
    open_device: Opener,
    limits: Limits | None = None,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``<directory>/<interface>.sock`` until cancelled (a stale socket file is replaced). A
    directory that is missing or not ours is logged and retried: the agent keeps running."""
    path = uapi.socket_path(interface, directory)
    started = False
    while True:  # nothing here may take the agent (the loop beside it) down: log and serve again
        try:
            listener = await anyio.create_unix_listener(path, mode=SOCKET_MODE)
        except OSError as exc:
            log.error("wireguard.readonly.listen_failed socket=%s error=%r", path, str(exc))
            await anyio.sleep(5.0)
            continue
        log.info("wireguard.readonly.listening socket=%s mode=%o", path, SOCKET_MODE)
        if not started:
            task_status.started()
            started = True
        try:
            await ReadOnlyServer(interface, open_device, limits).serve(listener)
        except Exception as exc:  # a bug
            why = f"{type(exc).__name__}: {exc}"
            log.error("wireguard.readonly.failed error=%r action=restart", why, exc_info=True)
            await anyio.sleep(1.0)


async def serve(
    directory: Path, interfaces: AsyncIterable[str], open_device: Opener, limits: Limits | None = None
) -> None:
    """Serve the socket of the interface the plan names, moving to a new one when a plan renames it
    (``interfaces`` says so, once per plan); until cancelled."""
    serving: tuple[str, anyio.CancelScope] | None = None
    async with anyio.create_task_group() as tg:
        async for name in interfaces:
            if serving is not None and serving[0] == name:
                continue
            if serving is not None:
                serving[1].cancel()
            scope = anyio.CancelScope()
            serving = (name, scope)

            async def one(name: str = name, scope: anyio.CancelScope = scope) -> None:
                with scope:
                    await serve_interface(directory, name, open_device, limits)

            tg.start_soon(one)
