"""The decisions behind the container images, as pure functions, and the thin file I/O around them.

``images/build.sh`` calls this with the project's virtual environment (``.venv/bin/python``):

* ``context IMAGE OUT``: stages the build context of ``images/IMAGE/Dockerfile``. The image's programs
  (the Dockerfile's ``net.bnerd.vpn.programs`` label) are the roots; the modules it holds are the
  closure of their imports over the modules of the repository's top-level packages (pyproject's
  packages.find). A new shared package or module lands in every image whose programs import it; a
  shared module no program of the image imports (the VICI client in the controller's image) stays out,
  and so does the test lab (no product code imports it). The Python dependencies are pyproject's
  ``[project.dependencies]`` entries, exactly as written there, whose import names the staged modules
  import: never the dev extras, and a dependency the image's code stops importing (the gateway's
  ``kubernetes`` client) leaves that image without an edit here. A product import that no runtime
  dependency provides is an error.
* ``inventory ROOTFS``: the Debian packages (with the ones the Dockerfile named), the Debian release and
  the Python distributions of an image's root file system, in the lock-file format.
* ``check LOCK INVENTORY``: compares an image's inventory with its checked-in lock (the pin policy of
  docs/images.md): a Debian revision that moved (a security or point update of the same upstream version)
  is reported and accepted; a package added or removed, an upstream version of a package the Dockerfile
  names, another Debian release, or any Python distribution that differs needs a lock refresh (exit 1).

Exit codes: 0 ok, 1 the lock is stale (``check``) or a build input is inconsistent, 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import importlib.metadata
import json
import re
import shutil
import sys
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS_LABEL = "net.bnerd.vpn.programs"
VENV_SITE = "opt/vpngw/venv/lib"
PROJECT = "vpngw"


class InputError(Exception):
    """Bad usage or an unreadable input file (exit 2)."""


class ContextError(Exception):
    """The repository cannot be staged as it stands: an import nothing provides (exit 1)."""


# --- names ------------------------------------------------------------------------------------------


def normalize(name: str) -> str:
    """A distribution name as PyPI compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(req: str) -> str:
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    if not m:
        raise InputError(f"pyproject: cannot read the requirement {req!r}")
    return normalize(m.group(1))


# --- pyproject and the package closure --------------------------------------------------------------


@dataclass(frozen=True)
class Project:
    """What the staged pyproject.toml needs from the repository's."""

    name: str
    version: str
    description: str
    requires_python: str
    dependencies: tuple[str, ...]
    build_requires: tuple[str, ...]
    build_backend: str
    include: tuple[str, ...]
    """pyproject's [tool.setuptools.packages.find] include patterns."""


def parse_pyproject(text: str) -> Project:
    try:
        doc = tomllib.loads(text)
        project = doc["project"]
        return Project(
            name=str(project["name"]),
            version=str(project["version"]),
            description=str(project.get("description", "")),
            requires_python=str(project.get("requires-python", "")),
            dependencies=tuple(str(d) for d in project.get("dependencies", [])),
            build_requires=tuple(str(r) for r in doc["build-system"]["requires"]),
            build_backend=str(doc["build-system"]["build-backend"]),
            include=tuple(str(p) for p in doc["tool"]["setuptools"]["packages"]["find"]["include"]),
        )
    except (tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise InputError(f"pyproject.toml: {exc!r}") from exc


def is_product(name: str, include: Iterable[str]) -> bool:
    """Whether pyproject's packages.find puts top-level package ``name`` into the project's wheel."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in include)


def module_name(rel: Path) -> str:
    """``agent/ipsec/run.py`` -> ``agent.ipsec.run``; ``agent/__init__.py`` -> ``agent``."""
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(source: str, module: str, is_package: bool) -> set[str]:
    """The dotted names a module imports, anywhere in it (also inside functions and ``if TYPE_CHECKING``:
    a lazy import still needs its module and distribution). Relative imports are resolved against
    ``module``; ``from X import a`` yields ``X`` and ``X.a`` (``a`` may be a module or a name in X)."""
    names: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if package else []
                if not base:
                    raise ContextError(f"{module}: a relative import beyond the top-level package")
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            names.add(target)
            names.update(f"{target}.{alias.name}" for alias in node.names if alias.name != "*")
    return {n for n in names if n and n.split(".")[0] != "__future__"}


def closure(roots: Iterable[str], imports: Mapping[str, set[str]]) -> set[str]:
    """The modules (keys of ``imports``: module -> the names it imports) reachable from ``roots``.

    Importing ``a.b.c`` runs ``a``, ``a.b`` and ``a.b.c``: a name reaches every prefix of it that is a
    module of the repository; names outside the repository are left out."""
    todo = list(roots)
    seen: set[str] = set()
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        if mod not in imports:
            raise ContextError(f"{mod!r} is not a module of the repository")
        seen.add(mod)
        parts = mod.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        for name in imports[mod]:
            pieces = name.split(".")
            todo.extend(p for i in range(1, len(pieces) + 1) if (p := ".".join(pieces[:i])) in imports)
    return seen


def select_dependencies(
    dependencies: Sequence[str],
    third_party: Mapping[str, set[str]],
    providers: Mapping[str, Sequence[str]],
) -> list[str]:
    """The entries of ``dependencies`` that provide the ``third_party`` import names (import name -> the
    product packages importing it), in pyproject's order.

    ``providers`` maps an import name to the distributions that install it
    (``importlib.metadata.packages_distributions()`` of an environment holding the runtime dependencies).
    """
    declared = {requirement_name(d): d for d in dependencies}
    wanted: set[str] = set()
    for name, importers in sorted(third_party.items()):
        dists = {normalize(d) for d in providers.get(name, ())}
        chosen = dists & declared.keys()
        if not chosen:
            raise ContextError(
                f"{', '.join(sorted(importers))} imports {name!r}, which no [project.dependencies] entry "
                f"provides (in this environment it comes from: {', '.join(sorted(dists)) or 'nothing'})"
            )
        wanted |= chosen
    return [d for d in dependencies if requirement_name(d) in wanted]


def programs_of(dockerfile_text: str) -> list[str]:
    m = re.search(rf'^LABEL\s+{re.escape(PROGRAMS_LABEL)}="([^"]+)"', dockerfile_text, re.M)
    if not m:
        raise InputError(f'the Dockerfile has no LABEL {PROGRAMS_LABEL}="<program> ..."')
    return m.group(1).split()


def staged_pyproject(
    project: Project, packages: Iterable[str], dependencies: Sequence[str], image: str
) -> str:
    """The pyproject.toml of an image's wheel: the repository's metadata, only the image's packages and
    the dependencies they import (so the installed metadata tells the truth about the image)."""

    def toml_list(items: Iterable[str]) -> str:
        return "[" + ", ".join(json.dumps(i) for i in items) + "]"

    include = [p for pkg in sorted(packages) for p in (pkg, f"{pkg}.*")]
    return (
        f"# Generated by images/imagectl.py for the {image} image from the repository's pyproject.toml.\n"
        "[build-system]\n"
        f"requires = {toml_list(project.build_requires)}\n"
        f"build-backend = {json.dumps(project.build_backend)}\n\n"
        "[project]\n"
        f"name = {json.dumps(project.name)}\n"
        f"version = {json.dumps(project.version)}\n"
        f"description = {json.dumps(project.description)}\n"
        f"requires-python = {json.dumps(project.requires_python)}\n"
        f"dependencies = {toml_list(dependencies)}\n\n"
        "[tool.setuptools.packages.find]\n"
        f"include = {toml_list(include)}\n"
    )


# --- inventories and the lock -----------------------------------------------------------------------


@dataclass(frozen=True)
class Deb:
    version: str
    named: bool
    """Installed because the Dockerfile names it (apt's manual mark), not as a dependency or the base."""


@dataclass(frozen=True)
class Inventory:
    """What an image holds, as its lock file records it."""

    release: str
    """The Debian point release of the base (/etc/debian_version), e.g. 12.15."""
    debs: dict[str, Deb] = field(default_factory=dict)
    python: dict[str, str] = field(default_factory=dict)
    """Python distribution (normalized name) -> version, the project itself excluded."""


def parse_dpkg_status(text: str) -> dict[str, str]:
    """Installed package -> version, from /var/lib/dpkg/status."""
    out: dict[str, str] = {}
    for stanza in text.split("\n\n"):
        fields = dict(
            line.split(":", 1) for line in stanza.splitlines() if ":" in line and not line.startswith(" ")
        )
        if fields.get("Status", "").strip() == "install ok installed":
            out[fields["Package"].strip()] = fields["Version"].strip()
    return out


def parse_auto_installed(text: str) -> set[str]:
    """Packages apt marked as automatically installed, from /var/lib/apt/extended_states."""
    auto: set[str] = set()
    for stanza in text.split("\n\n"):
        fields = dict(line.split(":", 1) for line in stanza.splitlines() if ":" in line)
        if fields.get("Auto-Installed", "").strip() == "1" and "Package" in fields:
            auto.add(fields["Package"].strip())
    return auto


def parse_metadata(text: str) -> tuple[str, str]:
    name = re.search(r"^Name: (.+)$", text, re.M)
    version = re.search(r"^Version: (.+)$", text, re.M)
    if not name or not version:
        raise InputError("a dist-info METADATA without Name or Version")
    return normalize(name.group(1).strip()), version.group(1).strip()


def inventory_of(rootfs: Path) -> Inventory:
    """Read an image's root file system (``podman image mount``, or ``umoci unpack``)."""
    try:
        release = (rootfs / "etc/debian_version").read_text().strip()
        installed = parse_dpkg_status((rootfs / "var/lib/dpkg/status").read_text())
        states = rootfs / "var/lib/apt/extended_states"
        auto = parse_auto_installed(states.read_text()) if states.exists() else set()
        python: dict[str, str] = {}
        for meta in sorted((rootfs / VENV_SITE).glob("python3*/site-packages/*.dist-info/METADATA")):
            name, version = parse_metadata(meta.read_text())
            if name != PROJECT:
                python[name] = version
    except OSError as exc:
        raise InputError(f"{rootfs}: not an image root file system: {exc}") from exc
    debs = {name: Deb(version, name not in auto) for name, version in installed.items()}
    return Inventory(release=release, debs=debs, python=python)


def format_lock(inv: Inventory, header: Sequence[str] = ()) -> str:
    lines = [f"# {h}" if h else "#" for h in header]
    lines.append(f"base debian {inv.release}")
    lines += [f"deb {n} {d.version}{' named' if d.named else ''}" for n, d in sorted(inv.debs.items())]
    lines += [f"py {n} {v}" for n, v in sorted(inv.python.items())]
    return "\n".join(lines) + "\n"


def parse_lock(text: str) -> Inventory:
    release = ""
    debs: dict[str, Deb] = {}
    python: dict[str, str] = {}
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        match parts:
            case ["base", "debian", rel]:
                release = rel
            case ["deb", name, version]:
                debs[name] = Deb(version, False)
            case ["deb", name, version, "named"]:
                debs[name] = Deb(version, True)
            case ["py", name, version]:
                python[normalize(name)] = version
            case _:
                raise InputError(f"lock line {no}: cannot read {raw!r}")
    if not release:
        raise InputError("lock: no 'base debian <release>' line")
    return Inventory(release=release, debs=debs, python=python)


# --- the pin policy ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    verdict: Literal["accepted", "stale"]
    """accepted: an ordinary Debian update, reported; stale: the lock must be refreshed (and reviewed)."""
    kind: str
    package: str
    lock: str
    built: str

    def line(self, image: str) -> str:
        return (
            f"images.lock.moved image={image} package={self.package} lock={self.lock} built={self.built} "
            f"change={self.kind} verdict={self.verdict}"
        )


def upstream_version(version: str) -> str:
    """The upstream part of a Debian version: no epoch, no Debian revision, no stable-update or binNMU
    suffix (``+deb12u6``, ``+b1``), so that 5.9.8-5+deb12u6 and 5.9.8-5+deb12u7 compare equal."""
    v = version.split(":", 1)[1] if ":" in version else version
    v = v.rsplit("-", 1)[0] if "-" in v else v
    return re.sub(r"([+~](deb\d+u\d+|b\d+|nmu\d+))+$", "", v)


def epoch_of(version: str) -> str:
    return version.split(":", 1)[0] if ":" in version else "0"


def compare(lock: Inventory, built: Inventory) -> list[Finding]:
    """What moved between an image's lock and what its build resolved (docs/images.md, pin policy)."""
    out: list[Finding] = []
    lock_major, built_major = lock.release.split(".")[0], built.release.split(".")[0]
    if lock.release != built.release:
        verdict: Literal["accepted", "stale"] = "accepted" if lock_major == built_major else "stale"
        out.append(Finding(verdict, "point-release" if verdict == "accepted" else "release", "debian",
                           lock.release, built.release))  # fmt: skip
    for name in sorted(lock.debs.keys() | built.debs.keys()):
        old, new = lock.debs.get(name), built.debs.get(name)
        if old is None:
            out.append(Finding("stale", "added", name, "-", new.version if new else "-"))
        elif new is None:
            out.append(Finding("stale", "removed", name, old.version, "-"))
        elif old.named != new.named:
            out.append(Finding("stale", "named" if new.named else "unnamed", name, old.version, new.version))
        elif old.version != new.version:
            same = upstream_version(old.version) == upstream_version(new.version) and epoch_of(
                old.version
            ) == epoch_of(new.version)
            if same:
                out.append(Finding("accepted", "revision", name, old.version, new.version))
            else:
                out.append(Finding("stale" if new.named else "accepted", "upstream", name, old.version,
                                   new.version))  # fmt: skip
    for name in sorted(lock.python.keys() | built.python.keys()):
        a, b = lock.python.get(name, "-"), built.python.get(name, "-")
        if a != b:
            out.append(Finding("stale", "python", name, a, b))
    return out


def constraints(lock: Inventory, requirements: Sequence[str]) -> list[str]:
    """pip constraints from the lock's Python pins, without the distributions pyproject pins itself
    (pyproject wins for those; its edit then shows up as a stale lock, not as a resolver conflict)."""
    direct = {requirement_name(r) for r in requirements}
    return [f"{n}=={v}" for n, v in sorted(lock.python.items()) if n not in direct]


# --- shells -----------------------------------------------------------------------------------------


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy source files with normalized modes (0644 files, 0755 dirs): the image's unprivileged user
    reads them whatever the checkout's umask was, and the layer does not depend on it."""
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if "__pycache__" in rel.parts or path.suffix == ".pyc":
            continue
        target = dst / rel
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            target.chmod(0o755)
        elif path.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            target.chmod(0o644)


def stage_context(image: str, out: Path, lock_path: Path | None, root: Path = ROOT) -> list[str]:
    """Write the build context of ``images/<image>/Dockerfile`` to ``out``; returns log lines."""
    image_dir = root / "images" / image
    dockerfile = image_dir / "Dockerfile"
    if not dockerfile.is_file():
        raise InputError(f"no such image: {dockerfile} does not exist")
    project = parse_pyproject((root / "pyproject.toml").read_text())
    programs = programs_of(dockerfile.read_text())
    tops = sorted(p.parent.name for p in root.glob("*/__init__.py"))
    products = {t for t in tops if is_product(t, project.include)}
    files = {
        module_name(f.relative_to(root)): f
        for pkg in products
        for f in (root / pkg).rglob("*.py")
        if "__pycache__" not in f.parts
    }
    imports = {m: imported_names(f.read_text(), m, f.name == "__init__.py") for m, f in files.items()}
    for mod, names in sorted(imports.items()):
        strays = sorted({n.split(".")[0] for n in names} & (set(tops) - products))
        if strays:
            raise ContextError(
                f"{mod} imports {strays}: top-level packages pyproject's packages.find leaves out"
            )
    unknown = sorted(set(programs) - products)
    if unknown:
        raise ContextError(f"the Dockerfile's programs {unknown} are not product packages of the repository")
    modules = closure([m for m in files if m.split(".")[0] in programs], imports)
    packages = {m.split(".")[0] for m in modules}
    third_party: dict[str, set[str]] = {}
    for mod in modules:
        for name in imports[mod]:
            top = name.split(".")[0]
            if top not in products and top not in sys.stdlib_module_names:
                third_party.setdefault(top, set()).add(mod)
    dependencies = select_dependencies(
        project.dependencies, third_party, importlib.metadata.packages_distributions()
    )
    if out.exists():
        shutil.rmtree(out)
    (out / "project").mkdir(parents=True)
    for mod in sorted(modules):
        target = out / "project" / files[mod].relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(files[mod], target)
    (out / "project" / "pyproject.toml").write_text(staged_pyproject(project, packages, dependencies, image))
    (out / "requirements.txt").write_text("".join(f"{d}\n" for d in dependencies))
    (out / "build-requirements.txt").write_text("".join(f"{r}\n" for r in project.build_requires))
    pins = constraints(parse_lock(lock_path.read_text()), dependencies) if lock_path else []
    (out / "constraints.txt").write_text("".join(f"{c}\n" for c in pins))
    _copy_tree(image_dir, out / "images" / image)
    for path in [out, *out.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return [
        f"images.context image={image} programs={','.join(programs)} packages={','.join(sorted(packages))} "
        f"modules={len(modules)}/{len(files)} "
        f"dependencies={','.join(requirement_name(d) for d in dependencies) or '-'} constraints={len(pins)}"
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="images/imagectl.py",
        description="Stage an image's build context, read an image's inventory, check it against its lock.",
        epilog="exit codes: 0 ok, 1 stale lock (check) or inconsistent build input, 2 bad usage or input.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ctx = sub.add_parser("context", help="stage the build context of images/IMAGE/Dockerfile in OUT")
    ctx.add_argument("image")
    ctx.add_argument("out", type=Path)
    ctx.add_argument("--lock", type=Path, help="take pip constraints from this lock's Python pins")
    ctx.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this one)")
    inv = sub.add_parser("inventory", help="print the lock lines of an image's root file system")
    inv.add_argument("rootfs", type=Path)
    inv.add_argument("--header", action="append", default=[], help="a comment line on top (repeatable)")
    chk = sub.add_parser("check", help="compare an inventory with a lock (the pin policy)")
    chk.add_argument("lock", type=Path)
    chk.add_argument("inventory", type=Path)
    chk.add_argument("--image", default="image", help="the image's name, for the log lines")
    args = parser.parse_args(argv)
    try:
        if args.command == "context":
            for line in stage_context(args.image, args.out, args.lock, args.root):
                print(line)
        elif args.command == "inventory":
            sys.stdout.write(format_lock(inventory_of(args.rootfs), args.header))
        else:
            lock = parse_lock(_read(args.lock))
            built = parse_lock(_read(args.inventory))
            findings = compare(lock, built)
            for f in findings:
                print(f.line(args.image))
            stale = [f for f in findings if f.verdict == "stale"]
            accepted = len(findings) - len(stale)
            if stale:
                print(
                    f"images.lock.stale image={args.image} stale={len(stale)} accepted={accepted} "
                    "hint='run images/build.sh --update-lock and review the lock diff (docs/images.md)'"
                )
                return 1
            print(f"images.lock.ok image={args.image} accepted={accepted}")
    except InputError as exc:
        print(f"images.input.invalid error={str(exc)!r}", file=sys.stderr)
        return 2
    except ContextError as exc:
        print(f"images.context.failed error={str(exc)!r}", file=sys.stderr)
        return 1
    return 0


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from exc


if __name__ == "__main__":
    sys.exit(main())
