"""Where a PoC stands, stage by stage, read from its committed runs and datasets only.

`poc_state(plan, data_dir)` says for each stage of the registry (tasks/poc/stages.py), in
order, 'done', 'due' (its gate passed: it can run now) or 'blocked' (with why: the stages it
needs that are not done). Nothing is
remembered between calls: a re-run of `poc` (flows/poc.py) and `ckpt-poc status` both start
from what the commit records and the datasets say, so both can be run at any time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.data.datasets import GATES
from tasks.data.errors import CkptPocError
from tasks.data.jsonform import JsonForm
from tasks.data.plan import Plan
from tasks.data.store import read_dataset
from tasks.poc.evidence import Evidence, WindowProgress
from tasks.poc.record.build import read_decision
from tasks.poc.stages import REGISTRY, STAGE_NAMES, WINDOW_DEPLOYMENTS, stage


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


@dataclass(frozen=True, slots=True)
class ScheduledRuns(JsonForm):
    """The window deployments' next scheduled runs, or why they were not looked up: an
    available one has runs and no why, another a why and no runs (the key absent)."""

    _OMIT_NONE = ("why", "runs")

    available: bool
    why: str | None = None
    runs: dict[str, list[str]] | None = None  # deployment → expected start times


@dataclass(frozen=True, slots=True)
class StageState(JsonForm):
    """One stage: done, due (its gate passed) or blocked, with why when not done."""

    status: str
    why: str | None


@dataclass(frozen=True, slots=True)
class PocState:
    """Where a PoC stands: each stage, the window so far, failed gates, the exit's outcome,
    the latest decision and the next scheduled runs (`status --json` prints ``to_json``)."""

    poc: str
    stages: dict[str, StageState]  # in the registry's order
    window: WindowProgress
    weeks_planned: int
    failed_gates: list[dict[str, Any]]  # rows of the gates dataset
    exit_outcome: str | None
    decision: dict[str, Any] | None  # decision.json as read
    scheduled: ScheduledRuns

    # a dict: the window's progress flattened in among the state's own keys
    def to_json(self) -> dict[str, Any]:
        return {
            "poc": self.poc,
            "stages": {name: s.to_json() for name, s in self.stages.items()},
            "weeks_sampled": self.window.weeks_sampled,
            "weeks_planned": self.weeks_planned,
            "weeks": list(self.window.weeks),
            "gap_s": self.window.gap_s,
            "gap_rows": self.window.gap_rows,
            "failed_gates": self.failed_gates,
            "exit_outcome": self.exit_outcome,
            "decision": self.decision,
            "scheduled": self.scheduled.to_json(),
        }


def next_scheduled_runs(limit: int = 3) -> ScheduledRuns:
    """The next scheduled runs of the window deployments, when PREFECT_API_URL names a
    reachable API that has them; otherwise why not (never starts a server: status only
    reads)."""
    if not os.environ.get("PREFECT_API_URL"):
        return ScheduledRuns(False, "no PREFECT_API_URL: scheduled runs not looked up")
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
        return ScheduledRuns(False, f"Prefect API not reachable: {exc}"[:300])
    return ScheduledRuns(True, runs=out)


def poc_state(
    plan: Plan, data_dir: str | Path, scheduled: bool = True, window_weeks: int | None = None
) -> PocState:
    """Each stage done / due / blocked (with why), weeks sampled, gap seconds, failed gates
    and (``scheduled``, when an API is configured) the window's next scheduled runs.
    ``window_weeks``: the weeks the window needs, when not the plan's (the demo's short
    window: 1)."""
    weeks_needed = plan.window.weeks if window_weeks is None else window_weeks
    evidence = Evidence(plan, Path(data_dir), weeks_needed)
    why_not: dict[str, str | None] = {s.name: s.done(evidence) for s in REGISTRY}
    stages: dict[str, StageState] = {}
    for s in REGISTRY:
        why = why_not[s.name]
        unmet = [n for n in s.needs if why_not[n] is not None]
        if why is None:
            stages[s.name] = StageState("done", None)
        elif unmet:
            stages[s.name] = StageState("blocked", "; ".join(str(why_not[n]) for n in unmet))
        else:
            stages[s.name] = StageState("due", why)
    exit_runs = evidence.good("exit_diff")
    return PocState(
        poc=plan.poc,
        stages=stages,
        window=evidence.window,
        weeks_planned=weeks_needed,
        failed_gates=failed_gates(data_dir, plan.poc),
        exit_outcome=str(exit_runs[-1]["outcome"]) if exit_runs else None,
        decision=read_decision(data_dir, plan.poc),
        scheduled=next_scheduled_runs() if scheduled else ScheduledRuns(False, "not asked"),
    )


def refusal_before(plan: Plan, data_dir: str | Path, name: str) -> str | None:
    """Why ``name``'s gate refuses it now (its needs not done, each with why), or None. The
    stage's flow asks this before it touches a node: the same gate `poc` and `status` show."""
    entry = poc_state(plan, data_dir, scheduled=False).stages[stage(name).name]
    return entry.why if entry.status == "blocked" else None


class GateRefused(CkptPocError):
    """A stage's gate has not passed: `poc` stops there with the gate's message."""


def next_stage(state: PocState, until: str, ran: list[str]) -> str | None:
    """The stage `poc` runs next, or None when every stage up to ``until`` is done. A
    blocked stage, or one that already ran in this `poc` run and still is not done, is
    refused with why (never a loop, never a stage past a gate)."""
    name = first_not_done(state)
    if name is None or STAGE_NAMES.index(name) > STAGE_NAMES.index(until):
        return None
    entry = state.stages[name]
    if entry.status == "blocked":
        raise GateRefused(f"{name} refused: {entry.why}")
    if name in ran:
        raise GateRefused(f"{name} ran but is not done: {entry.why}")
    return name


def first_not_done(state: PocState) -> str | None:
    """The first stage, in order, that is not done (None: the PoC is complete)."""
    return next((s for s in STAGE_NAMES if state.stages[s].status != "done"), None)


def state_lines(state: dict[str, Any]) -> list[str]:
    """The stage table and the window's figures as plain lines (the CLI prints them), from
    the state's JSON form (a flow's result holds it)."""
    lines = []
    for name in STAGE_NAMES:
        entry = state["stages"][name]
        why = f": {entry['why']}" if entry["why"] and entry["status"] != "done" else ""
        lines.append(f"  {name:<15} {entry['status']}{why}")
    lines.append(
        f"  window: {state['weeks_sampled']} of {state['weeks_planned']} week(s) sampled, "
        f"{state['gap_s']:.0f} s of gaps in {state['gap_rows']} gap row(s)"
    )
    dec = state.get("decision")
    lines.append(
        f"  decision: {dec['decision']}: {dec['decision_reason']} (record of "
        f"{dec.get('built_at', '?')}, data to {dec.get('week', '?')})"
        if dec
        else "  decision: none yet (no decision record built)"
    )
    for g in state["failed_gates"]:
        lines.append(f"  gate failed: {g['gate']} on {g['dataset']} (run {g['run_id']})")
    sched = state["scheduled"]
    if sched.get("available"):
        for name, times in sched["runs"].items():
            lines.append(f"  next runs of {name}: {', '.join(times) or 'none scheduled'}")
    return lines
