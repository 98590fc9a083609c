"""A pod's volumes on the node, as the kubelet lays them out: one directory per volume under the pod's
directory; ConfigMap, Secret, downwardAPI and projected volumes written by the kubelet's atomic writer;
emptyDirs (``medium: Memory`` a tmpfs of ``sizeLimit``), hostPath as the host's path.

The atomic writer (k8s.io/kubernetes pkg/volume/util/atomic_writer.go): the payload goes into a new
timestamped directory ``..<time>``, a symlink ``..data_tmp`` pointing at it is renamed over ``..data``
(the one atomic step), each visible name is a symlink ``<name> -> ..data/<name>``; names no longer in the
payload are removed, then the previous timestamped directory. A reader that opens ``<name>`` sees the
old or the new content, never a mix.

Memory emptyDirs are tmpfs mounts on the node (the root mount namespace, as on a real node); every one is
unmounted when the pod goes, and ``stale_mounts`` finds those of a killed run (their directory names
carry the run's prefix, whose pid is gone).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from lab.kubelet.model import Files

_UNITS = {"": 1, "k": 1000, "M": 1000**2, "G": 1000**3, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}


def quantity_bytes(q: str) -> int:
    """A Kubernetes quantity of bytes (``16Mi``, ``1G``, ``512``)."""
    m = re.fullmatch(r"(\d+)([kMG]i?|)", q.strip())
    if not m:
        raise ValueError(f"quantity {q!r}: not a number of bytes")
    return int(m.group(1)) * _UNITS[m.group(2)]


def _visible(payload: Files) -> set[str]:
    return {p.split("/", 1)[0] for p in payload}


def read_payload(target: Path) -> Files | None:
    """What ``..data`` holds now (None: never written)."""
    data = target / "..data"
    if not data.is_symlink():
        return None
    base = target / os.readlink(data)
    out: Files = {}
    for p in base.rglob("*"):
        if p.is_file():
            out[str(p.relative_to(base))] = (p.read_bytes(), p.stat().st_mode & 0o7777)
    return out


def write_atomic(target: Path, payload: Files, *, owner: tuple[int, int] | None = None) -> bool:
    """Make ``target`` show ``payload`` (atomic ``..data`` swap); False when it already does."""
    target.mkdir(parents=True, exist_ok=True)
    target.chmod(0o755)
    if read_payload(target) == payload:
        return False
    old = os.readlink(target / "..data") if (target / "..data").is_symlink() else None
    stamp = time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime()) + f"{time.monotonic_ns() % 10**9:09d}"
    new = target / stamp
    new.mkdir(mode=0o755)
    for rel, (content, mode) in sorted(payload.items()):
        f = new / rel
        f.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        f.write_bytes(content)
        f.chmod(mode)
        if owner is not None:
            os.chown(f, *owner)
    tmp = target / "..data_tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    tmp.symlink_to(stamp)
    os.replace(tmp, target / "..data")
    names = _visible(payload)
    for name in names:
        link = target / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")
    for entry in target.iterdir():
        if not entry.name.startswith("..") and entry.name not in names:
            entry.unlink()
    if old is not None and old != stamp:
        shutil.rmtree(target / old, ignore_errors=True)
    return True


def mount_tmpfs(path: Path, size: int | None) -> None:
    path.mkdir(parents=True, exist_ok=True)
    opts = "mode=0777" + (f",size={size}" if size else "")
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        raise OSError(f"mount tmpfs on {path}: {res.stderr.strip()}")


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def mounts_under(root: Path) -> list[Path]:
    """Mount points at or below ``root`` (from /proc/self/mountinfo), deepest first."""
    prefix = str(root.resolve())
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == prefix or mp.startswith(prefix + "/"):
                found.append(Path(mp))
    return sorted(found, key=lambda p: -len(p.parts))


def empty_dir(path: Path, *, memory: bool, size_limit: str | None) -> None:
    if memory:
        mount_tmpfs(path, quantity_bytes(size_limit) if size_limit else None)
    else:
        path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)


def remove_tree(root: Path) -> None:
    """Unmount whatever is mounted below ``root``, then remove it."""
    for mp in mounts_under(root):
        unmount(mp)
    shutil.rmtree(root, ignore_errors=True)


_RUN = re.compile(r"/(vg(\d+)x[0-9a-f]+)-kubelet(/|$)")


def stale_mounts() -> list[Path]:
    """tmpfs mounts of lab kubelets whose process is gone (a killed run)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            m = _RUN.search(mp)
            if m and not os.path.exists(f"/proc/{m.group(2)}"):
                out.append(Path(mp))
    return sorted(out, key=lambda p: -len(p.parts))
