"""gwkit.kube.config and .credentials without a server: client-go's merge of KUBECONFIG lists, context
selection, the exec plugin's cache (one run per expiry, one refresh per 401) with a fake runner and clock,
and the refusals, each naming the file and the field and never a secret."""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from gwkit.kube.config import ClusterConfig, ConfigError, Merged, from_kubeconfig, load, merge, select
from gwkit.kube.credentials import (
    Credential,
    ExecPlugin,
    ExecSpec,
    StaticToken,
    TokenFile,
    exec_info,
    exec_spec,
    parse_credential,
)

SECRET = "s3cr3t-token-value"  # noqa: S105 (a marker that must never show up)
V1 = "client.authentication.k8s.io/v1"


def doc(
    clusters: dict[str, dict[str, Any]] | None = None,
    users: dict[str, dict[str, Any]] | None = None,
    contexts: dict[str, dict[str, Any]] | None = None,
    current: str | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "clusters": [{"name": n, "cluster": c} for n, c in (clusters or {}).items()],
        "users": [{"name": n, "user": u} for n, u in (users or {}).items()],
        "contexts": [{"name": n, "context": c} for n, c in (contexts or {}).items()],
    }
    if current is not None:
        out["current-context"] = current
    return out


def write(path: Path, content: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(content))
    return path


# --- merge and select (pure) ------------------------------------------------------------------------


def test_the_first_file_to_define_a_name_keeps_it() -> None:
    a, b = Path("/a/config"), Path("/b/config")
    m = merge(
        [
            (a, doc(clusters={"shared": {"server": "https://a"}}, users={"u": {"token": "from-a"}})),
            (b, doc(clusters={"shared": {"server": "https://b"}, "only-b": {"server": "https://ob"}})),
        ]
    )
    assert m.clusters["shared"].body["server"] == "https://a"
    assert m.clusters["shared"].path == a
    assert m.clusters["only-b"].path == b, "a name only the second file has comes from it"
    assert m.users["u"].path == a


@pytest.mark.parametrize(
    "currents, want",
    [
        pytest.param([None, "two", "three"], "two", id="first-that-sets-it"),
        pytest.param(["one", "two"], "one", id="first-file"),
        pytest.param(["", None], "", id="none"),
    ],
)
def test_current_context_comes_from_the_first_file_that_sets_it(
    currents: list[str | None], want: str
) -> None:
    m = merge([(Path(f"/f{i}"), doc(current=c)) for i, c in enumerate(currents)])
    assert m.current_context == want


def test_an_empty_file_in_the_list_is_fine() -> None:
    m = merge([(Path("/empty"), None), (Path("/b"), doc(current="x"))])
    assert m.current_context == "x"


def merged_pair() -> Merged:
    return merge(
        [
            (
                Path("/a/config"),
                doc(
                    clusters={"ca": {"server": "https://a"}},
                    users={"ua": {"token": "a"}},
                    contexts={"a": {"cluster": "ca", "user": "ua"}},
                    current="a",
                ),
            ),
            (
                Path("/b/config"),
                doc(
                    clusters={"cb": {"server": "https://b"}},
                    users={"ub": {"token": "b"}},
                    contexts={"b": {"cluster": "cb", "user": "ub", "namespace": "nb"}},
                ),
            ),
        ]
    )


def test_select_takes_the_current_context_or_the_one_asked_for() -> None:
    m = merged_pair()
    assert select(m, None).cluster.name == "ca"
    got = select(m, "b")
    assert (got.context.name, got.cluster.name, got.user and got.user.name) == ("b", "cb", "ub")


@pytest.mark.parametrize(
    "context, message",
    [
        pytest.param(
            "nope", "--context names 'nope', which no file defines under contexts", id="unknown-context"
        ),
    ],
)
def test_select_errors_name_the_files(context: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        select(merged_pair(), context)
    assert message in str(e.value)
    assert "/a/config, /b/config" in str(e.value)


def test_a_context_whose_cluster_is_missing_names_the_field() -> None:
    m = merge([(Path("/c"), doc(contexts={"x": {"cluster": "gone"}}, current="x"))])
    with pytest.raises(ConfigError, match=r"kubeconfig /c: contexts\[x\]\.context\.cluster: 'gone'"):
        select(m, None)


# --- loading files --------------------------------------------------------------------------------


def test_relative_paths_are_relative_to_the_file_that_holds_them(tmp_path: Path) -> None:
    (tmp_path / "b" / "tok").parent.mkdir(parents=True)
    (tmp_path / "b" / "tok").write_text("from-b-dir\n")
    a = write(
        tmp_path / "a" / "config",
        doc(contexts={"x": {"cluster": "c", "user": "u"}}, current="x"),
    )
    b = write(
        tmp_path / "b" / "config",
        doc(clusters={"c": {"server": "https://b.example:6443/"}}, users={"u": {"tokenFile": "tok"}}),
    )
    cfg = load(environ={"KUBECONFIG": f"{a}:{tmp_path / 'missing'}:{b}"})
    assert cfg.server == "https://b.example:6443"
    assert cfg.token is not None and cfg.token() == "from-b-dir"
    assert str(a) in cfg.source and "context=x" in cfg.source


def test_a_context_never_means_in_cluster(tmp_path: Path) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t")
    kc = write(
        tmp_path / "config",
        doc(clusters={"c": {"server": "https://k"}}, contexts={"x": {"cluster": "c"}}),
    )
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBECONFIG": str(kc)}
    assert load(environ=env, context="x", service_account_dir=sa).server == "https://k"
    with pytest.raises(ConfigError, match="in-cluster CA"):  # no ca.crt here: but it was in-cluster it tried
        load(environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOME": str(tmp_path)}, service_account_dir=sa)


def test_kubeconfig_from_the_environment_wins_over_in_cluster_as_in_controller_runtime(
    tmp_path: Path,
) -> None:
    """controller-runtime's loadConfig: --kubeconfig, $KUBECONFIG, in-cluster, ~/.kube/config (found by
    review: in-cluster won over $KUBECONFIG set in a pod)."""
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t")
    kc = write(
        tmp_path / "config",
        doc(clusters={"c": {"server": "https://k"}}, contexts={"x": {"cluster": "c"}}, current="x"),
    )
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBECONFIG": str(kc)}
    assert load(environ=env, service_account_dir=sa).server == "https://k"


def test_a_kubeconfig_that_is_not_yaml_says_where_and_never_quotes_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "config"
    bad.write_text("users:\n- name: u\n  user:\n    token: abc: SECRETTOKEN123: x\n")
    with pytest.raises(ConfigError) as err:
        from_kubeconfig(bad)
    assert "not YAML at line 4" in str(err.value) and "SECRETTOKEN123" not in str(err.value)
    assert err.value.__cause__ is None and err.value.__suppress_context__, (
        "a traceback would print the snippet"
    )


def test_no_file_at_all_says_where_it_looked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"no kubeconfig at KUBECONFIG={tmp_path}/x:{tmp_path}/y"):
        load(environ={"KUBECONFIG": f"{tmp_path}/x:{tmp_path}/y"}, service_account_dir=tmp_path)


def test_token_file_wins_over_token_as_in_client_go(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text("file")
    kc = write(
        tmp_path / "config",
        doc(
            clusters={"c": {"server": "https://k"}},
            users={"u": {"token": "inline", "tokenFile": "tok"}},
            contexts={"x": {"cluster": "c", "user": "u"}},
            current="x",
        ),
    )
    cfg = from_kubeconfig(kc)
    assert cfg.token is not None and cfg.token() == "file"


def test_proxy_url_and_tls_server_name_reach_the_config(tmp_path: Path) -> None:
    kc = write(
        tmp_path / "config",
        doc(
            clusters={
                "c": {
                    "server": "https://[fd00::1]:6443",
                    "proxy-url": "http://proxy.example:3128",
                    "tls-server-name": "kubernetes.default.svc",
                }
            },
            contexts={"x": {"cluster": "c"}},
            current="x",
        ),
    )
    cfg = from_kubeconfig(kc)
    assert (cfg.server, cfg.proxy, cfg.tls_server_name) == (
        "https://[fd00::1]:6443",
        "http://proxy.example:3128",
        "kubernetes.default.svc",
    )


def test_insecure_skip_tls_verify_verifies_nothing_and_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kc = write(
        tmp_path / "config",
        doc(
            clusters={"c": {"server": "https://k", "insecure-skip-tls-verify": True}},
            contexts={"x": {"cluster": "c"}},
            current="x",
        ),
    )
    cfg = from_kubeconfig(kc)
    assert isinstance(cfg.ssl, ssl.SSLContext)
    assert cfg.ssl.verify_mode == ssl.CERT_NONE and not cfg.ssl.check_hostname
    assert any("kube.insecure" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)


REFUSALS = [
    pytest.param(
        {"auth-provider": {"name": "gcp", "config": {"access-token": SECRET}}},
        {},
        r"users\[u\]\.user\.auth-provider: 'gcp' is not supported .*use an exec credential plugin",
        id="auth-provider",
    ),
    pytest.param(
        {"exec": {"apiVersion": "client.authentication.k8s.io/v1alpha1", "command": "x"}},
        {},
        r"users\[u\]\.user\.exec\.apiVersion: 'client.authentication.k8s.io/v1alpha1' is not supported",
        id="exec-v1alpha1",
    ),
    pytest.param(
        {"exec": {"apiVersion": V1, "command": "x", "interactiveMode": "Always"}},
        {},
        r"users\[u\]\.user\.exec\.interactiveMode: 'Always'",
        id="exec-interactive-always",
    ),
    pytest.param(
        {"exec": {"apiVersion": V1, "command": "x"}},
        {},
        r"users\[u\]\.user\.exec\.interactiveMode: required by client.authentication.k8s.io/v1",
        id="exec-v1-without-interactive-mode",
    ),
    pytest.param(
        {"token": SECRET},
        {"proxy-url": "socks5://127.0.0.1:1080"},
        r"clusters\[c\]\.cluster\.proxy-url: socks5 proxies are not supported \(http and https are\)",
        id="socks-proxy",
    ),
    pytest.param(
        {"token": SECRET, "exec": {"apiVersion": V1, "command": "x", "interactiveMode": "Never"}},
        {},
        r"users\[u\]\.user\.exec: set together with token or tokenFile: keep one",
        id="exec-and-token",
    ),
    pytest.param(
        {"username": "admin", "password": SECRET},
        {},
        r"users\[u\]\.user\.username: basic authentication is not supported",
        id="basic-auth",
    ),
    pytest.param(
        {"token": SECRET, "as": "system:admin"},
        {},
        r"users\[u\]\.user\.as: impersonation is not supported",
        id="impersonation",
    ),
    pytest.param(
        {"client-certificate-data": "QUJD"},
        {},
        r"users\[u\]\.user\.client-key\(-data\): missing",
        id="certificate-without-key",
    ),
    pytest.param(
        {"client-certificate-data": "QUJD", "client-key-data": "QUJD"},
        {},
        r"users\[u\]\.user\.client-certificate-data: SSLError",
        id="certificate-unusable",
    ),
]


@pytest.mark.parametrize("user, cluster, message", REFUSALS)
def test_refusals_name_the_file_and_field_and_no_secret(
    tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any], message: str
) -> None:
    kc = write(
        tmp_path / "config",
        doc(
            clusters={"c": {"server": "https://k", **cluster}},
            users={"u": user},
            contexts={"x": {"cluster": "c", "user": "u"}},
            current="x",
        ),
    )
    with pytest.raises(ConfigError) as e:
        from_kubeconfig(kc)
    assert str(e.value).startswith(f"kubeconfig {kc}: ")
    assert e.match(message)
    assert SECRET not in str(e.value)


# --- exec plugins ---------------------------------------------------------------------------------


def spec(**kw: Any) -> ExecSpec:
    raw = {"apiVersion": V1, "command": "plugin", "interactiveMode": "Never", **kw}
    return exec_spec(raw, "kubeconfig /k: users[u].user.exec", Path("/k"))


def credential(token: str, expires: datetime | None, version: str = V1) -> bytes:
    status: dict[str, Any] = {"token": token}
    if expires is not None:
        status["expirationTimestamp"] = expires.strftime("%Y-%m-%dT%H:%M:%SZ")
    return json.dumps({"apiVersion": version, "kind": "ExecCredential", "status": status}).encode()


class Clock:
    def __init__(self) -> None:
        self.t = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.t


def scripted(
    outputs: list[bytes], calls: list[dict[str, str]]
) -> Callable[[list[str], dict[str, str]], bytes]:
    def run(argv: list[str], env: dict[str, str]) -> bytes:
        calls.append(env)
        return outputs[len(calls) - 1]

    return run


def test_exec_runs_once_per_expiry_not_per_request() -> None:
    clock = Clock()
    calls: list[dict[str, str]] = []
    outputs = [
        credential("one", clock.t + timedelta(minutes=15)),
        credential("two", clock.t + timedelta(hours=1)),
    ]
    plugin = ExecPlugin(spec(), ssl.create_default_context(), run=scripted(outputs, calls), now=clock)
    assert plugin.cached() is None, "nothing yet: the client would ask in a thread"
    assert [plugin() for _ in range(5)] == ["one"] * 5
    assert len(calls) == 1 and plugin.cached() == "one"
    clock.t += timedelta(minutes=15)  # expiry reached: expired (client-go: now.After(exp) is false at ==)
    assert plugin.cached() is None
    assert [plugin() for _ in range(5)] == ["two"] * 5
    assert len(calls) == 2


def test_exec_refresh_after_401_runs_once_for_all_waiting_requests() -> None:
    clock = Clock()
    calls: list[dict[str, str]] = []
    outputs = [credential("one", None), credential("two", None), credential("two", None)]
    plugin = ExecPlugin(spec(), ssl.create_default_context(), run=scripted(outputs, calls), now=clock)
    assert plugin() == "one"
    assert plugin() == "one", "no expiry: cached until the server refuses it"
    assert plugin.refresh("one") is True
    assert plugin.refresh("one") is True, "a second 401 for the old token: another request already refreshed"
    assert len(calls) == 2 and plugin() == "two"
    assert plugin.refresh("two") is False, "the plugin gave the same token again: no point resending"


def test_exec_env_args_and_exec_info() -> None:
    calls: list[dict[str, str]] = []
    s = spec(
        env=[{"name": "AWS_PROFILE", "value": "prod"}], args=["eks", "get-token"], provideClusterInfo=True
    )
    assert s.args == ("eks", "get-token")
    plugin = ExecPlugin(
        s,
        ssl.create_default_context(),
        {"server": "https://k"},
        run=scripted([credential("t", None)], calls),
        environ={"PATH": "/bin"},
    )
    plugin()
    env = calls[0]
    assert env["AWS_PROFILE"] == "prod" and env["PATH"] == "/bin"
    info = json.loads(env["KUBERNETES_EXEC_INFO"])
    assert info == {
        "apiVersion": V1,
        "kind": "ExecCredential",
        "spec": {"interactive": False, "cluster": {"server": "https://k"}},
    }
    assert "cluster" not in json.loads(exec_info(spec(), {"server": "x"}))["spec"], "only when asked for"
    assert "prod" not in repr(s) and "prod" not in repr(plugin)


def test_a_command_with_a_slash_is_relative_to_its_kubeconfig() -> None:
    raw = {"apiVersion": V1, "command": "./bin/plugin", "interactiveMode": "IfAvailable"}
    assert exec_spec(raw, "w", Path("/etc/kube")).command == "/etc/kube/bin/plugin"
    raw["command"] = "aws"
    assert exec_spec(raw, "w", Path("/etc/kube")).command == "aws", "a bare name is looked up on PATH"


@pytest.mark.parametrize(
    "output, message",
    [
        pytest.param(b"token=" + SECRET.encode(), "is not JSON", id="not-json"),
        pytest.param(
            credential(SECRET, None, "client.authentication.k8s.io/v1beta1"), "has apiVersion", id="version"
        ),
        pytest.param(
            json.dumps(
                {"apiVersion": V1, "kind": "ExecCredential", "status": {"clientKeyData": SECRET}}
            ).encode(),
            "only one of clientCertificateData and clientKeyData",
            id="key-without-cert",
        ),
        pytest.param(
            json.dumps({"apiVersion": V1, "kind": "ExecCredential", "status": {}}).encode(),
            "neither a token nor",
            id="empty-status",
        ),
        pytest.param(
            json.dumps(
                {
                    "apiVersion": V1,
                    "kind": "ExecCredential",
                    "status": {"token": SECRET, "expirationTimestamp": "soon"},
                }
            ).encode(),
            "expirationTimestamp is not an RFC 3339 time",
            id="bad-expiry",
        ),
    ],
)
def test_bad_plugin_output_is_named_without_its_content(output: bytes, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_credential(output, spec())
    assert message in str(e.value)
    assert str(e.value).startswith("kubeconfig /k: users[u].user.exec: the output of 'plugin'")
    assert SECRET not in str(e.value)


def test_missing_command_gives_the_install_hint() -> None:
    plugin = ExecPlugin(
        spec(command="no-such-plugin-here", installHint="Install it with: apt install the-plugin"),
        ssl.create_default_context(),
        environ={"PATH": "/nonexistent"},
    )
    with pytest.raises(ConfigError) as e:
        plugin()
    assert str(e.value) == (
        "kubeconfig /k: users[u].user.exec.command: 'no-such-plugin-here' not found on PATH. "
        "Install it with: apt install the-plugin"
    )


def test_no_repr_shows_a_secret(tmp_path: Path) -> None:
    (tmp_path / "tok").write_text(SECRET)
    kc = write(
        tmp_path / "config",
        doc(
            clusters={"c": {"server": "https://k"}},
            users={"u": {"token": SECRET}},
            contexts={"x": {"cluster": "c", "user": "u"}},
            current="x",
        ),
    )
    cfg = from_kubeconfig(kc)
    proxied = ClusterConfig("https://k", False, proxy=f"http://user:{SECRET}@proxy:3128")
    for text in (
        repr(proxied),
        repr(cfg),
        repr(cfg.token),
        repr(StaticToken(SECRET)),
        repr(TokenFile(tmp_path / "tok")),
        repr(Credential(SECRET, b"c", SECRET.encode())),
    ):
        assert SECRET not in text, text


def test_token_file_refresh_rereads_even_an_unchanged_stamp(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("one")
    tf = TokenFile(f)
    assert tf() == "one"
    st = f.stat()
    f.write_text("two")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # same inode and mtime: the stamp did not move
    assert tf() == "one"
    assert tf.refresh("one") is True and tf() == "two"
    assert tf.refresh("two") is False


# --- the command lines ----------------------------------------------------------------------------


def test_every_command_that_takes_a_kubeconfig_takes_a_context(tmp_path: Path) -> None:
    from agent.__main__ import parse_settings
    from controller.__main__ import build_parser

    parser = build_parser()
    assert parser.parse_args(["run", "--context", "eks-prod"]).context == "eks-prod"
    assert parser.parse_args(["adopt", "ns/gw", "port-id", "--context", "gke"]).context == "gke"
    assert parser.parse_args(["run"]).context is None
    argv = [
        "--plan",
        str(tmp_path / "p.json"),
        "--secrets-dir",
        str(tmp_path),
        "--kube-status",
        "--context",
        "aks",
    ]
    settings, _, _ = parse_settings(argv)
    assert settings.kube_context == "aks"


def test_the_controller_counts_a_missing_credential_as_such() -> None:
    from controller.run import Metrics
    from gwkit.kube import Unauthenticated, Unreachable

    m = Metrics()
    m.api_error("configmaps", Unauthenticated("kubeconfig /k: users[u].user.exec: ..."))
    m.api_error("configmaps", Unreachable("GET /: timed out"))
    value = m.registry.get_sample_value
    labels = {"resource": "configmaps"}
    assert value("vpngw_controller_api_errors_total", {**labels, "code": "unauthenticated"}) == 1
    assert value("vpngw_controller_api_errors_total", {**labels, "code": "unreachable"}) == 1
