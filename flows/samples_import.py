"""The sample history a site already has (a CSV export) → `samples`, `sample_gaps`,
`quarantine` (tasks.window.sampling.importer), with a short report artifact."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.common import failure_reported_as, run_name
from flows.plan_check import ensure_plan_is_valid
from tasks.data.plan import Plan
from tasks.data.runctx import open_run
from tasks.window.sampling.importer import import_samples

ARTIFACT_KEY = "samples-import"


@dataclass
class SamplesImported:
    summary: dict[str, Any]  # import_samples' summary, exactly
    notes: list[str] = field(default_factory=list)
    file: str = ""
    run_id: str = ""


@task(name="import_samples", cache_policy=NO_CACHE)
def import_samples_task(plan: Plan, plan_path: str, file: str, **options: Any) -> SamplesImported:
    notes: list[str] = []
    # Refused before writing (a missing column, a node outside the plan): no leftover.
    with open_run(plan, plan_path, "samples_import") as ctx:
        summary = import_samples(plan, ctx, file, notes=notes, **options).to_json()
    return SamplesImported(summary, notes, file, ctx.run_id)


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def summary_lines(result: SamplesImported) -> list[str]:
    """The import in a few lines, for the artifact and the CLI."""
    s = result.summary
    interval = "-" if s["interval_s"] is None else f"{s['interval_s']:g} s"
    mean = "-" if s["mean_value"] is None else f"{s['mean_value']:.4g}"
    return [
        f"rows read {s['rows_read']}, imported {s['rows_read'] - s['rows_quarantined']}, "
        f"quarantined {s['rows_quarantined']} (the `quarantine` dataset, by line)",
        f"entities {s['entities']}, median interval {interval}, mean value {mean}",
        f"from {_when(s['first'])} to {_when(s['last'])}",
        f"gaps {s['gaps']} ({s['gap_seconds']:g} s without samples)",
        *result.notes,
    ]


@flow(name="samples_import", flow_run_name=run_name("samples import"))
def samples_import(
    plan_path: str,
    file: str,
    time_column: str,
    value_column: str,
    entity_column: str,
    metric: str | None = None,
    gap_factor: float = 5.0,
    node: str | None = None,
    unit: str = "percent",
    device: str = "unknown",
) -> SamplesImported:
    """A site's CSV export of samples (time, value, entity a line) → `samples` (source
    import), `sample_gaps` and `quarantine`; each row covers [t - interval, t], the
    interval being the entity's median spacing."""
    plan = ensure_plan_is_valid(plan_path)
    with failure_reported_as(ARTIFACT_KEY, "Samples import"):
        result = import_samples_task(
            plan,
            plan_path,
            file,
            time_column=time_column,
            value_column=value_column,
            entity_column=entity_column,
            metric=metric,
            gap_factor=gap_factor,
            node=node,
            unit=unit,
            device=device,
        )
    create_markdown_artifact(
        key=ARTIFACT_KEY,
        markdown="\n".join(
            [f"# Samples imported from `{file}`", ""]
            + [f"- {line}" for line in summary_lines(result)]
        ),
        description="Imported sample history (measured by the site, read from its export)",
    )
    return result
