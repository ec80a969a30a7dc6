"""The compatibility sweep on a real single-node Slurm with real CRIU: each workload's sweep
a job pinned to the plan's node, the same causes and fidelity as the local sweep.

The training example restores through every cycle with the same result as its reference
run; the TCP holder fails as CRIU fails it locally, with CRIU's own line and the option it
wants. ~30 s here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.data.plan import load_plan
from tasks.data.runctx import open_run
from tasks.experiments.backends.registry import run_sweep
from tasks.experiments.compatibility_result import compatibility_result
from tasks.experiments.compatibility_rows import write_and_gate_compatibility
from tests.integration.test_compatibility import TCP, TRAIN, _plan

pytestmark = [pytest.mark.slurm, pytest.mark.criu]


@pytest.fixture
def slurm_env(slurm_jobs_env: dict[str, str]) -> dict[str, str]:
    return slurm_jobs_env


def test_the_sweep_runs_as_jobs_on_the_node(slurm_env, tmp_path: Path) -> None:
    path = _plan(tmp_path, [TRAIN, TCP])
    local = load_plan(path)
    plan = local.model_copy(
        update={
            "cluster": local.cluster.model_copy(
                update={"kind": "slurm", "nodes": ["ckpt-node1"], "queue": "poc"}
            )
        }
    )
    with open_run(plan, path, "compatibility") as ctx:
        run = run_sweep(plan, ctx)
        files = write_and_gate_compatibility(run, ctx)
    result = compatibility_result(run, ctx, files)
    by = {w.name: w for w in result.workloads}
    assert result.criu_version not in ("", "unknown")

    train = by["digits-train"]
    assert (train.cycles, train.restored, train.fidelity) == (3, 3, "same"), train
    assert [r["moment"] for r in train.cycle_rows] == ["app-checkpoint", "io", "periodic"]

    plain = by["tcp-plain"]
    assert (plain.cycles, plain.restored) == (3, 0), plain
    (cause,) = plain.causes
    assert "Connected TCP socket" in cause.cause and "--tcp-established" in cause.cause

    # Each workload was one job on the node, whose log and result are in the run folder.
    for name in ("digits-train", "tcp-plain"):
        job_dir = run.run_dir / f"sweep-{name}"
        assert (job_dir / "sweep.json").is_file()
    specs = sorted((run.run_dir / "jobs").glob("*-compat-*-sweep.json"))
    assert len(specs) == 2, specs
