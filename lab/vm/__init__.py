"""The kernel tier: run a command inside a qemu VM booted with Debian bookworm's own kernel (docs/vm.md).

This machine's kernel has no WireGuard module and no ESP in XFRM; Debian's has both as modules. The VM
runs the host's own userspace: the host's ``/`` is shared read-only over virtio-9p with a tmpfs overlay on
top (writable inside, the host untouched), the kernel's modules (unpacked by scripts/setup_vm.sh, never
installed) are bind-mounted at ``/lib/modules/<release>`` and the kernel's module autoloader calls the
host's ``modprobe``. So the checkout, its virtualenv, charon, iptables and wg are the host's, at the same
paths.

* The initramfs is busybox (busybox-static) and the handful of modules the root needs (virtio-pci, 9p,
  overlay), written here as a newc cpio, cached under .tools/vm by its inputs.
* The command's directory ("job") is a second 9p share, read-write, mounted inside at the same path it
  has on the host (under build/vm-jobs, never /tmp: the guest's /tmp is its own tmpfs). The guest writes
  the command's output, its exit code and its timings there; the console (serial) goes to a file kept for
  diagnosis only, never parsed.
* When the command ends, the guest's PID 1 exits, the kernel panics with ``panic=-1`` and qemu, started
  with ``-no-reboot``, exits. qemu is killed on every other exit path (timeout, exception, and our own
  death: PR_SET_PDEATHSIG).
* Acceleration: software emulation (TCG) unless KVM was probed and a guest actually booted under it (on
  the machines this was written on ``/dev/kvm`` answers but guests hang; LAB-FACTS). The probe boots a
  guest running ``true`` with a timeout and its answer is cached per host kernel and qemu version.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
VM_DIR = ROOT / ".tools" / "vm"
"""scripts/setup_vm.sh's cache (``current`` -> the unpacked kernel); the initramfs and the probe's answer
are cached here too."""
JOBS_DIR = ROOT / "build" / "vm-jobs"
QEMU = "qemu-system-x86_64"
BUSYBOX = Path("/bin/busybox")
ROOT_MODULES = ("virtio_pci", "9pnet_virtio", "9p", "overlay", "virtio_rng")
"""What the initramfs loads before the root exists; everything else the kernel autoloads with modprobe."""
DATAPATH_MODULES = (
    "wireguard",
    "veth",
    "xfrm_user",
    "esp4",
    "gcm",
    "ghash_generic",
    "ctr",
    "seqiv",
    "drbg",
    "jitterentropy_rng",
    "sha512_generic",
    "sha3_generic",
)
"""What the lab's kernel datapath makes the kernel autoload (lsmod after a run): ``boot(preload=...)``
loads them before the command, so no test deadline (charon's IKE retransmits) waits for them."""
MEMORY_MB = 2048
ACCEL_ENV = "VPNGW_VM_ACCEL"
"""``tcg`` or ``kvm`` forces the accelerator (no probe)."""

INIT = r"""#!/bin/busybox sh
# lab/vm's PID 1 in the initramfs: the host's / (9p, read-only) under a tmpfs overlay, then the job.
/bin/busybox --install -s /bin
mkdir -p /proc /sys /dev /host /ovl /newroot
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
fail() { echo "vm-init: $*" >&2; sleep 1; exit 1; }
for m in $(cat /modules.order); do insmod "/modules/$m" || fail "insmod $m"; done
for arg in $(cat /proc/cmdline); do
  case "$arg" in
    vmjob=*) JOB="${arg#vmjob=}" ;;
    vmmods=*) MODS="${arg#vmmods=}" ;;
    vmrel=*) REL="${arg#vmrel=}" ;;
  esac
done
[ -n "$JOB" ] && [ -n "$MODS" ] && [ -n "$REL" ] || fail "vmjob/vmmods/vmrel missing from the command line"
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 host /host || fail "9p host"
mount -t tmpfs -o size=75% ovl /ovl
mkdir -p /ovl/upper /ovl/work
mount -t overlay overlay -o lowerdir=/host,upperdir=/ovl/upper,workdir=/ovl/work /newroot || fail overlay
mkdir -p "/newroot/lib/modules/$REL"
mount --bind "/newroot$MODS" "/newroot/lib/modules/$REL" || fail "modules"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 job "/newroot$JOB" || fail "9p job"
for d in run tmp; do mount -t tmpfs -o mode=0755 "$d" "/newroot/$d"; done
chmod 1777 /newroot/tmp
mount --move /dev /newroot/dev
umount /sys /proc
exec switch_root /newroot /bin/sh "$JOB/run.sh"
"""

RUN = """#!/bin/sh
# lab/vm's job runner (PID 1 after switch_root): the command, its output and exit code into {job}.
J={job}
mount -t proc proc /proc && mount -t sysfs sys /sys || exit 1
echo /sbin/modprobe > /proc/sys/kernel/modprobe
mkdir -p /dev/shm /dev/pts && mount -t tmpfs -o mode=1777 shm /dev/shm && mount -t devpts devpts /dev/pts
ip link set lo up
hostname vpngw-vm
{preload}
cut -d' ' -f1 /proc/uptime > "$J/started"
cd {cwd}
env -i VM_JOB="$J" {env} {argv} > "$J/output.log" 2>&1 < /dev/null
echo $? > "$J/rc"
cut -d' ' -f1 /proc/uptime > "$J/finished"
sync
"""


class VmError(Exception):
    """The VM could not run the command (not the command's own failure: that is ``Result.returncode``)."""


@dataclass(frozen=True)
class Kernel:
    """The unpacked linux-image (scripts/setup_vm.sh): ``dir`` holds boot/ and lib/modules/<release>/."""

    dir: Path
    release: str

    @classmethod
    def locate(cls, vm_dir: Path = VM_DIR) -> Kernel:
        current = vm_dir / "current"
        try:
            d = current.resolve(strict=True)
            release = (d / "release").read_text().strip()
        except OSError as e:
            raise VmError(f"no unpacked kernel at {current} ({e}): run scripts/setup_vm.sh") from e
        return cls(d, release)

    @property
    def vmlinuz(self) -> Path:
        return self.dir / "boot" / f"vmlinuz-{self.release}"

    @property
    def modules(self) -> Path:
        return self.dir / "lib" / "modules" / self.release


def module_closure(kernel: Kernel, names: Sequence[str]) -> list[str]:
    """The modules ``names`` need, dependencies first, as paths relative to the modules directory
    (from ``modules.dep``, which ``depmod -b`` wrote)."""
    deps: dict[str, list[str]] = {}
    by_name: dict[str, str] = {}
    for line in (kernel.modules / "modules.dep").read_text().splitlines():
        path, _, rest = line.partition(":")
        deps[path] = rest.split()
        by_name[Path(path).name.removesuffix(".ko").replace("-", "_")] = path
    order: list[str] = []

    def visit(path: str) -> None:
        if path in order:
            return
        for dep in deps[path]:
            visit(dep)
        order.append(path)

    for name in names:
        if name not in by_name:
            raise VmError(f"module {name} is not in {kernel.modules}/modules.dep")
        visit(by_name[name])
    return order


def _cpio_newc(entries: Sequence[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive of (name, mode, data) entries (directories have S_IFDIR and no data)."""
    out = bytearray()

    def add(name: str, mode: int, data: bytes, ino: int) -> None:
        nb = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(nb), 0)
        out.extend(b"070701" + b"".join(b"%08X" % f for f in fields) + nb)
        out.extend(b"\0" * (-len(out) % 4))
        out.extend(data)
        out.extend(b"\0" * (-len(out) % 4))

    for i, (name, mode, data) in enumerate(entries, start=1):
        add(name, mode, data, i)
    add("TRAILER!!!", 0, b"", 0)
    return bytes(out)


def initramfs(kernel: Kernel, vm_dir: Path = VM_DIR) -> Path:
    """The busybox initramfs for ``kernel``, built once per input (init, busybox, the modules)."""
    modules = module_closure(kernel, ROOT_MODULES)
    busybox = BUSYBOX.read_bytes()
    h = hashlib.sha256(INIT.encode() + busybox + kernel.release.encode())
    for m in modules:
        h.update(m.encode() + hashlib.sha256((kernel.modules / m).read_bytes()).digest())
    path = vm_dir / f"initramfs-{h.hexdigest()[:16]}.cpio"
    if path.exists():
        with contextlib.suppress(OSError):
            os.utime(path)  # in use: not another checkout's to clean up
        return path
    entries: list[tuple[str, int, bytes]] = [
        ("bin", 0o040755, b""),
        ("bin/busybox", 0o100755, busybox),
        ("init", 0o100755, INIT.encode()),
        ("modules", 0o040755, b""),
        ("modules.order", 0o100644, "".join(f"{Path(m).name}\n" for m in modules).encode()),
    ]
    entries += [(f"modules/{Path(m).name}", 0o100644, (kernel.modules / m).read_bytes()) for m in modules]
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(_cpio_newc(entries))
    os.replace(tmp, path)
    # Another init's or kernel's, unused for a day (.tools is shared by checkouts: one may boot it now).
    for old in vm_dir.glob("initramfs-*.cpio"):
        with contextlib.suppress(OSError):
            if old != path and time.time() - old.stat().st_mtime > 86400:
                old.unlink()
    return path


@dataclass(frozen=True)
class Result:
    """What the command did inside the VM."""

    returncode: int
    output: str
    accel: str
    wall_seconds: float
    """From starting qemu to qemu's exit."""
    command_seconds: float
    """The command's own run (the guest's clock)."""
    boot_seconds: float
    """From the kernel's start to the job's start (the guest's uptime then)."""
    job_dir: Path
    console: str
    files: dict[str, str]
    """What the command wrote into ``$VM_JOB`` (its job directory, exported to it), by name."""


def _die_with_parent() -> None:
    """In qemu's child before exec: SIGKILL when the process that started it dies (PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


def _qemu_argv(kernel: Kernel, image: Path, job: Path, accel: str, cpus: int) -> list[str]:
    cpu = "host" if accel == "kvm" else "max"
    append = (
        f"console=ttyS0 panic=-1 quiet loglevel=4 vmjob={job} vmmods={kernel.modules} vmrel={kernel.release}"
    )
    return [
        QEMU,
        "-accel",
        accel if accel == "kvm" else "tcg,thread=multi",
        "-cpu",
        cpu,
        "-smp",
        str(cpus),
        "-m",
        str(MEMORY_MB),
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-monitor",
        "none",
        "-serial",
        f"file:{job / 'console.log'}",
        "-no-reboot",
        "-kernel",
        str(kernel.vmlinuz),
        "-initrd",
        str(image),
        "-append",
        append,
        "-virtfs",
        "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap",
        "-virtfs",
        f"local,path={job},mount_tag=job,security_model=none",
        "-device",
        "virtio-rng-pci",
    ]


_RUNNER_FILES = frozenset({"run.sh", "rc", "started", "finished", "output.log", "console.log", "qemu.log"})


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def boot(
    argv: Sequence[str],
    *,
    cwd: Path = ROOT,
    env: Mapping[str, str],
    timeout: float = 600.0,
    accel: str | None = None,
    cpus: int = 2,
    keep: bool = False,
    preload: Sequence[str] = (),
) -> Result:
    """Boot the VM, run ``argv`` (in ``cwd``, with exactly ``env``) as root inside and return what it did.

    ``cwd`` and everything the command reads must be visible on the host's ``/`` outside /tmp. Raises
    ``VmError`` when the VM did not come back with an exit code (timeout, boot failure); the job directory
    (output, console) is removed unless ``keep``, a failure, or a non-zero exit code of the command.
    ``preload``: modules loaded (``modprobe -a``)
    before the command starts, counted in ``boot_seconds``: the kernel would autoload them on first use,
    but each autoload execs modprobe from the 9p root under emulation (seconds), inside the command's
    deadlines (charon's first CHILD_SA install waits for esp4, gcm, drbg...)."""
    kernel = Kernel.locate()
    image = initramfs(kernel)
    accel = accel or choose_accel()
    JOBS_DIR.mkdir(parents=True, exist_ok=True)
    job = JOBS_DIR / uuid.uuid4().hex[:12]
    job.mkdir()
    environment = dict(env)  # given, never the host's whole environment: it is written to run.sh
    (job / "run.sh").write_text(
        RUN.format(
            job=shlex.quote(str(job)),
            cwd=shlex.quote(str(cwd)),
            env=" ".join(shlex.quote(f"{k}={v}") for k, v in sorted(environment.items())),
            argv=" ".join(shlex.quote(a) for a in argv),
            preload=f"modprobe -a {' '.join(shlex.quote(m) for m in preload)}" if preload else "",
        )
    )
    qemu = _qemu_argv(kernel, image, job, accel, cpus)
    started = time.monotonic()
    ok = False
    with open(job / "qemu.log", "wb") as qemu_log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            qemu,
            stdin=subprocess.DEVNULL,
            stdout=qemu_log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
    try:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise VmError(
                f"the VM ({accel}) did not finish {argv!r} within {timeout:g} s; console tail:\n"
                f"{_read(job / 'console.log')[-2000:]}\noutput tail:\n{_read(job / 'output.log')[-2000:]}"
            ) from e
        wall = time.monotonic() - started
        rc_text = _read(job / "rc").strip()
        if not rc_text:
            raise VmError(
                f"the VM ({accel}, qemu exit {proc.returncode}) gave no exit code for {argv!r}; "
                f"qemu: {_read(job / 'qemu.log')[-1000:]}\n"
                f"console tail:\n{_read(job / 'console.log')[-3000:]}"
            )
        boot_s = float(_read(job / "started") or 0)
        finished = float(_read(job / "finished") or boot_s)
        result = Result(
            returncode=int(rc_text),
            output=_read(job / "output.log"),
            accel=accel,
            wall_seconds=wall,
            command_seconds=finished - boot_s,
            boot_seconds=boot_s,
            job_dir=job,
            console=_read(job / "console.log"),
            files={p.name: _read(p) for p in job.iterdir() if p.is_file() and p.name not in _RUNNER_FILES},
        )
        # A failed guest run keeps its job directory (output, console, junit) for diagnosis.
        ok = result.returncode == 0
        log.info(
            "lab.vm.done accel=%s rc=%s wall=%.1fs boot=%.1fs command=%.1fs",
            accel,
            result.returncode,
            wall,
            boot_s,
            result.command_seconds,
        )
        return result
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if ok and not keep:
            shutil.rmtree(job, ignore_errors=True)


def _kvm_usable() -> bool:
    return os.access("/dev/kvm", os.R_OK | os.W_OK)


def choose_accel(probe_timeout: float = 30.0) -> str:
    """``kvm`` when a guest actually boots under it here (probed once per host kernel and qemu version,
    the answer cached), else ``tcg``; ``VPNGW_VM_ACCEL`` forces one."""
    forced = os.environ.get(ACCEL_ENV)
    if forced in ("tcg", "kvm"):
        return forced
    if not _kvm_usable():
        return "tcg"
    version = subprocess.run([QEMU, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256((os.uname().release + version).encode()).hexdigest()[:16]
    cache = VM_DIR / f"accel-{key}.json"
    try:
        return str(json.loads(cache.read_text())["accel"])
    except (OSError, ValueError, KeyError):
        pass
    try:
        res = boot(
            ["true"], env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, timeout=probe_timeout, accel="kvm"
        )
        accel, why = (
            ("kvm", f"a guest booted in {res.wall_seconds:.1f} s")
            if res.returncode == 0
            else (
                "tcg",
                f"the probe's guest answered {res.returncode}",
            )
        )
    except VmError as e:
        accel, why = (
            "tcg",
            f"no KVM guest came back (limit {probe_timeout:g} s): {' '.join(str(e).split())[:300]}",
        )
    log.info("lab.vm.accel accel=%s why=%s", accel, why)
    tmp = cache.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"accel": accel, "why": why}) + "\n")
    os.replace(tmp, cache)
    return accel
