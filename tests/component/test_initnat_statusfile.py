"""initnat.statusfile: init-nat's status document written atomically, only on change, never failing."""

from __future__ import annotations

import errno
import json
import logging
from pathlib import Path

import pytest

from initnat import report, statusfile
from initnat.statusfile import StatusFile


def test_written_on_change_only_with_the_time_of_the_change(tmp_path: Path) -> None:
    clock = iter([1_800_000_000.0, 1_800_000_030.0])
    status = StatusFile(tmp_path / "initnat-status.json", clock=lambda: next(clock))
    doc = report.document(plan_hash="sha256:ab")
    status.write(doc)
    status.write(doc)  # a resync with nothing new: not rewritten, the time stays
    assert status.writes == 1
    assert json.loads(status.path.read_text()) == {**doc, "updatedAt": "2027-01-15T08:00:00Z"}
    status.write(report.document(plan_hash="sha256:ab", last_error="failed: x (kept=last-good)"))
    assert status.writes == 2 and json.loads(status.path.read_text())["updatedAt"] == "2027-01-15T08:00:30Z"
    assert status.path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["initnat-status.json"], "no temp file left"


def test_a_status_that_cannot_be_written_is_logged_once_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    status = StatusFile(tmp_path / "missing" / "initnat-status.json")
    with caplog.at_level(logging.INFO, logger="initnat"):
        for _ in range(3):
            status.write(report.document(plan_hash=None))
    lines = [r for r in caplog.records if "initnat.status_unwritten" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING, "once per distinct error"
    assert status.writes == 0 and status.error == "No such file or directory"
    (tmp_path / "missing").mkdir()
    status.write(report.document(plan_hash=None))
    assert status.writes == 1 and status.error is None, "tried again, and written once possible"


def test_a_read_only_directory_is_the_init_containers_normal_case_an_info_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The init container's default path is next to the mounted ConfigMap (read-only): not a warning on
    every pod start. (A read-only mount cannot be made here without touching the host's mounts.)"""

    def read_only(path: Path, data: bytes) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(statusfile, "_atomic_write", read_only)
    with caplog.at_level(logging.INFO, logger="initnat"):
        StatusFile(tmp_path / "initnat-status.json").write(report.document(plan_hash=None))
    (line,) = [r for r in caplog.records if "initnat.status_unwritten" in r.getMessage()]
    assert line.levelno == logging.INFO and "--status-file" in line.getMessage()
