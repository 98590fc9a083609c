"""``python -m agent`` as a user runs it: --help, bad usage (exit 2), a missing or invalid plan waited for
(live, not ready with the path and the reason, never an exit), and a clean stop on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent.__main__ import UsageError, build_parser, parse_settings
from gwplan import Child, GatewayRef, Ipsec, Plan, Tunnel, dumps
from lab.wait import wait_for

AGENT = [sys.executable, "-m", "agent"]


def test_help_documents_every_option() -> None:
    out = subprocess.run([*AGENT, "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    for opt in (
        "--plan",
        "--secrets-dir",
        "--vici-socket",
        "--status-file",
        "--health-listen",
        "--kube-status",
        "--readonly-dir",
    ):
        assert opt in out.stdout
    assert "Exit codes" in out.stdout
    text = " ".join(out.stdout.split())
    assert "A missing or invalid plan at start is waited for, not fatal" in text
    assert "/readyz 503 'no valid plan at PATH: REASON'" in text and "every 5 s" in text


def test_bad_usage_exits_2_naming_the_option(tmp_path: Path) -> None:
    missing = subprocess.run([*AGENT, "--plan", "x"], capture_output=True, text=True, timeout=30)
    assert missing.returncode == 2 and "--secrets-dir" in missing.stderr
    bad = subprocess.run(
        [*AGENT, "--plan", "x", "--secrets-dir", str(tmp_path), "--health-listen", "localhost"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "--health-listen" in bad.stderr and "HOST:PORT" in bad.stderr


def test_waits_live_for_a_valid_plan_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text("{not json")
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*AGENT, "--plan", str(plan), "--secrets-dir", str(tmp_path), "--poll-interval", "0.05"],
            stderr=out,
        )
    try:
        # The event, not a fixed pause: a SIGTERM sent while Python still imports (a loaded machine took
        # over a second) kills the process before the agent handles signals, exit -15.
        wait_for(
            lambda: "plan.rejected" in log.read_text() or proc.poll() is not None,
            30,
            "the agent to report the invalid plan (or exit)",
            interval=0.02,
        )
        assert proc.poll() is None, "an invalid first plan is reported, not fatal"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = log.read_text()
    assert proc.returncode == 0, err
    assert "plan.rejected" in err and "not JSON" in err


def test_kube_status_end_to_end_through_kubeconfig_against_the_api_emulator(tmp_path: Path) -> None:
    """``python -m agent --kube-status`` with charon absent: the agent patches the CR's status subresource
    (tunnels Down, the reason) through a kubeconfig, against the Kubernetes API emulator (lab.kubeapi)."""
    from lab.cluster import Cluster

    gateway = GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "tenant-a", "gw")
    conn = {"s1": {"version": "2", "children": {"s1-0": {"remote_ts": ["10.1.0.0/24"]}}}}
    plan = Plan(
        gateway=gateway,
        type="ipsec",
        ipsec=Ipsec(tunnels=(Tunnel("s1", True, (Child("s1-0", "10.1.0.0/24"),), conn),)),
    )
    (tmp_path / "plan.json").write_bytes(dumps(plan))
    with Cluster(tmp_path / "k8s") as c:
        c.apply(
            [
                {
                    "apiVersion": "vpn.bnerd.net/v1alpha1",
                    "kind": "VPNGateway",
                    "metadata": {"name": "gw", "namespace": "tenant-a"},
                    "spec": {
                        "type": "ipsec",
                        "serviceCIDR": "198.18.0.0/24",
                        "ipsec": {"localID": "gw.example"},
                    },
                }
            ]
        )
        env = {**os.environ, "KUBECONFIG": str(c.kubeconfig)}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        argv = [
            *AGENT,
            "--plan",
            str(tmp_path / "plan.json"),
            "--secrets-dir",
            str(tmp_path),
            "--vici-socket",
            str(tmp_path / "no-charon.vici"),
            "--kube-status",
            "--poll-interval",
            "0.05",
        ]
        proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE)
        try:

            def with_tunnels() -> dict[str, Any] | None:
                g = c.get("vpn.bnerd.net/v1alpha1", "VPNGateway", "gw", "tenant-a")
                return g if g and "tunnels" in (g.get("status") or {}) else None

            gw = wait_for(with_tunnels, 20, "the agent's status")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
        status = gw["status"]
        (tunnel,) = status["tunnels"]
        assert tunnel["name"] == "s1" and tunnel["state"] == "Down"
        assert "charon unreachable" in tunnel["lastError"]
        assert status["agent"]["connected"] is False
        assert all(r.subresource == "status" for r in c.kube.requests(verb="patch"))
        assert proc.returncode == 0


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "0.5"])
def test_a_resync_period_outside_1s_to_a_day_is_bad_usage(tmp_path: Path, value: str) -> None:
    """nan slipped through a ``<= 0`` check (every comparison with nan is false)."""
    with pytest.raises(UsageError, match="--resync-seconds: must be between 1 and 86400"):
        parse_settings(["--plan", "x", "--secrets-dir", str(tmp_path), "--resync-seconds", value])


def test_the_default_vici_socket_is_where_the_gateway_image_puts_it() -> None:
    conf = (Path(__file__).resolve().parents[2] / "images" / "gateway" / "strongswan.conf").read_text()
    default = build_parser().get_default("vici_socket")
    assert f"socket = unix://{default}\n" in conf


def _get(port: int, path: str) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        return b"".join(iter(lambda: s.recv(4096), b"")).decode()


def test_a_missing_plan_is_waited_for_live_and_not_ready_naming_the_path(tmp_path: Path) -> None:
    """In a pod the agent is a long-running container: a missing plan is not an exit (a crash loop hides
    the reason) nor a silent wait. It says the path and the reason on /readyz and in its log (in the one
    RFC 3339 UTC format, whatever TZ says), and goes on when the plan appears."""
    plan = tmp_path / "plan.json"
    argv = [*AGENT, "--plan", str(plan), "--secrets-dir", str(tmp_path), "--poll-interval", "0.05"]
    argv += ["--health-listen", "127.0.0.1:0", "--vici-socket", str(tmp_path / "no-charon.vici")]
    proc = subprocess.Popen(
        argv, stderr=subprocess.PIPE, text=True, env={**os.environ, "TZ": "America/St_Johns"}
    )
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if m := re.search(r"health\.listening address=\S+ port=(\d+)", line):
                port = int(m.group(1))
            if "health.ready ready=no" in line:
                break
        ready, live = _get(port, "/readyz"), _get(port, "/healthz")
        gateway = GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "t", "gw")
        plan.write_bytes(dumps(Plan(gateway=gateway, type="ipsec", ipsec=Ipsec())))
        for line in proc.stderr:
            lines.append(line)
            if "agent.started" in line:
                break
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=10)
        lines += rest.splitlines(keepends=True)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = "".join(lines)
    assert ready.startswith("HTTP/1.0 503")
    assert f"not ready: no valid plan at {plan}: cannot read {plan}: No such file or directory" in ready
    assert live.startswith("HTTP/1.0 200") and live.endswith("ok\n")
    assert f"health.ready ready=no reason='no valid plan at {plan}: cannot read" in text
    assert "plan.loaded" in text and proc.returncode == 0
    for line in lines:
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (INFO|WARNING|ERROR) \S+ \S", line), line
    stamp = datetime.strptime(lines[0].split()[0], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    assert abs(stamp.timestamp() - time.time()) < 120, "UTC, not the process's local time"


def test_readonly_dir_holds_the_plan_copy_and_a_relay_that_closes_while_charon_is_down(
    tmp_path: Path,
) -> None:
    """``--readonly-dir`` with an IPsec plan: the exporter's plan copy and ``charon.vici`` (mode 0666,
    for an exporter that runs as another user than a root agent); with charon away a client is closed
    at once. The relay's filtering against a live charon: tests/integration/test_exporter_readonly.py."""
    gateway = GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "t", "gw")
    plan = Plan(
        gateway=gateway,
        type="ipsec",
        ipsec=Ipsec(tunnels=(Tunnel("s1", True, (Child("s1-0", "10.0.0.0/24"),), {"s1": {}}),)),
    )
    (tmp_path / "plan.json").write_bytes(dumps(plan))
    ro = tmp_path / "ro"
    ro.mkdir()
    argv = [*AGENT, "--plan", str(tmp_path / "plan.json"), "--secrets-dir", str(tmp_path), "--poll-interval"]
    argv += ["0.05", "--vici-socket", str(tmp_path / "no-charon.vici"), "--readonly-dir", str(ro)]
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stderr=out)
    try:
        # Listening, not only there: the socket file exists from its bind, before listen() (refused).
        def serving() -> bool:
            assert proc.poll() is None, "the agent exited before it served both"
            return "vici_relay.listening" in log.read_text() and (ro / "plan.json").exists()

        wait_for(serving, 20, "the agent to serve the plan copy and the VICI relay")
        assert (ro / "plan.json").read_bytes() == dumps(plan)
        assert (ro / "plan.json").stat().st_mode & 0o777 == 0o644
        assert (ro / "charon.vici").stat().st_mode & 0o777 == 0o666
        assert (ro / "ha-role").read_text() == "active\n", "no ha in the plan: active, for the exporter"
        assert (ro / "ha-role").stat().st_mode & 0o777 == 0o644
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(ro / "charon.vici"))
            t0 = time.monotonic()
            assert s.recv(100) == b"", "charon is down: closed, not left hanging"
            assert time.monotonic() - t0 < 2
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = log.read_text()
    assert proc.returncode == 0, err
    assert "vici_relay.listening" in err and "vici_relay.charon_unreachable" in err
