"""The CLI's own Prefect API server, for commands run without PREFECT_API_URL.

Prefect's ephemeral mode starts a server subprocess that outlives a killed command (it was
still alive 90 s after 14 of 17 SIGKILLs) and gives up after 20 s of start-up, which four
commands started at once on two cores exceeded. So the CLI starts the same server itself:

- once per command, before the first flow (a command running several flows pays once);
- with a parent-death signal, so it dies with the command however the command ends;
- one start-up at a time per PREFECT_HOME (each migrates the database as it starts);
- waiting for it as long as start-up takes under load (CKPT_POC_PREFECT_START_TIMEOUT_S),
  and failing with the server's own last lines when it exits;
- on Prefect's usual database (PREFECT_HOME), so the runs stay in its history.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tasks.data.errors import CkptPocError
from tasks.data.settings import env_name, settings
from tasks.engine.preflight import log_tail

START_TIMEOUT_ENV = env_name("prefect_start_timeout_s")
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_server: subprocess.Popen[bytes] | None = None


class PrefectServerError(CkptPocError):
    """The command's own Prefect server did not start."""


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the command's process ends."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        os._exit(70)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def server_pid() -> int | None:
    return _server.pid if _server is not None else None


def stop_server() -> None:
    global _server
    if _server is None:
        return
    _server.terminate()
    try:
        _server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        _server.kill()
        _server.wait()
    _server = None


def ensure_prefect_api() -> str:
    """PREFECT_API_URL if set (a real server: runs show in its UI); otherwise start this
    command's own server once, point PREFECT_API_URL at it, and return that."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    spec = importlib.util.find_spec("prefect")
    if spec is None or spec.origin is None:
        raise PrefectServerError("Prefect is not installed in this environment")
    app_dir = str(Path(spec.origin).parent.parent)
    log = Path(tempfile.gettempdir()) / f"ckpt-poc-prefect-server-{os.getpid()}.log"
    env = {
        **os.environ,
        # What Prefect's own ephemeral server sets: no UI, no background services.
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    # Start-ups take turns: a server migrates the database as it starts, and two doing that
    # at once on a new SQLite database fail ("index ... already exists").
    home = Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect")
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "ckpt-poc-server-start.lock", "w") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)  # released when this block closes the file
        port = _free_port()
        api_url = f"http://127.0.0.1:{port}/api"
        argv = [
            sys.executable,
            "-m",
            "uvicorn",
            "--app-dir",
            app_dir,
            "--factory",
            "prefect.server.api.server:create_app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "error",
            "--lifespan",
            "on",
        ]
        _start_and_wait(argv, env, log, api_url)
    os.environ["PREFECT_API_URL"] = api_url
    with contextlib.suppress(OSError):
        log.unlink()  # it answered: nothing in it is needed any more
    return api_url


def _start_and_wait(argv: list[str], env: dict[str, str], log: Path, api_url: str) -> None:
    global _server
    with open(log, "wb") as out:
        _server = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            # preexec_fn is unsafe with threads; the CLI has started none of its own yet.
            preexec_fn=_die_with_parent,
        )
    atexit.register(stop_server)
    timeout_s = settings().prefect_start_timeout_s
    deadline = time.monotonic() + timeout_s
    while not _healthy(api_url):
        if _server.poll() is not None:
            rc = _server.returncode
            stop_server()
            raise PrefectServerError(
                f"the command's Prefect server exited ({rc}) before answering; "
                f"last lines of {log}:\n{log_tail(log) or '(empty)'}"
            )
        if time.monotonic() > deadline:
            stop_server()
            raise PrefectServerError(
                f"the command's Prefect server did not answer within {timeout_s:.0f} s "
                f"({START_TIMEOUT_ENV} sets the limit); last lines of {log}:\n"
                f"{log_tail(log) or '(empty)'}"
            )
        time.sleep(0.1)
