"""Where the API server is and who we are to it: in-cluster service account, or kubeconfig files.

Discovery: an explicit kubeconfig path wins (that one file, which must exist); else, inside a pod
(``KUBERNETES_SERVICE_HOST`` set and the service-account token mounted) and no ``context`` asked for, the
in-cluster config; else every file of ``$KUBECONFIG`` (missing ones skipped, as client-go does), else
``~/.kube/config``. A ``context`` (the CLIs' ``--context``) picks a context of the merged files instead
of ``current-context``; asking for one means a kubeconfig, never the in-cluster config.

Several files merge by client-go's rules (``merge``, pure): a cluster, user or context name belongs to the
first file that defines it, ``current-context`` comes from the first file that sets it, and a relative path
(``certificate-authority``, ``client-certificate``, ``client-key``, ``tokenFile``, an exec ``command`` with a
slash) is relative to the file that holds it.

What a user meets on EKS, GKE, AKS or with OIDC, as client-go's loader reads it:

* ``exec`` credential plugins (``client.authentication.k8s.io/v1`` and ``v1beta1``; ``args``, ``env``,
  ``installHint`` in the error when the command is missing, ``provideClusterInfo``; never interactive, so
  ``interactiveMode: Always`` is refused): a token and/or a client certificate, cached until
  ``expirationTimestamp`` and re-fetched once on a 401 (``gwkit.kube.credentials``);
* bearer ``token`` and ``tokenFile`` (re-read when the file changes; the file wins over ``token``, as in
  client-go), client certificates from files or ``-data``;
* the cluster's CA (file or data), ``tls-server-name``, ``proxy-url`` (http and https proxies; socks is
  refused, naming the field), ``insecure-skip-tls-verify`` (logged as a warning).

Refused by name, never silently ignored: ``auth-provider`` (client-go removed the gcp and azure providers:
use their exec plugins), ``username``/``password`` (no server since 1.19 takes them), impersonation
(``as``, ``as-groups``, ``as-uid``, ``as-user-extra``: ignoring it would act with the real identity's rights),
``exec`` together with ``token``/``tokenFile`` (client-go would send the token and never run the plugin).

Service-account tokens are re-read when the file changes (the kubelet rotates bound tokens), so a
long-running pod keeps working. Credentials never appear in an error message, a log line or a ``repr``;
errors name the file and the field.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from gwkit.kube.credentials import (
    ExecPlugin,
    StaticToken,
    TokenFile,
    exec_spec,
    load_chain,
    load_chain_data,
)
from gwkit.kube.errors import ConfigError

__all__ = [
    "ClusterConfig",
    "ConfigError",
    "Merged",
    "TokenFile",
    "from_kubeconfig",
    "in_cluster",
    "load",
    "merge",
]

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SECTIONS = ("clusters", "users", "contexts")
IMPERSONATION = ("as", "as-groups", "as-uid", "as-user-extra")


@dataclass(frozen=True)
class ClusterConfig:
    server: str
    """``https://host:port`` (no trailing slash)."""
    ssl: ssl.SSLContext | bool = field(repr=False)
    """What httpx verifies with: a context (CA, client certificate; for ``insecure-skip-tls-verify`` one
    that verifies nothing), or False."""
    token: Callable[[], str] | None = field(default=None, repr=False)
    """Asked before every request (``gwkit.kube.credentials``); "" sends no Authorization header."""
    namespace: str = "default"
    """The context's (or the service account's) namespace."""
    source: str = ""
    """Where this came from, for logs: ``in-cluster`` or the kubeconfig path(s) and context."""
    tls_server_name: str | None = None
    """The name the server's certificate must carry when it is not the URL's host."""
    proxy: str | None = field(default=None, repr=False)
    """The cluster's ``proxy-url`` (http or https); None: httpx's default (``HTTPS_PROXY``, ``NO_PROXY``)."""


def kubeconfig_paths(env: Mapping[str, str]) -> list[Path]:
    """``$KUBECONFIG``'s files in order, each once; ``~/.kube/config`` when it is unset or empty."""
    out: list[Path] = []
    for p in env.get("KUBECONFIG", "").split(os.pathsep):
        if p and Path(p) not in out:
            out.append(Path(p))
    return out or [Path(env.get("HOME") or Path.home()) / ".kube" / "config"]


def load(
    kubeconfig: Path | None = None,
    *,
    context: str | None = None,
    environ: Mapping[str, str] | None = None,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> ClusterConfig:
    env = os.environ if environ is None else environ
    if kubeconfig is not None:
        return from_kubeconfig(kubeconfig, context=context)
    # controller-runtime's order (pkg/client/config loadConfig): $KUBECONFIG, then in-cluster, then
    # ~/.kube/config; found by review: in-cluster won over a $KUBECONFIG set in a pod.
    if (
        context is None
        and not env.get("KUBECONFIG")
        and env.get("KUBERNETES_SERVICE_HOST")
        and (service_account_dir / "token").exists()
    ):
        return in_cluster(env, service_account_dir)
    paths = kubeconfig_paths(env)
    found = [p for p in paths if p.exists()]
    if not found:
        where = "KUBECONFIG=" + os.pathsep.join(map(str, paths)) if env.get("KUBECONFIG") else str(paths[0])
        pod = (
            ""
            if context is not None
            else f"not in a pod (KUBERNETES_SERVICE_HOST or {service_account_dir}/token missing) and "
        )
        raise ConfigError(
            f"no cluster configuration: {pod}no kubeconfig at {where} (--kubeconfig or KUBECONFIG)"
        )
    return from_kubeconfig(found, context=context)


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


# --- merging (pure) ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    name: str
    body: Mapping[str, Any]
    """The ``cluster``/``user``/``context`` mapping."""
    path: Path
    """The file that defined it (relative paths in it are relative to this file)."""
    section: str

    def where(self, *fields: str) -> str:
        """``kubeconfig PATH: users[NAME].user.FIELD``: how errors name a field."""
        tail = "".join(f".{f}" for f in fields)
        return f"kubeconfig {self.path}: {self.section}[{self.name}].{self.section[:-1]}{tail}"


@dataclass(frozen=True)
class Merged:
    clusters: Mapping[str, Entry]
    users: Mapping[str, Entry]
    contexts: Mapping[str, Entry]
    current_context: str
    """From the first file that sets it ("" when none does)."""
    current_context_from: Path | None
    paths: tuple[Path, ...]


def merge(files: Sequence[tuple[Path, Any]]) -> Merged:
    """client-go's merge of a KUBECONFIG list: the first file to define a name keeps it; the first file to
    set ``current-context`` decides it. ``files`` are (path, parsed YAML) in order; an empty file is fine."""
    sections: dict[str, dict[str, Entry]] = {s: {} for s in SECTIONS}
    current, current_from = "", None
    for path, doc in files:
        if doc is None:
            continue
        if not isinstance(doc, Mapping):
            raise ConfigError(f"kubeconfig {path}: not a mapping")
        for section in SECTIONS:
            items = doc.get(section) or []
            if not isinstance(items, list):
                raise ConfigError(f"kubeconfig {path}: {section}: not a list")
            for i, item in enumerate(items):
                if not isinstance(item, Mapping) or not item.get("name"):
                    raise ConfigError(f"kubeconfig {path}: {section}[{i}]: no name")
                name = str(item["name"])
                body = item.get(section[:-1]) or {}
                if not isinstance(body, Mapping):
                    raise ConfigError(f"kubeconfig {path}: {section}[{name}].{section[:-1]}: not a mapping")
                sections[section].setdefault(name, Entry(name, body, path, section))
        if not current and doc.get("current-context"):
            current, current_from = str(doc["current-context"]), path
    return Merged(
        sections["clusters"], sections["users"], sections["contexts"], current, current_from,
        tuple(p for p, _ in files),
    )  # fmt: skip


@dataclass(frozen=True)
class Selected:
    context: Entry
    cluster: Entry
    user: Entry | None


def select(merged: Merged, context: str | None) -> Selected:
    """The context (``context``, else ``current-context``), its cluster and its user; errors name where."""
    files = ", ".join(map(str, merged.paths))
    name = context or merged.current_context
    if not name:
        raise ConfigError(f"kubeconfig {files}: no current-context (pass --context)")
    ctx = merged.contexts.get(name)
    if ctx is None:
        said = "--context" if context else f"current-context (in {merged.current_context_from})"
        raise ConfigError(f"kubeconfig {files}: {said} names {name!r}, which no file defines under contexts")
    cluster_name = str(ctx.body.get("cluster") or "")
    cluster = merged.clusters.get(cluster_name)
    if cluster is None:
        raise ConfigError(
            f"{ctx.where('cluster')}: {cluster_name!r} is not defined under clusters in {files}"
        )
    user = None
    if ctx.body.get("user"):
        user = merged.users.get(str(ctx.body["user"]))
        if user is None:
            raise ConfigError(
                f"{ctx.where('user')}: {ctx.body['user']!r} is not defined under users in {files}"
            )
    return Selected(ctx, cluster, user)


# --- building a ClusterConfig (files, ssl) ----------------------------------------------------------


def _data(value: Any, where: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except ValueError:
        raise ConfigError(f"{where}: not base64") from None


def _read(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"kubeconfig {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        # Where, never the snippet PyYAML quotes: the line may hold a token (found by review).
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"kubeconfig {path}: not YAML{at}") from None


def from_kubeconfig(paths: Path | Sequence[Path], *, context: str | None = None) -> ClusterConfig:
    files = [paths] if isinstance(paths, Path) else list(paths)
    sel = select(merge([(p, _read(p)) for p in files]), context)
    cluster, user = sel.cluster, sel.user
    c = cluster.body
    server = str(c.get("server") or "").rstrip("/")
    if not server.startswith(("https://", "http://")):
        raise ConfigError(f"{cluster.where('server')}: {server or '(missing)'!r} is not an http(s) URL")
    proxy = _proxy(c.get("proxy-url"), cluster)
    verify = _verify(cluster)
    u: Mapping[str, Any] = user.body if user is not None else {}
    token: Callable[[], str] | None = None
    if user is not None:
        _refuse(user)
        _client_certificate(verify, user)
        if u.get("tokenFile"):
            token = TokenFile(user.path.parent / str(u["tokenFile"]))
        elif u.get("token"):
            token = StaticToken(str(u["token"]))
        if u.get("exec"):
            if u.get("token") or u.get("tokenFile"):
                # client-go sends the static token and never runs the plugin; say so rather than guess
                raise ConfigError(f"{user.where('exec')}: set together with token or tokenFile: keep one")
            spec = exec_spec(u["exec"], user.where("exec"), user.path.parent)
            token = ExecPlugin(spec, verify, _exec_cluster(c, cluster))
    namespace = str(sel.context.body.get("namespace") or "default")
    sni = str(c["tls-server-name"]) if c.get("tls-server-name") else None
    source = f"{os.pathsep.join(map(str, files))} context={sel.context.name}"
    return ClusterConfig(server, verify, token, namespace, source, sni, proxy)


def _proxy(value: Any, cluster: Entry) -> str | None:
    if not value:
        return None
    url = str(value)
    scheme = urlsplit(url).scheme.lower()
    if scheme.startswith("socks"):
        raise ConfigError(
            f"{cluster.where('proxy-url')}: {scheme} proxies are not supported (http and https are)"
        )
    if scheme not in ("http", "https") or not urlsplit(url).hostname:
        raise ConfigError(f"{cluster.where('proxy-url')}: not an http(s) proxy URL")
    return url


def _verify(cluster: Entry) -> ssl.SSLContext:
    c = cluster.body
    if c.get("insecure-skip-tls-verify"):
        log.warning(
            "kube.insecure file=%s cluster=%s: the API server's certificate is NOT verified "
            "(insecure-skip-tls-verify)",
            cluster.path,
            cluster.name,
        )
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    cadata, cafile = None, None
    if c.get("certificate-authority-data"):
        cadata = _data(c["certificate-authority-data"], cluster.where("certificate-authority-data")).decode()
    elif c.get("certificate-authority"):
        cafile = str(cluster.path.parent / str(c["certificate-authority"]))
    name = str(c["tls-server-name"]) if c.get("tls-server-name") else ""
    try:
        if not name:
            return ssl.create_default_context(cafile=cafile, cadata=cadata)
        ctx = ServerNameContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.server_name = name
        ctx.verify_flags = ssl.create_default_context().verify_flags
        if cafile or cadata:
            ctx.load_verify_locations(cafile=cafile, cadata=cadata)
        else:
            ctx.load_default_certs()
        return ctx
    except (OSError, ssl.SSLError) as exc:
        field_ = "certificate-authority-data" if cadata else "certificate-authority"
        raise ConfigError(f"{cluster.where(field_)}: {exc}") from exc


class ServerNameContext(ssl.SSLContext):
    """A client context that sends and verifies ``server_name`` whatever host it is asked to connect to:
    the cluster's ``tls-server-name``. httpx's ``sni_hostname`` extension does this on a direct
    connection, but httpcore drops it inside an HTTP proxy's CONNECT tunnel (it wraps with the URL's host,
    httpcore 1.0.9 ``http_proxy.py``): there the certificate would be checked against the wrong name."""

    server_name = ""

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        return super().wrap_bio(incoming, outgoing, server_side, self.server_name or server_hostname, session)


def _exec_cluster(c: Mapping[str, Any], cluster: Entry) -> dict[str, Any]:
    """The cluster as ``KUBERNETES_EXEC_INFO`` gives it to a plugin with ``provideClusterInfo``."""
    out: dict[str, Any] = {"server": str(c.get("server") or "")}
    for key in ("tls-server-name", "insecure-skip-tls-verify", "certificate-authority-data", "proxy-url"):
        if c.get(key):
            out[key] = c[key]
    if not c.get("certificate-authority-data") and c.get("certificate-authority"):
        with contextlib.suppress(OSError):
            ca = (cluster.path.parent / str(c["certificate-authority"])).read_bytes()
            out["certificate-authority-data"] = base64.b64encode(ca).decode()
    ext = c.get("extensions")
    if isinstance(ext, list):
        for item in ext:
            if isinstance(item, Mapping) and item.get("name") == "client.authentication.k8s.io/exec":
                out["config"] = item.get("extension")
    return out


def _refuse(user: Entry) -> None:
    u = user.body
    if u.get("auth-provider"):
        provider = u["auth-provider"].get("name") if isinstance(u["auth-provider"], Mapping) else None
        raise ConfigError(
            f"{user.where('auth-provider')}: {provider or 'auth-provider'!r} is not supported "
            "(client-go removed the gcp and azure providers): use an exec credential plugin instead "
            "(gke-gcloud-auth-plugin, kubelogin, kubectl oidc-login)"
        )
    if u.get("username") or u.get("password"):
        raise ConfigError(
            f"{user.where('username')}: basic authentication is not supported "
            "(no API server since 1.19 takes it)"
        )
    for key in IMPERSONATION:
        if u.get(key):
            raise ConfigError(f"{user.where(key)}: impersonation is not supported")


def _client_certificate(ctx: ssl.SSLContext, user: Entry) -> None:
    u = user.body
    cert, key = u.get("client-certificate-data"), u.get("client-key-data")
    cert_file, key_file = u.get("client-certificate"), u.get("client-key")
    if bool(cert or cert_file) != bool(key or key_file):
        missing = "client-key(-data)" if cert or cert_file else "client-certificate(-data)"
        raise ConfigError(f"{user.where(missing)}: missing (a client certificate needs both)")
    if cert_file and key_file and not cert and not key:
        base = user.path.parent
        load_chain(ctx, base / str(cert_file), base / str(key_file), user.where("client-certificate"))
    elif cert or cert_file:
        load_chain_data(
            ctx,
            _bytes(user, "client-certificate"),
            _bytes(user, "client-key"),
            user.where("client-certificate-data" if cert else "client-certificate"),
        )


def _bytes(user: Entry, name: str) -> bytes:
    """``NAME-data`` decoded, else the file ``NAME`` (data wins, as in client-go)."""
    if user.body.get(f"{name}-data"):
        return _data(user.body[f"{name}-data"], user.where(f"{name}-data"))
    path = user.path.parent / str(user.body[name])
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{user.where(name)}: {path}: {exc.strerror or exc}") from None
