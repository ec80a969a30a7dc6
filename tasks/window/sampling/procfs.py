"""The procfs sampler: CPU and memory of the node and of the PoC's workload copies.

For CPU-only nodes and the embedded default. Every row is ``device=cpu``: a CPU figure is
never passed off as a GPU one. Per read, covering the time since the previous read:

- entity ``host``: ``cpu_utilization`` (cores busy on average, from /proc/stat jiffies) and
  ``memory_used_bytes`` (MemTotal − MemAvailable at the read);
- entity ``job:<id>`` per PoC copy (tasks.window.sampling.attribution): ``cpu_utilization`` (cores,
  from utime+stime of all its processes) and ``rss_bytes`` (their resident memory at the
  read). Memory is a level read at t_to; CPU is an average over the whole interval.

A process that starts between two reads counts from its start; one that exits between two
reads loses its last partial interval (a few jiffies), which is why CPU rows say ``points``
= the number of processes that contributed.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from tasks.window.sampling import GapRow, SampleRow, sample_row
from tasks.window.sampling.attribution import PROC, ProcessAttributor

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _host_cpu_jiffies(proc: Path) -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    fields = [int(x) for x in (proc / "stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already inside user/nice
    return total - idle, total


def _meminfo(proc: Path) -> dict[str, int]:
    out = {}
    for line in (proc / "meminfo").read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            out[key] = int(parts[0]) * 1024
    return out


def _proc_stat(proc: Path, pid: str) -> tuple[str, int, int] | None:
    """(start ticks, cpu ticks utime+stime, rss bytes) of one process, None if it is gone."""
    try:
        text = (proc / pid / "stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[19], int(fields[11]) + int(fields[12]), int(fields[21]) * PAGE


@dataclass
class ProcfsSampler:
    node: str
    attribute: ProcessAttributor
    proc: Path = PROC
    source: str = "procfs"
    _host: tuple[int, int] | None = None
    _cpu: dict[tuple[int, str], int] = field(default_factory=dict)
    _last: float | None = None
    _last_wall: dt.datetime | None = None
    _last_boot: float = float("inf")  # CLOCK_BOOTTIME of the previous read (process starts)

    def read(self) -> tuple[list[SampleRow], list[GapRow]]:
        now_mono, now_wall = time.monotonic(), dt.datetime.now(dt.UTC)
        now_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        host = _host_cpu_jiffies(self.proc)
        jobs, cpu_now = self._scan_jobs()
        rows: list[SampleRow] = []
        if self._last is not None and self._last_wall is not None and self._host is not None:
            busy = (host[0] - self._host[0]) / CLK_TCK  # CPU seconds the host spent
            rows = self._rows(busy, now_mono - self._last, self._last_wall, jobs)
        self._host, self._cpu = host, cpu_now
        self._last, self._last_wall, self._last_boot = now_mono, now_wall, now_boot
        return rows, []

    def _scan_jobs(
        self,
    ) -> tuple[dict[str, tuple[object, float, int, int]], dict[tuple[int, str], int]]:
        """Every attributed process's CPU since the previous read and RSS, summed per job:
        ``({job: (attribution, cpu ticks, rss bytes, processes)}, {(pid, start): ticks})``."""
        jobs: dict[str, tuple[object, float, int, int]] = {}  # job -> (attr, cpu, rss, n)
        cpu_now: dict[tuple[int, str], int] = {}
        seen: set[tuple[int, str]] = set()
        for name in os.listdir(self.proc):
            if not name.isdigit():
                continue
            stat = _proc_stat(self.proc, name)
            if stat is None:
                continue
            start, ticks, rss = stat
            key = (int(name), start)
            seen.add(key)
            attr = self.attribute(key[0], start)  # remembered: its environment is read once
            if attr.job_id is None:
                continue
            cpu_now[key] = ticks
            # A process first seen in this read counts from its start only if it started
            # after the previous read; otherwise its past CPU is not this interval's.
            before = self._cpu.get(key)
            if before is None:
                before = 0 if int(start) / CLK_TCK > self._last_boot else ticks
            delta = ticks - before
            _, cpu, total_rss, n = jobs.get(attr.job_id, (attr, 0.0, 0, 0))
            jobs[attr.job_id] = (attr, cpu + delta, total_rss + rss, n + 1)
        self.attribute.forget_except(seen)
        return jobs, cpu_now

    def _rows(
        self,
        busy: float,
        seconds: float,
        t_from: dt.datetime,
        jobs: dict[str, tuple[object, float, int, int]],
    ) -> list[SampleRow]:
        """The host's CPU (``busy`` CPU seconds) and memory, and each job's CPU and RSS, over
        the ``seconds`` since the previous read (which began at ``t_from``)."""
        rows: list[SampleRow] = []
        t_to = t_from + dt.timedelta(seconds=seconds)
        mem = _meminfo(self.proc)
        common = {"node": self.node, "source": self.source, "device": "cpu"}
        common_t = {"t_from": t_from, "t_to": t_to}
        rows.append(
            sample_row(
                **common,
                **common_t,
                entity="host",
                metric="cpu_utilization",
                unit="cores",
                value=busy / seconds if seconds > 0 else 0.0,
            )
        )
        rows.append(
            sample_row(
                **common,
                **common_t,
                entity="host",
                metric="memory_used_bytes",
                unit="bytes",
                value=mem.get("MemTotal", 0) - mem.get("MemAvailable", 0),
            )
        )
        for job, (attr, cpu, rss, n) in sorted(jobs.items()):
            entity = f"job:{job}"
            rows.append(
                sample_row(
                    **common,
                    **common_t,
                    entity=entity,
                    metric="cpu_utilization",
                    unit="cores",
                    value=(cpu / CLK_TCK) / seconds if seconds > 0 else 0.0,
                    points=n,
                    attribution=attr,  # type: ignore[arg-type]
                )
            )
            rows.append(
                sample_row(
                    **common,
                    **common_t,
                    entity=entity,
                    metric="rss_bytes",
                    unit="bytes",
                    value=rss,
                    points=n,
                    attribution=attr,  # type: ignore[arg-type]
                )
            )
        return rows

    def close(self) -> None:
        pass
