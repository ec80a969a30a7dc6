"""The snapshot collectors' registry: one collector per kind the plan's exit.watch can name."""

from __future__ import annotations

import inspect
from pathlib import Path

from tasks.data.plan import SNAPSHOT_KINDS, Watch
from tasks.exit import snapshots
from tasks.exit.collectors import COLLECTORS, Collector, Observation
from tasks.exit.collectors.processes import COLLECTOR_MODULE


def test_every_kind_has_exactly_one_collector() -> None:
    assert set(COLLECTORS) == set(SNAPSHOT_KINDS)
    for kind, collector in COLLECTORS.items():
        params = list(inspect.signature(collector).parameters)
        assert len(params) == 2, f"{kind}: a collector takes (col, obs), not {params}"


def test_the_srun_job_runs_the_module_the_process_kind_knows_as_ours() -> None:
    # processes/sockets leave out `python -m <COLLECTOR_MODULE> collect`: the srun job's own.
    assert snapshots.__name__ == COLLECTOR_MODULE


def test_a_local_plan_has_no_scheduler_view(tmp_path: Path) -> None:
    col = Collector(tmp_path)
    COLLECTORS["scheduler"](col, Observation(node="n", watch=Watch(kinds=["scheduler"])))
    assert col.rows() == [
        {
            "kind": "excluded",
            "key": "scheduler",
            "value": "a local plan: no scheduler holds a view of the node",
        }
    ]


def test_collect_runs_the_kinds_in_the_order_the_plan_names_them(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (tmp_path / "etc" / "group").write_text("root:x:0:\n")
    rows = snapshots.collect("n", Watch(kinds=["scheduler", "users"]), root=tmp_path)
    assert [r["kind"] for r in rows] == ["excluded", "users", "users"]
