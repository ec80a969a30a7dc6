"""The decision record from constructed datasets on disk: sections, numbers, HTML and PDF."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tasks.poc.record.sections import VERDICT_MEASURES
from tests.unit.test_record import POC, build_poc, context, record  # noqa: F401


def test_paths_verdicts_gates_exit(record: dict[str, Any]) -> None:
    root = record["data_dir"] / POC / "record"
    assert record["html"] == str(root / "decision-record.html")
    assert record["pdf"] == str(root / "decision-record.pdf")
    assert not list(root.glob(".*.tmp"))
    assert set(record["verdicts"]) == set(VERDICT_MEASURES)
    kinds = {v.split(":", 1)[0] for v in record["verdicts"].values()}
    assert kinds <= {"met", "not met", "undecided", "blocked", "no data"}
    # Recovery: managed median 3 s against the demo plan's threshold; goodput gain 0.15.
    assert record["verdicts"]["recovery_s"] in ("met", "not met")
    assert record["verdicts"]["goodput_gain"] != "no data"
    gates = record["gates"]
    assert list(gates) == [
        "no_baseline",
        "different_clocks",
        "synthetic_workload",
        "no_real_interruption",
        "one_run_per_configuration",
        "two_changes_at_once",
    ]
    assert gates["no_baseline"]["passed"], gates["no_baseline"]
    assert gates["different_clocks"]["passed"], gates["different_clocks"]
    assert gates["no_real_interruption"]["passed"], gates["no_real_interruption"]
    assert gates["two_changes_at_once"]["passed"]
    # Two restores of the plan's three fail mistake 5, say which, and hold the cold-start
    # verdict (only it) undecided.
    five = gates["one_run_per_configuration"]
    assert not five["passed"] and "cold_start/managed: 2" in five["reason"]
    assert list(five["holds"]) == ["cold_start_speedup"]
    assert record["verdicts"]["cold_start_speedup"].startswith("undecided: needs 3, has 2")
    assert record["exit"] == "leftovers: 1"


def test_record_flow_on_a_prefect_server(prefect_stack: Any, write_plan: Any) -> None:
    """The flow on a real Prefect server: the files, the verdicts first in the markdown
    artifact, and a link artifact to the HTML, both on the flow run."""
    import subprocess
    import sys

    plan_path = write_plan({"faults": [{"kind": "sigkill"}]})  # build_poc's faults
    data_dir = plan_path.parent / "data"
    build_poc(data_dir)
    code = (
        "import json, sys; from flows.record import record; "
        "r = record(sys.argv[1]).to_json(); "
        "print(json.dumps({k: r[k] for k in ('run_id', 'html', 'pdf')}))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(plan_path)],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PREFECT_API_URL": prefect_stack.api_url},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["html"] == str(data_dir / POC / "record" / "decision-record.html")
    assert Path(out["html"]).is_file() and Path(out["pdf"]).is_file()
    run = prefect_stack.flow_run(out["run_id"])
    assert run["state"]["type"] == "COMPLETED"
    (md,) = prefect_stack.artifacts(out["run_id"], key="decision-record")
    assert md["type"] == "markdown" and md["task_run_id"] is None
    body = md["data"]
    assert body.index("## Verdicts") < body.index("## The six mistakes")
    assert "recovery time: **met**" in body
    (link,) = prefect_stack.artifacts(out["run_id"], key="decision-record-html")
    # Prefect keeps a link artifact as markdown "[text](file:///…/decision-record.html)".
    assert link["task_run_id"] is None
    assert Path(out["html"]).resolve().as_uri() in link["data"]
    # The record writes no dataset rows and leaves no live marker behind.
    assert not list((data_dir / POC / "_live").glob("*.json"))
