"""The decision record: one HTML and PDF document from the committed datasets."""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.common import run_name
from flows.plan_check import ensure_plan_is_valid
from flows.results import RecordRun
from tasks.data.plan import Plan
from tasks.data.runctx import open_run
from tasks.poc.record import build_record, record_markdown


@task(name="build_record", cache_policy=NO_CACHE)
def build_record_task(plan: Plan, plan_path: str) -> RecordRun:
    # The record writes files, no dataset rows: nothing to commit (its file is its state).
    with open_run(plan, plan_path, "record", commits=False) as ctx:
        built = build_record(plan, ctx)
    return RecordRun(ctx.poc, ctx.run_id, built)


@flow(name="record", flow_run_name=run_name("decision record"))
def record(plan_path: str) -> RecordRun:
    """Every committed dataset → the decision record: the measures against the plan with
    their method, the six mistakes as gates, the baseline, the way out, change points, gaps
    and lineage (``<data_dir>/<poc>/record/decision-record.html`` and ``.pdf``)."""
    plan = ensure_plan_is_valid(plan_path)
    result = build_record_task(plan, plan_path)
    built = result.record
    create_markdown_artifact(
        key="decision-record",
        markdown=record_markdown(built.to_json()),
        description=f"Decision record, data to {built.week}",
    )
    create_link_artifact(
        key="decision-record-html",
        link=Path(built.html).resolve().as_uri(),
        link_text="decision record (HTML, on the worker's disk; the PDF is beside it)",
        description="The decision record",
    )
    return result
