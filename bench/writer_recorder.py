"""Writer recorder benchmark: what the exit's writer recorder (tasks/exit/writers/recorder.py)
costs a node, side by side with no recorder, in one run.

    uv run python bench/writer_recorder.py                # idle 10 s, storm 10 s, 3 rounds
    uv run python bench/writer_recorder.py --seconds 5 --rounds 2

Per round, alternating which goes first: a writer storm (one process creating, writing and
deleting small files under /tmp as fast as it can, and forking a `true` every 100 files)
without the recorder, then with it running (a separate process, as the harness starts it,
watching the default snapshot paths). Printed: the storm's files/s both ways and their ratio,
the recorder's CPU % (its utime + stime over the span) and events/s during the storm and
while idle (the idle span: nothing but this machine's own life), its peak RSS, and the
bench's. Needs root (fanotify, the process-events connector). Every round is printed and
written to ``.run/bench/writer-recorder-<time>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO, code_version, proc_mib, self_peak_mib, write_record

sys.path.insert(0, str(REPO))
from tasks.data.plan_watch import DEFAULT_WATCHED_PATHS

TICKS = os.sysconf("SC_CLK_TCK")


def storm(seconds: float, folder: Path) -> int:
    """Files created, written and deleted in ``seconds`` (a `true` forked every 100)."""
    n, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        path = folder / f"f{n % 64}"
        path.write_bytes(b"x" * 512)
        path.unlink()
        n += 1
        if n % 100 == 0:
            subprocess.run(["true"], check=True)
    return n


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def start_recorder(out: Path) -> subprocess.Popen[bytes]:
    spec = out / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "node": "bench",
                "out": str(out / "log"),
                "paths": list(DEFAULT_WATCHED_PATHS),
                "skip": ["/proc", "/sys", str(out)],
                "poc_folders": [str(REPO)],
                "poc_pids": [os.getpid()],
                "flush_s": 5,
            }
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "tasks.exit.writers.recorder", str(spec)], cwd=REPO
    )
    deadline = time.monotonic() + 30
    while not (out / "log" / "writers.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the recorder did not start (exit {proc.poll()})")
        time.sleep(0.05)
    return proc


def events_of(out: Path) -> int:
    return int(json.loads((out / "log" / "writers.json").read_text())["events"])


def one_round(seconds: float, recorder_first: bool) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-writers-", dir="/tmp"))
    out = Path(tempfile.mkdtemp(prefix="ckpt-bench-recorder-"))
    row: dict[str, Any] = {"recorder_first": recorder_first}
    try:
        for with_recorder in (recorder_first, not recorder_first):
            if not with_recorder:
                row["files_per_s_without"] = storm(seconds, work) / seconds
                continue
            proc = start_recorder(out)
            c0, t0 = cpu_s(proc.pid), time.monotonic()
            time.sleep(seconds)  # idle: the machine's own life
            c1, t1 = cpu_s(proc.pid), time.monotonic()
            row["idle_cpu_pct"] = 100 * (c1 - c0) / (t1 - t0)
            row["files_per_s_with"] = storm(seconds, work) / seconds
            c2, t2 = cpu_s(proc.pid), time.monotonic()
            row["storm_cpu_pct"] = 100 * (c2 - c1) / (t2 - t1)
            row["recorder_peak_mib"] = proc_mib(f"/proc/{proc.pid}/status", "VmHWM")
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
            row["events"] = events_of(out)
            row["events_per_s"] = row["events"] / (t2 - t0)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
    row["ratio"] = row["files_per_s_with"] / row["files_per_s_without"]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("needs root: fanotify filesystem marks and the process-events connector")
    stamp = dt.datetime.now(dt.UTC)
    rows = [one_round(args.seconds, recorder_first=i % 2 == 1) for i in range(args.rounds)]
    print(
        "round | files/s without | files/s with | ratio | recorder CPU % storm / idle | "
        "events/s | recorder peak MiB"
    )
    for i, r in enumerate(rows):
        print(
            f"{i:>5} | {r['files_per_s_without']:>15.0f} | {r['files_per_s_with']:>12.0f} | "
            f"{r['ratio']:>5.2f} | {r['storm_cpu_pct']:>12.1f} / {r['idle_cpu_pct']:<10.2f} | "
            f"{r['events_per_s']:>8.0f} | {r['recorder_peak_mib']:.0f}"
        )
    print(f"median ratio (with / without): {statistics.median(r['ratio'] for r in rows):.2f}")
    print(f"bench peak RSS: {self_peak_mib():.0f} MiB")
    record = {"code": code_version("tasks/exit/writers", "bench/writer_recorder.py"),
              "seconds": args.seconds, "rows": rows}  # fmt: skip
    print(write_record(REPO / ".run" / "bench", "writer-recorder", stamp, record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
