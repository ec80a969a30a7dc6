"""Flow logic on Prefect's own test harness: a temporary SQLite-backed server in this
process and no worker, so a flow's states and artifacts are read back without the session's
server (which the deployment tests need: tests/integration/test_prefect_deployment.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from tests.unit.test_record import POC, build_poc


@pytest.fixture(scope="module")
def prefect_harness() -> Iterator[None]:
    from prefect.testing.utilities import prefect_test_harness

    # Its own start-up limit: a loaded 2-core box takes longer than the default 30 s.
    with prefect_test_harness(server_startup_timeout=180):
        yield


def _artifacts(flow_run_id: str) -> dict[str, Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    only_this_run = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(flow_run_id)]))
    with get_client(sync_client=True) as client:
        return {a.key: a for a in client.read_artifacts(artifact_filter=only_this_run)}


def _state(flow_run_id: str) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return str(client.read_flow_run(UUID(flow_run_id)).state_type.value)


def test_the_record_flow_completes_with_its_verdicts_and_its_page(
    prefect_harness: None, write_plan: Any
) -> None:
    from flows.record import record

    plan_path = write_plan({"faults": [{"kind": "sigkill"}]})  # build_poc's faults
    data_dir = plan_path.parent / "data"
    build_poc(data_dir)
    result = record(str(plan_path))
    assert result.record.html == str(data_dir / POC / "record" / "decision-record.html")
    assert _state(result.run_id) == "COMPLETED"
    found = _artifacts(result.run_id)
    assert {"decision-record", "decision-record-html"} <= set(found)
    body = found["decision-record"].data
    assert body.index("## Verdicts") < body.index("## The six mistakes")
    assert Path(result.record.html).resolve().as_uri() in found["decision-record-html"].data


def test_the_weekly_report_flow_gives_its_rows_as_a_table(
    prefect_harness: None, write_plan: Any
) -> None:
    from flows.weekly_report import weekly_report

    plan_path = write_plan({"faults": [{"kind": "sigkill"}]})
    build_poc(plan_path.parent / "data")
    result = weekly_report(str(plan_path))
    assert _state(result.run_id) == "COMPLETED"
    found = _artifacts(result.run_id)
    assert {"weekly-report", "weekly-report-rows", "weekly-report-html"} <= set(found)
    assert found["weekly-report"].data == result.report.markdown
    assert found["weekly-report-rows"].type == "table"
    assert Path(result.report.html).is_file()
