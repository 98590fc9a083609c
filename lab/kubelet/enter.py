"""``python -m lab.kubelet.enter SPEC.json``: become one container of a pod (process mode), then exec it.

Started by the lab kubelet as ``ip netns exec <pod netns> <python> -m lab.kubelet.enter SPEC`` (as root):
``ip netns exec`` gives the process the pod's network namespace and a mount namespace of its own (with
``/sys`` of that network namespace). Here, in this order:

1. mount propagation private (nothing done here reaches the host), a UTS namespace with the pod's hostname;
2. every bind source opened (``O_PATH``) before anything is covered: sources may live under /tmp;
3. ``/etc`` becomes an overlay whose upper layer holds what the gateway image has and the host lacks (its
   group ``vpngw``, ``/etc/vpngw/...``) and the pod's ``resolv.conf``, ``hosts`` and ``hostname``, as the
   runtime writes them; fresh tmpfs on ``/run`` and ``/tmp`` (an image's empty directories), unless a
   volume is mounted there;
4. the volumes bound at their mount paths (``readOnly`` ones read-only), mount points created inside
   the container's own view only (the host never sees these paths);
5. ``readOnlyRootFilesystem``: ``/``, the ``/etc`` overlay and the fresh tmpfs become read-only;
6. privileges as the spec says: ``no_new_privs`` (allowPrivilegeEscalation false), the capability
   bounding set cut to the added capabilities (root then keeps exactly those across exec; any other user
   keeps none), supplementary groups, gid, uid;
7. ``chdir`` and ``execvpe``: the container's process is this pid from then on.

A failure is exit 127 with one ``enter.failed`` line on stderr (the container log), as a runtime that
cannot create a container reports it. This module runs as its own program: it imports nothing of the
project, so it starts fast and stays correct whatever the lab imports.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path
from typing import Any

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
CLONE_NEWUTS = 0x04000000
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
CAP_LAST_CAP_FILE = "/proc/sys/kernel/cap_last_cap"

CAPABILITIES = {
    "CHOWN": 0,
    "DAC_OVERRIDE": 1,
    "DAC_READ_SEARCH": 2,
    "FOWNER": 3,
    "FSETID": 4,
    "KILL": 5,
    "SETGID": 6,
    "SETUID": 7,
    "SETPCAP": 8,
    "LINUX_IMMUTABLE": 9,
    "NET_BIND_SERVICE": 10,
    "NET_BROADCAST": 11,
    "NET_ADMIN": 12,
    "NET_RAW": 13,
    "IPC_LOCK": 14,
    "IPC_OWNER": 15,
    "SYS_MODULE": 16,
    "SYS_RAWIO": 17,
    "SYS_CHROOT": 18,
    "SYS_PTRACE": 19,
    "SYS_PACCT": 20,
    "SYS_ADMIN": 21,
    "SYS_BOOT": 22,
    "SYS_NICE": 23,
    "SYS_RESOURCE": 24,
    "SYS_TIME": 25,
    "SYS_TTY_CONFIG": 26,
    "MKNOD": 27,
    "LEASE": 28,
    "AUDIT_WRITE": 29,
    "AUDIT_CONTROL": 30,
    "SETFCAP": 31,
    "MAC_OVERRIDE": 32,
    "MAC_ADMIN": 33,
    "SYSLOG": 34,
    "WAKE_ALARM": 35,
    "BLOCK_SUSPEND": 36,
    "AUDIT_READ": 37,
    "PERFMON": 38,
    "BPF": 39,
    "CHECKPOINT_RESTORE": 40,
}

_libc = ctypes.CDLL(None, use_errno=True)


class EnterError(Exception):
    pass


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise EnterError(f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    rc = _libc.mount(
        source.encode() if source is not None else None,
        target.encode(),
        fstype.encode() if fstype is not None else None,
        ctypes.c_ulong(flags),
        data.encode() if data is not None else None,
    )
    _check(rc, f"mount {source or fstype} on {target}")


def _inside(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _mountpoint(target: str, is_dir: bool, ours: list[str]) -> None:
    """Create a missing mount point, but only inside what this container owns (the /etc overlay, its
    fresh tmpfs, its volumes): a directory made anywhere else would appear on the host's disk."""
    p = Path(target)
    if not p.exists():
        existing = p
        while not existing.exists():
            existing = existing.parent
        if not _inside(os.path.realpath(existing), ours):
            raise EnterError(
                f"mount point {target}: missing, and {existing} is the host's own directory (process mode "
                "creates mount points only under /etc, /run, /tmp and the pod's volumes; use podman)"
            )
    if is_dir:
        p.mkdir(parents=True, exist_ok=True)
    else:
        p.parent.mkdir(parents=True, exist_ok=True)
        if not p.exists():
            p.touch()


def setup_mounts(spec: dict[str, Any]) -> None:
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    binds: list[tuple[int, str, bool, bool]] = []
    for m in spec.get("mounts", []):
        fd = os.open(m["source"], os.O_PATH)
        binds.append((fd, m["target"], bool(m.get("readonly")), os.path.isdir(m["source"])))
    etc = spec.get("etc")
    if etc:
        opts = f"lowerdir=/etc,upperdir={etc['upper']},workdir={etc['work']}"
        mount("overlay", "/etc", "overlay", 0, opts)
    targets = {t for _, t, _, _ in binds}
    fresh = [p for p in spec.get("tmpfs", []) if p not in targets]
    for path in fresh:
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m")
    ours = [*(["/etc"] if etc else []), *spec.get("tmpfs", [])]
    for fd, target, readonly, is_dir in sorted(binds, key=lambda b: b[1].count("/")):
        _mountpoint(target, is_dir, ours)
        mount(f"/proc/self/fd/{fd}", target, None, MS_BIND)
        ours.append(target)
        if readonly:
            mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
        os.close(fd)
    if spec.get("readonly_root"):
        for path in ["/", *(["/etc"] if etc else []), *fresh]:
            mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def drop_privileges(spec: dict[str, Any]) -> None:
    caps = spec.get("caps")
    if spec.get("no_new_privs"):
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    if caps is not None:  # None: privileged, keep everything
        keep = {CAPABILITIES[c.upper().removeprefix("CAP_")] for c in caps}
        last = int(Path(CAP_LAST_CAP_FILE).read_text())
        for cap in range(last + 1):
            if cap not in keep:
                _check(_libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"prctl(PR_CAPBSET_DROP, {cap})")
    uid, gid = int(spec.get("user", 0)), int(spec.get("group", 0))
    os.setgroups([int(g) for g in spec.get("groups", [])])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


def enter(spec: dict[str, Any]) -> None:
    hostname = spec.get("hostname")
    if hostname:
        _check(_libc.unshare(CLONE_NEWUTS), "unshare(CLONE_NEWUTS)")
        name = hostname.encode()
        _check(_libc.sethostname(name, len(name)), "sethostname")
    setup_mounts(spec)
    drop_privileges(spec)
    os.chdir(spec.get("cwd") or "/")
    argv = [str(a) for a in spec["argv"]]
    env = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
    os.execvpe(argv[0], argv, env)  # noqa: S606 - the container's own command, as the spec gives it


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(
            "usage: python -m lab.kubelet.enter SPEC.json\n"
            "Become one process-mode container of a lab pod (mounts, user, capabilities) and exec it.\n"
            "Exit codes: never returns on success (the container's command runs); 127 when the container "
            "cannot be created; 2 bad usage.",
            file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout,
        )
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    try:
        spec = json.loads(Path(argv[0]).read_text())
        enter(spec)
    except (OSError, EnterError, KeyError, ValueError) as exc:
        print(f"enter.failed error={str(exc)!r}", file=sys.stderr, flush=True)
        return 127
    return 127  # pragma: no cover - execvpe does not return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
