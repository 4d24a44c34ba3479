"""`rmq --version`: the installed distribution's version, plus the commit of a git checkout.

The installed wheel (no work tree around it) is checked in tests/packaging/test_wheel.py.
"""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import version
from cli.main import app

ROOT = Path(__file__).resolve().parents[2]


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=30
    )
    return done.stdout.strip()


def _repo_with_a_commit(path: Path) -> str:
    path.mkdir(parents=True)
    _git(path, "init", "-q")
    _git(
        path,
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "x",
    )
    return _git(path, "rev-parse", "--short", "HEAD")


def test_version_option_prints_the_distribution_version_and_the_checkout_commit() -> None:
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0, r.output
    head = _git(ROOT, "rev-parse", "--short", "HEAD")
    assert r.output == f"rmq {metadata.version('trio-rmq')} (commit {head})\n"


def test_version_is_eager_whatever_follows() -> None:
    r = CliRunner().invoke(app, ["--version", "topic", "list"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("rmq ")


def test_a_package_at_the_root_of_a_work_tree_is_a_checkout(tmp_path: Path) -> None:
    head = _repo_with_a_commit(tmp_path / "repo")
    (tmp_path / "repo" / "cli").mkdir()
    assert version.checkout_commit(tmp_path / "repo" / "cli") == head


def test_a_package_deeper_in_some_work_tree_is_not_a_checkout(tmp_path: Path) -> None:
    # a virtualenv inside an unrelated project's repository
    _repo_with_a_commit(tmp_path / "project")
    site = tmp_path / "project" / ".venv" / "lib" / "python3.11" / "site-packages" / "cli"
    site.mkdir(parents=True)
    assert version.checkout_commit(site) is None


def test_outside_any_work_tree_there_is_no_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    (tmp_path / "cli").mkdir()
    assert version.checkout_commit(tmp_path / "cli") is None


def test_without_git_there_is_no_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert version.checkout_commit(ROOT / "cli") is None


def test_a_checkout_that_is_not_installed_says_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(version.metadata, "version", missing)
    assert version.installed_version() == "unknown"
