"""lab.demo's decisions (pure): options, the example it applies, what of the controller's log and the pod's
status it shows, the tables it prints, its verdict and exit statuses."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from lab.demo import (
    EXIT_FAILED,
    EXIT_OK,
    Options,
    Outcome,
    Stopped,
    backoff_seconds,
    check_options,
    container_changes,
    controller_line,
    default_log_dir,
    diagnose_problem,
    exit_text,
    kubelet_options,
    read_example,
    revocation,
    status_table,
    stop_status,
    tunnel_bytes,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "code, text",
    [
        (0, "exited with status 0"),
        (3, "exited with status 3"),
        (-signal.SIGKILL, "was killed by SIGKILL"),
        (-signal.SIGINT, "was killed by SIGINT"),
        (-200, "was killed by signal 200"),
    ],
)
def test_exit_text(code: int, text: str) -> None:
    assert exit_text(code) == text


def test_stop_statuses_are_the_shells() -> None:
    assert (stop_status(signal.SIGINT), stop_status(signal.SIGTERM)) == (130, 143)


@pytest.mark.parametrize(
    "opts, error",
    [
        pytest.param(Options(), None, id="defaults"),
        pytest.param(Options(duration=0), "--duration must be positive", id="duration-0"),
        pytest.param(Options(kill_every=0), None, id="no-kills"),
        pytest.param(Options(kill_every=2), "--kill-every must be 0", id="kills-too-often"),
        pytest.param(Options(kill_every=-1), "--kill-every must be 0", id="negative"),
        pytest.param(Options(kills=2, kill_every=8), None, id="kills"),
        pytest.param(Options(kills=0), "--kills must be positive", id="kills-0"),
        pytest.param(Options(kills=2, kill_every=0), "with a --kill-every above 0", id="kills-never-killed"),
        pytest.param(Options(runtime="docker"), "--runtime must be process or podman", id="runtime"),
        pytest.param(Options(log_dir=Path("/tmp/" + "x" * 90)), "is too long", id="log-dir-too-long"),
    ],
)
def test_check_options_names_the_option_and_the_rule(opts: Options, error: str | None) -> None:
    got = check_options(opts)
    assert (got is None) if error is None else (got is not None and error in got)


def test_the_default_log_dir_is_named_by_the_start_in_utc() -> None:
    assert default_log_dir(0.0, Path("/b")) == Path("/b/vpngw-demo-19700101T000000Z")


def test_kubelet_back_off_is_forgotten_after_half_the_kill_interval_unless_real() -> None:
    assert kubelet_options(20.0, real_backoff=False) == {"backoff_reset": 10.0}
    assert kubelet_options(20.0, real_backoff=True) == {}
    assert kubelet_options(0.0, real_backoff=False) == {}


def test_read_example_of_the_docs_ipsec_example() -> None:
    docs = list(yaml.safe_load_all((REPO / "docs/examples/ipsec.yaml").read_text()))
    ex = read_example([d for d in docs if d])
    assert ex.gateway and ex.namespace and ex.sites
    assert set(ex.exposures) >= {"web", "db"}
    # every site's PSK Secret is named once: the demo creates each of them with a random value
    assert len(ex.secrets) == len(set(ex.secrets)) and all(name for name, _ in ex.secrets)
    site, grant = revocation(ex) or (None, None)
    assert site is not None and len(site.grants) >= 2 and grant == site.grants[-1]


def _gw(**spec: Any) -> dict[str, Any]:
    return {
        "kind": "VPNGateway",
        "metadata": {"name": "g", "namespace": "n"},
        "spec": {"type": "ipsec", "ipsec": {"localID": "gw", "pskSecretRef": {"name": "p"}}, **spec},
    }


def _peer(name: str, grants: list[str], **ipsec: Any) -> dict[str, Any]:
    return {
        "kind": "VPNPeer",
        "metadata": {"name": name},
        "spec": {
            "type": "site",
            "gatewayRef": {"name": "g"},
            "endpoint": "198.51.100.9",
            "ipsec": {"id": name, "remoteSubnets": ["203.0.113.0/28"], **ipsec},
            "authorization": {"exposures": grants},
        },
    }


def test_read_example_takes_each_peers_psk_or_the_gateways() -> None:
    ex = read_example([_gw(), _peer("a", ["w"]), _peer("b", [], pskSecretRef={"name": "b", "key": "k"})])
    assert [s.psk_secret for s in ex.sites] == [("p", "psk"), ("b", "k")]
    assert revocation(ex) is None  # nobody holds two grants: nothing to revoke under a running flow


@pytest.mark.parametrize(
    "docs, error",
    [
        pytest.param([], "exactly one IPsec VPNGateway", id="no-gateway"),
        pytest.param([_gw(type="wireguard")], "exactly one IPsec VPNGateway", id="wireguard"),
        pytest.param([_gw()], "no site peer", id="no-peer"),
    ],
)
def test_read_example_refuses_what_it_cannot_demo(docs: list[dict[str, Any]], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        read_example(docs)


def test_read_example_refuses_a_gateway_without_a_psk() -> None:
    gw = _gw()
    del gw["spec"]["ipsec"]["pskSecretRef"]
    with pytest.raises(ValueError, match="pskSecretRef"):
        read_example([gw, _peer("a", [])])


@pytest.mark.parametrize(
    "line, shown",
    [
        (
            "2026-12-01T13:01:10.804Z INFO controller.execute object.created kind=Role name=n/x",
            "13:01:10.804Z object.created kind=Role name=n/x",
        ),
        ("2026-12-01T13:01:10.8Z INFO controller.run gateway.reconciled gateway=g writes=3", "writes=3"),
        ("2026-12-01T13:01:10.8Z INFO controller.run gateway.reconciled gateway=g writes=1", None),
        ("2026-12-01T13:01:10.8Z WARNING controller.run cloud.failed reason=x", "WARNING cloud.failed"),
        ("2026-12-01T13:01:10.8Z DEBUG controller.run watch.event kind=Pod", None),
        ("not a log line", None),
    ],
)
def test_controller_line_shows_writes_and_warnings_only(line: str, shown: str | None) -> None:
    got = controller_line(line)
    assert (got is None) if shown is None else (got is not None and shown in got)


def _cs(
    name: str, state: dict[str, Any], ready: bool = False, restarts: int = 0, **kw: Any
) -> dict[str, Any]:
    return {"name": name, "state": state, "ready": ready, "restartCount": restarts, **kw}


def test_container_changes_reads_as_a_user_would() -> None:
    running = {"running": {"startedAt": "t"}}
    before = {
        "initContainerStatuses": [_cs("init-nat", {"running": {}})],
        "containerStatuses": [
            _cs("charon", running),
            _cs("status-agent", running),
            _cs("exporter", {"waiting": {"reason": "ContainerCreating"}}),
        ],
    }
    after = {
        "initContainerStatuses": [_cs("init-nat", {"terminated": {"reason": "Completed", "exitCode": 0}})],
        "containerStatuses": [
            _cs(
                "charon",
                running,
                ready=False,
                restarts=1,
                lastState={"terminated": {"exitCode": 137, "reason": "Error"}},
            ),
            _cs("status-agent", running, ready=True),
            _cs("exporter", {"waiting": {"reason": "ContainerCreating"}}),
        ],
    }
    assert container_changes(before, after) == [
        ("init-nat", "init container init-nat: terminated (Completed, exit 0)"),
        ("charon", "container charon: restarted by the kubelet (restartCount 1; last exit 137, Error)"),
        ("status-agent", "container status-agent: ready"),
    ]
    assert container_changes(after, after) == []  # nothing changed, nothing printed
    crash = {
        "containerStatuses": [
            _cs("charon", {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting"}})
        ]
    }
    ((_, text),) = container_changes(after, crash)
    assert text == "container charon: waiting (CrashLoopBackOff: back-off 10s restarting)"


def test_backoff_seconds() -> None:
    assert backoff_seconds("back-off 20s restarting failed container=charon") == 20.0
    assert backoff_seconds("something else") == 0.0


def test_tunnel_bytes_reads_the_exporters_counters() -> None:
    metrics = "\n".join(
        [
            "# TYPE strongswan_tunnel_bytes_total counter",
            'strongswan_tunnel_bytes_total{tunnel="s1",direction="in"} 1077.0',
            'strongswan_tunnel_bytes_total{tunnel="s1",direction="out"} 657.0',
            'strongswan_tunnel_bytes_total{tunnel="s2",direction="in"} 5.0',
            'strongswan_up{source="vici"} 1',
        ]
    )
    assert tunnel_bytes(metrics) == {"s1": (1077, 657), "s2": (5, 0)}


def test_status_table_has_a_row_per_tunnel_and_says_what_it_lacks() -> None:
    tunnels = [
        {"name": "s1", "state": "Established", "establishedAt": "2026-12-01T13:01:21Z"},
        {"name": "s2", "state": "Connecting"},
    ]
    table = status_table(tunnels, {"s1": (10, 20)}, {"s1": ("web", True), "s2": ("web", False)})
    header, s1, s2 = table.splitlines()
    assert "bytes in" in header
    assert s1.split() == ["s1", "Established", "13:01:21Z", "10", "20", "s1", "->", "web:", "reached"]
    assert "Connecting" in s2 and "NOT reached" in s2 and s2.split()[2:4] == ["-", "-"]
    assert "(exporter?)" in status_table(tunnels, None, {})
    assert "no tunnels" in status_table([], {}, {})


def test_outcome_verdict_and_exit_status() -> None:
    up = [{"name": "s1", "state": "Established"}]
    assert Outcome(final=up).exit_status() == EXIT_OK
    assert Outcome(final=[{"name": "s1", "state": "Connecting"}]).exit_status() == EXIT_FAILED
    assert Outcome(final=[]).exit_status() == EXIT_FAILED
    assert Outcome(final=up, failure="charon died").exit_status() == EXIT_FAILED
    assert Outcome(final=up, leftovers=["netns x"]).exit_status() == EXIT_FAILED
    stopped = Outcome(final=up, stopped=Stopped(signal.SIGTERM))
    assert stopped.exit_status() == 143 and "stopped by SIGTERM" in stopped.summary()
    assert "teardown LEFT ['netns x']" in Outcome(final=up, leftovers=["netns x"]).summary()


@pytest.mark.parametrize(
    ("code", "output", "want"),
    [
        (1, "1 problem found\n\n1. [error] PSKMismatch: tunnel s3: IKE authentication failed\n", None),
        (0, "no problems found\n", "exit status 0, not naming PSKMismatch for s3"),
        (1, "1. [error] PSKMismatch: tunnel s33: IKE authentication failed\n", "exit status 1, not naming"),
        (1, "1. [error] SecretMissing: tunnel s3: no Secret\n", "exit status 1, not naming"),
        (2, "1. [error] PSKMismatch: tunnel s3: x\n", "exit status 2, naming PSKMismatch for s3"),
    ],
)
def test_the_demo_accepts_only_diagnose_naming_the_fault_it_made(
    code: int, output: str, want: str | None
) -> None:
    got = diagnose_problem(code, output, "PSKMismatch", "s3")
    assert got == want if want is None else (got is not None and got.startswith(want))
