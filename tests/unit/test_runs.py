"""A killed run is never half visible: readers take committed runs only, `status` reports
what a killed run left, `clean` deletes it (never a committed or a live run), and the next
run removes temp files of killed writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tasks.data.datasets import GATES
from tasks.data.plan import load_plan
from tasks.data.runctx import make_run_context
from tasks.data.runs import clean_uncommitted, status_summary
from tasks.data.store import read_dataset, write_dataset
from tests.support.common import REPO
from tests.unit.test_datasets import _gate_rows

DEMO = REPO / "plans" / "demo.yaml"

# A stage's run in its own process: writes its first file, then works on (and is killed).
WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from tasks.data.datasets import GATES
    from tasks.data.store import write_dataset
    from tasks.data.plan import load_plan
    from tasks.data.runctx import make_run_context
    from tests.unit.test_datasets import _gate_rows

    plan = load_plan(sys.argv[1]).model_copy(update={"data_dir": sys.argv[2]})
    ctx = make_run_context(plan, sys.argv[1], run_id=sys.argv[3], stage="baseline")
    write_dataset(_gate_rows(4, ctx.run_id), GATES, data_dir=ctx.data_dir, poc=ctx.poc,
                  run_id=ctx.run_id)
    if sys.argv[4] == "true":
        ctx.commit()
    print("written", flush=True)
    time.sleep(120)
    """
)


def _start_writer(data_dir: Path, run_id: str, commit: bool) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(DEMO), str(data_dir), run_id, str(commit).lower()],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "written"
    return proc


def _plan(tmp_path: Path, data: Path) -> Path:
    import yaml

    plan = yaml.safe_load(DEMO.read_text())
    plan["data_dir"] = str(data)
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    return path


def test_the_next_run_removes_temp_files_of_killed_writes_only(tmp_path: Path) -> None:
    data = tmp_path / "data"
    plan = load_plan(DEMO).model_copy(update={"data_dir": str(data)})
    week = data / "demo" / "gates" / "week=2026-W49"
    week.mkdir(parents=True)
    old = week / ".r0.parquet.0123abcd.tmp"
    old.write_bytes(b"half a parquet file")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    live = _start_writer(data, "run-live", commit=False)  # a run in progress since now
    try:
        in_flight = week / ".run-live.parquet.4567ef.tmp"  # newer than the live run's start
        in_flight.write_bytes(b"being written")
        ctx = make_run_context(plan, DEMO, stage="recovery")
        assert not old.exists() and in_flight.exists()
        assert ctx.stage == "recovery"
    finally:
        live.kill()
        live.wait(timeout=10)


def test_a_run_of_another_host_is_never_cleaned(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_dataset(_gate_rows(2, "remote"), GATES, data_dir=data, poc="demo", run_id="remote")
    marker = data / "demo" / "_live" / "remote.json"
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"run_id": "remote", "host": "another-node", "pid": 1}))
    assert clean_uncommitted(data, "demo") == []
    assert [r.run_id for r in status_summary(data, "demo").running] == ["remote"]


@pytest.mark.parametrize("outcome", ["complete", "refused: gate 'recovery' failed"])
def test_a_commit_lists_the_runs_files(tmp_path: Path, outcome: str) -> None:
    plan = load_plan(DEMO).model_copy(update={"data_dir": str(tmp_path / "data")})
    ctx = make_run_context(plan, DEMO, stage="overhead")
    files = write_dataset(
        _gate_rows(2, ctx.run_id), GATES, data_dir=ctx.data_dir, poc=ctx.poc, run_id=ctx.run_id
    )
    record = json.loads(ctx.commit(outcome).read_text())
    assert record["outcome"] == outcome and record["stage"] == "overhead"
    assert record["files"] == [str(f.relative_to(ctx.data_dir / ctx.poc)) for f in files]
    assert not (ctx.data_dir / ctx.poc / "_live" / f"{ctx.run_id}.json").exists()


def test_the_readme_recipe_reads_committed_runs_only(tmp_path: Path) -> None:
    """The pandas and DuckDB recipe in the README, run as written, on a committed and an
    uncommitted run."""
    import re

    from tasks.data.datasets import TRIALS

    readme = (REPO / "README.md").read_text()
    recipe = re.search(
        r"without this package \(pandas or DuckDB.*?```python\n(.*?)```", readme, re.S
    )
    assert recipe, "the README lost its reading recipe"
    data = tmp_path / "data"
    plan = load_plan(DEMO).model_copy(update={"data_dir": str(data)})
    trials = _trial_rows(plan)
    for run_id, commit in (("run-done", True), ("run-killed", False)):
        ctx = make_run_context(plan, DEMO, run_id=run_id, stage="recovery")
        rows = trials.assign(run_id=run_id)
        write_dataset(rows, TRIALS, data_dir=data, poc="demo", run_id=run_id)
        if commit:
            ctx.commit()
    scope: dict = {"DATA": str(data / "demo")}
    exec(recipe.group(1), scope)  # the README's own code, on test data
    assert set(scope["trials"]["run_id"]) == {"run-done"}
    assert set(scope["trials_db"]["run_id"]) == {"run-done"}
    assert len(scope["trials"]) == len(read_dataset(TRIALS, data_dir=data, poc="demo"))


def _trial_rows(plan):
    import datetime as dt

    import pandas as pd

    from tasks.data.datasets import TRIALS
    from tasks.data.fingerprint import collect_fingerprint

    row = {c: None for c in TRIALS.column_names}
    row.update(
        poc="demo",
        measure="recovery",
        trial_id="sigkill-0",
        arm="managed",
        status="ok",
        repeat=0,
        gpus=1,
        gpus_from="plan",
        clock="fault_injected→serving_again",
        workload_hash="abc",
        nodes="local-a",
        started_at=dt.datetime(2026, 11, 30, 12, tzinfo=dt.UTC),
        **collect_fingerprint(),
    )
    return pd.DataFrame([row, {**row, "arm": "unmanaged"}])
