"""Each real application of plans/range.yaml through 3 checkpoint → kill → restore cycles on
the real CRIU (the compatibility stage's own function, `only=` the one workload), asserting
what was measured: restores k/n, the fidelity verdict, the moments caught. A failure CRIU
has on a real application is asserted as the result it is, never skipped.

The two shipped examples are swept in tests/integration/test_compatibility.py. Times below:
each test alone on this 2-core box with CRIU 4.2 (reference run + managed run + 3 cycles).
"""

from __future__ import annotations

import glob
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tasks.data.plan import load_plan
from tasks.data.runctx import open_run
from tasks.experiments.compatibility import run_compatibility
from tasks.experiments.compatibility_result import WorkloadResult, workload_result
from tests.unit.test_range import RANGE_PLAN, need

pytestmark = pytest.mark.criu

# GROMACS's -v progress ("step N, remaining wall clock time ...") ends each record with "\r":
# the progress probe follows lines ending in "\r" as well as "\n" (tasks/engine/probes.py).


def sweep_one(tmp_path: Path, name: str, drop: str | None = None) -> WorkloadResult:
    """plans/range.yaml as it is (its data in tmp_path), the one workload swept; ``drop``:
    a key of that workload's item left out."""
    data: dict[str, Any] = yaml.safe_load(RANGE_PLAN.read_text())
    data["data_dir"] = str(tmp_path / "data")
    if drop is not None:
        (item,) = [w for w in data["workloads"] if w["name"] == name]
        del item[drop]
    path = tmp_path / "range.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    plan = load_plan(path, check_cluster=False)
    with open_run(plan, path, "compatibility") as ctx:
        run = run_compatibility(plan, ctx, only=[name])
    (sweep,) = run.sweeps
    result = workload_result(sweep)
    # The figures, in the test's output (pytest -s, or on failure).
    print(json.dumps(result.to_json(), indent=1, default=str))
    return result


def assert_restored_faithfully(r: WorkloadResult, cycles: int = 3) -> None:
    assert r.error is None, r.error
    assert (r.cycles, r.restored, r.fidelity) == (cycles, cycles, "same"), (
        r.failures,
        r.fidelity_detail,
        r.notes,
    )
    assert r.image_bytes_median is not None and r.image_bytes_median > 1e6
    assert r.freeze_s_median is not None and r.freeze_s_median > 0


def test_sklearn_training_job_restores_faithfully(tmp_path: Path, criu_binary: str) -> None:
    # ~21 s; image ~124 MB (OpenBLAS threads), freeze ~0.12 s.
    r = sweep_one(tmp_path, "sklearn-mlp")
    assert_restored_faithfully(r)
    assert [c["moment"] for c in r.cycle_rows] == ["app-checkpoint", "io", "periodic"]
    for c in r.cycle_rows:
        assert c["step"] < c["resumed_step"] <= 2000, c


def test_gromacs_restores_faithfully(tmp_path: Path, criu_binary: str) -> None:
    # ~9 s while it fails (~20 s with the probe fixed); image ~3 MB, freeze ~0.014 s.
    need("gmx")
    r = sweep_one(tmp_path, "gromacs-water")
    assert_restored_faithfully(r)
    assert "md.edr: same" in r.fidelity_detail and "md.gro: same" in r.fidelity_detail


def test_lammps_restores_faithfully_with_the_tcp_options(tmp_path: Path, criu_binary: str) -> None:
    # ~19 s; image ~12 MB (lmp and its orted), freeze ~0.06 s.
    need("lmp")
    r = sweep_one(tmp_path, "lammps-melt")
    assert_restored_faithfully(r)
    assert "{log}: same (255 numbers" in r.fidelity_detail  # 51 thermo lines x 5 numbers


def test_lammps_without_the_tcp_options_fails_to_dump_and_says_which_option(
    tmp_path: Path, criu_binary: str
) -> None:
    # ~14 s. lmp is linked to Open MPI: alone it starts an orted and holds a loopback TCP
    # connection to it. CRIU as it comes refuses, and its own error line names the option.
    need("lmp")
    r = sweep_one(tmp_path, "lammps-melt", drop="criu")
    assert r.error is None, r.error
    assert (r.cycles, r.restored) == (3, 0), r.failures
    assert all(c["dump"] == "failed" and c["restore"] == "not tried" for c in r.cycle_rows)
    assert r.fidelity == "not checked"  # an uncut run's files say nothing of a restore
    (group,) = r.causes
    assert "Connected TCP socket" in group.cause and "--tcp-established" in group.cause
    assert all(c["wants_option"] == "--tcp-established" for c in r.cycle_rows)
    assert group.criu_log is not None and Path(group.criu_log).is_file()


def test_open_mpi_two_ranks_restore_faithfully(tmp_path: Path, criu_binary: str) -> None:
    # ~14 s; the whole tree (mpirun, 2 ranks) with the TCP options; image ~13.5 MB. mpirun
    # forwards the ranks' output a line at a time, so here GROMACS's progress ends in "\n".
    need("mpirun", "gmx_mpi")
    before = set(glob.glob("/tmp/ompi.*/*")) | set(glob.glob("/dev/shm/vader_segment.*"))
    try:
        r = sweep_one(tmp_path, "mpi-gromacs")
    finally:
        # What Open MPI leaves on the node: a killed mpirun may leave its session folder
        # (/tmp/ompi.<host>.<uid>/pid.N: seen after one sweep of several); the ranks'
        # shared-memory segments (/dev/shm/vader_segment.*) stay while a dumped copy is
        # down (its restore needs them) and go when the restored run ends. Said, removed.
        left = sorted(set(glob.glob("/tmp/ompi.*/*")) | set(glob.glob("/dev/shm/vader_segment.*")))
        left = [p for p in left if p not in before]
        print("Open MPI left:", left)
        for path in left:
            if Path(path).is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                Path(path).unlink(missing_ok=True)
    assert_restored_faithfully(r)
    assert not [p for p in left if "vader_segment" in p], left


def test_redis_keys_written_before_the_dump_are_read_after_the_restore(
    tmp_path: Path, criu_binary: str
) -> None:
    # ~11 s; 20,000 keys, image ~19 MB, freeze ~0.03 s.
    need("redis-server", "redis-cli")
    r = sweep_one(tmp_path, "redis")
    assert_restored_faithfully(r)
    assert all(c["query"] == "same" for c in r.cycle_rows)
