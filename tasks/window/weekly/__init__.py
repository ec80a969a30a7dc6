"""The weekly report: one REPORTS row per (measure, arm, ISO week), its change points and gaps.

Plain functions, no Prefect (the ``weekly_report`` flow wraps ``build_weekly_report``). By
reason to change: ``segments`` (ISO weeks, comparability), ``model`` (a row, its criterion
and statistic), ``measures`` (the measured rows), ``extrapolation`` (Young/Daly, waste,
expected gain), ``rows`` (a week's rows in report order), ``render`` and ``plots`` (markdown,
HTML, PNGs) and ``stage`` (paths, reading and writing).

Definitions (docs/design.md §4; the report says them too):

- **Pooling.** Trial-based rows (recovery, work lost, overhead, cold start, checkpoint cost and
  the extrapolations built on them) pool every trial from the start of the week's
  *comparability segment* up to and including the week: cumulative to date, restarted at a
  change point, never across one. Utilization and goodput are per week (that week's
  UTILIZATION rows only); the measured goodput gain is the plan's statistic over the
  segment's weekly gains so far.
- **Segments.** Per source dataset (trials, utilization, samples when given) a week's
  fingerprint is the sorted set of fp_driver, fp_cuda, fp_kernel, the checkpointer's version
  (``fp_versions[<checkpointer kind>]``) and fp_host over that week's rows of that source.
  A week whose fingerprint differs from the last one that source had is a change point and
  starts a new segment. Sources are compared with themselves only, so a week without trials
  is no change. The granularity is the week: a change in mid-week puts the whole week in
  the new segment.
- **λ** (interruptions per hour of job time) = exposed allocations / GPU-hours of the latest
  baseline's exposure rows (kind 'state', EXPOSED_STATES count as interruptions, TIMEOUT
  included) × the plan's workload GPUs. Without GPU-hours: exposed allocations / node-hours
  (a one-node job). M = 1/λ.
- **δ** (checkpoint cost, s) = median freeze_s of ok managed checkpoint trials (the time the
  workload is stopped); median dump_s when no freeze time was recorded.
- **R** = median recovery_s of ok recovery trials of the arm. The unmanaged arm also loses its
  median work_lost_s (compute since its recoverable point) per interruption.
- **Waste** (first order, Young/Daly): managed W = δ/τ + λ(τ/2 + R_managed) at the plan's
  checkpointer.interval_s; unmanaged W = λ(L_unmanaged + R_unmanaged). Expected goodput =
  1 − W; the expected gain is their difference, set beside the measured gain.
"""

from tasks.window.weekly.stage import build_weekly_report

__all__ = ["build_weekly_report"]
