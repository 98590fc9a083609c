"""The exporter reading live wireguard-go through the agent's read-only UAPI socket, as an unprivileged
process: uid/gid 65532, no capabilities (empty bounding set), no_new_privs, as the pod runs it.

It produces the same metrics as the exporter reading wireguard-go directly (as root), while it cannot open
wireguard-go's own socket (0700 root); set=1 through the read-only socket is refused and changes nothing;
neither the gateway's private key nor the preshared key ever crosses it. The server here is
``agent.wireguard.readonly`` in this (root) test process, reading wireguard-go as the agent does.
"""

from __future__ import annotations

import base64
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.wireguard import readonly
from exporter.collector import families
from exporter.family import Renderer
from exporter.service import Exporter, PlanFile
from exporter.sources import WireGuardSource
from gwkit.wireguard import uapi
from gwplan.model import GatewayRef, Plan, SecretRef, WgPeer, WireGuard, dumps
from lab.peers import wireguard_pair
from lab.world import Lab

pytestmark = [pytest.mark.lab, pytest.mark.anyio]

UID = 65532
REPO = Path(__file__).resolve().parents[2]
PSK = "q2Yyr7B3xB9v8bQ0hE0oGqQ0gF9rWcN3c1b3ZgYw2Ew="  # test-only preshared key
UNPRIVILEGED = [
    "setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all",
    "--no-new-privs",
]  # fmt: skip
"""What the pod's securityContext gives the exporter: runAsUser/Group 65532, capabilities drop ALL,
allowPrivilegeEscalation false."""
DEBIAN_PYTHON = "/usr/bin/python3"
"""The venv's interpreter lives under /root (0700): the unprivileged process runs Debian's python3 with
the project and the venv's packages on PYTHONPATH, as the lab kubelet runs a container."""


def env() -> dict[str, str]:
    import sysconfig

    return {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONPATH": f"{REPO}:{sysconfig.get_paths()['purelib']}",
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": "/nonexistent",
    }


def as_exporter_user(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*UNPRIVILEGED, DEBIAN_PYTHON, "-c", code, *args], capture_output=True, text=True, env=env(), cwd="/",
        timeout=30, check=False,
    )  # fmt: skip


EXCHANGE = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print("ERR", exc.errno, exc.strerror)
    raise SystemExit(0)
s.sendall(sys.argv[2].encode().decode("unicode_escape").encode())
out = b""
while not out.endswith(b"\\n\\n"):
    d = s.recv(65536)
    if not d:
        break
    out += d
sys.stdout.write(out.decode())
"""


@pytest.fixture
def ro_dir() -> Iterator[Path]:
    """The read-only directory: under /tmp (pytest's tmp_path is under a 0700 directory), 0755."""
    d = Path(tempfile.mkdtemp(prefix="vpngw-ro-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def series(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name != "wireguard_scrape_duration_seconds"
    }


async def test_the_unprivileged_exporter_reads_every_peer_metric_through_the_agents_socket_only(
    lab: Lab, tmp_path: Path, ro_dir: Path
) -> None:
    site = lab.add_site()
    keys = wireguard_pair(lab, site, tmp_path, psk=PSK)
    wgd = lab.gw.wireguard["wg0"]
    assert site.ping("10.99.0.1", count=3, wait=1.0), "premise: a handshake and traffic"
    plan = Plan(
        gateway=GatewayRef("VPNGateway", "vpn.bnerd.net/v1alpha1", "tenant-a", "gw1"),
        type="wireguard",
        wireguard=WireGuard(
            interface="wg0", listen_port=51820, address="10.99.0.1/24",
            private_key_ref=SecretRef("gw1-wg", "privateKey"),
            peers=(WgPeer(name="alice", public_key=keys[site.role][1], allowed_ips=("10.99.0.2/32",)),
                   WgPeer(name="bob", public_key="x" * 42 + "A=", allowed_ips=("10.99.0.3/32",))),
        ),
    )  # fmt: skip
    (ro_dir / "plan.json").write_bytes(dumps(plan))
    (ro_dir / "plan.json").chmod(0o644)
    secrets = [keys["gw"][0], keys[site.role][0], PSK]
    secrets += [base64.b64decode(k).hex() for k in secrets]
    port = free_port()
    log = tmp_path / "exporter.log"
    async with anyio.create_task_group() as tg:
        tg.start_soon(readonly.serve_interface, ro_dir, "wg0", readonly.opener(wgd.uapi_dir))
        with anyio.fail_after(5):
            while not (ro_dir / "wg0.sock").exists():  # noqa: ASYNC110 - the listener starts in a task
                await anyio.sleep(0.01)
        assert (ro_dir / "wg0.sock").stat().st_mode & 0o777 == 0o666
        argv = [
            *UNPRIVILEGED, DEBIAN_PYTHON, "-m", "exporter", "--listen", f"127.0.0.1:{port}",
            "--wireguard-interface", "wg0", "--wireguard-uapi-dir", str(ro_dir),
            "--plan", str(ro_dir / "plan.json"),
        ]  # fmt: skip
        with log.open("wb") as out:
            proc = await anyio.open_process(argv, stdout=out, stderr=out, env=env(), cwd="/")
        try:
            body = await anyio.to_thread.run_sync(wait_scrape, port, proc.pid)
            st = status(proc.pid)
            assert st["Uid"].split() == [str(UID)] * 4 and st["Gid"].split() == [str(UID)] * 4
            assert int(st["CapEff"], 16) == int(st["CapPrm"], 16) == int(st["CapBnd"], 16) == 0
            assert st["NoNewPrivs"] == "1"

            direct = Exporter(
                wireguard=WireGuardSource(wgd.uapi_dir), plan=plan_file(tmp_path, plan)
            )  # root, wireguard-go's own socket
            want = Renderer().render(families(await direct.snapshot())).decode()

            # The same user, by hand: wireguard-go's socket is closed to it; the read-only one answers
            # get without keys and refuses set.
            own = await anyio.to_thread.run_sync(
                as_exporter_user, EXCHANGE, str(wgd.uapi_socket), "get=1\\n\\n"
            )
            got_ro = await anyio.to_thread.run_sync(
                as_exporter_user, EXCHANGE, str(ro_dir / "wg0.sock"), "get=1\\n\\n"
            )
            before = await uapi.get(wgd.uapi_socket)
            peer_hex = base64.b64decode(keys[site.role][1]).hex()
            set_reply = await anyio.to_thread.run_sync(
                as_exporter_user, EXCHANGE, str(ro_dir / "wg0.sock"),
                f"set=1\\nlisten_port=1\\npublic_key={peer_hex}\\nremove=true\\n\\n",
            )  # fmt: skip
            after = await uapi.get(wgd.uapi_socket)
        finally:
            proc.send_signal(signal.SIGTERM)
            with anyio.fail_after(10):
                await proc.wait()
            tg.cancel_scope.cancel()

    assert own.stdout.startswith("ERR 13 Permission denied"), own.stdout + own.stderr
    assert got_ro.stdout.endswith("errno=0\n\n") and f"public_key={peer_hex}" in got_ro.stdout
    assert set_reply.stdout == "errno=1\n\n", set_reply.stdout + set_reply.stderr
    assert after == before and after.listen_port == 51820 and len(after.peers) == 1, "set reached nothing"
    for secret in secrets:
        assert secret not in got_ro.stdout, "a key crossed the read-only socket"
        assert secret not in body, "a key reached the metrics"

    a, b = series(body), series(want)
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    assert a == b, "every metric, value for value"
    alice = (("interface", "wg0"), ("peer", "alice"))
    assert a[("wireguard_up", (("interface", "wg0"),))] == 1
    assert a[("wireguard_peer_receive_bytes_total", alice)] == before.peers[0].rx_bytes > 0
    assert a[("wireguard_peer_last_handshake_timestamp_seconds", alice)] == before.peers[0].last_handshake
    assert a[("wireguard_peer_present", (("interface", "wg0"), ("peer", "bob")))] == 0
    assert proc.returncode == 0, log.read_text()


def plan_file(tmp: Path, plan: Plan) -> PlanFile:
    path = tmp / "direct-plan.json"
    path.write_bytes(dumps(plan))
    pf = PlanFile(path)
    pf.load_initial()
    return pf


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_scrape(port: int, pid: int) -> str:
    deadline = time.monotonic() + 20
    while True:
        try:
            body = scrape(port)
            if re.search(r'^wireguard_up\{interface="wg0"\} 1', body, re.M):
                return body
        except OSError:
            pass
        if time.monotonic() > deadline or not Path(f"/proc/{pid}").exists():
            raise AssertionError("the unprivileged exporter did not serve wireguard_up 1")
        time.sleep(0.1)
