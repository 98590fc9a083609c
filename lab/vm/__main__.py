"""``python -m lab.vm [--kernel-datapath] [--timeout S] -- COMMAND...``: run COMMAND as root in the kernel
tier's VM (Debian's kernel under qemu, the host's userspace; docs/vm.md) and exit with its exit code.

COMMAND runs in this checkout with this process's PATH, PYTHONPATH set to the checkout and the lab
datapath's modules loaded; ``--kernel-datapath`` also sets ``VPNGW_LAB_DATAPATH=kernel`` (the lab's
charon without kernel-libipsec). Its output is printed once the VM has stopped. Example: the existing
scenarios the tier leaves out, on the kernel datapath::

    python -m lab.vm --kernel-datapath -- python -m pytest -p no:cacheprovider -q \\
        tests/integration/test_agent_ipsec.py::test_child_rekey_never_shows_zero_bytes_or_a_non_established_state

Exit codes: COMMAND's, or 125 when the VM could not run it (no kernel: run scripts/setup_vm.sh).
"""

from __future__ import annotations

import argparse
import os
import sys

from lab.vm import DATAPATH_MODULES, ROOT, VmError, boot


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.vm", description=__doc__.split("\n\n")[0])
    p.add_argument("--kernel-datapath", action="store_true", help="set VPNGW_LAB_DATAPATH=kernel")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds (default: %(default)s)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    ns = p.parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not command:
        p.error("no command")
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "PYTHONPATH": str(ROOT),
        "HOME": "/root",
        "LANG": "C.UTF-8",
    }
    if ns.kernel_datapath:
        env["VPNGW_LAB_DATAPATH"] = "kernel"
    if command[0] == "python":
        command[0] = sys.executable
    try:
        res = boot(command, cwd=ROOT, env=env, timeout=ns.timeout, preload=DATAPATH_MODULES)
    except VmError as e:
        print(f"lab.vm: {e}", file=sys.stderr)
        return 125
    sys.stdout.write(res.output)
    print(
        f"lab.vm: accel={res.accel} boot={res.boot_seconds:.1f}s command={res.command_seconds:.1f}s "
        f"wall={res.wall_seconds:.1f}s exit={res.returncode}",
        file=sys.stderr,
    )
    return res.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
