"""Install, opt-in and uninstall of the criu checkpointer: locally (the demo plan's cycle) and
on the real single-node Slurm (SPANK flag, an opted-in job checkpointed and restored beside
one that did not opt in and is left alone), each stage refusing nodes the plan does not name,
and uninstall never deleting what install did not create."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tasks.data.errors import BlastRadiusError
from tasks.data.runctx import make_run_context
from tasks.engine.clock import read_journal
from tasks.exit import install as inst
from tests.support import slurm_cluster
from tests.unit.test_install_criu_cycle import (  # noqa: F401
    _event,
    _latest_checkpoint,
    _sbatch,
    _slurm_plan,
    _snapshot,
    _spec,
    _steps,
    _wait,
    install_env,
    slurm_env,
)

# alone: its uninstall's diff snapshots the whole node
pytestmark = pytest.mark.alone


@pytest.mark.slurm
@pytest.mark.criu
def test_slurm_cycle_opted_in_job_is_checkpointed_and_restored_the_other_left_alone(
    slurm_env, tmp_path: Path
) -> None:
    plan, path = _slurm_plan(tmp_path)
    etc = Path(os.environ["SLURM_CONF"]).parent
    _snapshot(plan, path, "before_install")
    ctx = make_run_context(plan, path, stage="install")
    with pytest.raises(BlastRadiusError):
        inst.install(plan, ctx, nodes=["ckpt-node2"])
    done = inst.install(plan, ctx).nodes["ckpt-node1"]
    prefix = Path(done.prefix)
    hook = etc / "plugstack.conf.d" / "ckpt-poc-slurm-install.conf"
    assert done.hooks == [str(hook)] and hook.is_file()
    assert (prefix / "lib" / "ckpt_poc_spank.so").is_file()
    helptext = subprocess.run(["sbatch", "--help"], capture_output=True, text=True).stdout
    assert "--ckpt-poc" in helptext
    opted = inst.opt_in(plan, ctx)
    assert opted["sbatch_args"] == ["--ckpt-poc"]
    wrapper = prefix / "bin" / "ckpt-poc-job"

    # Both jobs take a notice (USR1, as Slurm's --signal=B:USR1@N, a preemption's or a
    # drain's, sends it): only the one opted in through the SPANK flag dumps on it.
    managed = _spec(tmp_path, "opted", notice={"grace_s": 30})
    plain = _spec(tmp_path, "plain", notice={"grace_s": 30})
    job_m = _sbatch(opted["sbatch_args"], wrapper, managed, tmp_path, "opted")
    job_p = _sbatch([], wrapper, plain, tmp_path, "plain")  # same node, no flag
    root = Path(managed["ckpt_root"])
    _wait("a periodic checkpoint of the opted-in job", lambda: _latest_checkpoint(root))
    subprocess.run(["scancel", "--batch", "--signal=USR1", job_m], check=True)
    dumped = _wait(
        "the opted-in job's notice checkpoint",
        lambda: _event(Path(managed["events"]), "notice_checkpoint"),
    )
    assert dumped.detail["outcome"] == "finished", dumped.detail
    point = _latest_checkpoint(root)
    assert point is not None and point.index == dumped.detail["index"]
    # The dump ended the copy (no --leave-running); the job holds on for its requeue
    # (refused: submitted --no-requeue), so the test ends it.
    subprocess.run(["scancel", job_m], check=True)
    slurm_cluster.wait_state(job_m, {"CANCELLED"}, 60, env=slurm_env)
    held = max(_steps(Path(managed["log"])))
    restore = _spec(tmp_path, "opted", mode="restore", restore_from=str(point.path))
    restore["events"] = str(tmp_path / "opted-restore.events.jsonl")
    job_r = _sbatch(opted["sbatch_args"], wrapper, restore, tmp_path, "opted-restore")
    _wait(
        "the restored job to report new steps",
        lambda: len(_steps(Path(managed["log"]))) > held + 5 and _steps(Path(managed["log"])),
    )
    events = {e.event: e for e in read_journal(Path(restore["events"]))}
    assert events["managed_job"].detail["opted_in"] is True
    assert events["managed_job"].detail["criu"] == str(prefix / "bin" / "criu")
    assert "restored" in events
    first = {e.event for e in read_journal(Path(managed["events"]))}
    assert {"checkpoint_start", "checkpoint_end"} <= first

    # The job that did not opt in ran beside it, plainly: no dump folder, no checkpoint event;
    # its notice is heard and nothing dumped. (It may have started later than the opted-in
    # one: its steps are waited for, not assumed.)
    _wait("the plain job to log steps", lambda: len(_steps(Path(plain["log"]))) > 10)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job_p], check=True)
    _wait("the plain job's notice", lambda: _event(Path(plain["events"]), "notice"))
    assert len(_steps(Path(plain["log"]))) > 10
    plain_events = read_journal(Path(plain["events"]))
    assert plain_events[0].event == "managed_job" and plain_events[0].detail["opted_in"] is False
    assert not any(e.event.startswith(("checkpoint", "restore")) for e in plain_events)
    assert not Path(plain["ckpt_root"]).exists()
    # Even asked to restore, a job that did not opt in is refused.
    job_x = _sbatch([], wrapper, {**restore, "events": str(tmp_path / "x.jsonl")}, tmp_path, "x")
    slurm_cluster.wait_state(job_x, {"FAILED"}, 60, env=slurm_env)
    assert [e.event for e in read_journal(tmp_path / "x.jsonl")] == [
        "managed_job",
        "restore_refused",
    ]
    subprocess.run(["scancel", job_r, job_p], check=True)
    for job in (job_r, job_p):
        slurm_cluster.wait_state(job, {"CANCELLED"}, 60, env=slurm_env)

    with pytest.raises(BlastRadiusError):
        inst.uninstall(plan, ctx, nodes=["ckpt-node2"])
    result = inst.uninstall(plan, ctx)
    assert result.nodes["ckpt-node1"].rc == 0, result
    assert not hook.exists() and not prefix.exists()
    helptext = subprocess.run(["sbatch", "--help"], capture_output=True, text=True).stdout
    assert "--ckpt-poc" not in helptext
    ctx.commit()

    from tasks.exit.exit_diff import exit_diff

    _snapshot(plan, path, "after_uninstall")
    diff_ctx = make_run_context(plan, path, stage="exit_diff")
    diff = exit_diff(plan, diff_ctx, "before_install", "after_uninstall")
    assert diff.verdict == "clean", diff.leftovers
