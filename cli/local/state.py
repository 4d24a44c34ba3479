"""A running local cluster as other commands find it: a state file and a control channel.

Theory of operation: while `rmq up` (foreground or `--detach`) runs, its supervisor

* records itself in `<data-dir>/supervisor.json`: its pid and process start time (so a
  reused pid is not mistaken for it), the control socket's path and every node's pid and
  status; rewritten (atomically, by rename) on every spawn and status change, removed when it
  ends. A supervisor killed outright leaves the file behind: readers check the pid (and its
  start time) before believing it.
* serves a Unix socket, `<data-dir>/control.sock` (or a short path in the temp dir when the
  data dir is too deep for AF_UNIX's ~108 bytes). One request per connection, one JSON line
  each way: `{"op": "status"}`, `{"op": "kill", "node": N}`, `{"op": "restart", "node": N,
  "wait": S}`, `{"op": "down"}`; the answer is `{"ok": true, ...}` or `{"ok": false,
  "error": "<one line for the user>"}`. A bad request gets an error answer; the supervisor
  stays up. The socket is only reachable by local users with access to the path (0700 dir
  permissions are the user's choice, as for the data itself).

The client side (`request`) is plain blocking sockets: the commands that use it (`rmq status`,
`down`, `kill`, `restart`) never need to start Trio.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from cli.errors import CliError, ControlError

if TYPE_CHECKING:
    import trio

STATE_FILE = "supervisor.json"
SOCKET_NAME = "control.sock"
_MAX_UNIX_PATH = 100  # sun_path holds 108 bytes on Linux, 104 on macOS
_MAX_REQUEST = 64 * 1024


class NoCluster(CliError):
    """No supervisor runs for this data dir."""


class Unreachable(CliError):
    """A supervisor process exists but does not answer on its control socket."""


class Refused(CliError):
    """The supervisor answered with an error (unknown node, node not running, ...)."""


class _NodeView(Protocol):
    def to_json(self) -> dict[str, Any]: ...


class Controlled(Protocol):
    """What the control channel needs of the cluster it serves (cli/local/supervisor.py's
    `Supervisor`, which imports this module to serve its channel)."""

    data_dir: Path
    # called after every change the state file should record; the channel installs it
    on_change: Callable[[], None]
    stop_requested: trio.Event  # set by `down`

    def snapshot(self) -> dict[str, Any]: ...

    async def kill(self, name: str) -> _NodeView: ...

    async def restart(self, name: str, timeout: float | None = None) -> _NodeView: ...


# --- the state file --------------------------------------------------------------------------


def state_path(data_dir: Path) -> Path:
    return data_dir / STATE_FILE


def control_socket_path(data_dir: Path) -> Path:
    path = data_dir.absolute() / SOCKET_NAME
    if len(os.fsencode(path)) <= _MAX_UNIX_PATH:
        return path
    digest = hashlib.sha1(os.fsencode(data_dir.absolute())).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"rmq-{digest}.sock"


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (clock ticks since boot), None when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None  # field 22, starttime


def pid_running(pid: int, start_time: str | None = None) -> bool:
    """Whether `pid` runs (not a zombie) and, when known, is the process started at
    `start_time` rather than a later one that reused the pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # someone else's process: not ours
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[-1].split()[0] == "Z":
            return False
    except (OSError, IndexError):
        pass  # no /proc (macOS): trust kill(0)
    if start_time is not None:
        now = process_start_time(pid)
        return now is None or now == start_time
    return True


def read_state(data_dir: Path) -> dict[str, Any] | None:
    """The state file's content, None when there is none (or it is unreadable)."""
    try:
        state = json.loads(state_path(data_dir).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict) or not isinstance(state.get("supervisor_pid"), int):
        return None
    return state


def write_state(data_dir: Path, state: dict[str, Any]) -> None:
    path = state_path(data_dir)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, path)  # readers see the old or the new file, never half of one


def remove_state(data_dir: Path, *, pid: int | None = None) -> None:
    """Remove the state file (only if it still names `pid`, when given)."""
    if pid is not None:
        state = read_state(data_dir)
        if state is not None and state["supervisor_pid"] != pid:
            return
    with contextlib.suppress(FileNotFoundError):
        state_path(data_dir).unlink()


def running_supervisor(data_dir: Path) -> dict[str, Any] | None:
    """The state of a supervisor that still runs for `data_dir`, or None."""
    state = read_state(data_dir)
    if state is None:
        return None
    if not pid_running(state["supervisor_pid"], state.get("start_time")):
        return None
    return state


# --- the control channel: server -------------------------------------------------------------


@contextlib.asynccontextmanager
async def control_channel(supervisor: Controlled) -> AsyncIterator[None]:
    """Serve the control socket and keep the state file while the body runs."""
    import trio

    from common.errors import unwrapping_groups

    data_dir = supervisor.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    other = running_supervisor(data_dir)
    if other is not None and other["supervisor_pid"] != os.getpid():
        raise ControlError(
            f"a cluster is already running in {data_dir} (supervisor pid "
            f"{other['supervisor_pid']}); `rmq down --data-dir {data_dir}` stops it"
        )
    path = control_socket_path(data_dir)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # left by a supervisor that was killed outright (checked above)
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind(str(path))
    sock.listen(16)
    listener = trio.SocketListener(sock)
    start_time = process_start_time(os.getpid())

    def record() -> None:
        write_state(
            data_dir, {**supervisor.snapshot(), "socket": str(path), "start_time": start_time}
        )

    supervisor.on_change = record
    record()
    try:
        with unwrapping_groups():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.serve_listeners, _handler(supervisor), [listener])
                try:
                    yield
                finally:
                    nursery.cancel_scope.cancel()
    finally:
        supervisor.on_change = lambda: None
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        remove_state(data_dir, pid=os.getpid())


def _handler(supervisor: Controlled) -> Callable[[trio.SocketStream], Awaitable[None]]:
    import trio

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            try:
                with trio.fail_after(5):
                    request = await _read_request(stream)
                reply = await _dispatch(supervisor, request)
            except CliError as exc:
                reply = {"ok": False, "error": str(exc)}
            except (trio.TooSlowError, ValueError, TypeError, KeyError):
                reply = {"ok": False, "error": "bad control request"}
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return  # the client went away
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.send_all(json.dumps(reply).encode() + b"\n")

    return handle


async def _read_request(stream: trio.SocketStream) -> dict[str, Any]:
    data = b""
    while b"\n" not in data:
        chunk = await stream.receive_some(4096)
        if not chunk or len(data) > _MAX_REQUEST:
            break
        data += chunk
    request = json.loads(data.split(b"\n", 1)[0])
    if not isinstance(request, dict):
        raise ValueError("a request is a JSON object")
    return request


async def _dispatch(supervisor: Controlled, request: dict[str, Any]) -> dict[str, Any]:
    op = request.get("op")
    if op == "status":
        return {"ok": True, **supervisor.snapshot()}
    if op == "kill":
        ns = await supervisor.kill(str(request["node"]))
        return {"ok": True, "node": ns.to_json()}
    if op == "restart":
        timeout = request.get("wait")
        ns = await supervisor.restart(
            str(request["node"]), None if timeout is None else float(timeout)
        )
        return {"ok": True, "node": ns.to_json()}
    if op == "down":
        supervisor.stop_requested.set()
        return {"ok": True, **supervisor.snapshot()}
    raise ControlError(f"unknown control operation {op!r}")


# --- the control channel: client -------------------------------------------------------------


def request(
    data_dir: Path, op: str, args: dict[str, Any] | None = None, *, timeout: float = 10.0
) -> dict[str, Any]:
    """One control request to the supervisor of `data_dir`; its answer (`ok` true).

    Raises `NoCluster` (no state file, or its supervisor is gone), `Unreachable` (the
    supervisor lives but does not answer) or `Refused` (it answered with an error).
    """
    state = read_state(data_dir)
    if state is None:
        raise NoCluster(f"no cluster is running in {data_dir} (start one with `rmq up`)")
    pid = state["supervisor_pid"]
    if not pid_running(pid, state.get("start_time")):
        raise NoCluster(f"no cluster is running in {data_dir} (its supervisor, pid {pid}, is gone)")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(state["socket"]))
            sock.sendall(json.dumps({**(args or {}), "op": op}).encode() + b"\n")
            data = b""
            while b"\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except (OSError, KeyError) as exc:
        raise Unreachable(
            f"the supervisor of {data_dir} (pid {pid}) does not answer on its control socket: {exc}"
        ) from None
    try:
        reply = json.loads(data)
    except ValueError:
        raise Unreachable(f"the supervisor of {data_dir} (pid {pid}) gave no answer") from None
    if not reply.get("ok"):
        raise Refused(str(reply.get("error") or "refused"))
    return reply
