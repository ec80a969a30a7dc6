"""Drive a real Prefect server, work pool, deployments and worker from tests.

Plain functions and one small class, no pytest dependency. :class:`PrefectStack` runs
``scripts/prefect-up`` / ``scripts/prefect-down`` for a private directory and port, so a
fixture can do::

    stack = PrefectStack(tmp_path, env={"CKPT_POC_PSEUDONYM_KEY": "..."})
    try:
        stack.up()
        yield stack
    finally:
        report = stack.down()

and tests can run deployments with :meth:`PrefectStack.run_deployment` and read the
server through its REST API (:meth:`PrefectStack.api`), without importing Prefect into
the test process (its settings would leak into other tests).

Ownership: every process prefect-up starts carries ``PREFECT_HOME=<dir>/home`` in its
environment, and so do the flow-run processes the worker starts (in their own
sessions). :func:`processes_with_home` finds them all; :meth:`PrefectStack.down`
reports any left after ``scripts/prefect-down``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PREFECT_UP = REPO / "scripts" / "prefect-up"
PREFECT_DOWN = REPO / "scripts" / "prefect-down"
POOL = "ckpt-poc"

API_RETRIES = 4  # calls answered 503 (busy) are made again, 1 s, 2 s, 3 s apart
_UUID_RE = re.compile(r"UUID: ([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")


class PrefectStackError(RuntimeError):
    """prefect-up / prefect-down or a Prefect CLI call failed."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def processes_with_home(home: Path) -> list[int]:
    """Live processes (readable by us) whose environment has ``PREFECT_HOME=home``."""
    marker = f"PREFECT_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0") and alive(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def _kill(pids: list[int], grace: float = 5.0) -> None:
    """SIGTERM these pids, then SIGKILL those still alive after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)


VENV_BIN = str(Path(sys.executable).parent)
# What `uv run` (and an activated venv) add to a shell; a user's plain shell has none.
_RUN_MARKERS = ("VIRTUAL_ENV", "UV_RUN_RECURSION_DEPTH", "PYTHONPATH", "PYTHONHOME")


def user_shell_env() -> dict[str, str]:
    """The environment of a user's plain shell, not the test runner's: no Prefect or
    prefect-up settings (e.g. an exported PREFECT_API_URL of a developer's own server), and
    no trace of the project's virtual environment (pytest runs inside `uv run`, so its PATH
    starts with .venv/bin, which a worker started from a plain shell never has)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PREFECT_", "CKPT_POC_PREFECT_"))
        and k not in ("CKPT_POC_REPO", "CKPT_POC_PYTHON", *_RUN_MARKERS)
    }
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p != VENV_BIN
    )
    return env


@dataclass
class DownReport:
    returncode: int
    output: str
    # Both are killed by PrefectStack.down after prefect-down, and make the report unclean.
    still_alive: list[int]  # pids from the pid files alive after prefect-down
    leftovers: list[int]  # any process still carrying this PREFECT_HOME

    @property
    def clean(self) -> bool:
        return self.returncode == 0 and not self.still_alive and not self.leftovers


@dataclass
class PrefectStack:
    """Server + pool + deployments + worker of scripts/prefect-up under ``dir``."""

    dir: Path
    port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)
    started: dict[str, int] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.dir / "home"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def full_env(self) -> dict[str, str]:
        return {
            **user_shell_env(),
            "CKPT_POC_PREFECT_DIR": str(self.dir),
            "CKPT_POC_PREFECT_PORT": str(self.port),
            "PREFECT_HOME": str(self.home),
            "PREFECT_API_URL": self.api_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_CLI_COLORS": "false",
            "PREFECT_CLI_WRAP_LINES": "false",
            **self.env,
        }

    def pid_files(self) -> dict[str, int]:
        """The pids in run/server.pid and run/worker.pid (those that exist)."""
        pids = {}
        for name in ("server", "worker"):
            try:
                text = (self.dir / "run" / f"{name}.pid").read_text().strip()
            except OSError:
                continue
            if text.isdigit():
                pids[name] = int(text)
        return pids

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for path in sorted((self.dir / "log").glob("*.log")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name} ---\n" + "\n".join(tail))
        return "\n".join(out)

    def up(self, timeout: float = 240) -> str:
        """Run scripts/prefect-up; return its stdout (the export line)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            proc = subprocess.run(
                [str(PREFECT_UP)],
                env=self.full_env(),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        finally:
            self.started.update(self.pid_files())
        if proc.returncode != 0:
            raise PrefectStackError(
                f"scripts/prefect-up failed ({proc.returncode}):\n{proc.stderr}\n{self.log_tail()}"
            )
        return proc.stdout

    def down(self, timeout: float = 60) -> DownReport:
        """Run scripts/prefect-down; never raises. Whatever it leaves (pid-file processes,
        or any process carrying this PREFECT_HOME, e.g. a flow run still going) is killed
        here by pid and reported."""
        self.started.update(self.pid_files())
        try:
            proc = subprocess.run(
                [str(PREFECT_DOWN), str(self.dir)],
                env=user_shell_env(),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            rc, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, output = -1, f"prefect-down timed out after {timeout}s: {exc}"
        still = [pid for pid in self.started.values() if alive(pid)]
        leftovers = processes_with_home(self.home)
        _kill(sorted(set(still) | set(leftovers)))
        return DownReport(rc, output, still, leftovers)

    def prefect(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run the Prefect CLI of this environment against this server."""
        return subprocess.run(
            [sys.executable, "-m", "prefect", *args],
            env=self.full_env(),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def run_deployment(
        self,
        name: str,
        parameters: dict[str, Any] | None = None,
        timeout: int = 150,
        env: dict[str, str] | None = None,
    ) -> tuple[str | None, subprocess.CompletedProcess[str]]:
        """``prefect deployment run NAME --params JSON --watch``: (flow run id, process).
        ``env``: the flow run's environment on the worker (the process pool's ``env`` job
        variable, as a custom run sets it in the UI).

        The CLI exits 0 only when the run ends Completed."""
        args = ["deployment", "run", name, "--watch", "--watch-timeout", str(timeout)]
        if parameters:
            args += ["--params", json.dumps(parameters)]
        if env:
            args += ["--job-variable", f"env={json.dumps(env)}"]
        proc = self.prefect(*args, timeout=timeout + 30)
        match = _UUID_RE.search(proc.stdout)
        return (match.group(1) if match else None), proc

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """A JSON call to this server's REST API (``path`` below /api)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.api_url}/{path.lstrip('/')}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        # A 503 is the server's busy database (SQLite locked while the scheduler and the
        # worker write): the same call again a moment later, as Prefect's own client does.
        for attempt in range(API_RETRIES):
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    return json.loads(resp.read() or b"null")
            except urllib.error.HTTPError as exc:
                if exc.code != 503 or attempt == API_RETRIES - 1:
                    raise
                time.sleep(1 + attempt)
        raise AssertionError("unreachable")

    def flow_run(self, flow_run_id: str) -> dict[str, Any]:
        return self.api("GET", f"flow_runs/{flow_run_id}")

    def deployment(self, flow: str, name: str) -> dict[str, Any]:
        return self.api("GET", f"deployments/name/{flow}/{name}")

    def artifacts(self, flow_run_id: str, key: str | None = None) -> list[dict[str, Any]]:
        flt: dict[str, Any] = {"flow_run_id": {"any_": [flow_run_id]}}
        if key:
            flt["key"] = {"any_": [key]}
        return self.api("POST", "artifacts/filter", {"artifacts": flt})

    def wait_flow_run(self, flow_run_id: str, timeout: float = 120) -> dict[str, Any]:
        """Poll until the run's state is final; return the run."""
        deadline = time.monotonic() + timeout
        while True:
            run = self.flow_run(flow_run_id)
            if run["state"] and run["state"]["type"] in (
                "COMPLETED",
                "FAILED",
                "CRASHED",
                "CANCELLED",
            ):
                return run
            if time.monotonic() > deadline:
                raise PrefectStackError(f"flow run {flow_run_id} not final after {timeout}s")
            time.sleep(0.5)
