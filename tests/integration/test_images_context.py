"""What images/imagectl.py stages as an image's build context: the import closure of the image's programs
over the repository's top-level packages, and the [project.dependencies] entries that closure imports.

Against the real repository (what the gateway and controller images get) and against a small repository
written here, where a new shared package appears, a package nobody imports stays out, and an import no
runtime dependency provides is refused.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.integration.test_images_lock import IMAGECTL, imagectl

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def stage(image: str, out: Path, root: Path = ROOT) -> list[str]:
    lines: list[str] = imagectl.stage_context(image, out, None, root=root)
    return lines


@pytest.mark.parametrize(
    ("image", "programs"), [("gateway", {"agent", "initnat", "exporter"}), ("controller", {"controller"})]
)
def test_the_repositorys_images_get_their_programs_closure_and_no_lab(
    image: str, programs: set[str], tmp_path: Path
) -> None:
    out = tmp_path / "ctx"
    stage(image, out)
    staged = {p.name for p in (out / "project").iterdir() if p.is_dir()}
    assert programs <= staged and "lab" not in staged and "gwplan" in staged
    assert ("controller" in staged) == (image == "controller")
    if image == "controller":  # import-linter: the controller never imports the data plane's clients
        assert not {"agent", "initnat", "exporter"} & staged
        assert not (out / "project" / "gwkit" / "vici").exists()
        assert not {"vici", "pyroute2"} & {
            imagectl.requirement_name(r) for r in (out / "requirements.txt").read_text().split()
        }
    requirements = (out / "requirements.txt").read_text().split()
    assert requirements and set(requirements) <= set(RUNTIME), "only pyproject's runtime entries, verbatim"
    meta = tomllib.loads((out / "project" / "pyproject.toml").read_text())
    assert meta["project"]["dependencies"] == requirements
    assert sorted(meta["tool"]["setuptools"]["packages"]["find"]["include"]) == sorted(
        x for p in staged for x in (p, f"{p}.*")
    )
    assert not list(out.rglob("__pycache__")) and not list(out.rglob("*.pyc"))
    modes = {p.stat().st_mode & 0o777 for p in out.rglob("*")}
    assert modes <= {0o644, 0o755}, oct(max(modes))


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"
[project]
name = "vpngw"
version = "0.1.0"
dependencies = ["PyYAML==6.0.4", "anyio==4.16.0"]
[project.optional-dependencies]
dev = ["pytest==9.2.0"]
[tool.setuptools.packages.find]
include = ["prog*", "shared*", "unused*", "lab*"]
"""

REPO = {
    "pyproject.toml": PYPROJECT,
    "images/app/Dockerfile": 'FROM scratch\nLABEL net.bnerd.vpn.programs="prog"\n',
    "images/app/app.conf": "x = 1\n",
    "prog/__init__.py": "",
    "prog/__main__.py": "import json\nfrom shared import helper\n",
    "shared/__init__.py": "def helper() -> None:\n    import yaml  # lazy: still needs its distribution\n",
    "shared/other.py": "import anyio  # no program of the image imports this module\n",
    "unused/__init__.py": "import anyio\n",
    "lab/__init__.py": "import prog\n",
}


def test_a_new_shared_package_is_staged_and_an_unimported_one_is_not(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    write(root, REPO)
    (line,) = stage("app", tmp_path / "ctx", root)
    assert "programs=prog packages=prog,shared modules=3/6 dependencies=pyyaml" in line
    assert (tmp_path / "ctx" / "requirements.txt").read_text() == "PyYAML==6.0.4\n"
    assert (tmp_path / "ctx" / "images" / "app" / "app.conf").read_text() == "x = 1\n"
    assert not (tmp_path / "ctx" / "project" / "unused").exists()
    assert not (tmp_path / "ctx" / "project" / "shared" / "other.py").exists()
    assert not (tmp_path / "ctx" / "project" / "lab").exists()


def test_an_import_no_runtime_dependency_provides_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    write(root, {**REPO, "shared/__init__.py": "import pytest\n"})
    with pytest.raises(
        imagectl.ContextError, match=re.escape("shared imports 'pytest', which no [project.dependencies]")
    ):
        stage("app", tmp_path / "ctx", root)


def test_a_package_left_out_of_packages_find_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    write(root, {**REPO, "prog/__main__.py": "import stray\n", "stray/__init__.py": ""})
    with pytest.raises(imagectl.ContextError, match=re.escape("prog.__main__ imports ['stray']")):
        stage("app", tmp_path / "ctx", root)


def test_the_cli_exits_1_for_an_inconsistent_repository_and_2_for_bad_usage(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    write(root, {**REPO, "shared/__init__.py": "import pytest\n"})
    inconsistent = subprocess.run(
        [sys.executable, str(IMAGECTL), "context", "app", str(tmp_path / "ctx"), "--root", str(root)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert inconsistent.returncode == 1 and "images.context.failed" in inconsistent.stderr
    bad = subprocess.run(
        [sys.executable, str(IMAGECTL), "context", "no-such-image", str(tmp_path / "ctx")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "no such image" in bad.stderr
    usage = subprocess.run(
        [sys.executable, str(IMAGECTL), "frobnicate"], capture_output=True, text=True, check=False
    )
    assert usage.returncode == 2


@pytest.mark.parametrize(
    ("source", "module", "is_package", "names"),
    [
        pytest.param(
            "import a.b, c\nfrom d.e import f\n", "p.m", False, {"a.b", "c", "d.e", "d.e.f"}, id="absolute"
        ),
        pytest.param(
            "from . import g\nfrom .h import i\nfrom ..x import y\n",
            "p.sub.m",
            False,
            {"p.sub", "p.sub.g", "p.sub.h", "p.sub.h.i", "p.x", "p.x.y"},
            id="relative",
        ),
        pytest.param("from .a import b\n", "p", True, {"p.a", "p.a.b"}, id="relative-in-init"),
        pytest.param("def f():\n    import lazy\n", "p.m", False, {"lazy"}, id="lazy"),
        pytest.param("from __future__ import annotations\n", "p.m", False, set(), id="future"),
    ],
)
def test_imported_names(source: str, module: str, is_package: bool, names: set[str]) -> None:
    assert imagectl.imported_names(source, module, is_package) == names


def test_closure_follows_imports_to_modules_and_their_packages() -> None:
    imports = {
        "a": set(),
        "a.__main__": {"b.x.f", "json"},
        "b": set(),
        "b.x": {"b.y"},
        "b.y": {"b.x"},
        "b.z": {"anyio"},
        "d": {"a"},
    }
    assert imagectl.closure(["a", "a.__main__"], imports) == {"a", "a.__main__", "b", "b.x", "b.y"}
    with pytest.raises(imagectl.ContextError):
        imagectl.closure(["nope"], imports)
