"""The project's version, as every program reports it (``--version``, ``vpngw_build_info``).

Read from the installed distribution's metadata (``pyproject.toml``'s ``[project] name``): the images
install the project's wheel, a checkout installs it editable. Run from a bare source tree (no metadata),
the version is ``UNKNOWN`` rather than a guess.
"""

from __future__ import annotations

import argparse
from importlib import metadata

DISTRIBUTION = "vpngw"
UNKNOWN = "0+unknown"


def version() -> str:
    """The installed ``vpngw`` distribution's version, else ``UNKNOWN``."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    """``--version``: print ``<prog> <version>`` on stdout and exit 0 (argparse's own action)."""
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {version()}",
        help="print the program's version and exit",
    )
