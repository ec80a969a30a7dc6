"""Probes see a change within 50 ms of it happening, and record it on the event clock."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from tasks.clock import EventRecorder
from tasks.plan import load_plan
from tasks.probes import LogProgressProbe, last_step_before, wait_ready
from tasks.runctx import make_run_context
from tests.conftest import REPO


def _recorder(tmp_path: Path) -> EventRecorder:
    plan = load_plan(REPO / "plans" / "demo.yaml").model_copy(update={"data_dir": str(tmp_path)})
    return EventRecorder(make_run_context(plan, REPO / "plans" / "demo.yaml"))


def test_progress_probe_latency_and_partial_lines(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path)
    log = tmp_path / "w.log"
    log.write_text("")
    probe = LogProgressProbe(log, r"^step=(\d+) ", recorder, "t", "managed").start()
    latencies = []
    try:
        with open(log, "a") as fh:
            for step in range(1, 21):
                fh.write(f"noise step={step + 100} \nstep={step} loss=0.5")  # no newline yet
                fh.flush()
                time.sleep(0.02)
                written = time.monotonic_ns()
                fh.write("\n")
                fh.flush()
                seen = probe.wait_for(lambda s, n=step: s.step == n, timeout=2)
                assert seen is not None, step
                latencies.append((seen.t_mono_ns - written) / 1e6)
    finally:
        probe.stop()
    assert max(latencies) < 50, latencies
    # Only whole lines count, and only lines the regex anchors on.
    assert [e.detail["step"] for e in recorder.events(event="progress")] == list(range(1, 21))
    assert last_step_before(log, len("noise step=101 \nstep=1 loss=0.5\n"), r"^step=(\d+) ") == 1


def test_ready_probe_latency(tmp_path: Path) -> None:
    recorder = _recorder(tmp_path)
    ready_at: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = bool(ready_at)
            self.send_response(200 if ok else 503)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        threading.Timer(0.3, lambda: ready_at.append(time.monotonic_ns())).start()
        url = f"http://127.0.0.1:{server.server_port}/ready"
        assert wait_ready(url, recorder, "t", "unmanaged", timeout=5)
    finally:
        server.shutdown()
        server.server_close()
    (event,) = recorder.events(event="ready")
    assert 0 <= (event.t_mono_ns - ready_at[0]) / 1e6 < 50
