"""Harness overhead benchmark: what our own measuring costs a running workload.

    uv run python bench/harness_overhead.py                     # 2 pairs of 400 steps (~45 s)
    uv run python bench/harness_overhead.py --pairs 6 --steps 1000
    uv run python bench/harness_overhead.py --no-watch          # the probe's 10 ms poll mode

The real example workload (``python -m examples.train_digits --steps N --step-sleep S``,
stdout and stderr to a log file) runs alternately in two modes, A B B A A B B A ...:

* **bare** (A): nothing watches it; this process only waits for it (``os.wait4``, blocking,
  no CPU) - the bench process's own baseline;
* **harness** (B): a ``tasks.engine.probes.LogProgressProbe`` tails its log at its defaults (on a
  local Linux filesystem: woken by inotify, reads at most every ``HOLD_S`` = 0.1 s while
  steps keep coming, each timed by the log's mtime, a safety read every 0.5 s; elsewhere, or
  with ``--no-watch``: a read every 10 ms) with the engine's progress regex and records a
  ``progress`` event per read that found a new step (its default; the newest step) into a
  ``tasks.engine.clock.EventRecorder``, which
  journals events to the run folder as they happen (``progress`` in batches, at most 0.5 s
  late); writing parquet happens once per run, after the workload, and is not a cost the
  workload sees. The probe's mode, and why, is printed and recorded.

The workload is started with ``subprocess.Popen``, not ``LocalCluster`` (its ``unshare``
launcher and pid polling would add the same cost to both modes and only add noise).

Per run: this process's CPU time (``time.process_time``, all threads) over the run's wall
time, the probe thread's own CPU time (``time.thread_time`` at the end of the thread: a
cross-check), its wake-ups (sleeps of its thread that ended: ``wakeups``) and reads of the
log, the workload's wall time, steps/s and CPU
time (``os.wait4``'s rusage of that child), and this process's RSS growth and peak RSS.
Per pair: the harness's CPU as % of one core = (B's CPU / B's wall - A's CPU / A's wall)
x 100; the harness's CPU per wake-up of the probe (that % x wall / wake-ups); wake-ups per
progress line (the workload logs one line per step); and workload wall time B / A.
The wall-time pairs go through ``tasks.experiments.stats.compare_paired`` against the plan's
overhead threshold. Target: harness CPU under 0.5 % of one core; PASS/MISS is printed
against the median over pairs. Everything measured goes to
``.run/bench/harness-overhead-<time>.json``; the logs stay beside it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchlib import code_version, proc_mib, self_peak_mib

from tasks.data.plan import load_plan
from tasks.data.runctx import RunContext, make_run_context
from tasks.engine.clock import EventRecorder
from tasks.engine.probes import HOLD_S, POLL_S, SAFETY_POLL_S, LogProgressProbe
from tasks.experiments.stats import compare_paired

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".run" / "bench"
PLAN = REPO / "plans" / "demo.yaml"
STEP_RE = r"^step=(\d+) "
TARGET_PCT = 0.5  # of one core: the most the harness may cost
BARE, HARNESS = "bare", "harness"


class BenchError(RuntimeError):
    """A run did not do what it must for its numbers to count (the message says what)."""


class TimedProbe(LogProgressProbe):
    """The engine's probe, unchanged, plus its thread's CPU time (its own counts: ``reads``
    of the log and ``wakeups`` of its thread)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.thread_cpu_s: float | None = None

    def _run(self) -> None:
        try:
            super()._run()
        finally:
            self.thread_cpu_s = time.thread_time()  # this thread's CPU since it started


def self_rss_mib() -> float:
    return proc_mib("/proc/self/status", "VmRSS") or float("nan")


def order_of(pairs: int) -> list[tuple[int, str]]:
    """(pair, mode) in A B B A order, so a linear drift hits both modes alike."""
    runs: list[tuple[int, str]] = []
    for p in range(pairs):
        runs += [(p, BARE), (p, HARNESS)] if p % 2 == 0 else [(p, HARNESS), (p, BARE)]
    return runs


def workload_argv(steps: int, step_sleep: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "examples.train_digits",
        "--steps",
        str(steps),
        "--step-sleep",
        str(step_sleep),
    ]


def run_once(
    mode: str,
    argv: list[str],
    log: Path,
    ctx: RunContext,
    steps: int,
    poll_s: float,
    watch: bool = True,
    hold_s: float = HOLD_S,
) -> dict[str, Any]:
    """One workload run in ``mode``; what it and this process cost over its wall time."""
    recorder = EventRecorder(ctx) if mode == HARNESS else None
    rss0 = self_rss_mib()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO)
    probe = None
    if recorder is not None:
        probe = TimedProbe(
            log,
            STEP_RE,
            recorder,
            "harness-overhead",
            mode,
            poll_s=poll_s,
            watch=watch,
            hold_s=hold_s,
        )
        probe.start()
    # wait4: the child's own CPU time, without polling. (Not its ru_maxrss: Linux carries
    # the parent's RSS at fork/vfork into it through exec, so it reads as this process's.)
    _, status, child = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    last_step = None
    if probe is not None:
        # What a real harness does at the end: see the last line, then stop.
        seen = probe.wait_for(lambda s: s.step >= steps, timeout=2)
        probe.stop()
        last_step = seen.step if seen else (probe.last.step if probe.last else None)
    cpu = time.process_time() - cpu0
    if proc.returncode != 0:
        raise BenchError(f"{mode} run exited {proc.returncode}; log tail:\n{log_tail(log)}")
    if probe is not None and last_step != steps:
        raise BenchError(f"probe saw step {last_step}, the workload ran {steps}")
    return {
        "mode": mode,
        "wall_s": wall,
        "steps_per_s": steps / wall,
        "bench_cpu_s": cpu,
        "bench_cpu_pct": cpu / wall * 100,
        "probe_thread_cpu_s": probe.thread_cpu_s if probe else None,
        "probe_cpu_pct": probe.thread_cpu_s / wall * 100 if probe and probe.thread_cpu_s else None,
        "polls": probe.reads if probe else None,
        "wakeups": probe.wakeups if probe else None,
        "probe_mode": probe.mode if probe else None,
        "probe_mode_reason": probe.mode_reason if probe else None,
        "events": len(recorder.events()) if recorder else None,
        "bench_rss_growth_mib": self_rss_mib() - rss0,
        "workload_cpu_s": child.ru_utime + child.ru_stime,
        "log": str(log.relative_to(REPO)),
    }


def log_tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return f"(no log at {path})"


def _f(v: float | None, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if v is None else f"{v:>{width}{spec}}"


def print_runs(runs: list[dict[str, Any]]) -> None:
    cols = [
        ("wall_s", "wall s", ".2f", 7),
        ("steps_per_s", "steps/s", ".1f", 7),
        ("workload_cpu_s", "wl CPU s", ".2f", 8),
        ("bench_cpu_s", "bench CPU s", ".3f", 11),
        ("bench_cpu_pct", "bench %core", ".3f", 11),
        ("probe_cpu_pct", "probe %core", ".3f", 11),
        ("polls", "reads", "d", 5),
        ("wakeups", "wakes", "d", 5),
        ("events", "events", "d", 6),
        ("bench_rss_growth_mib", "+RSS MiB", ".1f", 8),
    ]
    head = f"{'#':>2} {'pair':>4} {'mode':>7} " + " ".join(f"{h:>{w}}" for _, h, _, w in cols)
    print(head)
    print("-" * len(head))
    for i, r in enumerate(runs, 1):
        cells = [_f(r.get(k), spec, w) for k, _, spec, w in cols]
        print(f"{i:>2} {r['pair'] + 1:>4} {r['mode']:>7} " + " ".join(cells))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=2, help="A/B pairs, run A B B A ... (2)")
    ap.add_argument("--steps", type=int, default=400, help="workload steps per run (400)")
    ap.add_argument("--step-sleep", type=float, default=0.02, help="workload --step-sleep")
    ap.add_argument(
        "--poll-ms",
        type=float,
        default=POLL_S * 1000,
        help="probe poll in poll mode (default: the engine's)",
    )
    ap.add_argument(
        "--hold-ms",
        type=float,
        default=HOLD_S * 1000,
        help="probe's hold in inotify mode: reads at most this often while steps come "
        "(default: the engine's)",
    )
    ap.add_argument(
        "--watch",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="let the probe use inotify where it can (default); --no-watch forces poll mode",
    )
    args = ap.parse_args(argv)
    if args.pairs < 1 or args.steps < 1:
        ap.error("--pairs and --steps must be >= 1")

    stamp = dt.datetime.now()
    work = CACHE / f"harness-overhead-{stamp:%Y%m%dT%H%M%S}"
    work.mkdir(parents=True)
    plan = load_plan(PLAN).model_copy(update={"data_dir": str(work / "data")})
    ctx = make_run_context(plan, PLAN)
    threshold = plan.success.overhead_pct.threshold
    poll_s = args.poll_ms / 1000
    wl = workload_argv(args.steps, args.step_sleep)
    env = {
        "time": stamp.isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "code": code_version("tasks", "examples", "bench/harness_overhead.py"),
        "load_avg_1m": os.getloadavg()[0],
    }
    print(
        f"harness overhead benchmark  {stamp:%Y-%m-%d %H:%M}  cpus={env['cpus']} "
        f"kernel={env['kernel']} python={env['python']} code={env['code']}"
    )
    print(
        f"workload: train_digits --steps {args.steps} --step-sleep {args.step_sleep}; "
        f"{args.pairs} pair(s) in A B B A order (A bare, B harness); probe "
        + (
            f"inotify where it can (reads at most every {args.hold_ms:g} ms while steps "
            f"come, safety read every {SAFETY_POLL_S * 1000:g} ms), else "
            if args.watch
            else "forced to poll mode, "
        )
        + f"poll {args.poll_ms:g} ms; a progress event per read with a new step; "
        f"load avg {env['load_avg_1m']:.2f}"
    )
    # Untimed warm-up: the first interpreter start pays for a cold page cache of imports.
    subprocess.run(
        workload_argv(3, 0), cwd=REPO, check=True, stdout=subprocess.DEVNULL, timeout=120
    )

    runs: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    for i, (pair, mode) in enumerate(order_of(args.pairs), 1):
        print(f"  run {i} pair {pair + 1} {mode} ...", end="", flush=True)
        log = work / f"{i:02d}-{mode}.log"
        run = run_once(mode, wl, log, ctx, args.steps, poll_s, args.watch, args.hold_ms / 1000)
        run["pair"] = pair
        runs.append(run)
        probe_mode = f", probe mode {run['probe_mode']}" if run["probe_mode"] else ""
        print(f" {run['wall_s']:.2f}s, bench CPU {run['bench_cpu_s']:.3f}s{probe_mode}", flush=True)
    wall = time.perf_counter() - t_start

    print()
    print_runs(runs)
    by_pair = {p: {r["mode"]: r for r in runs if r["pair"] == p} for p in range(args.pairs)}
    harness_pct = [b[HARNESS]["bench_cpu_pct"] - b[BARE]["bench_cpu_pct"] for b in by_pair.values()]
    probe_pct = [b[HARNESS]["probe_cpu_pct"] for b in by_pair.values()]
    wall_ratio = [b[HARNESS]["wall_s"] / b[BARE]["wall_s"] for b in by_pair.values()]
    rate_ratio = [b[HARNESS]["steps_per_s"] / b[BARE]["steps_per_s"] for b in by_pair.values()]
    wl_cpu_ratio = [
        b[HARNESS]["workload_cpu_s"] / b[BARE]["workload_cpu_s"] for b in by_pair.values()
    ]
    # The harness's CPU (all threads, over bare) per wake-up of the probe's thread.
    us_per_wake = [
        harness_pct[p] / 100 * b[HARNESS]["wall_s"] / b[HARNESS]["wakeups"] * 1e6
        for p, b in by_pair.items()
    ]
    wakes_per_line = [b[HARNESS]["wakeups"] / args.steps for b in by_pair.values()]
    polls = sum(b[HARNESS]["polls"] for b in by_pair.values())
    wakeups = sum(b[HARNESS]["wakeups"] for b in by_pair.values())
    probe_cpu = sum(b[HARNESS]["probe_thread_cpu_s"] for b in by_pair.values())
    med = statistics.median
    print(
        "  bench %core: this process's CPU s / the run's wall s x 100 (all threads; in bare\n"
        "  runs it only waits); probe %core: the probe thread's own CPU s / wall s x 100;\n"
        "  wl: the workload process (rusage from wait4); +RSS: this process's RSS growth."
    )
    print()
    print("per pair (harness vs bare):")
    for p, b in by_pair.items():
        print(
            f"  pair {p + 1}: harness CPU {harness_pct[p]:.3f} % of one core "
            f"({us_per_wake[p]:.0f} us per wake-up, {wakes_per_line[p]:.3f} wake-ups per "
            "progress line, "
            f"{harness_pct[p] * 0.6:.4f} CPU s per wall min; probe thread alone "
            f"{probe_pct[p]:.3f} %), wall {b[HARNESS]['wall_s']:.2f} / {b[BARE]['wall_s']:.2f} s "
            f"= {wall_ratio[p]:.4f}x, steps/s ratio {rate_ratio[p]:.4f}x, workload CPU ratio "
            f"{wl_cpu_ratio[p]:.4f}x"
        )
    primary = med(harness_pct)
    modes = sorted({(r["probe_mode"], r["probe_mode_reason"]) for r in runs if r["probe_mode"]})
    probe_mode = "/".join(m for m, _ in modes)  # one mode unless the fallback struck mid-run
    print()
    print("probe mode: " + "; ".join(f"{m} ({why})" for m, why in modes))
    print(
        f"harness CPU (median of pairs): {primary:.3f} % of one core = {primary * 0.6:.4f} CPU s "
        f"per minute of wall time = {med(us_per_wake):.0f} us CPU per wake-up (all threads, "
        f"over bare); probe thread alone {med(probe_pct):.3f} % "
        f"({probe_cpu / wakeups * 1e6:.1f} us CPU per wake-up over {wakeups} wake-ups, "
        f"{wakeups / sum(b[HARNESS]['wall_s'] for b in by_pair.values()):.1f} wake-ups/s; "
        f"{polls} reads)"
    )
    print(
        f"wake-ups per progress line (median of pairs): {med(wakes_per_line):.3f} "
        f"({args.steps} lines per run)"
    )
    print(
        f"workload: wall time harness/bare {med(wall_ratio):.4f}x, steps/s harness/bare "
        f"{med(rate_ratio):.4f}x, CPU time harness/bare {med(wl_cpu_ratio):.4f}x (medians of "
        "pairs)"
    )
    stats = compare_paired(
        [b[HARNESS]["wall_s"] for b in by_pair.values()],
        [b[BARE]["wall_s"] for b in by_pair.values()],
        threshold_pct=threshold,
    )
    print(
        "paired wall-time overhead (tasks.experiments.stats.compare_paired, "
        f"n={stats.n}): median "
        f"{stats.overhead_pct:+.2f} %, 95% CI [{stats.ci_low_pct:+.2f}, "
        f"{stats.ci_high_pct:+.2f}] %, p={stats.p_value:.3g}; {stats.difference}; "
        f"vs {threshold:g} %: {stats.verdict} ({stats.verdict_reason})"
        + (f"; MDE {stats.mde_pct:.2f} %" if stats.mde_pct is not None else "")
    )
    peak = self_peak_mib()
    print(f"harness peak RSS (ru_maxrss of this process): {peak:,.0f} MiB")
    verdict = "PASS" if primary < TARGET_PCT else "MISS"
    print(
        f"{verdict}: harness CPU {primary:.3f} % of one core (target < {TARGET_PCT} %), "
        f"{med(wakes_per_line):.3f} wake-ups per progress line, {med(us_per_wake):.0f} us per "
        f"wake-up, probe mode {probe_mode}"
    )
    print(f"wall time {wall:.0f}s")

    record = CACHE / f"harness-overhead-{stamp:%Y%m%dT%H%M%S}.json"
    record.write_text(
        json.dumps(
            {
                "env": env,
                "args": vars(args),
                "workload_argv": wl,
                "runs": runs,
                "harness_cpu_pct_pairs": harness_pct,
                "probe_cpu_pct_pairs": probe_pct,
                "harness_us_per_wakeup_pairs": us_per_wake,
                "wakeups_per_line_pairs": wakes_per_line,
                "hold_s": args.hold_ms / 1000,
                "wall_ratio_pairs": wall_ratio,
                "steps_per_s_ratio_pairs": rate_ratio,
                "workload_cpu_ratio_pairs": wl_cpu_ratio,
                "probe_mode": probe_mode,
                "harness_cpu_pct": primary,
                "target_pct": TARGET_PCT,
                "verdict": verdict,
                "wall_time_stats": stats.to_json(),
                "harness_peak_rss_mib": peak,
                "wall_s": wall,
            },
            indent=1,
        )
    )
    print(f"record: {record.relative_to(REPO)}; logs under {work.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
