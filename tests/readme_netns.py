"""Run a list of shell steps the way a reader of the README would, inside fresh namespaces.

Used by tests/test_readme.py and tests/packaging/test_wheel.py (not a test module itself). It
is started as

    unshare --net --pid --fork --mount-proc --kill-child -- python tests/readme_netns.py

with a JSON document on stdin: {"workdir", "env", "steps": [...]}; it prints a JSON transcript
(one entry per step) on stdout.

Why namespaces: the README's commands use the fixed ports 9876, 10911, 10921 ... A network
namespace of our own has its own loopback, so those ports are free whatever else runs on the
machine, and the README runs as written. The PID namespace is the cleanup guarantee: this
script is its PID 1, and when it exits the kernel kills every process left in it (a detached
cluster included), so nothing the README starts can outlive the test.

As PID 1 it must also reap orphans (a detached `rmq up` supervisor is re-parented to it; an
unreaped one would look alive to `rmq down`). So PID 1 forks: the child runs the steps, the
parent only reaps until that child is gone.

Steps ("op"):
  run     cmd, timeout, [stdin]           -> rc, out (stdout and stderr together), seconds
  start   cmd, until, timeout             a background process; returns once `until` is printed
  stop    signal                          signal the background process, wait -> rc, out
  follow  cmd, probe, expect, timeout     start cmd, then run `probe` until cmd prints
                                          `expect`; SIGINT -> rc, out
  write   path, text
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time


class Background:
    def __init__(self, cmd: str, env: dict, cwd: str) -> None:
        self.proc = subprocess.Popen(
            ["bash", "-c", f"exec {cmd}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=cwd,
        )
        self.lines: list[str] = []
        self._pump = threading.Thread(target=self._read, daemon=True)
        self._pump.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines):
                return True
            if self.proc.poll() is not None:
                self._pump.join(2)
                return any(text in line for line in self.lines)
            time.sleep(0.05)
        return False

    def stop(self, sig: int, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            rc = -999  # did not stop on the signal
        self._pump.join(5)
        return rc

    def out(self) -> str:
        return "\n".join(self.lines)


def run_steps(doc: dict) -> list[dict]:
    env, cwd = doc["env"], doc["workdir"]
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    transcript: list[dict] = []
    bg: Background | None = None
    for step in doc["steps"]:
        op = step["op"]
        entry: dict = {"op": op, **{k: v for k, v in step.items() if k in ("cmd", "path", "block")}}
        t0 = time.monotonic()
        if op == "run":
            try:
                done = subprocess.run(
                    ["bash", "-o", "pipefail", "-c", step["cmd"]],
                    input=step.get("stdin"),
                    capture_output=True,
                    text=True,
                    env=env,
                    cwd=cwd,
                    timeout=step.get("timeout", 60),
                )
                entry.update(rc=done.returncode, out=done.stdout + done.stderr)
            except subprocess.TimeoutExpired as exc:
                raw = (exc.stdout or b"") + (exc.stderr or b"")
                out = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
                entry.update(rc="timeout", out=out)
        elif op == "start":
            bg = Background(step["cmd"], env, cwd)
            ok = bg.wait_for(step["until"], step.get("timeout", 60))
            entry.update(rc=0 if ok else "not-ready", out=bg.out())
        elif op == "stop":
            assert bg is not None
            rc = bg.stop(getattr(signal, step["signal"]))
            entry.update(rc=rc, out=bg.out())
            bg = None
        elif op == "follow":
            follower = Background(step["cmd"], env, cwd)
            time.sleep(step.get("settle", 2.0))
            probe = subprocess.run(
                ["bash", "-c", step["probe"]],
                capture_output=True,
                text=True,
                env=env,
                cwd=cwd,
                timeout=30,
            )
            seen = follower.wait_for(step["expect"], step.get("timeout", 20))
            rc = follower.stop(signal.SIGINT)
            entry.update(
                rc=rc,
                out=follower.out(),
                seen=seen,
                probe_rc=probe.returncode,
                probe_out=probe.stdout + probe.stderr,
            )
        elif op == "write":
            with open(os.path.join(cwd, step["path"]), "w") as f:
                f.write(step["text"])
            entry.update(rc=0, out="")
        else:
            raise ValueError(f"unknown step {op!r}")
        entry["seconds"] = round(time.monotonic() - t0, 2)
        transcript.append(entry)
        if step.get("stop_on_failure") and entry["rc"] != 0:
            break
    if bg is not None:
        bg.stop(signal.SIGTERM)
    return transcript


def main() -> int:
    doc = json.load(sys.stdin)
    if os.getpid() != 1:
        print(json.dumps(run_steps(doc)))
        return 0
    # PID 1 of the namespace: the steps run in a child; this process only reaps
    child = os.fork()
    if child == 0:
        code = 1
        try:
            print(json.dumps(run_steps(doc)), flush=True)
            code = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    while True:
        pid, status = os.wait()
        if pid == child:
            return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
