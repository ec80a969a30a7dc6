"""The plan's sampling window (`window:`: when and how the test nodes are sampled, a site's
Prometheus, the Prefect schedules) and its `exclusions:` (maintenance windows removed from both
arms' utilization alike). Models of tasks/data/plan.py, re-exported from there."""

from __future__ import annotations

import datetime as dt
import re
from typing import Literal, get_args

from pydantic import AwareDatetime, Field, field_validator, model_validator

from tasks.data.plan_dates import PlanDate
from tasks.data.plan_workload import (
    SafeName,
    _Strict,  # the plan's one strict base: finite, no extras
)

MAX_WINDOW_WEEKS = 104  # two years of sampling
MAX_EXCLUSIONS = 1000


MAX_SAMPLE_SPAN_S = 24 * 3600  # one sampler run covers at most a day
MIN_SAMPLE_INTERVAL_S = 0.1
# What a Prometheus metric's value is, so the report never mixes a duty cycle with SM activity.
SampleUnit = Literal["percent", "fraction", "bytes", "watts", "mhz", "celsius", "cores", "count"]
SAMPLE_UNITS: tuple[str, ...] = get_args(SampleUnit)


class PrometheusMetric(_Strict):
    """One PromQL expression and what its value is (``metric`` names the row)."""

    metric: SafeName
    query: str = Field(min_length=1)
    unit: SampleUnit


class PrometheusSource(_Strict):
    """A Prometheus a site already runs (e.g. scraping NVIDIA's DCGM exporter)."""

    url: str
    step_s: float = Field(default=30, gt=0, le=3600, description="query step, ≤ 1 h")
    metrics: list[PrometheusMetric] = Field(min_length=1)
    # Which label of a series holds the node, the GPU (UUID preferred) and the job.
    node_label: str = "Hostname"
    gpu_label: str | None = "UUID"
    job_label: str | None = "hpc_job"
    timeout_s: float = Field(default=30, gt=0, le=600)

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        if not re.match(r"^https?://[^\s]+$", value):
            raise ValueError("prometheus url must be an http(s) URL")
        return value.rstrip("/")


class Schedules(_Strict):
    """When Prefect starts the long-window flows (prefect.yaml reads these at deploy time)."""

    active: bool = False
    timezone: str = "UTC"
    sample_window: str = Field(default="0 * * * *", description="cron: a span starts")
    utilization: str = Field(default="30 0 * * *", description="cron: daily")
    weekly_report: str = Field(default="0 6 * * 1", description="cron: Monday morning")

    @field_validator("timezone")
    @classmethod
    def _tz(cls, value: str) -> str:
        import zoneinfo

        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {value!r} (an IANA name, e.g. UTC)") from exc
        return value

    @field_validator("sample_window", "utilization", "weekly_report")
    @classmethod
    def _cron(cls, value: str) -> str:
        if len(value.split()) != 5:
            raise ValueError(f"{value!r} is not a 5-field cron expression")
        return value


class Window(_Strict):
    # A date or relative to the PoC's anchor day (today, +Nd, +Nw: tasks/data/plan_dates.py).
    start: PlanDate
    weeks: int = Field(gt=0, le=MAX_WINDOW_WEEKS, description="weeks of sampling, ≤ 104")
    # How the test nodes are sampled: nvml (GPU nodes), procfs (CPU data, labelled so),
    # prometheus (a site's existing exporter).
    sampler: Literal["nvml", "procfs", "prometheus"] = "procfs"
    span_s: float = Field(
        default=3600, gt=0, le=MAX_SAMPLE_SPAN_S, description="one sampler run, ≤ a day"
    )
    interval_s: float = Field(
        default=10, ge=MIN_SAMPLE_INTERVAL_S, le=3600, description="between samples, 0.1..3600"
    )
    prometheus: PrometheusSource | None = None
    schedules: Schedules = Field(default_factory=Schedules)

    @model_validator(mode="after")
    def _sampler_source(self) -> Window:
        if self.sampler == "prometheus" and self.prometheus is None:
            raise ValueError("sampler prometheus needs window.prometheus (url, metrics)")
        if self.interval_s > self.span_s:
            raise ValueError("interval_s is longer than span_s: a span would hold no sample")
        return self

    @property
    def end(self) -> dt.date:
        return self.start + dt.timedelta(weeks=self.weeks)


class Exclusion(_Strict):
    """A maintenance window (or any span the plan says is not the workload's to judge): every
    chain's allocation inside it is removed from both arms' utilization alike, and the weekly
    report and the record list it with the GPU-hours it removed."""

    start: AwareDatetime = Field(description="ISO 8601 with a zone, e.g. 2026-12-05T02:00:00Z")
    end: AwareDatetime
    reason: str = Field(min_length=1, max_length=200)

    @model_validator(mode="after")
    def _ordered(self) -> Exclusion:
        if self.end <= self.start:
            raise ValueError(
                f"end {self.end.isoformat()} is not after start {self.start.isoformat()}"
            )
        return self

    @property
    def interval(self) -> tuple[float, float]:
        """(start, end) in POSIX seconds, as the utilization intervals are."""
        return self.start.timestamp(), self.end.timestamp()
