"""The weekly sample summary: known answers, and the in-memory and Dask paths row for row,
Dask locally and on a real dask-jobqueue SLURMCluster whose worker is a Slurm job."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import dask
import pandas as pd
import pytest

from tasks.window.sample_summary import (
    weekly_sample_summary,
    weekly_sample_summary_dask,
)
from tests.support.common import REPO
from tests.unit.test_sample_summary import MON, _assert_same, _squeue, synth  # noqa: F401


@pytest.mark.parametrize("scheduler", ["synchronous", "threads"])
def test_memory_and_dask_local_agree(synth: list[str], scheduler: str) -> None:
    ours = weekly_sample_summary(synth)
    with dask.config.set(scheduler=scheduler):
        theirs = weekly_sample_summary_dask(synth)
    _assert_same(ours, theirs)
    assert ours["n"].sum() == sum(pd.read_parquet(f, columns=["value"]).shape[0] for f in synth)


@pytest.mark.slurm
def test_memory_and_slurmcluster_agree(
    synth: list[str], slurm_env: dict[str, str], tmp_path: Path, monkeypatch
) -> None:
    from dask.distributed import Client
    from dask_jobqueue import SLURMCluster

    # sbatch/squeue/scancel, run by dask-jobqueue from this process, address the test cluster.
    monkeypatch.setenv("SLURM_CONF", slurm_env["SLURM_CONF"])
    name = f"summary-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    cluster = None
    try:
        cluster = SLURMCluster(
            queue="poc",  # scripts/slurm-up's partition (8 CPUs, 4096 MB)
            cores=1,
            processes=1,
            memory="1GiB",
            walltime="00:10:00",
            job_name=name,
            python=sys.executable,  # the project's interpreter: it imports tasks.*
            interface="lo",  # scheduler and worker on loopback: the node is this host
            job_script_prologue=[
                f"export SLURM_CONF={slurm_env['SLURM_CONF']}",
                f"cd {REPO}",
            ],
            log_directory=str(tmp_path / "worker-logs"),
            local_directory=str(tmp_path / "worker-space"),
            death_timeout=60,
        )
        cluster.scale(1)
        with Client(cluster) as client:
            client.wait_for_workers(1, timeout=180)
            (worker,) = client.scheduler_info()["workers"].values()
            assert worker["host"] == "127.0.0.1"
            assert _squeue(name, slurm_env), "no Slurm job runs the worker"
            theirs = weekly_sample_summary_dask(synth, client=client)
            # The only worker, the one that computed it, is a Slurm job's process.
            job_ids = client.run(lambda: os.environ.get("SLURM_JOB_ID"))
            assert len(job_ids) == 1 and all(job_ids.values()), job_ids
        _assert_same(weekly_sample_summary(synth), theirs)
    finally:
        if cluster is not None:
            cluster.close()
        for job in _squeue(name, slurm_env):
            subprocess.run(["scancel", job], env=slurm_env, check=False)
        print(f"SLURMCluster test took {time.monotonic() - started:.1f}s")
    deadline = time.monotonic() + 30
    while _squeue(name, slurm_env) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _squeue(name, slurm_env), "a worker job outlived the cluster"
