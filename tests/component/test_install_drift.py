"""What the project runs is what its install files install: set-up on a fresh machine, the gateway image.

This machine is not a fresh one: a package installed here by hand once made CI pass while a fresh
machine's charon could not load its openssl plugin (libstrongswan-standard-plugins, which strongswan-charon
only Recommends; the project installs with --no-install-recommends). So every charon plugin the two
strongswan.conf files load and every command the code runs must come (``dpkg -S``) from a package that
``scripts/setup.sh`` names, or, for the gateway image, that ``images/gateway/Dockerfile`` names, or from
what those packages Depend on (Depends and Pre-Depends; Recommends do not count), or from the packages
every Debian system has (Essential, Priority required: debootstrap's minbase).

The commands are declared in tests/commands.py (``IMAGE_COMMANDS``: what the gateway pod's containers
run; ``HOST_COMMANDS``: what the lab, the tests, the demo and the benchmarks run besides). The session
records every command it actually starts (tests/conftest.py, an audit hook); a command missing from these
lists fails the run, so the lists cannot fall behind the code.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import pytest

from lab.daemons import CHARON_PLUGINS
from tests.commands import HOST_COMMANDS, IMAGE_COMMANDS, MACHINE_COMMANDS

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_DIR = Path("/usr/lib/ipsec/plugins")


def _words(text: str) -> list[str]:
    return text.replace("\\\n", " ").split()


def setup_packages() -> set[str]:
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup.sh"), "--print-packages"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(out.stdout.split())


def dockerfile_packages(dockerfile: Path) -> set[str]:
    """Every package an ``apt-get install`` of the Dockerfile names (versions stripped)."""
    words = _words(dockerfile.read_text())
    names: set[str] = set()
    i = 0
    while i < len(words):
        if words[i] == "apt-get" and i + 1 < len(words) and words[i + 1] == "install":
            i += 2
            while i < len(words) and words[i] not in ("&&", ";", "||", "|"):
                w = words[i]
                if not w.startswith("-") and re.fullmatch(r"[a-z0-9][a-z0-9+.-]*(=\S+)?", w):
                    names.add(w.split("=", 1)[0])
                i += 1
        i += 1
    return names


@cache
def _dpkg_db() -> tuple[dict[str, list[list[str]]], dict[str, set[str]], frozenset[str]]:
    """Installed packages: their Depends + Pre-Depends (groups of alternatives), who provides what, and
    the ones every Debian system has (Essential, Priority required)."""
    fields = ("Package", "Essential", "Priority", "Provides", "Pre-Depends", "Depends", "db:Status-Abbrev")
    fmt = "\t".join(f"${{{f}}}" for f in fields) + "\n"
    out = subprocess.run(["dpkg-query", "-W", "-f", fmt], capture_output=True, text=True, check=True).stdout
    deps: dict[str, list[list[str]]] = {}
    provides: dict[str, set[str]] = {}
    base: set[str] = set()
    for line in out.splitlines():
        pkg, essential, priority, prov, pre, dep, status = (line.split("\t") + [""] * 7)[:7]
        if not status.startswith("ii"):
            continue
        pkg = pkg.split(":")[0]
        groups = []
        for field in (pre, dep):
            for group in filter(None, (g.strip() for g in field.split(","))):
                groups.append([re.split(r"[\s(:]", alt.strip(), maxsplit=1)[0] for alt in group.split("|")])
        deps[pkg] = groups
        for p in filter(None, (x.strip() for x in prov.split(","))):
            provides.setdefault(re.split(r"[\s(]", p, maxsplit=1)[0], set()).add(pkg)
        if essential == "yes" or priority == "required":
            base.add(pkg)
    return deps, provides, frozenset(base)


def closure(roots: Iterable[str]) -> set[str]:
    """``roots`` and everything they Depend/Pre-Depend on, recursively (any installed alternative)."""
    deps, provides, _ = _dpkg_db()
    seen: set[str] = set()
    todo = [r for r in roots]
    while todo:
        name = todo.pop()
        for pkg in {name} | provides.get(name, set()):
            if pkg in seen or pkg not in deps:
                continue
            seen.add(pkg)
            todo += [alt for group in deps[pkg] for alt in group]
    return seen


def base_packages() -> set[str]:
    return closure(_dpkg_db()[2])


def owner(path: str) -> str | None:
    """The package that ships ``path`` (merged /usr: dpkg may know it as /bin/x or /sbin/x)."""
    candidates = [path, os.path.realpath(path)]
    for p in list(candidates):
        for merged, old in (("/usr/bin/", "/bin/"), ("/usr/sbin/", "/sbin/"), ("/usr/lib/", "/lib/")):
            if p.startswith(merged):
                candidates.append(old + p[len(merged) :])
    for p in candidates:
        res = subprocess.run(["dpkg-query", "-S", p], capture_output=True, text=True, check=False)
        owners = [line for line in res.stdout.splitlines() if not line.startswith("diversion ")]
        if res.returncode == 0 and owners:
            return owners[0].split(":", 1)[0].split(",")[0].strip()
    return None


def command_path(command: str) -> str:
    path = command if command.startswith("/") else shutil.which(command)
    assert path and os.path.exists(path), f"{command}: not installed (scripts/setup.sh must install it)"
    return path


def loaded_plugins(conf_text: str) -> list[str]:
    found = re.findall(r"^\s*load\s*=\s*(.+)$", conf_text, flags=re.MULTILINE)
    assert found, "no load = line"
    return [p for line in found for p in line.split()]


def plugin_owner(plugin: str) -> str:
    so = PLUGIN_DIR / f"libstrongswan-{plugin}.so"
    assert so.exists(), f"charon plugin {plugin!r}: {so} is not installed"
    pkg = owner(str(so))
    assert pkg, f"charon plugin {plugin!r}: no package ships {so}"
    return pkg


def image_conf() -> str:
    return (ROOT / "images" / "gateway" / "strongswan.conf").read_text()


@pytest.mark.parametrize(
    "conf, image",
    [
        pytest.param("lab", False, id="lab-strongswan.conf"),
        pytest.param("image", True, id="image-strongswan.conf"),
    ],
)
def test_every_plugin_charon_loads_comes_from_a_package_the_install_files_name(
    conf: str, image: bool
) -> None:
    text = image_conf() if image else f"load = {CHARON_PLUGINS}"
    allowed = closure(setup_packages()) | base_packages()
    image_allowed = closure(dockerfile_packages(ROOT / "images" / "gateway" / "Dockerfile")) | base_packages()
    for plugin in loaded_plugins(text):
        pkg = plugin_owner(plugin)
        assert pkg in allowed, f"charon plugin {plugin!r} is in {pkg}, which scripts/setup.sh does not bring"
        if image:
            assert pkg in image_allowed, (
                f"charon plugin {plugin!r} is in {pkg}, which images/gateway/Dockerfile does not bring"
            )


def test_every_command_the_project_runs_comes_from_a_package_setup_installs() -> None:
    allowed = closure(setup_packages()) | base_packages()
    for command in sorted((IMAGE_COMMANDS | HOST_COMMANDS) - MACHINE_COMMANDS):
        path = command_path(command)
        pkg = owner(path)
        assert pkg is not None, f"{command} ({path}) belongs to no Debian package: installed by hand?"
        assert pkg in allowed, f"{command} ({path}) is in {pkg}, which scripts/setup.sh does not bring"


def test_every_command_the_gateway_pod_runs_comes_from_a_package_its_dockerfile_installs() -> None:
    named = dockerfile_packages(ROOT / "images" / "gateway" / "Dockerfile")
    allowed = closure(named) | base_packages()
    for command in sorted(IMAGE_COMMANDS):
        if command == "python3":
            assert "python3" in named or "python3-minimal" in allowed
            continue
        path = command_path(command)
        pkg = owner(path)
        assert pkg is not None and pkg in allowed, (
            f"{command} ({path}) is in {pkg}, which images/gateway/Dockerfile does not bring"
        )


def test_recommends_do_not_count() -> None:
    """The check itself: the openssl plugin's package is only Recommended by strongswan-charon, so it is
    not in strongswan-charon's closure, and naming it is what makes the plugin count."""
    assert plugin_owner("openssl") == "libstrongswan-standard-plugins"
    assert "libstrongswan-standard-plugins" not in closure({"strongswan-charon"})
    assert "libstrongswan-standard-plugins" in closure({"libstrongswan-standard-plugins"})


def test_the_dockerfile_parser_reads_versions_and_continuations(tmp_path: Path) -> None:
    df = tmp_path / "Dockerfile"
    df.write_text(
        "FROM x\nRUN apt-get update \\\n && apt-get install -y --no-install-recommends \\\n"
        "      strongswan-charon=5.9.8-5+deb12u6 wg-tool \\\n && rm -rf /var/lib/apt/lists/*\n"
    )
    assert dockerfile_packages(df) == {"strongswan-charon", "wg-tool"}
