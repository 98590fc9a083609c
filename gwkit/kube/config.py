"""Where the API server is and who we are to it: in-cluster service account, or a kubeconfig file.

The usual discovery, as client-go does it: an explicit kubeconfig path wins; else, inside a pod
(``KUBERNETES_SERVICE_HOST`` set and the service-account token mounted), the in-cluster config; else
``$KUBECONFIG`` (the first file of the list), else ``~/.kube/config``.

Supported kubeconfig credentials: bearer ``token`` / ``tokenFile``, client certificates (file or
``-data``), CA file or data, ``insecure-skip-tls-verify``, ``tls-server-name``. Exec plugins and
auth-providers are refused by name (``ConfigError``), never silently ignored. Service-account tokens are
re-read when the file changes (the kubelet rotates bound tokens), so a long-running pod keeps working.
Credentials never appear in an error message or a ``repr``.
"""

from __future__ import annotations

import base64
import contextlib
import os
import ssl
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ConfigError(Exception):
    """No usable cluster configuration; the message says which file and which field."""


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

    def __repr__(self) -> str:
        return f"TokenFile({str(self.path)!r})"


@dataclass(frozen=True)
class ClusterConfig:
    server: str
    """``https://host:port`` (no trailing slash)."""
    ssl: ssl.SSLContext | bool = field(repr=False)
    """What httpx verifies with: a context (CA, client certificate) or False (insecure-skip-tls-verify)."""
    token: Callable[[], str] | None = field(default=None, repr=False)
    namespace: str = "default"
    """The context's (or the service account's) namespace."""
    source: str = ""
    """Where this came from, for logs: ``in-cluster`` or the kubeconfig path."""
    tls_server_name: str | None = None
    """The name the server's certificate must carry when it is not the URL's host."""


def load(kubeconfig: Path | None = None, *, environ: Mapping[str, str] | None = None,
         service_account_dir: Path = SERVICE_ACCOUNT_DIR) -> ClusterConfig:  # fmt: skip
    env = os.environ if environ is None else environ
    if kubeconfig is not None:
        return from_kubeconfig(kubeconfig)
    if env.get("KUBERNETES_SERVICE_HOST") and (service_account_dir / "token").exists():
        return in_cluster(env, service_account_dir)
    paths = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    path = Path(paths[0]) if paths else Path.home() / ".kube" / "config"
    if not path.exists():
        raise ConfigError(
            f"no cluster configuration: not in a pod (KUBERNETES_SERVICE_HOST or {service_account_dir}/token "
            f"missing) and no kubeconfig at {path} (--kubeconfig or KUBECONFIG)"
        )
    return from_kubeconfig(path)


def in_cluster(env: Mapping[str, str], sa: Path = SERVICE_ACCOUNT_DIR) -> ClusterConfig:
    host, port = env["KUBERNETES_SERVICE_HOST"], env.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:  # IPv6
        host = f"[{host}]"
    ca = sa / "ca.crt"
    try:
        ctx = ssl.create_default_context(cafile=str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"in-cluster CA {ca}: {exc}") from exc
    namespace = "default"
    with contextlib.suppress(OSError):
        namespace = (sa / "namespace").read_text().strip() or namespace
    return ClusterConfig(f"https://{host}:{port}", ctx, TokenFile(sa / "token"), namespace, "in-cluster")


def _named(doc: Mapping[str, Any], section: str, name: str, path: Path) -> Mapping[str, Any]:
    for item in doc.get(section) or []:
        if isinstance(item, Mapping) and item.get("name") == name:
            body = item.get(section[:-1])
            return body if isinstance(body, Mapping) else {}
    raise ConfigError(f"{path}: {section} has no entry named {name!r}")


def _data(value: Any, what: str, path: Path) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except ValueError as exc:
        raise ConfigError(f"{path}: {what} is not base64") from exc


def from_kubeconfig(path: Path) -> ClusterConfig:
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"kubeconfig {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"kubeconfig {path}: not YAML: {exc}") from exc
    if not isinstance(doc, Mapping):
        raise ConfigError(f"kubeconfig {path}: not a mapping")
    current = doc.get("current-context")
    if not current:
        raise ConfigError(f"kubeconfig {path}: no current-context")
    ctx = _named(doc, "contexts", str(current), path)
    cluster = _named(doc, "clusters", str(ctx.get("cluster")), path)
    user = _named(doc, "users", str(ctx.get("user")), path) if ctx.get("user") else {}
    server = str(cluster.get("server") or "").rstrip("/")
    if not server.startswith(("https://", "http://")):
        raise ConfigError(f"kubeconfig {path}: cluster {ctx.get('cluster')!r} has no http(s) server")
    base = path.parent
    verify: ssl.SSLContext | bool
    if cluster.get("insecure-skip-tls-verify"):
        verify = False
    else:
        cadata = None
        cafile = None
        if cluster.get("certificate-authority-data"):
            cadata = _data(cluster["certificate-authority-data"], "certificate-authority-data", path).decode()
        elif cluster.get("certificate-authority"):
            cafile = str(base / str(cluster["certificate-authority"]))
        try:
            verify = ssl.create_default_context(cafile=cafile, cadata=cadata)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"kubeconfig {path}: the cluster's certificate authority: {exc}") from exc
    for unsupported in ("exec", "auth-provider"):
        if user.get(unsupported):
            raise ConfigError(
                f"kubeconfig {path}: user {ctx.get('user')!r} uses {unsupported}: not supported"
            )
    if isinstance(verify, ssl.SSLContext):
        _client_certificate(verify, user, base, path)
    token: Callable[[], str] | None = None
    if user.get("token"):
        value = str(user["token"])
        token = _Constant(value)
    elif user.get("tokenFile"):
        token = TokenFile(base / str(user["tokenFile"]))
    namespace = str(ctx.get("namespace") or "default")
    sni = str(cluster["tls-server-name"]) if cluster.get("tls-server-name") else None
    return ClusterConfig(server, verify, token, namespace, str(path), sni)


class _Constant:
    def __init__(self, value: str) -> None:
        self._value = value

    def __call__(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "<token>"


def _client_certificate(ctx: ssl.SSLContext, user: Mapping[str, Any], base: Path, path: Path) -> None:
    cert, key = user.get("client-certificate-data"), user.get("client-key-data")
    if cert and key:
        # ssl loads a certificate chain only from files: a private directory, removed at once.
        with tempfile.TemporaryDirectory(prefix="kubecfg-") as d:
            cf, kf = Path(d) / "c.pem", Path(d) / "k.pem"
            cf.write_bytes(_data(cert, "client-certificate-data", path))
            kf.touch(mode=0o600)
            kf.write_bytes(_data(key, "client-key-data", path))
            _load_chain(ctx, cf, kf, path)
    elif user.get("client-certificate") and user.get("client-key"):
        _load_chain(ctx, base / str(user["client-certificate"]), base / str(user["client-key"]), path)


def _load_chain(ctx: ssl.SSLContext, cert: Path, key: Path, path: Path) -> None:
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"kubeconfig {path}: client certificate: {type(exc).__name__}") from None
