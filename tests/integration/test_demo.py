"""`make demo` for real: ``python -m lab demo`` as a user (or a script) runs it, with the operator flow.

The demo builds the whole world (the lab's namespaces, the API emulator, the controller as a process, the
lab kubelet, remote sites with their own charon), applies docs/examples/ipsec.yaml with kubectl and shows
the tunnels coming up, a third site with a mistyped PSK (``kubectl get vpnpeers`` AuthFailed, ``kubectl vpngw
diagnose`` naming it, the Secret fixed), traffic, a grant revoked, charon's container killed and restarted,
counters moving.
Here it runs as a script's background job (``sh -c 'demo & wait'``) in a session of its own: a short
``--duration`` run to its end; SIGINT to its process group and SIGTERM to it (130 / 143); a process it
runs SIGKILLed under it (exit 1, named). Every run must leave nothing behind: no namespace of its lab or of
its pod, no mount or directory of its lab kubelet, none of the processes it printed; its logs stay (or go
with ``--clean-logs``), and never hold the PSKs it drew.
"""

from __future__ import annotations

import base64
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lab import netns
from lab.kubelet.kubelet import cleanup_stale
from lab.kubelet.world import KUBECTL

pytestmark = [pytest.mark.lab, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[2]
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (INFO|WARNING|ERROR) lab\.demo demo\.\S+")
TABLE_ROW = re.compile(r"^  (s1|s2|s3) +Established +\S+ +(\d+) +(\d+)  \1 -> web: reached$", re.MULTILINE)


def peers_table(states: dict[str, str]) -> str:
    """The pattern of ``kubectl get vpnpeers -A`` as the demo prints it, a row per peer with its STATE."""
    rows = "".join(rf"  tenant-acme +{name} +acme +site +{state} +\S+\n" for name, state in states.items())
    return r"\$ kubectl get vpnpeers -A\n  NAMESPACE +NAME +GATEWAY +TYPE +STATE +AGE\n" + rows


class Demo:
    """``python -m lab demo ARGS`` as a script's background job (``sh -c 'demo & wait'``) in a session of
    its own; ``until`` reads its output as it comes. Killed (the whole session) if a test leaves early."""

    def __init__(self, *args: str, shell_ignores_sigint: bool = True) -> None:
        trap = 'trap "" INT; ' if shell_ignores_sigint else ""
        script = (
            f'{trap}"$0" -m lab demo "$@" & echo "demo-pid=$!"; wait $!; code=$?; echo "demo-exit=$code"; '
            'exit "$code"'
        )
        self.proc = subprocess.Popen(
            ["sh", "-c", script, sys.executable, *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the shell leads a new process group, as a script run by cron would
        )
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        self._buf = b""
        self.text = ""
        self.demo_pid = int(self.until(r"demo-pid=(\d+)", 10).group(1))

    def _lines(self, deadline: float) -> Iterator[str]:
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            if not self._sel.select(timeout=max(0.0, deadline - time.monotonic())):
                continue
            chunk = self.proc.stdout.read(65536) or b""
            if not chunk:
                return
            self._buf += chunk
            *done, self._buf = self._buf.split(b"\n")
            # Every complete line into the text before the caller looks: one that stops at a match keeps
            # the lines after it (a line at a time, they were lost with the abandoned generator).
            if done:
                self.text += "".join(raw.decode(errors="replace") + "\n" for raw in done)
                yield self.text

    def until(self, pattern: str, timeout: float) -> re.Match[str]:
        if m := re.search(pattern, self.text, re.MULTILINE):
            return m
        for _ in self._lines(time.monotonic() + timeout):
            if m := re.search(pattern, self.text, re.MULTILINE):
                return m
        raise AssertionError(f"no {pattern!r} within {timeout} s; output so far:\n{self.text}")

    def until_true(self, predicate: Callable[[str], bool], timeout: float, what: str) -> None:
        if predicate(self.text):
            return
        for _ in self._lines(time.monotonic() + timeout):
            if predicate(self.text):
                return
        raise AssertionError(f"no {what} within {timeout} s; output so far:\n{self.text}")

    def finish(self, timeout: float = 90) -> int:
        for _ in self._lines(time.monotonic() + timeout):
            pass
        return self.proc.wait(timeout=5)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        cleanup_stale()  # what a SIGKILLed demo left, as the next start would


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "logs"


def run_ids(text: str) -> tuple[str, str]:
    """The lab's and the lab kubelet's run prefixes the demo printed."""
    m = re.search(r"lab namespaces (\S+)-\*, pod namespaces (\S+)-p\*", text)
    assert m, text
    return m.group(1), m.group(2)


def printed_pids(text: str) -> dict[str, int]:
    """Every process the demo said it runs: the controller, the sites' charons, each container instance."""
    out = {"controller": int(re.search(r"controller pid (\d+)", text).group(1))}  # type: ignore[union-attr]
    for site, pid in re.findall(r"site (\w+): its own charon \(pid (\d+)\)", text):
        out[f"site {site}"] = int(pid)
    for i, (name, pid) in enumerate(re.findall(r"pod: (?:init )?container ([\w-]+): .*\(pid (\d+)\)", text)):
        out[f"{name}#{i}"] = int(pid)
    return out


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def assert_torn_down(text: str) -> None:
    lab, kubelet = run_ids(text)
    left = [ns for ns in netns.list_namespaces() if ns.startswith((lab, kubelet))]
    assert left == [], f"namespaces left behind: {left}"
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if kubelet in line]
    assert mounts == [], f"mounts left behind: {mounts}"
    assert not Path(f"/tmp/{kubelet}-kubelet").exists(), "the lab kubelet's directory"
    pids = printed_pids(text)
    assert len(pids) >= 8, pids  # controller, 2 sites, init-nat + 4 containers
    alive = {name: pid for name, pid in pids.items() if not gone(pid)}
    assert alive == {}, f"processes left behind: {alive}"
    assert "demo: torn down: no namespace, veth, mount, container or process of the run is left" in text


def counters(text: str, site: str) -> list[tuple[int, int]]:
    return [(int(i), int(o)) for s, i, o in TABLE_ROW.findall(text) if s == site]


def secret_values(kubeconfig: str, names: tuple[str, ...]) -> list[str]:
    """The PSKs the demo drew, read as a user would (kubectl with the printed kubeconfig)."""
    out = []
    for name in names:
        res = subprocess.run(
            [
                str(KUBECTL),
                "--kubeconfig",
                kubeconfig,
                "get",
                "secret",
                name,
                "-n",
                "tenant-acme",
                "-o",
                "jsonpath={.data.psk}",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        out.append(base64.b64decode(res.stdout).decode())
    return out


def test_the_demo_runs_the_operator_flow_to_its_end_and_leaves_only_its_logs(log_dir: Path) -> None:
    demo = Demo("--kills", "2", "--kill-every", "8", "--log-dir", str(log_dir), shell_ignores_sigint=False)
    try:
        kubeconfig = demo.until(r"export KUBECONFIG=(\S+) ", 60).group(1)
        demo.until(r"every tunnel Established on the CR", 60)
        psks = secret_values(kubeconfig, ("acme-psk", "s1-psk"))  # the user's kubectl, while it runs
        demo.until(r"VPNPeer s3 is Established", 60)
        psks += secret_values(kubeconfig, ("s3-psk",))  # fixed: the site's PSK
        code = demo.finish(timeout=120)
    finally:
        demo.kill()
    text = demo.text
    assert code == 0 and "demo-exit=0" in text, text
    # The steps, as the user reads them.
    assert (
        "$ kubectl create -f -" in text
        and "secret/acme-psk created" in text
        and "secret/s1-psk created" in text
    )
    assert "$ kubectl apply -f docs/examples/ipsec.yaml" in text
    assert "vpngateway.vpn.bnerd.net/acme created" in text and "vpnpeer.vpn.bnerd.net/s2 created" in text
    created = r"controller \| \S+ object\.created kind=Deployment name=vpngw-gateways/vpngw-acme-"
    assert re.search(created, text), "the pod's Deployment, in the gateway namespace"
    assert re.search(r"pod: init container init-nat: terminated \(Completed, exit 0\)", text)
    for container in ("init-nat-watch", "charon", "status-agent", "exporter"):
        assert re.search(rf"pod: container {container}: running", text), container
    assert re.search(r"vpngateway\.vpn\.bnerd\.net/acme +ipsec +node-a +192\.0\.2\.2 +True", text), text
    assert re.search(r"acme +True +s1,s2 +Established,Established", text), "the tunnels, with kubectl"
    # s3's firewall has another PSK than its Secret: its VPNPeer AuthFailed (the status-agent's write), the
    # others Established; diagnose names the cause and only it, exit 1; the Secret fixed, s3 Established.
    assert "secret/s3-psk created" in text and "vpnpeer.vpn.bnerd.net/s3 created" in text
    failed = peers_table({"s1": "Established", "s2": "Established", "s3": "AuthFailed"})
    assert re.search(failed, text), f"kubectl get vpnpeers -A: s3 AuthFailed, the others Established\n{text}"
    diagnosed = re.search(
        r"^\$ kubectl vpngw diagnose tenant-acme/acme --readyz-timeout 0 .*\n"
        r"  VPNGateway/tenant-acme/acme: (?:Ready|not Ready); 1 problem found\n"
        r"  1\. \[error\] PSKMismatch: tunnel s3: IKE authentication failed.*\n"
        r"     cause: AUTHENTICATION_FAILED: .*\n"
        r"     fix: .*\n"
        r"  \(exit status 1: a problem found\)$",
        text,
        re.MULTILINE,
    )
    assert diagnosed, f"kubectl vpngw diagnose: exit 1, PSKMismatch for s3 and nothing else\n{text}"
    assert "secret/s3-psk replaced" in text
    assert re.search(r"VPNPeer s3 is Established \d+\.\d s after the Secret's fix", text)
    fixed = peers_table({"s1": "Established", "s2": "Established", "s3": "Established"})
    assert re.search(failed + r"(?:.*\n)*" + fixed, text), f"kubectl get vpnpeers -A after the fix\n{text}"
    assert re.search(r"s3 -> web \(\S+\): reached \(granted\)", text)
    assert re.search(r"; mistyped PSK -> AuthFailed, diagnosed, fixed, Established \d+\.\d s;", text)
    assert "s1 -> db (198.18.0." in text and re.search(r"s2 -> db \(\S+\): refused \(not granted\)", text)
    assert re.search(r"s1 -> web \(\S+\): reached \(granted\)", text)
    assert "vpnpeer.vpn.bnerd.net/s1 patched" in text
    assert re.search(r"the flow s1 -> db was cut \d+\.\d\d s after the patch", text)
    assert "a new connection s1 -> db: refused; s1 -> web: reached" in text
    kills = re.findall(
        r"pod: container charon: restarted by the kubelet \(restartCount (\d+); last exit 137", text
    )
    # The step's kill and two more in the running phase (--kills 2: counted, not a time window a slow set-up
    # eats into); each one restarted by the kubelet with a growing restartCount.
    assert len(kills) >= 3 and kills == [str(n) for n in range(1, len(kills) + 1)], kills
    assert len(re.findall(r"every tunnel Established again on the CR", text)) == len(kills)
    assert len(set(counters(text, "s1"))) >= 4, "the counters move in the status table"
    assert "all tunnels Established; exit status 0" in text
    assert any(LOG_LINE.match(line) for line in text.splitlines()), "demo.* log lines in the one format"
    assert_torn_down(text)
    # The logs stay, at the paths it announced, and hold no PSK.
    assert f"demo: logs kept in {log_dir}" in text
    pods = list((log_dir / "pods").iterdir())
    assert len(pods) == 1 and not pods[0].is_symlink(), pods
    for f in ("charon-0.log", "charon-1.log", "status-agent-0.log", "exporter-0.log", "init-nat-0.log"):
        assert (pods[0] / f).stat().st_size > 0, f
    assert "agent.started" in (pods[0] / "status-agent-0.log").read_text()
    assert "object.created" in (log_dir / "k8s" / "controller.log").read_text()
    assert "IKE_SA" in (log_dir / "lab" / "s1" / "charon" / "charon.log").read_text()
    assert "verb=patch" in (log_dir / "api-requests.log").read_text()
    assert "kubelet.container.started" in (log_dir / "lab.log").read_text()
    assert len(psks) == 3 and all(len(p) >= 24 for p in psks) and len(set(psks)) == 3
    for p in psks:
        assert p not in text, "a PSK in the demo's output"
        for path in log_dir.rglob("*"):
            if path.is_file() and not path.is_socket():
                assert p.encode() not in path.read_bytes(), f"a PSK in {path}"


@pytest.mark.parametrize(
    "sig, to_group, clean",
    [
        pytest.param(signal.SIGINT, True, False, id="sigint-to-the-process-group-of-a-background-job"),
        pytest.param(signal.SIGTERM, False, True, id="sigterm-to-the-demo-with-clean-logs"),
    ],
)
def test_a_stop_signal_tears_everything_down_and_exits_128_plus_its_number(
    sig: signal.Signals, to_group: bool, clean: bool, log_dir: Path
) -> None:
    """The newcomer's script: the demo as a background job (SIGINT ignored on entry), default run
    (charon killed every 20 s). The signal comes once its counters moved in the status table."""
    args = ["--log-dir", str(log_dir), *(["--clean-logs"] if clean else [])]
    demo = Demo(*args)
    try:
        shell_ignored = int(
            Path(f"/proc/{demo.proc.pid}/status").read_text().split("SigIgn:")[1].split()[0], 16
        )
        assert shell_ignored & (1 << (signal.SIGINT - 1)), "the job must start with SIGINT ignored"
        demo.until(r"running until Ctrl-C", 90)
        demo.until_true(lambda text: len(set(counters(text, "s1"))) >= 2, 30, "the counters moving")
        if to_group:
            os.killpg(demo.proc.pid, sig)
        else:
            os.kill(demo.demo_pid, sig)
        code = demo.finish()
    finally:
        demo.kill()
    text = demo.text
    assert f"demo: stopped by {sig.name}, tearing the lab down" in text, text
    assert f"demo-exit={128 + sig}" in text and code == 128 + sig, text
    assert f"; stopped by {sig.name}; exit status {128 + sig}" in text
    assert_torn_down(text)
    if clean:
        assert not log_dir.exists() and f"demo: logs deleted ({log_dir}, --clean-logs)" in text
    else:
        assert f"demo: logs kept in {log_dir}" in text and (log_dir / "k8s" / "controller.log").exists()
    assert any(LOG_LINE.match(line) for line in text.splitlines()), "demo.* log lines in the one format"


@pytest.mark.parametrize(
    "victim, pattern",
    [
        pytest.param("controller", r"controller pid (\d+)", id="the-controller"),
        pytest.param("charon of site s2", r"site s2: its own charon \(pid (\d+)\)", id="a-sites-charon"),
    ],
)
def test_a_process_it_runs_that_dies_fails_the_demo_loudly(victim: str, pattern: str, log_dir: Path) -> None:
    """The controller (or a site's charon) SIGKILLed under the demo: it says which, with the end of its
    log, tears everything down and exits 1. (The pod's containers are the lab kubelet's: it restarts them.)"""
    demo = Demo("--kill-every", "0", "--log-dir", str(log_dir), shell_ignores_sigint=False)
    try:
        demo.until(r"running until Ctrl-C", 90)
        pid = int(demo.until(pattern, 1).group(1))
        os.kill(pid, signal.SIGKILL)
        code = demo.finish(timeout=60)
    finally:
        demo.kill()
    text = demo.text
    assert f"demo: FAILED: {victim} (pid {pid}) was killed by SIGKILL; the end of its log" in text, text
    assert code == 1 and "demo-exit=1" in text
    assert re.search(rf"ERROR lab\.demo demo\.process_exited name='{victim}' pid={pid} returncode=-9", text)
    assert "demo: tearing the lab down" in text and "; FAILED; exit status 1" in text
    assert_torn_down(text)
