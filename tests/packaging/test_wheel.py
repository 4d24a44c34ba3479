"""The installed product is the tested product: what `pip wheel .` builds from a clean clone,
installed into a fresh virtualenv as a user installs it, holds every shipped module, imports,
and runs a cluster; the sdist builds and installs the same files.

Everything else in the suite imports the checkout itself (the repository is on sys.path), so a
module the packaging config leaves out of the wheel passes every other test and fails only on
a user's machine. Here the repository is never on sys.path:

* the wheel and the sdist are built from a copy of the checkout's files (what `git ls-files`
  lists, plus files not yet added and not ignored): ignored build output (`build/`,
  `*.egg-info`) cannot leak into them;
* the virtualenvs live in pytest's tmp_path, the dependencies come from the package index (pip's
  configuration and cache, as for a user), and every command runs with no PYTHONPATH and a
  working directory outside the checkout;
* the wheel's virtualenv gets the `spark` extra, so every module of the wheel imports, the
  Spark data source's modules (pyspark, pyarrow and numba at import) included;
* the cluster runs in a network namespace of its own (its loopback has the default ports free)
  and a PID namespace (whatever is left running dies with it): tests/readme_netns.py;
* setup.py's extension modules are optional for an install (no compiler: the numpy fallback),
  but the wheel holds them compiled and the installed product runs them.

The virtualenvs are created without pip and filled by this interpreter's pip (`pip --python`):
what gets installed is the same, and a bootstrap of pip into each is not part of the product.
The sdist's virtualenv installs it with --no-deps and borrows the wheel virtualenv's
dependencies (a .pth line after its own site-packages), after checking that both distributions
declare the same ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import tomllib
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
# the product: these packages and their subpackages, nothing else of the repository (tests,
# bench, examples, docs); pyproject.toml's [tool.setuptools.packages.find] must find exactly them
SHIPPED = frozenset({"common", "namesrv", "broker", "rmq", "cli", "pipeline"})
# package files a wheel must hold besides the modules: sources and files commands read at run
# time, and the type stubs of compiled modules
DATA_SUFFIXES = (".c", ".pyi", ".yml")
# setup.py's extension modules: the wheel holds each one compiled for the interpreter that built
# it (this one); they are optional for an install, not for the wheel the product ships
COMPILED = ("broker.store._record_check", "common.remoting._json_header")
EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")
BODIES = [f"packaged-{i}" for i in range(5)]

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    # builds, two virtualenvs and a cluster: 2 to 3 minutes on a 2-core machine under load 10+
    pytest.mark.timeout(600),
]


def _clean_env() -> dict[str, str]:
    """This process's environment without what would put the checkout (or another Python
    environment) in front of the virtualenv: a user's shell has none of these."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def _run(
    cmd: list[str], cwd: Path, timeout: float = 300, **kw: Any
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        cmd, cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=timeout, **kw
    )
    assert done.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {done.returncode}:\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done


def _checkout_files() -> list[str]:
    """The files a clean clone has once the work in progress is committed: tracked ones and
    new ones git does not ignore, as paths relative to the repository root."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.split(b"\0")
    return sorted({n.decode() for n in listed if n and (ROOT / n.decode()).is_file()})


def _shipped_in_checkout(files: list[str]) -> set[str]:
    return {
        f
        for f in files
        if f.split("/")[0] in SHIPPED and "/" in f and f.endswith((".py", *DATA_SUFFIXES))
    }


def _compiled_files() -> set[str]:
    return {name.replace(".", "/") + EXT_SUFFIX for name in COMPILED}


def _module_name(path: str) -> str:
    parts = path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _site_packages(venv: Path) -> Path:
    (site,) = (venv / "lib").glob("python3*/site-packages")
    return site


class Timings:
    """Seconds per phase, printed at the end: the builds and installs are most of the test."""

    def __init__(self) -> None:
        self.spans: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, label: str) -> Iterator[None]:
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.spans[label] = round(time.monotonic() - t0, 1)


def _pip(venv: Path, *args: str, timeout: float = 300) -> None:
    """This interpreter's pip working on `venv` (created without a pip of its own)."""
    _run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), *args],
        venv.parent,
        timeout,
    )


def _declared_dependencies(extra: str) -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"][extra]]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The wheel and the sdist built from a copy of the checkout, each installed into a fresh
    virtualenv; removed afterwards (the Spark extra alone is most of a gigabyte).

    Installing the dependencies is most of the time, so the wheel's virtualenv gets them from
    the index while the wheel and the sdist are built; installing the wheel afterwards then
    checks them against the wheel's own metadata (pip fetches whatever it declares and the
    virtualenv lacks)."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.fail("the wheel test needs root and unshare (network + PID namespaces)")
    try:
        import build  # noqa: F401  (`python -m build`, the sdist builder of the test extra)
    except ImportError:
        pytest.fail("`python -m build` is missing: install the test extra ('.[test]')")
    base = tmp_path_factory.mktemp("wheel")
    t_all = time.monotonic()
    timings = Timings()
    files = _checkout_files()
    src, dist = base / "src", base / "dist"
    for rel in files:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    venv_w, venv_s = base / "venv-wheel", base / "venv-sdist"

    def dependencies() -> None:
        _run([sys.executable, "-m", "venv", "--without-pip", str(venv_w)], base)
        deps = _declared_dependencies("spark")
        with timings("install the dependencies"):
            # --no-compile: byte-compiling all of pyspark and numba would take longer than
            # unpacking them; what this test imports compiles as it is imported
            _pip(venv_w, "install", "-q", "--no-compile", *deps, timeout=600)

    def builds() -> tuple[Path, Path]:
        with timings("pip wheel ."):
            _run(
                [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), "."], src
            )
        with timings("python -m build --sdist"):
            _run([sys.executable, "-m", "build", "--sdist", "--outdir", str(dist), "."], src)
        (wheel,), (sdist,) = dist.glob("*.whl"), dist.glob("*.tar.gz")
        _run([sys.executable, "-m", "venv", "--without-pip", str(venv_s)], base)
        with timings("pip install --no-deps sdist"):
            _pip(venv_s, "install", "-q", "--no-deps", str(sdist))
        return wheel, sdist

    try:
        with ThreadPoolExecutor(2) as pool:
            deps_job, builds_job = pool.submit(dependencies), pool.submit(builds)
            wheel, sdist = builds_job.result()
            deps_job.result()
        with timings("pip install wheel[spark]"):
            _pip(venv_w, "install", "-q", f"{wheel}[spark]")
        # after the sdist's own site-packages on sys.path: its files come first
        (_site_packages(venv_s) / "wheel_venv_dependencies.pth").write_text(
            f"{_site_packages(venv_w)}\n"
        )
        timings.spans["builds and installs"] = round(time.monotonic() - t_all, 1)
        yield {
            "base": base,
            "files": files,
            "wheel": wheel,
            "sdist": sdist,
            "venv_w": venv_w,
            "venv_s": venv_s,
            "timings": timings,
        }
    finally:
        print("wheel test timings (s):", json.dumps(timings.spans))
        for path in (venv_w, venv_s, src):
            shutil.rmtree(path, ignore_errors=True)


def _wheel_names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


def _wheel_files(wheel: Path) -> set[str]:
    return {n for n in _wheel_names(wheel) if ".dist-info/" not in n}


def _wheel_requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = (n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    return sorted(Parser().parsestr(text).get_all("Requires-Dist") or [])


def test_the_wheel_holds_exactly_the_shipped_packages(built: dict[str, Any]) -> None:
    in_wheel = _wheel_files(built["wheel"])
    expected = _shipped_in_checkout(built["files"]) | _compiled_files()
    missing, extra = sorted(expected - in_wheel), sorted(in_wheel - expected)
    assert not missing, f"the checkout has these files and the wheel does not: {missing}"
    assert not extra, f"the wheel holds files outside the shipped packages: {extra}"
    assert {n.split("/")[0] for n in in_wheel} == SHIPPED


_IMPORT_ALL = """
import importlib, json, sys, traceback
found = {}
for name in sys.argv[1:]:
    try:
        found[name] = {"file": importlib.import_module(name).__file__}
    except BaseException as exc:
        found[name] = {"error": "".join(traceback.format_exception_only(exc)).strip()}
print(json.dumps(found))
"""


def test_every_module_of_the_wheel_imports_from_the_virtualenv(built: dict[str, Any]) -> None:
    modules = sorted(_module_name(n) for n in _wheel_files(built["wheel"]) if n.endswith(".py"))
    assert "broker.acl.validator" in modules and "cli.main" in modules
    modules += COMPILED
    venv = built["venv_w"]
    site = _site_packages(venv)
    # -I: no PYTHONPATH, no user site, not even the working directory on sys.path
    done = _run([str(venv / "bin" / "python"), "-I", "-c", _IMPORT_ALL, *modules], built["base"])
    found = json.loads(done.stdout.splitlines()[-1])  # after anything a module printed
    failed = {name: r["error"] for name, r in found.items() if "error" in r}
    assert not failed, "modules of the wheel that do not import:\n" + "\n".join(
        f"  {name}: {err}" for name, err in failed.items()
    )
    elsewhere = {n: r["file"] for n, r in found.items() if not r["file"].startswith(f"{site}/")}
    assert not elsewhere, f"imported from outside the virtualenv's site-packages: {elsewhere}"


def test_the_installed_wheel_runs_the_compiled_record_check(built: dict[str, Any]) -> None:
    # crash recovery's check below the checkpoint (broker/store/commitlog_scan.py): compiled,
    # not the numpy fallback an install without a compiler gets
    probe = "from broker.store import commitlog_scan as s; print(s.check_implementation())"
    venv = built["venv_w"]
    done = _run([str(venv / "bin" / "python"), "-I", "-c", probe], built["base"])
    assert done.stdout.strip() == "compiled"


def test_the_installed_wheel_runs_the_compiled_header_codec(built: dict[str, Any]) -> None:
    # every remoting frame's JSON header (common/remoting/_json_header.c), not the Python path
    # an install without a compiler gets
    probe = "from common.remoting import codec; print(codec._json_header is not None)"
    venv = built["venv_w"]
    done = _run([str(venv / "bin" / "python"), "-I", "-c", probe], built["base"])
    assert done.stdout.strip() == "True"


@pytest.fixture(scope="module")
def session(built: dict[str, Any]) -> dict[str, Any]:
    """The product used from the wheel's virtualenv, the way the README uses it."""
    work = built["base"] / "work"
    work.mkdir()
    steps = [
        {"op": "run", "cmd": "rmq --version", "timeout": 60},
        {"op": "run", "cmd": 'python -c "import cli; print(cli.__file__)"', "timeout": 60},
        {"op": "run", "cmd": "rmq up --detach", "timeout": 120, "stop_on_failure": 1},
        {"op": "run", "cmd": "rmq topic create Packaged", "timeout": 60},
        {
            "op": "run",
            "cmd": "rmq produce --topic Packaged",
            "stdin": "".join(f"{b}\n" for b in BODIES),
            "timeout": 60,
        },
        {
            "op": "run",
            "cmd": f"rmq consume --topic Packaged --group packaged --from-beginning "
            f"--count {len(BODIES)}",
            "timeout": 60,
        },
        {"op": "run", "cmd": "rmq down", "timeout": 60},
    ]
    env = {
        "PATH": f"{built['venv_w'] / 'bin'}:/usr/bin:/bin",
        "HOME": str(work),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "160",
    }
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            "unshare",
            "--net",
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            "--",
            str(built["venv_w"] / "bin" / "python"),
            "-I",
            str(ROOT / "tests" / "readme_netns.py"),
        ],
        input=json.dumps({"workdir": str(work), "env": env, "steps": steps}),
        capture_output=True,
        text=True,
        timeout=400,
        cwd=work,
        env=_clean_env(),
    )
    built["timings"].spans["cluster session"] = round(time.monotonic() - t0, 1)
    assert proc.returncode == 0, proc.stderr[-4000:]
    transcript = json.loads(proc.stdout)
    print(
        "installed-wheel session:\n"
        + "\n".join(f"{e['seconds']:7.2f} s  rc={e['rc']}  {e['cmd']}" for e in transcript)
    )
    logs = sorted((work / ".rmq" / "logs").glob("*.log"))
    for e in transcript:
        if e["rc"] != 0:  # a node that died says why in its log, not on the command's output
            e["out"] += "".join(f"\n--- {log.name}:\n{log.read_text()[-2000:]}" for log in logs)
    return {"steps": {e["cmd"]: e for e in transcript}, "work": work}


def _ok(session: dict, cmd: str) -> str:
    e = session["steps"].get(cmd)
    assert e is not None, f"`{cmd}` did not run (an earlier step failed)"
    assert e["rc"] == 0, f"`{cmd}` exited {e['rc']}:\n{e['out'][-3000:]}"
    return e["out"]


def test_rmq_version_prints_the_version_and_no_commit_outside_a_checkout(
    session: dict[str, Any],
) -> None:
    assert _ok(session, "rmq --version") == f"rmq {VERSION}\n"


def test_the_checkout_is_not_on_sys_path(session: dict[str, Any], built: dict[str, Any]) -> None:
    out = _ok(session, 'python -c "import cli; print(cli.__file__)"')
    assert out.strip() == str(_site_packages(built["venv_w"]) / "cli" / "__init__.py")


def test_the_installed_cluster_stores_and_serves_messages(session: dict[str, Any]) -> None:
    assert "ready" in _ok(session, "rmq up --detach")
    _ok(session, "rmq topic create Packaged")
    _ok(session, "rmq produce --topic Packaged")
    consumed = _ok(
        session,
        f"rmq consume --topic Packaged --group packaged --from-beginning --count {len(BODIES)}",
    )
    assert sorted(line for line in consumed.splitlines() if line.strip()) == sorted(BODIES)
    assert "stopped" in _ok(session, "rmq down")
    assert (session["work"] / ".rmq").is_dir()  # the data dir is the working directory's


_SDIST_CHECK = """
import json, sys
from importlib import metadata
import broker.acl.validator, cli
dist = metadata.distribution("trio-rmq")
print(json.dumps({
    "files": [str(f) for f in dist.files],
    "requires": sorted(dist.requires or []),
    "validator": broker.acl.validator.__file__,
    "cli": cli.__file__,
}))
"""


def test_the_sdist_holds_the_sources_and_installs_the_same_files(built: dict[str, Any]) -> None:
    with tarfile.open(built["sdist"]) as tf:
        in_sdist = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    missing = sorted(_shipped_in_checkout(built["files"]) - in_sdist)
    assert not missing, f"the sdist lacks: {missing}"
    venv = built["venv_s"]
    site = _site_packages(venv)
    found = json.loads(
        _run([str(venv / "bin" / "python"), "-I", "-c", _SDIST_CHECK], built["base"]).stdout
    )
    assert found["validator"].startswith(f"{site}/") and found["cli"].startswith(f"{site}/")
    installed = {f for f in found["files"] if f.split("/")[0] in SHIPPED and "__pycache__" not in f}
    assert installed == _wheel_files(built["wheel"])
    # the dependencies borrowed from the wheel's virtualenv are the ones the sdist declares
    assert found["requires"] == _wheel_requires(built["wheel"])
    done = _run([str(venv / "bin" / "rmq"), "--version"], built["base"])
    assert done.stdout == f"rmq {VERSION}\n"
