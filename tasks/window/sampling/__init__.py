"""The long window's samplers (docs/design.md §3 `sampler`).

Every backend produces rows of the `samples` dataset (tasks.data.datasets.SAMPLES) without the
run columns (poc, run_id, fingerprint), which the span runner (tasks.window.sampling.span) adds,
and rows of `sample_gaps` for what it could not read, with the reason. The contract:

- A sample row covers its whole interval [t_from, t_to]: a backend averages what the
  driver or the exporter buffered since its previous read (no instantaneous duty cycle
  standing for ten seconds).
- `metric` says what the number is and `device` whose it is: `gpu_utilization` (NVML's
  duty cycle) and `sm_activity` are never the same row, and procfs rows are `device=cpu`.
- Attribution (job, arm, workload, trial) comes from tasks.window.sampling.attribution.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Protocol

# A backend's rows: the SAMPLES and SAMPLE_GAPS columns but the run's stamp (declared there).
from tasks.data.row_types import AttributionColumns, GapRow, SampleRow


@dataclass(frozen=True)
class Attribution:
    """Whose a process (or a GPU) is: a PoC job's, or nobody's we know ('none')."""

    job_id: str | None = None
    arm: str | None = None
    workload: str | None = None
    trial_id: str | None = None
    attributed_by: str = "none"  # env | cgroup | gres | cuda_visible_devices | label | none

    def columns(self) -> AttributionColumns:
        """A sample row's attribution columns."""
        return {
            "job_id": self.job_id,
            "arm": self.arm,
            "workload": self.workload,
            "trial_id": self.trial_id,
            "attributed_by": self.attributed_by,
        }


UNATTRIBUTED = Attribution()


class Attributor(Protocol):
    def __call__(self, pid: int) -> Attribution: ...


class Backend(Protocol):
    """A live sampler on one node: `read()` is called every interval by the span runner."""

    source: str

    def read(self) -> tuple[list[SampleRow], list[GapRow]]:
        """Rows covering the time since the previous read (the first read only primes)."""
        ...

    def close(self) -> None: ...


def sample_row(
    *,
    node: str,
    source: str,
    entity: str,
    device: str,
    metric: str,
    unit: str,
    value: float,
    t_from: dt.datetime,
    t_to: dt.datetime,
    points: int = 1,
    gpu_uuid: str | None = None,
    gpu_index: int | None = None,
    pid: int | None = None,
    attribution: Attribution = UNATTRIBUTED,
) -> SampleRow:
    return {
        "node": node,
        "source": source,
        "entity": entity,
        "device": device,
        "gpu_uuid": gpu_uuid,
        "gpu_index": gpu_index,
        "metric": metric,
        "unit": unit,
        "value": float(value),
        "t_from": t_from,
        "t_to": t_to,
        "points": int(points),
        "pid": pid,
        **attribution.columns(),
    }


def gap_row(
    *,
    node: str,
    source: str,
    t_from: dt.datetime,
    t_to: dt.datetime,
    reason: str,
    detected_by: str,
    entity: str | None = None,
    metric: str | None = None,
) -> GapRow:
    return {
        "node": node,
        "source": source,
        "entity": entity,
        "metric": metric,
        "t_from": t_from,
        "t_to": t_to,
        "gap_s": max(0.0, (t_to - t_from).total_seconds()),
        "reason": reason,
        "detected_by": detected_by,
    }
