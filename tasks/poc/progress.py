"""Where a PoC stands, stage by stage, read from its committed runs and datasets only.

`poc_state(plan, data_dir)` says for each stage, in order, 'done', 'due' (its gate passed:
it can run now) or 'blocked' (with why: the gate before it that has not passed). Nothing is
remembered between calls: a re-run of `poc` (flows/poc.py) and `ckpt-poc status` both start
from what the commit records and the datasets say, so both can be run at any time.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tasks.data.datasets import (
    GATES,
    SAMPLE_GAPS,
    SAMPLES,
    SNAPSHOTS,
    TRIALS,
    dataset_files,
    read_dataset,
)
from tasks.data.errors import CkptPocError
from tasks.data.plan import Plan
from tasks.data.runs import committed_runs
from tasks.window.sample_summary import week_of

# The PoC's stages in the order `poc` runs them (`--until` takes these names).
STAGES: tuple[str, ...] = (
    "plan_check",
    "baseline",
    "before_install",
    "install",
    "opt_in",
    "recovery",
    "overhead",
    "cold_start",
    "window",
    "weekly_report",
    "uninstall",
    "exit_diff",
    "record",
)
# The scheduled deployments of the long window (prefect.yaml): `poc` switches them on.
WINDOW_DEPLOYMENTS: tuple[str, ...] = (
    "sample_window/sample_window",
    "utilization/utilization",
    "weekly_report/weekly_report",
)
ARMS = ("unmanaged", "managed")


def _refused(record: dict[str, Any]) -> bool:
    return str(record.get("outcome", "")).startswith(("refused", "partial"))


def _good_runs(runs: dict[str, dict[str, Any]], stage: str) -> list[dict[str, Any]]:
    """Committed runs of ``stage`` that no gate refused, oldest first."""
    good = [r for r in runs.values() if r.get("stage") == stage and not _refused(r)]
    return sorted(good, key=lambda r: str(r.get("committed_at", "")))


def _last_refusal(runs: dict[str, dict[str, Any]], stage: str) -> str | None:
    refused = [r for r in runs.values() if r.get("stage") == stage and _refused(r)]
    if not refused:
        return None
    return str(max(refused, key=lambda r: str(r.get("committed_at", "")))["outcome"])


def _arms_missing(trials: Any, measure: str, run_ids: set[str]) -> list[str]:
    """The arms without a single ok trial of ``measure`` in the given (unrefused) runs."""
    rows = trials[
        (trials["measure"] == measure)
        & (trials["status"] == "ok")
        & (trials["run_id"].astype(str).isin(run_ids))
    ]
    present = set(rows["arm"].astype(str))
    return [arm for arm in ARMS if arm not in present]


def _record_missing(data_dir: str | Path, poc: str, runs: dict[str, dict[str, Any]]) -> str | None:
    """Why the decision record (flows/record.py: files, no commit) is not done: absent, or
    older than the last committed run (it no longer says what the data says)."""
    html = Path(data_dir) / poc / "record" / "decision-record.html"
    if not html.exists():
        return "no decision record"
    last = max((str(r.get("committed_at", "")) for r in runs.values()), default="")
    written = dt.datetime.fromtimestamp(html.stat().st_mtime, dt.UTC).isoformat()
    if last and written < last:
        return "the decision record is older than the last committed run"
    return None


def failed_gates(data_dir: str | Path, poc: str) -> list[dict[str, Any]]:
    """Gates whose latest check failed (a later passing check of the same gate clears it)."""
    gates = read_dataset(
        GATES,
        data_dir=data_dir,
        poc=poc,
        columns=["run_id", "gate", "dataset", "success", "observed", "checked_at"],
    )
    if gates.empty:
        return []
    latest = gates.sort_values("checked_at").groupby(["gate", "dataset"], observed=True).tail(1)
    failed = latest[~latest["success"].astype(bool)]
    return [
        {
            "gate": str(r.gate),
            "dataset": str(r.dataset),
            "run_id": str(r.run_id),
            "observed": None if r.observed is None else str(r.observed)[:300],
            "checked_at": str(r.checked_at),
        }
        for r in failed.itertuples()
    ]


def window_progress(data_dir: str | Path, poc: str) -> dict[str, Any]:
    """Weeks with committed samples (their week partitions) and the gap seconds on record."""
    weeks = sorted({week_of(f) for f in dataset_files(data_dir, poc, SAMPLES)})
    gaps = read_dataset(SAMPLE_GAPS, data_dir=data_dir, poc=poc, columns=["gap_s"])
    return {
        "weeks_sampled": len(weeks),
        "weeks": weeks,
        "gap_s": float(gaps["gap_s"].astype(float).sum()) if not gaps.empty else 0.0,
        "gap_rows": len(gaps),
    }


def next_scheduled_runs(limit: int = 3) -> dict[str, Any]:
    """The next scheduled runs of the window deployments, when PREFECT_API_URL names a
    reachable API that has them; otherwise why not (never starts a server: status only
    reads)."""
    if not os.environ.get("PREFECT_API_URL"):
        return {"available": False, "why": "no PREFECT_API_URL: scheduled runs not looked up"}
    try:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import (
            DeploymentFilter,
            DeploymentFilterId,
            FlowRunFilter,
            FlowRunFilterState,
            FlowRunFilterStateType,
        )
        from prefect.client.schemas.objects import StateType
        from prefect.client.schemas.sorting import FlowRunSort

        out: dict[str, list[str]] = {}
        with get_client(sync_client=True) as client:
            for name in WINDOW_DEPLOYMENTS:
                try:
                    dep = client.read_deployment_by_name(name)
                except Exception:  # absent on this API: said, not fatal
                    out[name] = []
                    continue
                runs = client.read_flow_runs(
                    deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])),
                    flow_run_filter=FlowRunFilter(
                        state=FlowRunFilterState(
                            type=FlowRunFilterStateType(any_=[StateType.SCHEDULED])
                        )
                    ),
                    sort=FlowRunSort.EXPECTED_START_TIME_ASC,
                    limit=limit,
                )
                out[name] = [str(r.expected_start_time) for r in runs]
    except Exception as exc:  # an unreachable API only loses this optional part
        return {"available": False, "why": f"Prefect API not reachable: {exc}"[:300]}
    return {"available": True, "runs": out}


def poc_state(
    plan: Plan, data_dir: str | Path, scheduled: bool = True, window_weeks: int | None = None
) -> dict[str, Any]:
    """Each stage done / due / blocked (with why), weeks sampled, gap seconds, failed gates
    and (``scheduled``, when an API is configured) the window's next scheduled runs.
    ``window_weeks``: the weeks the window needs, when not the plan's (the demo's short
    window: 1)."""
    poc = plan.poc
    weeks_needed = plan.window.weeks if window_weeks is None else window_weeks
    runs = committed_runs(data_dir, poc)
    trials = read_dataset(
        TRIALS, data_dir=data_dir, poc=poc, columns=["run_id", "measure", "arm", "status"]
    )
    window = window_progress(data_dir, poc)
    stages: dict[str, dict[str, Any]] = {}

    def good(stage: str) -> list[dict[str, Any]]:
        return _good_runs(runs, stage)

    def missing_before_install() -> list[str]:
        # As tasks.exit.snapshots.latest_snapshot picks it (the newest run's per node), but read
        # once, five columns: status answers in well under two seconds.
        snaps = read_dataset(
            SNAPSHOTS,
            data_dir=data_dir,
            poc=poc,
            columns=["run_id", "node", "phase", "partial", "taken_at"],
        )
        snaps = snaps[snaps["phase"] == "before_install"]
        out = []
        for node in plan.cluster.nodes:
            rows = snaps[snaps["node"] == node]
            if rows.empty:
                out.append(f"no before_install snapshot of node {node}")
                continue
            newest = rows.groupby("run_id", observed=True)["taken_at"].max().idxmax()
            if bool(rows[rows["run_id"] == newest]["partial"].any()):
                out.append(f"the before_install snapshot of node {node} is partial")
        return out

    def measured(stage: str) -> str | None:
        """Why ``stage`` (a measure on both arms) is not done, or None when it is."""
        ids = {str(r["run_id"]) for r in good(stage)}
        if not ids:
            refusal = _last_refusal(runs, stage)
            return f"no committed {stage} run" + (f" (last refused: {refusal})" if refusal else "")
        missing = _arms_missing(trials, stage, ids)
        if missing:
            return f"{stage} has no ok trials on the {' and '.join(missing)} arm"
        return None

    def last_at(stage: str) -> str:
        return max((str(r.get("committed_at", "")) for r in good(stage)), default="")

    # Each check returns why the stage is not done (None: done).
    checks: dict[str, Callable[[], str | None]] = {
        # The plan was loaded (validated) to be passed here: its gate has passed.
        "plan_check": lambda: None,
        "baseline": lambda: (
            None
            if good("baseline")
            else "no committed baseline"
            + (f" (last refused: {r})" if (r := _last_refusal(runs, "baseline")) else "")
        ),
        "before_install": lambda: "; ".join(missing_before_install()) or None,
        "install": lambda: None if good("install") else "not installed (no committed install)",
        "opt_in": lambda: None if good("opt_in") else "workload not opted in",
        "recovery": lambda: measured("recovery"),
        "overhead": lambda: measured("overhead"),
        "cold_start": lambda: measured("cold_start"),
        "window": lambda: (
            None
            if window["weeks_sampled"] >= weeks_needed
            else f"window: {window['weeks_sampled']} of {weeks_needed} week(s) sampled"
        ),
        # A report counts once it was built after the last sampler run (it saw every week).
        "weekly_report": lambda: (
            None
            if good("weekly_report")
            and last_at("weekly_report") >= max(last_at("sample_window"), last_at("utilization"))
            else "no weekly report over the whole window"
        ),
        "uninstall": lambda: None if good("uninstall") else "not uninstalled",
        "exit_diff": lambda: (
            None
            if good("exit_diff") and last_at("exit_diff") >= last_at("uninstall")
            else "no exit diff after the uninstall"
        ),
        "record": lambda: _record_missing(data_dir, poc, runs),
    }
    # The gate before each stage: the stage whose result it needs. The window needs only
    # the opt-in (it samples the managed workload); the way out needs the comparisons done
    # first (uninstalling earlier would end them); the record needs the exit diff.
    gate_before = {
        "baseline": "plan_check",
        "before_install": "baseline",
        "install": "before_install",
        "opt_in": "install",
        "recovery": "opt_in",
        "overhead": "recovery",
        "cold_start": "overhead",
        "window": "opt_in",
        "weekly_report": "window",
        "uninstall": "cold_start",
        "exit_diff": "uninstall",
        "record": "exit_diff",
    }
    why_not: dict[str, str | None] = {stage: checks[stage]() for stage in STAGES}
    for stage in STAGES:
        why = why_not[stage]
        if why is None:
            stages[stage] = {"status": "done", "why": None}
            continue
        before = gate_before.get(stage)
        # Install has the gate flows/install.py enforces: a baseline and the before snapshot.
        blockers = [before] if before else []
        if stage == "install":
            blockers = ["baseline", "before_install"]
        if stage == "record":
            blockers = ["weekly_report", "exit_diff"]
        unmet = [b for b in blockers if why_not[b] is not None]
        if unmet:
            stages[stage] = {"status": "blocked", "why": "; ".join(str(why_not[b]) for b in unmet)}
        else:
            stages[stage] = {"status": "due", "why": why}
    exit_runs = good("exit_diff")
    return {
        "poc": poc,
        "stages": stages,
        "weeks_sampled": window["weeks_sampled"],
        "weeks_planned": weeks_needed,
        "weeks": window["weeks"],
        "gap_s": window["gap_s"],
        "gap_rows": window["gap_rows"],
        "failed_gates": failed_gates(data_dir, poc),
        "exit_outcome": str(exit_runs[-1]["outcome"]) if exit_runs else None,
        "scheduled": next_scheduled_runs()
        if scheduled
        else {"available": False, "why": "not asked"},
    }


class GateRefused(CkptPocError):
    """A stage's gate has not passed: `poc` stops there with the gate's message."""


def next_stage(state: dict[str, Any], until: str, ran: list[str]) -> str | None:
    """The stage `poc` runs next, or None when every stage up to ``until`` is done. A
    blocked stage, or one that already ran in this `poc` run and still is not done, is
    refused with why (never a loop, never a stage past a gate)."""
    stage = first_not_done(state)
    if stage is None or STAGES.index(stage) > STAGES.index(until):
        return None
    entry = state["stages"][stage]
    if entry["status"] == "blocked":
        raise GateRefused(f"{stage} refused: {entry['why']}")
    if stage in ran:
        raise GateRefused(f"{stage} ran but is not done: {entry['why']}")
    return stage


def first_not_done(state: dict[str, Any]) -> str | None:
    """The first stage, in order, that is not done (None: the PoC is complete)."""
    return next((s for s in STAGES if state["stages"][s]["status"] != "done"), None)


def state_lines(state: dict[str, Any]) -> list[str]:
    """The stage table and the window's figures as plain lines (the CLI prints them)."""
    lines = []
    for stage in STAGES:
        entry = state["stages"][stage]
        why = f": {entry['why']}" if entry["why"] and entry["status"] != "done" else ""
        lines.append(f"  {stage:<15} {entry['status']}{why}")
    lines.append(
        f"  window: {state['weeks_sampled']} of {state['weeks_planned']} week(s) sampled, "
        f"{state['gap_s']:.0f} s of gaps in {state['gap_rows']} gap row(s)"
    )
    for g in state["failed_gates"]:
        lines.append(f"  gate failed: {g['gate']} on {g['dataset']} (run {g['run_id']})")
    sched = state["scheduled"]
    if sched.get("available"):
        for name, times in sched["runs"].items():
            lines.append(f"  next runs of {name}: {', '.join(times) or 'none scheduled'}")
    return lines
