"""Fixtures the integration modules share."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_initnat_traffic import Procs


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """Processes a test starts in the lab's namespaces (``Procs``), stopped on every exit path."""
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A scratch directory the images' unprivileged user can reach (pytest's tmp_path sits under a 0700
    directory), removed after the test."""
    d = Path(tempfile.mkdtemp(prefix="vpngw-image-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
