"""``python -m lab.kubeapi`` as a process: --help, the ready line, real HTTPS, signals and exit codes."""

from __future__ import annotations

import json
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "lab.kubeapi", *args]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_cmd(*args), capture_output=True, text=True, timeout=30, cwd=ROOT, check=False)


@pytest.fixture
def proc(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    kc = tmp_path / "kubeconfig"
    p = subprocess.Popen(
        _cmd(
            "--listen",
            "127.0.0.1:0",
            "--kubeconfig",
            str(kc),
            "--san",
            "10.96.0.1",
            "--bookmark-interval",
            "1",
            "--history",
            "50",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        yield p, line, kc
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)


def _get(kc: Path, path: str) -> tuple[int, dict[str, object]]:
    cfg = yaml.safe_load(kc.read_text())
    server = cfg["clusters"][0]["cluster"]["server"]
    with tempfile.NamedTemporaryFile("wb", suffix=".crt") as ca:
        import base64

        ca.write(base64.b64decode(cfg["clusters"][0]["cluster"]["certificate-authority-data"]))
        ca.flush()
        ctx = ssl.create_default_context(cafile=ca.name)
    req = urllib.request.Request(  # noqa: S310
        server + path, headers={"Authorization": f"Bearer {cfg['users'][0]['user']['token']}"}
    )
    # https to our own server on 127.0.0.1
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:  # noqa: S310
        return r.status, json.loads(r.read())


def test_help_exits_0_and_names_the_emulator() -> None:
    p = _run("--help")
    assert (
        p.returncode == 0
        and "EMULATOR" in p.stdout
        and "--bookmark-interval" in p.stdout
        and "--san" in p.stdout
    )


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("--kubeconfig", "/tmp/x", "--listen", "nonsense"), id="bad-listen"),
        pytest.param(("--kubeconfig", "/tmp/x", "--listen", "127.0.0.1:99999"), id="port-range"),
        pytest.param(("--kubeconfig", "/tmp/x", "--bookmark-interval", "0"), id="bookmark-zero"),
        pytest.param(("--kubeconfig", "/tmp/x", "--history", "-1"), id="history-negative"),
        pytest.param((), id="no-kubeconfig"),
    ],
)
def test_bad_usage_exits_2(args: tuple[str, ...]) -> None:
    assert _run(*args).returncode == 2


def test_a_taken_port_is_a_runtime_failure(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = _run("--listen", f"127.0.0.1:{port}", "--kubeconfig", str(tmp_path / "kc"))
    assert p.returncode == 1 and "kubeapi.start_failed" in p.stderr


def test_ready_line_serves_https_and_sigterm_exits_0(proc: tuple[subprocess.Popen[str], str, Path]) -> None:
    p, line, kc = proc
    assert line.startswith("kubeapi.ready url=https://127.0.0.1:") and f"kubeconfig={kc}" in line
    cfg = yaml.safe_load(kc.read_text())
    assert cfg["users"][0]["user"]["token"] not in line  # the token is only in the 0600 kubeconfig
    assert kc.stat().st_mode & 0o777 == 0o600
    code, version = _get(kc, "/version")
    assert code == 200 and version["gitVersion"] == "v1.35.0+kubeapi-emulator"
    code, ns = _get(kc, "/api/v1/namespaces/kube-system")
    assert code == 200 and ns["metadata"]["name"] == "kube-system"  # type: ignore[index]
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 0
    assert p.stderr is not None and "kubeapi.stopping reason=signal" in p.stderr.read()


def test_sigint_exits_0(proc: tuple[subprocess.Popen[str], str, Path]) -> None:
    p, line, _ = proc
    assert line.startswith("kubeapi.ready ")
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=10) == 0


def test_a_killed_emulators_work_directory_is_removed_at_the_next_start(tmp_path: Path) -> None:
    p = subprocess.Popen(
        _cmd("--kubeconfig", str(tmp_path / "kc")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        workdir = Path(line.split(" ca=")[1].split()[0]).parent
        assert (workdir / "server.key").exists()
    finally:
        p.kill()
        p.wait(timeout=10)
    assert workdir.exists()  # SIGKILL left it behind
    second = subprocess.Popen(
        _cmd("--kubeconfig", str(tmp_path / "kc2")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert second.stdout is not None and second.stdout.readline().startswith("kubeapi.ready ")
        assert not workdir.exists()
    finally:
        second.terminate()
        second.wait(timeout=10)
