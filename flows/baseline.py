"""Stage 1: the baseline from the scheduler's accounting history (before anything installs)."""

from __future__ import annotations

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.common import run_name
from flows.plan_check import ensure_plan_is_valid
from tasks.baseline.run import BaselineResult, run_baseline
from tasks.baseline.time_formats import parse_dumped_on
from tasks.data.plan import Plan
from tasks.data.runctx import open_run
from tasks.experiments.report import baseline_markdown, exposure_rows


@task(name="measure_exposure", cache_policy=NO_CACHE)
def measure_exposure(
    plan: Plan,
    plan_path: str,
    sacct_file: str | None,
    live: bool,
    use_dask: bool | None,
    delimiter: str | None,
    sacct_format: str | None = None,
    dumped_on: str | None = None,
) -> BaselineResult:
    # Committed once jobs, quarantine, exposure and gates are all written; a failed gate
    # commits it as refused (its gate rows are the record).
    with open_run(plan, plan_path, "baseline") as ctx:
        return run_baseline(
            plan,
            ctx,
            sacct_file=sacct_file,
            live=live,
            use_dask=use_dask,
            delimiter=delimiter.encode() if delimiter else None,
            sacct_format=sacct_format,
            dumped_on=parse_dumped_on(dumped_on),
        )


def publish_exposure(result: BaselineResult) -> None:
    """Called from the flow body, so the artifacts hang off the flow run (a task's would
    hang off its task run and the flow run's Artifacts tab would be empty)."""
    create_table_artifact(
        key="baseline-exposure",
        table=exposure_rows(result),
        description="Exposure per final allocation state (measured)",
    )
    create_markdown_artifact(
        key="baseline-summary",
        markdown=baseline_markdown(result),
        description="Baseline exposure, candidates and limitations",
    )


@flow(name="baseline", flow_run_name=run_name("baseline"))
def baseline(
    plan_path: str,
    sacct_file: str | None = None,
    live: bool = False,
    use_dask: bool | None = None,
    delimiter: str | None = None,
    sacct_format: str | None = None,
    dumped_on: str | None = None,
) -> BaselineResult:
    """Accounting history → validated `jobs`, `exposure`, `quarantine` datasets and a summary.

    ``delimiter``: the dump's, when its header does not show it; ``sacct_format``: the
    fields a header-less dump was taken with (sacct's --format syntax, e.g. JobID,State);
    ``dumped_on``: the day (YYYY-MM-DD, UTC) sacct wrote a dump with relative times, where the
    file's mtime is not it.
    """
    plan = ensure_plan_is_valid(plan_path)
    parse_dumped_on(dumped_on)  # a bad date is refused before anything is read
    result = measure_exposure(
        plan, plan_path, sacct_file, live, use_dask, delimiter, sacct_format, dumped_on
    )
    publish_exposure(result)
    return result
