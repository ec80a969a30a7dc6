"""The run context and the run's journal.

A stage's run is opened with ``with open_run(plan, plan_path, stage) as ctx:``; ``ctx`` is built
once, passed explicitly and stamped on every row the run writes, and the journal closes the run
whatever happens (the Chaos Toolkit journal pattern: completed in ``finally``). No stage commits
by hand.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.data.errors import CkptPocError
from tasks.data.fingerprint import Fingerprint, collect_fingerprint
from tasks.data.plan import Plan, plan_hash
from tasks.data.plan_dates import fix_plan_dates
from tasks.data.row_types import RunStamp
from tasks.data.runs import (
    RunStatus,
    clean_stale_tmp,
    commit_run,
    forget_if_empty,
    mark_live,
)


@dataclass
class RunEnd:
    """How the run says it ended, read by its journal when the run's block ends normally."""

    outcome: str = "complete"
    status: RunStatus | None = None


REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class RunContext:
    poc: str
    run_id: str
    plan_path: str
    plan_hash: str
    git_sha: str
    data_dir: Path
    started_at: dt.datetime
    fingerprint: Fingerprint
    stage: str = "unknown"
    # The plan's dates as the PoC fixed them (anchor, resolved dates, forms): in the commit.
    plan_dates: dict[str, Any] = field(default_factory=dict)
    # Mutable on purpose: the stage's code says how it ended; open_run writes it down.
    end: RunEnd = field(default_factory=RunEnd, compare=False)

    def ends_as(self, outcome: str, status: RunStatus | None = None) -> None:
        """The outcome the journal commits if the run's block ends normally (default
        'complete'): e.g. 'stopped early', 'partial: [...]', 'exit verdict: clean'."""
        self.end.outcome, self.end.status = outcome, status

    @property
    def file_metadata(self) -> dict[str, str]:
        """Stored in every parquet file this run writes."""
        return {
            "ckpt_poc.plan_path": self.plan_path,
            "ckpt_poc.plan_hash": self.plan_hash,
            "ckpt_poc.git_sha": self.git_sha,
            "ckpt_poc.started_at": self.started_at.isoformat(),
        }

    def stamp(self) -> RunStamp:
        """The columns every row of this run carries, spread into its rows."""
        return {"poc": self.poc, "run_id": self.run_id, **self.fingerprint}

    def commit(self, outcome: str = "complete", status: RunStatus | None = None) -> Path:
        """Make the run's rows visible to readers, once they are complete and gated
        (tasks.data.runs). Stages do not call this: open_run does, last."""
        return commit_run(
            self.data_dir,
            self.poc,
            self.run_id,
            self.stage,
            outcome,
            status,
            self.plan_dates or None,
        )


def current_run_id() -> str:
    """The Prefect flow run id when inside a flow run, else a fresh UUID."""
    try:
        from prefect.runtime import flow_run

        run_id = flow_run.id
    except Exception:
        run_id = None
    return str(run_id) if run_id else str(uuid.uuid4())


def git_sha() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def make_run_context(
    plan: Plan, plan_path: str | Path, run_id: str | None = None, stage: str = "unknown"
) -> RunContext:
    """The run's context. The run is registered as live (its rows stay invisible until it
    commits), and temp files that killed writes left behind are removed. The PoC's first
    run fixes its plan dates' anchor (tasks/data/plan_dates.py)."""
    data_dir = Path(plan.data_dir).resolve()
    dates = fix_plan_dates(plan.dates, data_dir, plan.poc)
    ctx = RunContext(
        poc=plan.poc,
        run_id=run_id or current_run_id(),
        plan_path=str(plan_path),
        plan_hash=plan_hash(plan_path),
        git_sha=git_sha(),
        data_dir=data_dir,
        started_at=dt.datetime.now(dt.UTC),
        fingerprint=collect_fingerprint(),
        stage=stage,
        plan_dates=dates.record(),
    )
    mark_live(ctx.data_dir, ctx.poc, ctx.run_id, stage)
    clean_stale_tmp(ctx.data_dir, ctx.poc)
    return ctx


@contextlib.contextmanager
def open_run(
    plan: Plan,
    plan_path: str | Path,
    stage: str,
    run_id: str | None = None,
    commit_refusals: bool = False,
    commits: bool = True,
) -> Iterator[RunContext]:
    """One run of ``stage``, from its live marker to its commit record. On leaving the block:

    - normally: committed with the outcome the run set (``ctx.ends_as``; default complete);
    - on an error that refuses the run's rows (``refuses_run``: a failed gate, a run stopped
      early), or any CkptPocError with ``commit_refusals`` (a snapshot, an exit diff: the
      record says why there is none): committed as refused, with the error's refusal line;
    - on anything else (a workload that does not start, a bug, a cancelled run): forgotten
      when it wrote nothing; what it wrote stays uncommitted, as a killed run's (`status`
      reports it, `clean` deletes it).

    ``commits=False``: a run that writes files but no dataset rows (the decision record) is
    never committed; its live marker is dropped however it ends.
    """
    ctx = make_run_context(plan, plan_path, run_id=run_id, stage=stage)
    if not commits:
        try:
            yield ctx
        finally:
            forget_if_empty(ctx.data_dir, ctx.poc, ctx.run_id)
        return
    try:
        yield ctx
    except CkptPocError as exc:
        if exc.refuses_run or commit_refusals:
            ctx.commit(exc.refusal(), "refused")
        else:
            forget_if_empty(ctx.data_dir, ctx.poc, ctx.run_id)
        raise
    except BaseException:
        forget_if_empty(ctx.data_dir, ctx.poc, ctx.run_id)
        raise
    ctx.commit(ctx.end.outcome, ctx.end.status)
