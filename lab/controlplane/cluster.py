"""A real control plane as child processes: etcd, kube-apiserver, kube-controller-manager (the binaries
scripts/setup_controlplane.sh builds into .tools/bin), with the certificates, keys and kubeconfigs they
need, started in order and waited on until each is ready.

Processes follow the OpenStack lab's rules (lab.openstack.process): each in its own session (its group
is stopped whole: SIGTERM, a grace period, SIGKILL), output to a log in the run directory, its group
recorded there so that a later run's ``cleanup_stale`` kills what a SIGKILLed owner left; started from
the main thread, each gets PR_SET_PDEATHSIG and dies with its owner. ``stop()`` runs on every exit path
(context manager, atexit) and removes the run and data directories.

Ports: a child cannot bind port 0 and tell us, so ports are picked free on 127.0.0.1 just before the
start and a process that exits saying "address already in use" (another process took the port in
between) is started again on new ports, up to ``PORT_ATTEMPTS`` times.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import logging
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import yaml

from lab.controlplane import flags, pki
from lab.controlplane.flags import Layout, NodeTimings, Ports
from lab.openstack import process
from lab.wait import WaitTimeout, wait_for

log = logging.getLogger("lab.controlplane")

ROOT = Path(__file__).resolve().parents[2]
BIN_DIR = ROOT / ".tools" / "bin"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")
PORT_ATTEMPTS = 4
SHM = Path("/dev/shm")


class ControlPlaneError(RuntimeError):
    """The control plane could not be started or used; the message says what and shows the log."""


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def data_root() -> Path | None:
    """Where etcd's data goes: /dev/shm (a tmpfs: etcd's fsync per write costs nothing there) when it is
    writable, else None (the temporary directory)."""
    return SHM if SHM.is_dir() and os.access(SHM, os.W_OK) else None


def missing_binaries(bin_dir: Path = BIN_DIR) -> list[str]:
    return [str(bin_dir / b) for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports on 127.0.0.1 that nobody listens on right now (all bound at once, so no
    two are the same; released before return: see the module's note on retries)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _new_etcd_ports(ports: Ports) -> Ports:
    client, peer = free_ports(2)
    return replace(ports, etcd_client=client, etcd_peer=peer)


def cleanup_stale() -> list[Path]:
    """Leftovers of a SIGKILLed owner: its run directories (temporary directory) and etcd data (tmpfs)."""
    removed = process.cleanup_stale()
    root = data_root()
    if root is not None:
        removed += process.cleanup_stale(root)
    return removed


@dataclass(eq=False)
class ControlPlane:
    """One control plane. ``start()`` (or ``with``) brings it to ready; ``stop()`` tears it down.

    ``url``, ``kubeconfig`` (admin: a client certificate in system:masters), ``ca_file``; ``kubectl()``
    runs .tools/bin/kubectl against it; ``service_account_kubeconfig()`` and ``node_kubeconfig()`` mint
    other identities; ``timings`` has the seconds each start phase took."""

    bin_dir: Path = BIN_DIR
    tmp_root: Path | None = None
    """Parent of the run directory (default: the temporary directory)."""
    data_parent: Path | None = field(default_factory=data_root)
    """Parent of etcd's data directory (default: /dev/shm when writable)."""
    nodes: NodeTimings = field(default_factory=NodeTimings)
    ready_timeout: float = 60.0
    grace: float = 10.0
    """Seconds a process gets between SIGTERM and SIGKILL."""
    layout: Layout | None = None
    ports: Ports | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    ca: pki.CA | None = field(default=None, repr=False)
    _admin_ssl: ssl.SSLContext | None = field(default=None, repr=False)
    _stopped: bool = False

    # --- what callers use -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._ports().apiserver}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self._ports().etcd_client}"

    @property
    def controller_manager_url(self) -> str:
        return f"https://127.0.0.1:{self._ports().controller_manager}"

    @property
    def kubeconfig(self) -> Path:
        return self._layout().admin_kubeconfig

    @property
    def ca_file(self) -> Path:
        return self._layout().ca_crt

    @property
    def kubectl_path(self) -> Path:
        return self.bin_dir / "kubectl"

    def log_path(self, component: str) -> Path:
        """Where ``component`` (one of ``BINARIES``) writes its output while the control plane runs."""
        return self._layout().log(component)

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.procs.items() if p.poll() is None}

    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """``kubectl ARGS`` as admin (or as ``kubeconfig``); raises ControlPlaneError when ``check`` and
        it fails, with its stderr."""
        argv = [str(self.kubectl_path), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        res = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and res.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} exited {res.returncode}: {res.stderr.strip()}")
        return res

    def client(self, kubeconfig: Path | None = None, timeout: float = 10.0) -> httpx.Client:
        """An HTTP client for the apiserver as admin (its client certificate), verifying the cluster CA;
        with ``kubeconfig`` as the identity in that file (a client certificate or a token)."""
        if kubeconfig is None and self._admin_ssl is not None:
            return httpx.Client(base_url=self.url, verify=self._admin_ssl, timeout=timeout)
        doc = yaml.safe_load((kubeconfig or self.kubeconfig).read_text())
        user = doc["users"][0]["user"]
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        headers: dict[str, str] = {}
        if "token" in user:
            headers["Authorization"] = f"Bearer {user['token']}"
        else:
            with tempfile.TemporaryDirectory(dir=self._layout().run_dir) as d:
                cert, key = Path(d) / "c.crt", Path(d) / "c.key"
                pki.write_private(cert, _b64(user["client-certificate-data"]))
                pki.write_private(key, _b64(user["client-key-data"]))
                ctx.load_cert_chain(cert, key)
        return httpx.Client(base_url=self.url, verify=ctx, headers=headers, timeout=timeout)

    def service_account_kubeconfig(
        self, namespace: str, name: str, *, expiration_seconds: int = 3600, path: Path | None = None
    ) -> Path:
        """A kubeconfig for ServiceAccount ``namespace/name`` (which must exist) with a token from the
        TokenRequest API (audience: the issuer; at least 600 s, the API's minimum)."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"audiences": [flags.ISSUER], "expirationSeconds": expiration_seconds},
        }
        with self.client() as c:
            r = c.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", json=body)
        if r.status_code != 201:
            raise ControlPlaneError(f"TokenRequest for {namespace}/{name}: {r.status_code} {r.text[:300]}")
        token = r.json()["status"]["token"]
        user = f"system:serviceaccount:{namespace}:{name}"
        target = (
            path
            or self._layout().run_dir / f"sa-{flags.safe_name(namespace)}-{flags.safe_name(name)}.kubeconfig"
        )
        self._write_kubeconfig(target, user, token=token, namespace=namespace)
        return target

    def node_kubeconfig(self, node: str, *, path: Path | None = None) -> Path:
        """A kubeconfig for node ``node``: a client certificate for ``system:node:<node>`` in group
        ``system:nodes``, as a kubelet's (the Node authorizer and NodeRestriction apply to it)."""
        return self.user_kubeconfig(f"system:node:{node}", ("system:nodes",), path=path)

    def user_kubeconfig(self, user: str, groups: Sequence[str] = (), *, path: Path | None = None) -> Path:
        """A kubeconfig for any user name and groups (a client certificate from the cluster CA)."""
        pair = self._ca().issue(user, organizations=groups)
        target = path or self._layout().run_dir / f"user-{flags.safe_name(user)}.kubeconfig"
        self._write_kubeconfig(target, user, cert=pair)
        return target

    # --- start and stop ---------------------------------------------------------------------------

    def start(self) -> None:
        if self.procs or self._stopped:
            raise ControlPlaneError("a ControlPlane starts once")
        missing = missing_binaries(self.bin_dir)
        if missing:
            raise ControlPlaneError(f"missing {', '.join(missing)}: run scripts/setup_controlplane.sh")
        t0 = time.monotonic()
        run_dir = process.make_run_dir("controlplane", self.tmp_root)
        data_dir = process.make_run_dir("etcd", self.data_parent) / "data"
        self.layout = Layout(run_dir=run_dir, data_dir=data_dir)
        _started.add(self)
        try:
            self._write_pki()
            self.timings["pki"] = time.monotonic() - t0
            self._start_all()
        except BaseException:
            self.stop()
            raise
        self.timings["total"] = time.monotonic() - t0
        log.info(
            "controlplane.ready url=%s seconds=%.2f phases=%s run_dir=%s",
            self.url,
            self.timings["total"],
            ",".join(f"{k}:{v:.2f}" for k, v in self.timings.items() if k != "total"),
            run_dir,
        )

    def stop(self) -> None:
        """Stop every process (reverse start order) and remove the directories. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        try:
            for name in reversed(list(self.procs)):
                process.stop_group(self.procs[name], grace=self.grace, what=name)
        finally:
            if self.layout is not None:
                self._keep_logs()
                shutil.rmtree(self.layout.data_dir.parent, ignore_errors=True)
                shutil.rmtree(self.layout.run_dir, ignore_errors=True)
            _started.discard(self)
        log.info("controlplane.stopped")

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- internals --------------------------------------------------------------------------------

    def _layout(self) -> Layout:
        if self.layout is None:
            raise ControlPlaneError("not started")
        return self.layout

    def _ports(self) -> Ports:
        if self.ports is None:
            raise ControlPlaneError("not started")
        return self.ports

    def _ca(self) -> pki.CA:
        if self.ca is None:
            raise ControlPlaneError("not started")
        return self.ca

    def _write_pki(self) -> None:
        lay = self._layout()
        self.ca = ca = pki.CA.make()
        pki.write_private(lay.ca_crt, ca.cert_pem)
        pki.write_private(lay.ca_key, ca.key_pem)  # node certificates can be minted by other processes
        serving = ca.issue("kube-apiserver", sans=pki.apiserver_sans(flags.SERVICE_IP), server=True)
        pki.write_private(lay.apiserver_crt, serving.cert_pem)
        pki.write_private(lay.apiserver_key, serving.key_pem)
        sa = pki.service_account_keys()
        pki.write_private(lay.sa_pub, sa.cert_pem)
        pki.write_private(lay.sa_key, sa.key_pem)

    def _write_kubeconfig(
        self,
        path: Path,
        user: str,
        *,
        cert: pki.KeyPair | None = None,
        token: str | None = None,
        namespace: str = "default",
    ) -> None:
        doc = flags.kubeconfig_doc(
            self.url,
            self._ca().cert_pem,
            user,
            cert_pem=cert.cert_pem if cert else None,
            key_pem=cert.key_pem if cert else None,
            token=token,
            namespace=namespace,
        )
        pki.write_private(path, yaml.safe_dump(doc, sort_keys=False).encode())

    def _start_all(self) -> None:
        lay = self._layout()
        client, peer, api, kcm = free_ports(4)
        self.ports = Ports(etcd_client=client, etcd_peer=peer, apiserver=api, controller_manager=kcm)
        t = time.monotonic()
        self._launch_retrying(
            "etcd",
            lambda: flags.etcd_argv(self.bin_dir / "etcd", lay, self._ports()),
            self._etcd_ok,
            new_ports=_new_etcd_ports,
            before=lambda: shutil.rmtree(lay.data_dir, ignore_errors=True),
        )
        self.timings["etcd"] = time.monotonic() - t
        t = time.monotonic()
        self._launch_retrying(
            "kube-apiserver",
            lambda: flags.apiserver_argv(self.bin_dir / "kube-apiserver", lay, self._ports()),
            self._apiserver_ready,
            new_ports=lambda p: replace(p, apiserver=free_ports(1)[0]),
            before=self._write_client_kubeconfigs,  # they name the apiserver's port
        )
        self.timings["apiserver"] = time.monotonic() - t
        t = time.monotonic()
        self._launch_retrying(
            "kube-controller-manager",
            lambda: flags.controller_manager_argv(
                self.bin_dir / "kube-controller-manager", lay, self._ports(), self.nodes
            ),
            self._controller_manager_ok,
            new_ports=lambda p: replace(p, controller_manager=free_ports(1)[0]),
        )
        self.timings["controller_manager"] = time.monotonic() - t
        t = time.monotonic()
        self._wait("the default ServiceAccount (the serviceaccount controller runs)", self._default_sa)
        self.timings["default_sa"] = time.monotonic() - t

    def _write_client_kubeconfigs(self) -> None:
        lay = self._layout()
        admin = self._ca().issue("kubernetes-admin", organizations=("system:masters",))
        self._write_kubeconfig(lay.admin_kubeconfig, "kubernetes-admin", cert=admin)
        pki.write_private(lay.pki / "admin.crt", admin.cert_pem)
        pki.write_private(lay.pki / "admin.key", admin.key_pem)
        ctx = ssl.create_default_context(cafile=str(lay.ca_crt))
        ctx.load_cert_chain(lay.pki / "admin.crt", lay.pki / "admin.key")
        self._admin_ssl = ctx
        kcm = self._ca().issue("system:kube-controller-manager")
        self._write_kubeconfig(lay.controller_manager_kubeconfig, "system:kube-controller-manager", cert=kcm)

    def _launch_retrying(
        self,
        name: str,
        argv: Callable[[], list[str]],
        ready: Callable[[], bool],
        *,
        new_ports: Callable[[Ports], Ports],
        before: Callable[[], None] | None = None,
    ) -> None:
        """``_launch`` on the current ports; when the process says its port was taken, again on new
        ones (``new_ports``), up to ``PORT_ATTEMPTS`` times."""
        for attempt in range(1, PORT_ATTEMPTS + 1):
            if before is not None:
                before()
            if self._launch(name, argv(), ready):
                return
            log.info("controlplane.port_taken component=%s attempt=%d", name, attempt)
            self.ports = new_ports(self._ports())
        raise ControlPlaneError(f"{name}: its ports were taken {PORT_ATTEMPTS} times")

    def _launch(self, name: str, argv: list[str], ready: Callable[[], bool]) -> bool:
        """Start ``name`` and wait until ``ready``; False when it exited because its port was taken."""
        lay = self._layout()
        logfile = lay.log(name)
        with contextlib.suppress(FileNotFoundError):
            logfile.unlink()
        proc = process.spawn(argv, run_dir=lay.run_dir, log_path=logfile, env=_env())
        self.procs[name] = proc
        # Recorded beside its data too: whichever directory a later cleanup_stale finds kills the group.
        with open(lay.data_dir.parent / "pgids", "a") as f:
            f.write(f"{proc.pid}\n")

        def started() -> str | None:
            # The child exiting fails at once (raised here), or ends the wait as "port taken" (a retry).
            if proc.poll() is not None:
                self.procs.pop(name)
                text = logfile.read_text(errors="replace") if logfile.exists() else ""
                if flags.address_in_use(text):
                    return "port taken"
                raise ControlPlaneError(f"{name} exited with {proc.returncode}:\n{tail(logfile)}")
            return "ready" if ready() else None

        try:
            got = wait_for(started, self.ready_timeout, f"{name} to be ready", interval=0.05)
        except WaitTimeout as exc:
            msg = f"{name} was not ready after {self.ready_timeout:.0f} s:\n{tail(logfile)}"
            raise ControlPlaneError(msg) from exc
        return got == "ready"

    def _wait(self, what: str, ready: Callable[[], bool]) -> None:
        def up() -> bool:
            for name, proc in self.procs.items():  # one of them exiting fails at once
                if proc.poll() is not None:
                    raise ControlPlaneError(
                        f"{name} exited with {proc.returncode}:\n{tail(self._layout().log(name))}"
                    )
            return ready()

        try:
            wait_for(up, self.ready_timeout, what, interval=0.05)
        except WaitTimeout as exc:
            logs = "\n".join(f"--- {n}\n{tail(self._layout().log(n), 10)}" for n in self.procs)
            raise ControlPlaneError(f"{what}: not after {self.ready_timeout:.0f} s\n{logs}") from exc

    def _etcd_ok(self) -> bool:
        try:
            r = httpx.get(f"{self.etcd_url}/health", timeout=1.0)
            return r.status_code == 200 and r.json().get("health") == "true"
        except (httpx.HTTPError, ValueError):
            return False

    def _apiserver_ready(self) -> bool:
        """/readyz as admin: etcd reachable, every post-start hook done (RBAC bootstrap roles, priority
        and fairness, the system namespaces...)."""
        try:
            with self.client(timeout=2.0) as c:
                return c.get("/readyz").status_code == 200
        except (httpx.HTTPError, ssl.SSLError):
            return False

    def _controller_manager_ok(self) -> bool:
        """/healthz on its secure port (always allowed without credentials). It serves a certificate it
        made itself, so it is not verified: the process is ours, the port is on loopback."""
        try:
            r = httpx.get(f"{self.controller_manager_url}/healthz", verify=False, timeout=2.0)  # noqa: S501
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    def _default_sa(self) -> bool:
        try:
            with self.client(timeout=2.0) as c:
                return c.get("/api/v1/namespaces/default/serviceaccounts/default").status_code == 200
        except httpx.HTTPError:
            return False

    def _keep_logs(self) -> None:
        """With ``VPNGW_CONTROLPLANE_LOGS=<dir>``, the components' logs survive ``stop()`` (as
        ``<dir>/<run dir name>/``): the run directory itself is always removed."""
        target = os.environ.get("VPNGW_CONTROLPLANE_LOGS")
        if not target or self.layout is None:
            return
        dest = Path(target) / self.layout.run_dir.name
        dest.mkdir(parents=True, exist_ok=True)
        for name in BINARIES:
            with contextlib.suppress(OSError):
                shutil.copyfile(self.layout.log(name), dest / f"{name}.log")

    def describe(self) -> dict[str, Any]:
        """What ``up`` prints and records: endpoints, files, pids."""
        lay = self._layout()
        return {
            "url": self.url,
            "kubeconfig": str(lay.admin_kubeconfig),
            "ca": str(lay.ca_crt),
            "ca_key": str(lay.ca_key),
            "etcd": self.etcd_url,
            "controller_manager": self.controller_manager_url,
            "run_dir": str(lay.run_dir),
            "data_dir": str(lay.data_dir),
            "pids": self.pids(),
            "seconds": round(self.timings.get("total", 0.0), 2),
        }


def _b64(text: str) -> bytes:
    return base64.b64decode(text)


def _env() -> dict[str, str]:
    """The components' environment: ours without proxies (everything is on loopback) and KUBECONFIG."""
    drop = {"KUBECONFIG", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"}
    return {k: v for k, v in os.environ.items() if k not in drop}


_started: set[ControlPlane] = set()


@atexit.register
def _stop_all() -> None:  # pragma: no cover - last-resort teardown
    for cp in list(_started):
        cp.stop()
