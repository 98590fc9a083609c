"""Two container runtimes for the lab kubelet: processes from the project's environment, and the built
images under podman.

* ``ProcessRuntime`` (always available, ~0.1 s a container): ``ip netns exec <pod netns> python -m
  lab.kubelet.enter SPEC``; ``enter`` makes the container's mount view (volumes at their paths, an
  ``/etc`` overlay, fresh ``/run`` and ``/tmp``, read-only root) and takes the spec's user, capability
  bounding set and no_new_privs before it execs the command. Programs run on the host's binaries; the
  gateway image's Python is Debian's ``python3`` with a venv, so ``python3`` here is Debian's too, with the
  project and the project's virtualenv on ``PYTHONPATH`` (its C extensions are built for the same minor
  version: checked at start), bound read-only at fixed paths under the container's /run
  (``PROJECT_IN_CONTAINER``), wherever the checkout lives. The image's ``ENV`` lines are given to every
  container (``process_image``) and what the image adds under ``/etc`` (group ``vpngw``) comes in through
  the overlay.
* ``PodmanRuntime``: ``podman run`` of the pod spec's image in the pod's network namespace
  (``--network ns:``), ``--cap-drop all`` plus the spec's capabilities, the spec's user,
  ``--read-only`` without podman's extra tmpfs (as the kubelet's runtime does it), the volumes as bind
  mounts, ``--pull never`` (no registry: the image must be built, images/build.sh). podman enforces
  user and capabilities as a real runtime does.

A runtime starts one container instance and hands back a ``Running`` the kubelet waits on; a restarted
container is a new instance.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

import anyio
import anyio.abc

from lab.netns import LabError

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
LABEL = "net.bnerd.vpn.test"
"""Every podman container the lab starts carries it; its value is the run id ``vg<pid>x<hex>`` (the same
label tests/integration/test_images_run.py uses, so each cleans up after the other)."""
DEBIAN_PYTHON = "/usr/bin/python3"
PROCESS_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def site_packages() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]


PROJECT_IN_CONTAINER = "/run/lab-kubelet/project"
SITE_PACKAGES_IN_CONTAINER = "/run/lab-kubelet/site-packages"
"""Where a process-mode container sees the project and its virtualenv's packages: read-only binds of the
host's, at fixed paths on the container's fresh /run. Not the host's own paths: a checkout under /tmp
(a CI's clean clone) would be hidden by the container's fresh /tmp, as the image's /tmp hides nothing of
its /opt/vpngw."""


def project_mounts() -> list[Mount]:
    """The binds behind ``PROJECT_IN_CONTAINER`` and ``SITE_PACKAGES_IN_CONTAINER``."""
    return [
        Mount(str(ROOT), PROJECT_IN_CONTAINER, readonly=True),
        Mount(site_packages(), SITE_PACKAGES_IN_CONTAINER, readonly=True),
    ]


IMAGES = ROOT / "images"
GATEWAY_IMAGE = "gateway"
IMAGE_PREFIX = "localhost/vpngw-"


@dataclass(frozen=True)
class ProcessImage:
    """What process mode takes from a container's image: the configuration of the project's image of
    that name (``localhost/vpngw-<name>`` -> ``images/<name>/Dockerfile``, its last stage), or the
    gateway image's for any other name (the kubelet contract's small pods).

    * ``entrypoint``/``cmd``: what a container without ``command`` (or ``args``) runs. The images' ``python``
      is their venv's interpreter, ``python3`` by another name; the host has only ``python3``, so an
      ``argv[0]`` of ``python`` runs as ``python3``.
    * ``env``: the image's ENV with ``PATH`` the host's and the project and its virtualenv on
      ``PYTHONPATH`` (where the image has its venv), at the paths the container sees them
      (``project_mounts``).
    * ``gateway_etc``: what the gateway image adds under /etc (its group ``vpngw``, strongswan.conf),
      given through the container's /etc overlay; the controller image adds nothing there.
    """

    name: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    env: Mapping[str, str]
    gateway_etc: bool


def image_name(image: str) -> str:
    """``localhost/vpngw-controller:0.1.0`` -> ``controller``; anything else -> the gateway's."""
    repo = image.split("@", 1)[0]
    if ":" in repo.rsplit("/", 1)[-1]:
        repo = repo.rsplit(":", 1)[0]
    name = repo.removeprefix(IMAGE_PREFIX) if repo.startswith(IMAGE_PREFIX) else ""
    return name if name and (IMAGES / name / "Dockerfile").is_file() else GATEWAY_IMAGE


def process_image(image: str) -> ProcessImage:
    """The configuration process mode takes from ``image``, read from its Dockerfile once per process (the
    kubelet asks at every container start, the runtime again when it starts the process)."""
    return _process_image(image_name(image))


@cache
def _process_image(name: str) -> ProcessImage:
    from lab.kubelet.model import image_config

    cfg = image_config((IMAGES / name / "Dockerfile").read_text())
    env = {
        **{k: v for k, v in cfg.env.items() if k != "PATH"},
        "PATH": PROCESS_PATH,
        "PYTHONPATH": f"{PROJECT_IN_CONTAINER}:{SITE_PACKAGES_IN_CONTAINER}",
        "PYTHONNOUSERSITE": "1",
    }
    return ProcessImage(
        name, cfg.entrypoint, cfg.cmd, MappingProxyType(env), gateway_etc=name == GATEWAY_IMAGE
    )


def process_argv(argv: list[str]) -> list[str]:
    """The images' ``python`` is ``python3`` here (``ProcessImage``)."""
    return ["python3", *argv[1:]] if argv and argv[0] == "python" else argv


def check_process_python() -> None:
    """Process mode runs Debian's python3 on the project's virtualenv: same minor version, or refuse."""
    res = subprocess.run(
        [DEBIAN_PYTHON, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
        capture_output=True,
        text=True,
        check=False,
    )
    want = f"{sys.version_info[0]} {sys.version_info[1]}"
    if res.returncode != 0 or res.stdout.strip() != want:
        raise LabError(
            f"process mode needs {DEBIAN_PYTHON} (the gateway image's interpreter) at Python "
            f"{want.replace(' ', '.')}, the virtualenv's version; found "
            f"{res.stdout.strip() or res.stderr.strip()!r}"
        )


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    readonly: bool = False


@dataclass
class ContainerRun:
    """One container instance to start, as the kubelet decided it."""

    key: str
    """Unique on the node: ``<pod netns>-<container>-<instance>``."""
    name: str
    pod_ns: str
    hostname: str
    image: str
    argv: list[str]
    env: dict[str, str]
    dir: Path
    log: Path
    mounts: list[Mount] = field(default_factory=list)
    etc_files: dict[str, bytes] = field(default_factory=dict)
    """Files under /etc the runtime provides (resolv.conf, hosts, hostname)."""
    image_files: dict[str, bytes] = field(default_factory=dict)
    """Files under /etc that the image has and the host lacks (process mode only)."""
    image_entrypoint: bool = False
    """``argv`` holds only the container's args (it has no ``command``): the image's ENTRYPOINT runs them
    (podman; process mode resolves the entrypoint into ``argv`` itself)."""
    user: int = 0
    group: int = 0
    groups: list[int] = field(default_factory=list)
    caps: list[str] | None = field(default_factory=list)
    """Capabilities kept (all others dropped); None: privileged."""
    no_new_privs: bool = True
    seccomp: str = "unconfined"
    """``runtime-default`` (the runtime's default filter) or ``unconfined`` (``model.seccomp``); podman
    applies it, process mode loads no filter."""
    readonly_root: bool = False
    devices: list[str] = field(default_factory=list)
    workdir: str | None = None


class Running(Protocol):
    container_id: str

    async def wait(self) -> int: ...

    async def stop(self, grace: float) -> None: ...

    async def kill(self, sig: int = signal.SIGKILL) -> None: ...

    @property
    def pid(self) -> int | None: ...


def _exit_code(rc: int | None) -> int:
    if rc is None:
        return -1
    return 128 - rc if rc < 0 else rc


class ProcessContainer:
    def __init__(self, proc: anyio.abc.Process, key: str) -> None:
        self.proc = proc
        self.container_id = f"lab://{key}"
        self._rc: int | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc.returncode is None else None

    async def wait(self) -> int:
        if self._rc is None:
            self._rc = _exit_code(await self.proc.wait())
        return self._rc

    async def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.returncode is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    async def stop(self, grace: float) -> None:
        await self.kill(signal.SIGTERM)
        with anyio.move_on_after(grace):
            await self.wait()
            return
        await self.kill(signal.SIGKILL)
        with anyio.fail_after(10):
            await self.wait()


class ProcessRuntime:
    name = "process"

    def __init__(self) -> None:
        check_process_python()

    async def start(self, run: ContainerRun) -> Running:
        run.dir.mkdir(parents=True, exist_ok=True)
        upper, work = run.dir / "etc-upper", run.dir / "etc-work"
        for d in (upper, work):
            d.mkdir(exist_ok=True)
        for rel, content in {**run.image_files, **run.etc_files}.items():
            f = upper / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(content)
            f.chmod(0o644)
        env = {**process_image(run.image).env, **run.env}
        spec = {
            "argv": run.argv,
            "env": env,
            "cwd": run.workdir or "/",
            "hostname": run.hostname,
            "etc": {"upper": str(upper), "work": str(work)},
            "tmpfs": ["/run", "/tmp"],
            "mounts": [
                {"source": m.source, "target": m.target, "readonly": m.readonly}
                for m in [*project_mounts(), *run.mounts]
            ]
            + [{"source": d, "target": d, "readonly": False} for d in run.devices],
            "readonly_root": run.readonly_root,
            "user": run.user,
            "group": run.group,
            "groups": run.groups,
            "caps": run.caps,
            "no_new_privs": run.no_new_privs,
        }
        spec_file = run.dir / "enter.json"
        spec_file.write_text(json.dumps(spec))
        spec_file.chmod(0o600)
        argv = ["ip", "netns", "exec", run.pod_ns, sys.executable, "-m", "lab.kubelet.enter", str(spec_file)]
        out = await anyio.to_thread.run_sync(lambda: open(run.log, "ab"))  # noqa: SIM115 - closed below
        try:
            proc = await anyio.open_process(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=str(ROOT),
                env={"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", PROCESS_PATH)},
            )
        finally:
            out.close()  # the child has its own descriptor
        return ProcessContainer(proc, run.key)


# --- podman -----------------------------------------------------------------------------------------------


def podman_env() -> dict[str, str]:
    conf = ROOT / "out" / "containers"
    return {
        **os.environ,
        "CONTAINERS_CONF": str(conf / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(conf / "storage.conf"),
    }


async def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    with anyio.fail_after(timeout):
        res = await anyio.run_process(["podman", *args], check=False, env=podman_env())
    if check and res.returncode != 0:
        raise LabError(
            f"podman {' '.join(args[:3])}...: exit {res.returncode}: {res.stderr.decode()[-1500:]}"
        )
    return res


def podman_sync(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, env=podman_env(), timeout=timeout, check=False
    )


class PodmanContainer:
    def __init__(self, name: str, waiter: anyio.abc.Process, cid: str) -> None:
        self.name = name
        self.container_id = f"podman://{cid}"
        self._waiter = waiter
        self._rc: int | None = None

    @property
    def pid(self) -> int | None:
        res = podman_sync("inspect", "--format", "{{.State.Pid}}", self.name, timeout=30)
        try:
            pid = int(res.stdout.strip())
        except ValueError:
            return None
        return pid or None

    async def wait(self) -> int:
        if self._rc is None:
            await self._waiter.wait()
            assert self._waiter.stdout is not None
            out = (await self._waiter.stdout.receive()).decode() if self._waiter.returncode == 0 else ""
            try:
                self._rc = int(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                res = await podman("inspect", "--format", "{{.State.ExitCode}}", self.name, check=False)
                self._rc = int(res.stdout.decode().strip() or "-1")
        return self._rc

    async def kill(self, sig: int = signal.SIGKILL) -> None:
        await podman("kill", "--signal", str(int(sig)), self.name, check=False)

    async def stop(self, grace: float) -> None:
        await podman("stop", "--time", str(max(0, int(grace))), self.name, check=False, timeout=grace + 60)
        with anyio.fail_after(30):
            await self.wait()


class PodmanRuntime:
    name = "podman"

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def args(self, run: ContainerRun) -> list[str]:
        out = [
            "run",
            "-d",
            "--name",
            run.key,
            "--label",
            f"{LABEL}={self.run_id}",
            "--network",
            f"ns:/run/netns/{run.pod_ns}",
            "--uts",
            "private",
            "--hostname",
            run.hostname,
            "--pull",
            "never",
            "--log-driver",
            "k8s-file",
            "--log-opt",
            f"path={run.log}",
            "--user",
            f"{run.user}:{run.group}",
        ]
        if not run.image_entrypoint:
            out += ["--entrypoint", json.dumps(run.argv[:1])]
        for g in run.groups:
            out += ["--group-add", str(g)]
        if run.caps is None:
            out += ["--privileged"]
        else:
            out += ["--cap-drop", "all"]
            if run.caps:
                out += ["--cap-add", ",".join(run.caps)]
        if run.no_new_privs:
            out += ["--security-opt", "no-new-privileges"]
        if run.seccomp == "unconfined" and run.caps is not None:  # podman's default is its filter
            out += ["--security-opt", "seccomp=unconfined"]
        if run.readonly_root:
            out += ["--read-only", "--read-only-tmpfs=false"]
        files = run.dir / "etc"
        files.mkdir(parents=True, exist_ok=True)
        for rel, content in run.etc_files.items():
            f = files / rel.replace("/", "_")
            f.write_bytes(content)
            f.chmod(0o644)
            out += ["-v", f"{f}:/etc/{rel}:ro"]
        for m in run.mounts:
            out += ["-v", f"{m.source}:{m.target}" + (":ro" if m.readonly else "")]
        for d in run.devices:
            out += ["--device", d]
        for k, v in run.env.items():
            out += ["--env", f"{k}={v}"]
        if run.workdir:
            out += ["--workdir", run.workdir]
        return [*out, run.image, *(run.argv if run.image_entrypoint else run.argv[1:])]

    async def start(self, run: ContainerRun) -> Running:
        run.dir.mkdir(parents=True, exist_ok=True)
        await podman("rm", "-f", "-t", "0", run.key, check=False)
        res = await podman(*self.args(run))
        cid = res.stdout.decode().strip()
        waiter = await anyio.open_process(
            ["podman", "wait", run.key], stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=podman_env()
        )
        return PodmanContainer(run.key, waiter, cid[:12])

    async def remove(self, key: str) -> None:
        await podman("rm", "-f", "-t", "0", key, check=False)


def remove_stale_containers(alive: Mapping[str, bool] | None = None) -> list[str]:
    """podman containers of lab runs whose process is gone."""
    import shutil

    if shutil.which("podman") is None:
        return []
    res = podman_sync("ps", "-a", "--filter", f"label={LABEL}", "--format", "json", timeout=60)
    removed = []
    for item in json.loads(res.stdout or "[]"):
        run_id = (item.get("Labels") or {}).get(LABEL, "")
        pid = run_id[2:].split("x", 1)[0] if run_id.startswith("vg") else ""
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            podman_sync("rm", "-f", "-t", "0", item["Id"], timeout=60)
            removed.append(str(item["Id"])[:12])
    return removed
