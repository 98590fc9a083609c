"""gwkit.kube against the Kubernetes API emulator (real HTTPS) with the kubeconfigs clouds hand out: an exec
plugin (a real program) whose token expires, a client certificate the server checks, a KUBECONFIG pair with
a context from the second file, and a proxy-url through a real HTTP CONNECT proxy.

The emulator authenticates by bearer token only; for the client-certificate tests its TLS context is made
to require a certificate from a CA of the test's own (``require_client_certificates``), so a handshake
without one fails."""

from __future__ import annotations

import base64
import datetime
import selectors
import socket
import socketserver
import ssl
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gwkit.kube import KubeClient, Unauthenticated, Unreachable, load
from gwkit.kube.client import CONFIGMAPS
from gwkit.kube.config import ClusterConfig, from_kubeconfig
from gwkit.kube.credentials import ExecPlugin
from lab.kubeapi import KubeAPIThread

V1 = "client.authentication.k8s.io/v1"
MASTERS = ("system:masters",)

PLUGIN = textwrap.dedent(
    """\
    import json, os, pathlib, sys
    state = pathlib.Path(sys.argv[1])
    n = int(state.read_text()) if state.exists() else 0
    state.write_text(str(n + 1))
    if os.environ.get("FAIL"):
        print("the plugin's complaint", file=sys.stderr)
        sys.exit(3)
    info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
    assert info["spec"]["interactive"] is False and not sys.stdin.isatty(), "never interactive"
    status = {"token": os.environ["TOKENS"].split(",")[n]}
    expiry = os.environ.get("EXPIRIES", "").split(",")[n] if os.environ.get("EXPIRIES") else ""
    if expiry:
        status["expirationTimestamp"] = expiry
    if os.environ.get("CERT"):
        status["clientCertificateData"] = pathlib.Path(os.environ["CERT"]).read_text()
        status["clientKeyData"] = pathlib.Path(os.environ["KEY"]).read_text()
    print(json.dumps({"apiVersion": "@V1@", "kind": "ExecCredential", "status": status}))
    """
).replace("@V1@", V1)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeAPIThread]:
    with KubeAPIThread(kubeconfig=tmp_path / "admin.kubeconfig") as a:
        yield a


def emulator_cluster(api: KubeAPIThread) -> dict[str, Any]:
    admin = yaml.safe_load(api.kubeconfig.read_text())
    cluster: dict[str, Any] = admin["clusters"][0]["cluster"]
    return cluster


def kubeconfig(
    path: Path, cluster: dict[str, Any], user: dict[str, Any], context: str = "ctx", current: bool = True
) -> Path:
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": f"{context}-cluster", "cluster": cluster}],
        "users": [{"name": f"{context}-user", "user": user}],
        "contexts": [
            {"name": context, "context": {"cluster": f"{context}-cluster", "user": f"{context}-user"}}
        ],
    }
    if current:
        doc["current-context"] = context
    path.write_text(yaml.safe_dump(doc))
    return path


async def list_configmaps(config: ClusterConfig, times: int = 1) -> None:
    async with KubeClient(config, timeout=5) as kube:
        for _ in range(times):
            await kube.list(CONFIGMAPS, "default")


def users_seen(api: KubeAPIThread, since: int) -> list[str]:
    return [r.user for r in api.requests(since=since, resource="configmaps")]


# --- exec plugins ---------------------------------------------------------------------------------


def exec_user(tmp_path: Path, tokens: list[str], expiries: list[str], **env: str) -> dict[str, Any]:
    script = tmp_path / "plugin.py"
    script.write_text(PLUGIN)
    values = {"TOKENS": ",".join(tokens), "EXPIRIES": ",".join(expiries), **env}
    return {
        "exec": {
            "apiVersion": V1,
            "command": sys.executable,
            "args": [str(script), str(tmp_path / "runs")],
            "env": [{"name": k, "value": v} for k, v in values.items()],
            "interactiveMode": "IfAvailable",
            "installHint": "the test's plugin",
        }
    }


def test_an_exec_token_is_used_until_it_expires_then_the_next_one(api: KubeAPIThread, tmp_path: Path) -> None:
    tokens = [api.user_token(f"exec-{n}", MASTERS) for n in ("one", "two", "three")]
    user = exec_user(tmp_path, tokens, ["2030-01-01T00:00:00Z", "2040-01-01T00:00:00Z", ""])
    config = from_kubeconfig(kubeconfig(tmp_path / "config", emulator_cluster(api), user))
    plugin = config.token
    assert isinstance(plugin, ExecPlugin)
    clock = [datetime.datetime(2029, 6, 1, tzinfo=datetime.UTC)]
    plugin.now = lambda: clock[0]
    mark = api.reset_requests()

    async def concurrently(n: int) -> None:
        async with KubeClient(config, timeout=5) as kube, anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(kube.list, CONFIGMAPS, "default")

    anyio.run(concurrently, 8)
    assert plugin.runs == 1, "one run for the first eight requests, not one each"
    assert users_seen(api, mark) == ["exec-one"] * 8

    clock[0] = datetime.datetime(2031, 1, 1, tzinfo=datetime.UTC)  # past the first token's expiry
    anyio.run(concurrently, 8)
    assert plugin.runs == 2, "one run at the expiry for all eight requests waiting on it"
    assert users_seen(api, mark)[8:] == ["exec-two"] * 8

    # The server stops taking the second token before its expiry: one refresh, and the request is resent.
    api.inject_fault(401, count=1, resource="configmaps")
    anyio.run(list_configmaps, config)
    assert plugin.runs == 3
    assert [(r.user, r.code) for r in api.requests(since=mark, resource="configmaps")][16:] == [
        ("exec-two", 401),
        ("exec-three", 200),
    ]
    assert int((tmp_path / "runs").read_text()) == 3, "the program itself ran three times"


def test_a_failing_plugin_is_an_unauthenticated_error_naming_the_field(
    api: KubeAPIThread, tmp_path: Path
) -> None:
    user = exec_user(tmp_path, ["unused"], [], FAIL="1")
    path = kubeconfig(tmp_path / "config", emulator_cluster(api), user)
    with pytest.raises(Unauthenticated) as e:
        anyio.run(list_configmaps, from_kubeconfig(path))
    assert str(e.value).startswith(f"kubeconfig {path}: users[ctx-user].user.exec: ")
    assert f"{sys.executable!r} exited with status 3 (23 bytes on its stderr, not shown" in str(e.value)
    assert "complaint" not in str(e.value)


# --- client certificates --------------------------------------------------------------------------


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def client_pki(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A CA, and a client certificate and key it signed: (ca.pem, client.pem, client.key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("test-client-ca"))
        .issuer_name(_name("test-client-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("tester"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    paths = (tmp_path / "ca.pem", tmp_path / "client.pem", tmp_path / "client.key")
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(cert.public_bytes(pem))
    paths[2].write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    paths[2].chmod(0o600)
    return paths


def require_client_certificates(api: KubeAPIThread, ca: Path) -> None:
    def harden() -> None:
        ctx: ssl.SSLContext = api.api._ssl  # type: ignore[union-attr]
        ctx.load_verify_locations(cafile=str(ca))
        ctx.verify_mode = ssl.CERT_REQUIRED

    api.call(harden)


def test_a_client_certificate_from_data_files_or_a_plugin_passes_the_servers_check(
    api: KubeAPIThread, tmp_path: Path
) -> None:
    ca, cert, key = client_pki(tmp_path)
    require_client_certificates(api, ca)
    token = api.admin_token
    cluster = emulator_cluster(api)

    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    without = kubeconfig(tmp_path / "without", cluster, {"token": token})
    with pytest.raises(Unreachable):
        anyio.run(list_configmaps, from_kubeconfig(without))

    data = {"token": token, "client-certificate-data": b64(cert), "client-key-data": b64(key)}
    anyio.run(list_configmaps, from_kubeconfig(kubeconfig(tmp_path / "data", cluster, data)))
    files = {"token": token, "client-certificate": cert.name, "client-key": key.name}  # relative to the file
    anyio.run(list_configmaps, from_kubeconfig(kubeconfig(tmp_path / "files", cluster, files)))
    plugin = exec_user(tmp_path, [token], [""], CERT=str(cert), KEY=str(key))
    anyio.run(list_configmaps, from_kubeconfig(kubeconfig(tmp_path / "plugin", cluster, plugin)))


# --- merged KUBECONFIG and a context ---------------------------------------------------------------


def test_a_kubeconfig_list_with_a_context_from_the_second_file(api: KubeAPIThread, tmp_path: Path) -> None:
    token = api.user_token("second-file", MASTERS)
    unreachable = {"server": "https://127.0.0.1:9", "certificate-authority-data": emulator_cluster(api)[
        "certificate-authority-data"]}  # fmt: skip
    first = kubeconfig(tmp_path / "first", unreachable, {"token": "not-this-one"}, context="first")
    second = kubeconfig(
        tmp_path / "second", emulator_cluster(api), {"token": token}, context="emu", current=False
    )
    env = {"KUBECONFIG": f"{first}:{tmp_path / 'absent'}:{second}"}
    assert load(environ=env).server == "https://127.0.0.1:9", "current-context: the first file's"
    config = load(environ=env, context="emu")
    mark = api.reset_requests()
    anyio.run(list_configmaps, config)
    assert users_seen(api, mark) == ["second-file"]
    assert config.source == f"{first}:{second} context=emu"


# --- proxy-url ------------------------------------------------------------------------------------


class ConnectProxy(socketserver.ThreadingTCPServer):
    """An HTTP CONNECT proxy on 127.0.0.1 that sends every tunnel to ``upstream`` whatever host it names
    (so a name that resolves nowhere proves the client went through it), recording the request lines."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.seen: list[str] = []
        super().__init__(("127.0.0.1", 0), _Tunnel)


class _Tunnel(socketserver.BaseRequestHandler):
    server: ConnectProxy

    def handle(self) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.request.recv(4096)
            if not chunk:
                return
            head += chunk
        line = head.split(b"\r\n", 1)[0].decode()
        self.server.seen.append(line)
        if not line.startswith("CONNECT "):
            self.request.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            return
        with socket.create_connection(self.server.upstream) as up:
            self.request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            sel = selectors.DefaultSelector()
            sel.register(self.request, selectors.EVENT_READ, up)
            sel.register(up, selectors.EVENT_READ, self.request)
            while True:
                for key, _ in sel.select(timeout=10):
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    key.data.sendall(data)


@pytest.fixture
def proxy(api: KubeAPIThread) -> Iterator[ConnectProxy]:
    server = ConnectProxy(("127.0.0.1", int(api.url.rsplit(":", 1)[1])))
    t = threading.Thread(target=server.serve_forever, args=(0.05,), name="connect-proxy", daemon=True)
    t.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("name, works", [("kubernetes.default.svc", True), ("wrong.example", False)])
def test_proxy_url_tunnels_and_keeps_the_tls_server_name(
    api: KubeAPIThread, proxy: ConnectProxy, tmp_path: Path, name: str, works: bool
) -> None:
    port = api.url.rsplit(":", 1)[1]
    cluster = {
        **emulator_cluster(api),
        "server": f"https://api.nowhere.invalid:{port}",  # only the proxy knows where that is
        "proxy-url": f"http://127.0.0.1:{proxy.server_address[1]}",
        "tls-server-name": name,
    }
    config = from_kubeconfig(kubeconfig(tmp_path / "config", cluster, {"token": api.admin_token}))
    assert config.proxy == cluster["proxy-url"]
    if works:
        anyio.run(list_configmaps, config)
    else:
        with pytest.raises(Unreachable, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            anyio.run(list_configmaps, config)
    assert proxy.seen == [f"CONNECT api.nowhere.invalid:{port} HTTP/1.1"]


@pytest.mark.parametrize("name, works", [("kubernetes.default.svc", True), ("wrong.example", False)])
def test_tls_server_name_on_a_direct_connection(
    api: KubeAPIThread, tmp_path: Path, name: str, works: bool
) -> None:
    cluster = {**emulator_cluster(api), "tls-server-name": name}  # the server's URL: https://127.0.0.1:PORT
    config = from_kubeconfig(kubeconfig(tmp_path / "config", cluster, {"token": api.admin_token}))
    if works:
        anyio.run(list_configmaps, config)
    else:  # the certificate does cover 127.0.0.1: only the name asked for can make this fail
        with pytest.raises(Unreachable, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            anyio.run(list_configmaps, config)
