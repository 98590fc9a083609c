"""Live daemons of the lab: a strongSwan charon or a wireguard-go per namespace, kept as our children.

Facts these rely on (LAB-FACTS.md, re-checked here):
* charon's pid file ``/var/run/charon.pid`` is compiled in, so each daemon gets a private /run by a bind
  mount inside the mount namespace ``ip netns exec`` gives it.
* the kernel has no ESP: ``kernel-libipsec`` (userspace ESP over the TUN ``ipsec0``) must load before
  ``kernel-netlink`` (not in lab/vm's VM: ``VPNGW_LAB_DATAPATH=kernel``, XFRM); ``kdf`` is required;
  ``counters`` gives ``get-counters``.
* charon is our own child and we ``wait()`` it: PID 1 here reaps orphans late and charon's
  "already running" check trusts a zombie's pid file.
* wireguard-go puts its UAPI socket in /run/wireguard; the same private-/run bind mount makes it land in
  the instance's directory, reachable from outside the namespace.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from lab.netns import LabError, ns_exec
from lab.wait import WaitTimeout, wait_for

log = logging.getLogger(__name__)

CHARON = "/usr/lib/ipsec/charon"
DATAPATH_ENV = "VPNGW_LAB_DATAPATH"
"""``kernel``: the kernel has WireGuard and ESP in XFRM (lab/vm's VM sets it, docs/vm.md); charon loads
``kernel-netlink`` alone, as production does (SAs and policies in XFRM). Unset or ``userspace``: this
machine's kernel (no ESP), ``kernel-libipsec`` first."""


def kernel_datapath() -> bool:
    """Whether the lab runs on the kernel's datapath (``VPNGW_LAB_DATAPATH=kernel``)."""
    value = os.environ.get(DATAPATH_ENV, "userspace")
    if value not in ("userspace", "kernel"):
        raise LabError(f"{DATAPATH_ENV}={value!r}: must be 'userspace' or 'kernel'")
    return value == "kernel"


CHARON_PLUGINS = (
    "random nonce openssl kdf pem pkcs1 pkcs8 x509 pubkey revocation constraints counters "
    + ("" if kernel_datapath() else "kernel-libipsec ")
    + "kernel-netlink socket-default vici"
)

STRONGSWAN_CONF = """\
charon {{
  load_modular = no
  load = {plugins}
  # Quick failure detection in a lab where every peer is one veth away.
  retransmit_timeout = 1.0
  retransmit_tries = 3
  retransmit_base = 1.4
  install_virtual_ip = no
  plugins {{
    vici {{
      socket = unix://{dir}/charon.vici
    }}
  }}
  filelog {{
    log {{
      path = {dir}/charon.log
      flush_line = yes
      time_format = %H:%M:%S
      default = 1
      ike = 1
      cfg = 1
    }}
  }}
}}
"""


def wait_for_socket(path: Path, proc: subprocess.Popen[bytes], deadline: float, what: str) -> None:
    """Until ``path`` accepts a connection (``lab.wait``, checking every 5 ms); LabError when ``proc``
    exits first or the socket does not answer by ``deadline`` (a ``time.monotonic()`` value)."""

    def answers() -> bool:
        if proc.poll() is not None:
            raise LabError(f"{what} exited with {proc.returncode} before its socket appeared")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(path))
        return True

    timeout = max(0.0, deadline - time.monotonic())
    try:
        wait_for(answers, timeout, f"{what}: socket {path}", interval=0.005, ignoring=(OSError,))
    except WaitTimeout as e:
        raise LabError(f"{what}: socket {path} did not answer in time ({e})") from e


def _stop(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM, grace: float = 5.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGCONT)  # a SIGSTOPped daemon cannot act on SIGTERM
        proc.send_signal(sig)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace)
    except ProcessLookupError:
        proc.wait(timeout=grace)


@dataclass
class _Daemon:
    """A daemon we started inside a lab namespace and keep as our own child (so we reap it)."""

    ns: str
    dir: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False, kw_only=True)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc and self.proc.poll() is None else None

    def _spawn(
        self, what: str, argv: list[str], env: dict[str, str], logfile: Path, socket: Path, timeout: float
    ) -> None:
        """Start ``argv`` logging to ``logfile`` and wait until ``socket`` accepts connections."""
        with open(logfile, "ab") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        wait_for_socket(socket, self.proc, time.monotonic() + timeout, f"{what} in {self.ns}")

    def stop(self) -> None:
        _stop(self.proc)

    def kill(self) -> None:
        """kill -9: the fault the seed's status-agent could not survive."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def pause(self) -> None:
        """SIGSTOP: the socket stays open but nothing answers."""
        if self.proc:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc:
            os.kill(self.proc.pid, signal.SIGCONT)


@dataclass
class Charon(_Daemon):
    """A live charon in namespace ``ns`` with its own config, /run and VICI socket under ``dir``."""

    starts: int = 0

    @property
    def vici_socket(self) -> Path:
        return self.dir / "charon.vici"

    @property
    def log_path(self) -> Path:
        return self.dir / "charon.log"

    @property
    def conf_path(self) -> Path:
        return self.dir / "strongswan.conf"

    def write_config(self) -> None:
        (self.dir / "run").mkdir(parents=True, exist_ok=True)
        (self.dir / "swanctl").mkdir(parents=True, exist_ok=True)
        self.conf_path.write_text(STRONGSWAN_CONF.format(plugins=CHARON_PLUGINS, dir=self.dir))

    def start(self, timeout: float = 10.0) -> None:
        if self.pid is not None:
            raise LabError(f"charon in {self.ns} is already running (pid {self.pid})")
        self.write_config()
        self.vici_socket.unlink(missing_ok=True)  # a stale socket from a killed daemon is no liveness signal
        env = {**os.environ, "STRONGSWAN_CONF": str(self.conf_path)}
        argv = ns_exec(self.ns, "sh", "-c", f'mount --bind "{self.dir}/run" /run && exec {CHARON}')
        self.starts += 1
        self._spawn("charon", argv, env, self.dir / "charon.stderr", self.vici_socket, timeout)
        log.debug("lab.charon.started ns=%s pid=%s", self.ns, self.pid)

    def restart(self) -> None:
        self.kill()
        self.start()

    def swanctl(self, command: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        """Run ``swanctl COMMAND ARGS`` against this daemon (from the root ns: VICI is a unix socket)."""
        argv = ["swanctl", command, "--uri", f"unix://{self.vici_socket}", *args]
        res = subprocess.run(argv, capture_output=True, timeout=30, check=False)
        if check and res.returncode != 0:
            raise LabError(f"{' '.join(argv)}: {res.stdout.decode()} {res.stderr.decode()}")
        return res

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


@dataclass
class WireGuardGo(_Daemon):
    """A userspace WireGuard interface (wireguard-go) in namespace ``ns``, UAPI socket under ``dir``."""

    interface: str = "wg0"

    @property
    def uapi_dir(self) -> Path:
        return self.dir / "run" / "wireguard"

    @property
    def uapi_socket(self) -> Path:
        return self.uapi_dir / f"{self.interface}.sock"

    def start(self, timeout: float = 10.0) -> None:
        if self.pid is not None:
            raise LabError(f"wireguard-go in {self.ns} is already running")
        self.uapi_dir.mkdir(parents=True, exist_ok=True)
        self.uapi_socket.unlink(missing_ok=True)
        env = {**os.environ, "WG_PROCESS_FOREGROUND": "1", "LOG_LEVEL": "error"}
        argv = ns_exec(
            self.ns,
            "sh",
            "-c",
            f'mount --bind "{self.dir}/run" /run && exec wireguard-go -f {self.interface}',
        )
        logfile = self.dir / f"wireguard-go-{self.interface}.log"
        self._spawn("wireguard-go", argv, env, logfile, self.uapi_socket, timeout)

    def wg(self, *args: str, input: bytes | None = None) -> str:
        """Run the ``wg`` tool against this interface (it finds the UAPI socket through our /run)."""
        argv = ns_exec(
            self.ns, "sh", "-c", f'mount --bind "{self.dir}/run" /run && exec wg "$@"', "wg", *args
        )
        res = subprocess.run(argv, input=input, capture_output=True, timeout=30, check=False)
        if res.returncode != 0:
            raise LabError(f"wg {' '.join(args)}: {res.stderr.decode(errors='replace').strip()}")
        return res.stdout.decode()
