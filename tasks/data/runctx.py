"""The run context: built once per run, passed explicitly, stamped on every row it writes."""

from __future__ import annotations

import datetime as dt
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.data.fingerprint import collect_fingerprint
from tasks.data.plan import Plan, plan_hash
from tasks.data.runs import clean_stale_tmp, commit_run, mark_live

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
    fingerprint: dict[str, Any]
    stage: str = "unknown"

    @property
    def file_metadata(self) -> dict[str, str]:
        """Stored in every parquet file this run writes."""
        return {
            "ckpt_poc.plan_path": self.plan_path,
            "ckpt_poc.plan_hash": self.plan_hash,
            "ckpt_poc.git_sha": self.git_sha,
            "ckpt_poc.started_at": self.started_at.isoformat(),
        }

    def stamp(self) -> dict[str, Any]:
        """The columns every row of this run carries."""
        return {"poc": self.poc, "run_id": self.run_id, **self.fingerprint}

    def commit(self, outcome: str = "complete") -> Path:
        """Make the run's rows visible to readers: call last, once they are complete and
        gated (tasks.data.runs)."""
        return commit_run(self.data_dir, self.poc, self.run_id, self.stage, outcome)


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
    commits), and temp files that killed writes left behind are removed."""
    ctx = RunContext(
        poc=plan.poc,
        run_id=run_id or current_run_id(),
        plan_path=str(plan_path),
        plan_hash=plan_hash(plan_path),
        git_sha=git_sha(),
        data_dir=Path(plan.data_dir).resolve(),
        started_at=dt.datetime.now(dt.UTC),
        fingerprint=collect_fingerprint(),
        stage=stage,
    )
    mark_live(ctx.data_dir, ctx.poc, ctx.run_id, stage)
    clean_stale_tmp(ctx.data_dir, ctx.poc)
    return ctx
