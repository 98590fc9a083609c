"""Fixtures the integration modules share."""

from __future__ import annotations

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
