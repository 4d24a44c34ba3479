"""What `rmq --version` prints: the installed distribution's version and, when the code runs
from a git checkout of this repository, the commit checked out there.

The version comes from the distribution's metadata (what pip installed), so a wheel and the
checkout it was built from print the same number. The commit tells two checkouts (or a
checkout and its installed wheel) apart; an installed wheel has no git work tree around its
packages, so it prints the version alone.
"""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

import typer

__all__ = ["DISTRIBUTION", "checkout_commit", "installed_version", "print_version", "version_line"]

DISTRIBUTION = "trio-rmq"

# where `cli` lives: in a checkout, one level below the work tree's root
_PACKAGE_DIR = Path(__file__).resolve().parent


def installed_version() -> str:
    """The version pip installed, or "unknown" when this code runs without being installed
    (a checkout on PYTHONPATH)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def checkout_commit(package_dir: Path = _PACKAGE_DIR) -> str | None:
    """The short commit hash of the git work tree `package_dir` belongs to, or None.

    Only a checkout of this repository counts: the package directory must sit at the root of
    the work tree. A wheel installed into a virtualenv that happens to lie inside some other
    repository (a `.venv` in a project directory) is not a checkout, and neither is a
    directory outside any work tree or a machine without git.
    """
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "--short", "HEAD"],
            cwd=package_dir,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) != 2:
        return None
    toplevel, commit = lines
    if Path(toplevel).resolve() != package_dir.resolve().parent:
        return None
    return commit


def version_line() -> str:
    """`rmq 0.1.0`, or `rmq 0.1.0 (commit 1a2b3c4)` from a checkout."""
    commit = checkout_commit()
    line = f"rmq {installed_version()}"
    return f"{line} (commit {commit})" if commit else line


def print_version(value: bool) -> None:
    """The eager `--version` option's callback: print the version line and exit."""
    if value:
        typer.echo(version_line())
        raise typer.Exit()
