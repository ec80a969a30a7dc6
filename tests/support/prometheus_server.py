"""Run a real Prometheus (Debian's `prometheus` package) and small HTTP stand-ins from tests.

Plain functions, no pytest dependency, so that a fixture can do::

    tsdb = tmp / "tsdb"
    backfill(write_openmetrics(tmp / "history.om", series), tsdb)
    server = start_prometheus(tmp, tsdb)
    try:
        yield server
    finally:
        server.stop()

- :func:`backfill` writes a deterministic history with ``promtool tsdb
  create-blocks-from openmetrics`` into a private TSDB directory; the server started on
  it afterwards serves it (keep it inside the 15-day default retention, or it is deleted
  at start-up).
- :func:`start_prometheus` starts ``prometheus`` on a free loopback port with a temporary
  config and ``--storage.tsdb.path`` (never the Debian service), optionally scraping
  targets, and waits for ``/-/ready``.
- :func:`start_exporter` runs a DCGM-like ``prometheus_client`` exporter in its own process.
- :func:`serve_answers` is a tiny HTTP server answering every request with fixed bytes (for
  garbage answers); :func:`silent_port` accepts connections and never answers (timeouts).

A missing binary raises :class:`PrometheusServerError` saying to run scripts/setup-debian.
"""

from __future__ import annotations

import contextlib
import http.server
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SETUP_HINT = (
    "run scripts/setup-debian prometheus (scripts/test does) to install Debian's prometheus"
)


class PrometheusServerError(RuntimeError):
    """The prometheus/promtool binary is missing, or the server did not come up."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary(name: str) -> str:
    """Path of `prometheus` or `promtool`; raises with how to install it when missing."""
    path = shutil.which(name) or (
        f"/usr/bin/{name}" if os.access(f"/usr/bin/{name}", os.X_OK) else None
    )
    if path is None:
        raise PrometheusServerError(f"{name} not found: {SETUP_HINT}")
    return path


# --- history ----------------------------------------------------------------------------------

Series = tuple[str, Mapping[str, str], Iterable[tuple[float, float]]]  # name, labels, (t, v)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def write_openmetrics(path: Path, series: Iterable[Series]) -> Path:
    """An OpenMetrics text file of gauges (timestamps in seconds), for :func:`backfill`."""
    by_name: dict[str, list[tuple[Mapping[str, str], Iterable[tuple[float, float]]]]] = {}
    for name, labels, points in series:
        by_name.setdefault(name, []).append((labels, points))
    with path.open("w") as out:
        for name, members in by_name.items():
            out.write(f"# TYPE {name} gauge\n")
            for labels, points in members:
                sel = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
                for t, v in points:
                    out.write(f"{name}{{{sel}}} {_number(v)} {t:.3f}\n")
        out.write("# EOF\n")
    return path


def backfill(openmetrics: Path, tsdb: Path, timeout: float = 300) -> None:
    """promtool tsdb create-blocks-from openmetrics FILE TSDB (before the server starts)."""
    tsdb.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [
            binary("promtool"),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(openmetrics),
            str(tsdb),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise PrometheusServerError(
            f"promtool backfill failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )


# --- the server -------------------------------------------------------------------------------


@dataclass
class PrometheusServer:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def stop(self, grace: float = 10) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; only this process."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_prometheus(
    workdir: Path,
    tsdb: Path,
    *,
    targets: Iterable[str] = (),
    scrape_interval: str = "1s",
    timeout: float = 60,
) -> PrometheusServer:
    """A private prometheus on 127.0.0.1:<free port>, scraping `targets` (host:port)."""
    exe = binary("prometheus")
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    target_list = ", ".join(f"'{t}'" for t in targets)
    config.write_text(
        textwrap.dedent(
            f"""\
            global:
              scrape_interval: {scrape_interval}
              evaluation_interval: {scrape_interval}
            scrape_configs:
              - job_name: dcgm
                scrape_interval: {scrape_interval}
                honor_labels: true
                static_configs:
                  - targets: [{target_list}]
            """
        )
    )
    port = free_port()
    log = workdir / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                exe,
                f"--config.file={config}",
                f"--storage.tsdb.path={tsdb}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=30d",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            start_new_session=True,
        )
    server = PrometheusServer(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise PrometheusServerError(
                f"prometheus exited {proc.returncode}:\n{server.log_tail()}"
            )
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as resp,
        ):
            if resp.status == 200:
                return server
        time.sleep(0.2)
    server.stop()
    raise PrometheusServerError(f"prometheus not ready within {timeout}s:\n{server.log_tail()}")


# --- a DCGM-like exporter ---------------------------------------------------------------------

_EXPORTER = """
import sys, time
from prometheus_client import CollectorRegistry, Gauge, start_http_server
registry = CollectorRegistry()
g = Gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).",
          ["gpu", "UUID", "Hostname", "hpc_job"], registry=registry)
g.labels(gpu="0", UUID=sys.argv[2], Hostname=sys.argv[3], hpc_job=sys.argv[4]).set(
    float(sys.argv[5]))
start_http_server(int(sys.argv[1]), addr="127.0.0.1", registry=registry)
print("ready", flush=True)
while True:
    time.sleep(3600)
"""


@dataclass
class Exporter:
    address: str
    proc: subprocess.Popen[str]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_exporter(uuid: str, hostname: str, job: str, value: float) -> Exporter:
    """A prometheus_client exporter of one DCGM_FI_DEV_GPU_UTIL series, in a process."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", _EXPORTER, str(port), uuid, hostname, job, str(value)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise PrometheusServerError(f"exporter did not start (said {line!r})")
    return Exporter(f"127.0.0.1:{port}", proc)


# --- stand-ins ----------------------------------------------------------------------------------


@contextlib.contextmanager
def serve_answers(
    status: int, body: bytes, content_type: str = "application/json"
) -> Iterator[str]:
    """An HTTP server on a free loopback port answering every GET/POST with `body`; yields
    its base URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = _answer
        do_POST = _answer

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def silent_port() -> Iterator[str]:
    """A listening socket that never accepts: connections complete (backlog) and requests get
    no answer, so a client times out. Yields its base URL."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"
