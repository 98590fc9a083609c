"""Credentials that change while the process runs: token files and exec credential plugins.

The client asks its credential for a bearer token before every request (``ClusterConfig.token``, a
callable). That one shape covers three lifetimes:

* a constant (``StaticToken``: a kubeconfig's ``token``);
* a file that someone else rewrites (``TokenFile``: the kubelet rotates a pod's bound service-account
  token; a kubeconfig's ``tokenFile``), re-read when its inode or mtime changes;
* a program that prints an ExecCredential (``ExecPlugin``: ``aws eks get-token``,
  ``gke-gcloud-auth-plugin``, ``kubelogin``), run when there is no credential yet or it has passed its
  ``expirationTimestamp``, and cached until then: one run per expiry, not per request, and one run for
  all the requests waiting on it (a lock). Its client certificate, when it prints one, is loaded into the
  connection's ``SSLContext`` (new connections present it).

A 401 means the server no longer takes what we sent: the client calls ``refresh(stale)`` once, which
re-reads the file or re-runs the plugin (unless another request already did) and says whether the
credential changed; only then is the request sent again. client-go does the same refresh on a 401 (but
does not resend).

Secrets never leave these objects: no ``repr`` shows one, and no error or log line carries a plugin's
output, standard error included (kubectl shows a plugin's stderr; a plugin's debug output can hold the
token, so here an error says how many bytes it wrote and to run the command by hand).
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gwkit.kube.errors import ConfigError

EXEC_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
"""What client-go's exec plugins speak today (v1alpha1 was removed in Kubernetes 1.24)."""
EXEC_TIMEOUT = 120.0
"""Seconds a plugin may take: long enough for a cloud CLI's token exchange, not a hang forever."""


class TokenFile:
    """A bearer token read from a file, re-read when the file changes (mtime or inode)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._token = ""

    def __call__(self) -> str:
        try:
            st = self.path.stat()
            stamp = (st.st_ino, st.st_mtime_ns)
            if stamp != self._stamp:
                self._token = self.path.read_text().strip()
                self._stamp = stamp
        except OSError as exc:
            if not self._token:
                raise ConfigError(f"token file {self.path}: {exc.strerror or exc}") from exc
        return self._token

    def refresh(self, stale: str) -> bool:
        """The server refused ``stale``: read the file again even if its stamp did not move."""
        self._stamp = None
        return self() != stale

    def __repr__(self) -> str:
        return f"TokenFile({str(self.path)!r})"


class StaticToken:
    """A kubeconfig's ``token``: the same every time (a 401 cannot be cured by asking again)."""

    def __init__(self, value: str) -> None:
        self._value = value

    def __call__(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "StaticToken(<hidden>)"


# --- exec credential plugins ------------------------------------------------------------------------


@dataclass(frozen=True)
class ExecSpec:
    """A kubeconfig user's ``exec`` stanza, checked (``exec_spec``)."""

    where: str
    """``kubeconfig PATH: users[NAME].user.exec``: errors start with it."""
    api_version: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    """Added to our environment for the plugin (values may be secrets: not in the repr)."""
    install_hint: str = ""
    provide_cluster_info: bool = False


def exec_spec(raw: Any, where: str, base: Path) -> ExecSpec:
    """Check an ``exec`` stanza as client-go does; ``base`` is the directory of the file that holds it (a
    command with a slash in it is relative to that file, a bare name is looked up on ``PATH``)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: not a mapping")
    version = str(raw.get("apiVersion") or "")
    if version not in EXEC_VERSIONS:
        raise ConfigError(
            f"{where}.apiVersion: {version or '(missing)'!r} is not supported "
            f"(one of {', '.join(EXEC_VERSIONS)})"
        )
    command = str(raw.get("command") or "")
    if not command:
        raise ConfigError(f"{where}.command: missing")
    if os.sep in command and not os.path.isabs(command):
        command = str(base / command)
    args = raw.get("args") or []
    if not isinstance(args, list):
        raise ConfigError(f"{where}.args: not a list")
    env: list[tuple[str, str]] = []
    for i, item in enumerate(raw.get("env") or []):
        if not isinstance(item, Mapping) or not item.get("name"):
            raise ConfigError(f"{where}.env[{i}]: needs a name and a value")
        env.append((str(item["name"]), str(item.get("value") or "")))
    mode = raw.get("interactiveMode")
    if mode is None and version.endswith("/v1"):
        raise ConfigError(f"{where}.interactiveMode: required by {version} (Never or IfAvailable)")
    if mode not in (None, "Never", "IfAvailable"):
        raise ConfigError(
            f"{where}.interactiveMode: {mode!r}: this program never has a terminal for the plugin "
            "(Never or IfAvailable work; with IfAvailable the plugin runs without one)"
        )
    return ExecSpec(
        where,
        version,
        command,
        tuple(str(a) for a in args),
        tuple(env),
        str(raw.get("installHint") or ""),
        bool(raw.get("provideClusterInfo")),
    )


@dataclass(frozen=True)
class Credential:
    """What one run of a plugin gave (never printed: the fields are secrets)."""

    token: str = field(default="", repr=False)
    cert_pem: bytes = field(default=b"", repr=False)
    key_pem: bytes = field(default=b"", repr=False)
    expires: datetime | None = None
    """None: good until the server says 401."""


def parse_credential(stdout: bytes, spec: ExecSpec) -> Credential:
    """The ExecCredential a plugin printed. Errors say what is wrong, never what was printed."""
    what = f"{spec.where}: the output of {spec.command!r}"
    try:
        doc = json.loads(stdout)
    except ValueError:
        raise ConfigError(f"{what} is not JSON (an ExecCredential was expected)") from None
    if not isinstance(doc, Mapping) or doc.get("kind") != "ExecCredential":
        raise ConfigError(f"{what} is not an ExecCredential")
    if doc.get("apiVersion") != spec.api_version:
        raise ConfigError(
            f"{what} has apiVersion {doc.get('apiVersion')!r}, the kubeconfig asks for {spec.api_version}"
        )
    status = doc.get("status")
    if not isinstance(status, Mapping):
        raise ConfigError(f"{what} has no status")
    token = status.get("token") or ""
    cert, key = status.get("clientCertificateData") or "", status.get("clientKeyData") or ""
    if not isinstance(token, str) or not isinstance(cert, str) or not isinstance(key, str):
        raise ConfigError(f"{what}: status.token, clientCertificateData and clientKeyData must be strings")
    if bool(cert) != bool(key):
        raise ConfigError(f"{what}: status has only one of clientCertificateData and clientKeyData")
    if not token and not cert:
        raise ConfigError(f"{what}: status has neither a token nor clientCertificateData and clientKeyData")
    expires = None
    stamp = status.get("expirationTimestamp")
    if stamp:
        try:
            expires = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(f"{what}: status.expirationTimestamp is not an RFC 3339 time") from None
        if expires.tzinfo is None:
            raise ConfigError(f"{what}: status.expirationTimestamp has no time zone")
    return Credential(token, cert.encode(), key.encode(), expires)


Runner = Callable[[list[str], dict[str, str]], bytes]
"""Runs argv with that environment and returns its standard output; ``ConfigError`` when it fails."""


def exec_info(spec: ExecSpec, cluster: Mapping[str, Any] | None) -> str:
    """``KUBERNETES_EXEC_INFO``, as client-go sets it: never interactive; the cluster when asked for."""
    body: dict[str, Any] = {"interactive": False}
    if spec.provide_cluster_info and cluster is not None:
        body["cluster"] = dict(cluster)
    return json.dumps({"apiVersion": spec.api_version, "kind": "ExecCredential", "spec": body})


def run_plugin(spec: ExecSpec) -> Runner:
    def run(argv: list[str], env: dict[str, str]) -> bytes:
        hint = f". {spec.install_hint.strip()}" if spec.install_hint else ""
        if os.sep not in argv[0] and shutil.which(argv[0], path=env.get("PATH")) is None:
            raise ConfigError(f"{spec.where}.command: {argv[0]!r} not found on PATH{hint}")
        try:
            # stdin is not a terminal: the plugin must not prompt (interactiveMode Never/IfAvailable).
            # Its stdout (the secret) goes only to the parser; its stderr is kept out of errors and logs
            # too (kubectl shows it, but a plugin's debug output may carry the token or its refresh token).
            done = subprocess.run(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=EXEC_TIMEOUT,
                check=False,
            )
        except FileNotFoundError:
            raise ConfigError(f"{spec.where}.command: {argv[0]!r} not found{hint}") from None
        except PermissionError:
            raise ConfigError(f"{spec.where}.command: {argv[0]!r} is not executable") from None
        except subprocess.TimeoutExpired:
            raise ConfigError(f"{spec.where}: {argv[0]!r} did not finish in {EXEC_TIMEOUT:.0f} s") from None
        if done.returncode != 0:
            raise ConfigError(
                f"{spec.where}: {argv[0]!r} exited with status {done.returncode} ({len(done.stderr)} bytes "
                "on its stderr, not shown as they may hold a secret: run the command by hand to read them)"
            )
        return done.stdout

    return run


class ExecPlugin:
    """A bearer token (and maybe a client certificate) from an exec credential plugin, cached until its
    expiry. ``blocking``: a call may run a program, so the async client calls it in a worker thread when
    ``cached()`` has nothing valid."""

    blocking = True

    def __init__(
        self,
        spec: ExecSpec,
        ssl_context: ssl.SSLContext,
        cluster: Mapping[str, Any] | None = None,
        *,
        run: Runner | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.spec = spec
        self._ssl = ssl_context
        self._cluster = cluster
        self._run = run or run_plugin(spec)
        self.now = now
        """The clock expirations are compared with (tests move it)."""
        self._environ = environ
        self._lock = threading.Lock()
        self._cred: Credential | None = None
        self.runs = 0
        """How often the plugin ran (for tests and logs)."""

    def _valid(self, cred: Credential | None) -> bool:
        return cred is not None and (cred.expires is None or self.now() < cred.expires)

    def cached(self) -> str | None:
        """The token if one is cached and not expired ("" for a certificate-only credential), else None;
        never runs anything."""
        cred = self._cred
        return cred.token if cred is not None and self._valid(cred) else None

    def __call__(self) -> str:
        with self._lock:
            if not self._valid(self._cred):
                self._fetch()
            assert self._cred is not None
            return self._cred.token

    def refresh(self, stale: str) -> bool:
        """The server refused ``stale`` (401): run the plugin again, unless another request already got a
        different credential meanwhile. True when what ``__call__`` gives now differs from ``stale``."""
        with self._lock:
            old = self._cred
            if old is not None and old.token != stale and self._valid(old):
                return True
            self._fetch()
            new = self._cred
            assert new is not None
            return new.token != stale or (old is not None and new.cert_pem != old.cert_pem)

    def _fetch(self) -> None:
        env = dict(os.environ if self._environ is None else self._environ)
        env.update(self.spec.env)
        env["KUBERNETES_EXEC_INFO"] = exec_info(self.spec, self._cluster)
        self.runs += 1
        cred = parse_credential(self._run([self.spec.command, *self.spec.args], env), self.spec)
        if cred.cert_pem and (self._cred is None or cred.cert_pem != self._cred.cert_pem):
            load_chain_data(
                self._ssl, cred.cert_pem, cred.key_pem, f"{self.spec.where}: the plugin's client certificate"
            )
        self._cred = cred

    def __repr__(self) -> str:
        return f"ExecPlugin({self.spec.command!r}, where={self.spec.where!r})"


# --- client certificates ----------------------------------------------------------------------------


def load_chain_data(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes, what: str) -> None:
    """Load a client certificate and key given as bytes (ssl loads chains only from files: a private
    directory, removed at once). Errors name ``what``, never the key."""
    with tempfile.TemporaryDirectory(prefix="kubecfg-") as d:
        cf, kf = Path(d) / "c.pem", Path(d) / "k.pem"
        cf.write_bytes(cert_pem)
        kf.touch(mode=0o600)
        kf.write_bytes(key_pem)
        load_chain(ctx, cf, kf, what)


def load_chain(ctx: ssl.SSLContext, cert: Path, key: Path, what: str) -> None:
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "reason", None) or exc.strerror or "unusable"
        raise ConfigError(f"{what}: {type(exc).__name__}: {reason}") from None
