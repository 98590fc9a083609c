"""The pin policy (docs/images.md): each image's checked-in lock (images/<image>/packages.lock) against what
its build resolved, and the rules that decide what a moved version means.

Debian's stable archive serves one version of each package per suite (bookworm-security only its latest),
so the Dockerfiles name packages without versions and the lock records what the build resolved. The CI
check is ``test_the_built_image_matches_its_lock``: an ordinary security or point update (the same
upstream version, another Debian revision) passes and is reported as a warning naming the package and
both versions; a package added or removed, an upstream version of a package the Dockerfile names,
another Debian release, or a Python distribution that differs fails until the lock is refreshed
(``images/build.sh --update-lock``) and the diff reviewed.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_images_run import IMAGES, build_images, podman

ROOT = Path(__file__).resolve().parents[2]
IMAGECTL = ROOT / "images" / "imagectl.py"


def _load() -> Any:
    spec = importlib.util.spec_from_file_location("imagectl", IMAGECTL)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["imagectl"] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


imagectl = _load()


def check(tmp_path: Path, lock: str, built: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "lock").write_text(lock)
    (tmp_path / "built").write_text(built)
    return subprocess.run(
        [
            sys.executable,
            str(IMAGECTL),
            "check",
            str(tmp_path / "lock"),
            str(tmp_path / "built"),
            "--image",
            "gw",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


LOCK = """\
# a comment
base debian 12.15
deb strongswan-charon 5.9.8-5+deb12u6 named
deb libssl3 3.0.17-1~deb12u2
deb tzdata 2025b-0+deb12u1
deb conntrack 1:1.4.7-1+b2 named
py anyio 4.16.0
"""


@pytest.mark.parametrize(
    ("version", "upstream"),
    [
        pytest.param("5.9.8-5+deb12u6", "5.9.8", id="security-update"),
        pytest.param("1:1.4.7-1+b2", "1.4.7", id="epoch-binnmu"),
        pytest.param("3.0.17-1~deb12u2", "3.0.17", id="backport-style"),
        pytest.param("1.0.128+nmu2+deb12u2", "1.0.128", id="native-with-stable-update"),
        pytest.param("2025b-0+deb12u1", "2025b", id="tzdata"),
        pytest.param("10.0.0", "10.0.0", id="native"),
    ],
)
def test_upstream_version_drops_epoch_revision_and_stable_suffixes(version: str, upstream: str) -> None:
    assert imagectl.upstream_version(version) == upstream


def test_an_unchanged_build_matches(tmp_path: Path) -> None:
    res = check(tmp_path, LOCK, LOCK)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == "images.lock.ok image=gw accepted=0"


def test_a_security_update_is_reported_with_both_versions_and_accepted(tmp_path: Path) -> None:
    res = check(tmp_path, LOCK, LOCK.replace("5.9.8-5+deb12u6", "5.9.8-5+deb12u7"))
    assert res.returncode == 0, res.stdout
    assert (
        "images.lock.moved image=gw package=strongswan-charon lock=5.9.8-5+deb12u6 built=5.9.8-5+deb12u7 "
        "change=revision verdict=accepted"
    ) in res.stdout


def test_a_point_release_and_upstream_moves_of_dependencies_are_accepted(tmp_path: Path) -> None:
    built = LOCK.replace("12.15", "12.16").replace("3.0.17-1~deb12u2", "3.0.18-1~deb12u1")
    built = built.replace("2025b-0+deb12u1", "2026a-0+deb12u1")
    res = check(tmp_path, LOCK, built)
    assert res.returncode == 0, res.stdout
    assert "package=debian lock=12.15 built=12.16 change=point-release verdict=accepted" in res.stdout
    assert (
        "package=libssl3 lock=3.0.17-1~deb12u2 built=3.0.18-1~deb12u1 change=upstream verdict=accepted"
        in res.stdout
    )
    assert "package=tzdata" in res.stdout and "images.lock.ok image=gw accepted=3" in res.stdout


@pytest.mark.parametrize(
    ("built", "expected"),
    [
        pytest.param(
            LOCK.replace("5.9.8-5+deb12u6", "5.9.9-1+deb12u1"),
            "package=strongswan-charon lock=5.9.8-5+deb12u6 built=5.9.9-1+deb12u1 change=upstream "
            "verdict=stale",
            id="named-upstream",
        ),
        pytest.param(
            LOCK.replace("1:1.4.7-1+b2", "2:1.4.7-1+b2"),
            "package=conntrack lock=1:1.4.7-1+b2 built=2:1.4.7-1+b2 change=upstream verdict=stale",
            id="named-epoch",
        ),
        pytest.param(
            LOCK + "deb libfoo1 1.0-1\n",
            "package=libfoo1 lock=- built=1.0-1 change=added verdict=stale",
            id="added",
        ),
        pytest.param(
            LOCK.replace("deb tzdata 2025b-0+deb12u1\n", ""),
            "package=tzdata lock=2025b-0+deb12u1 built=- change=removed verdict=stale",
            id="removed",
        ),
        pytest.param(
            LOCK.replace("deb libssl3 3.0.17-1~deb12u2", "deb libssl3 3.0.17-1~deb12u2 named"),
            "package=libssl3 lock=3.0.17-1~deb12u2 built=3.0.17-1~deb12u2 change=named verdict=stale",
            id="newly-named",
        ),
        pytest.param(
            LOCK.replace("py anyio 4.16.0", "py anyio 4.17.0"),
            "package=anyio lock=4.16.0 built=4.17.0 change=python verdict=stale",
            id="python",
        ),
        pytest.param(
            LOCK.replace("12.15", "13.2"),
            "package=debian lock=12.15 built=13.2 change=release verdict=stale",
            id="release",
        ),
    ],
)
def test_a_move_that_needs_review_fails_naming_the_package_and_both_versions(
    tmp_path: Path, built: str, expected: str
) -> None:
    res = check(tmp_path, LOCK, built)
    assert res.returncode == 1, res.stdout
    assert f"images.lock.moved image=gw {expected}" in res.stdout
    assert "images.lock.stale image=gw stale=1" in res.stdout and "--update-lock" in res.stdout


@pytest.mark.parametrize(
    "lock",
    [pytest.param("deb x 1\n", id="no-base"), pytest.param("base debian 12.15\nrpm x 1\n", id="bad-line")],
)
def test_an_unreadable_lock_exits_2(tmp_path: Path, lock: str) -> None:
    res = check(tmp_path, lock, LOCK)
    assert res.returncode == 2 and "images.input.invalid" in res.stderr, res.stderr


def test_a_missing_file_exits_2(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, str(IMAGECTL), "check", str(tmp_path / "nope"), str(tmp_path / "nope2")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 2 and "cannot read" in res.stderr


def test_constraints_leave_pyprojects_own_pins_to_pyproject() -> None:
    lock = imagectl.parse_lock(LOCK + "py idna 3.20\npy kubernetes 37.0.2\n")
    assert imagectl.constraints(lock, ["kubernetes==38.0.0", "anyio==4.16.0"]) == ["idna==3.20"]


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_each_image_has_a_lock_whose_release_is_the_dockerfiles(image: str) -> None:
    lock = imagectl.parse_lock((ROOT / "images" / image / "packages.lock").read_text())
    dockerfile = (ROOT / "images" / image / "Dockerfile").read_text()
    assert f"ARG DEBIAN_RELEASE={lock.release}\n" in dockerfile, (
        f"images/{image}/Dockerfile's DEBIAN_RELEASE differs from its lock's {lock.release}: "
        "images/build.sh --update-lock writes both"
    )
    assert lock.python, "the lock records the image's Python distributions"
    assert lock.debs["python3"].named, "the lock marks the packages the Dockerfile names"


@pytest.fixture(scope="module")
def built() -> str:
    return build_images()


@pytest.fixture
def inventory(built: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """The image's inventory, read from the image itself (podman image mount), not from the build's output."""
    ref = IMAGES[request.param]
    mnt = podman("image", "mount", ref).stdout.strip()
    try:
        out = subprocess.run(
            [sys.executable, str(IMAGECTL), "inventory", mnt], capture_output=True, text=True, check=True
        ).stdout
    finally:
        podman("image", "unmount", ref, check=False)
    path = tmp_path / "inventory"
    path.write_text(out)
    yield path


@pytest.mark.lab
@pytest.mark.timeout(900)
@pytest.mark.parametrize("inventory", sorted(IMAGES), indirect=True)
def test_the_built_image_matches_its_lock(inventory: Path, request: pytest.FixtureRequest) -> None:
    """The CI check. Accepted moves (security/point updates) pass and are reported as warnings."""
    image = request.node.callspec.params["inventory"]
    lock = ROOT / "images" / image / "packages.lock"
    res = subprocess.run(
        [sys.executable, str(IMAGECTL), "check", str(lock), str(inventory), "--image", image],
        capture_output=True,
        text=True,
        check=False,
    )
    moved = [line for line in res.stdout.splitlines() if line.startswith("images.lock.moved")]
    assert res.returncode == 0, "the lock needs a refresh (images/build.sh --update-lock):\n" + res.stdout
    for line in moved:
        warnings.warn(f"pin moved (accepted: {line})", UserWarning, stacklevel=1)
