"""Drive the real single-node Slurm cluster of ``scripts/slurm-up`` from tests.

Plain functions, no pytest dependency, so that a session fixture can do::

    @pytest.fixture(scope="session")
    def slurm_env():
        return slurm_cluster.ensure_slurm_up()

and tests can submit real jobs with :func:`submit` and wait for their accounting
records with :func:`wait_state`. :func:`submit_job_mix` runs a fixed mix of real
jobs that end in every state the analysis cares about (COMPLETED, FAILED,
TIMEOUT, CANCELLED, NODE_FAIL, two REQUEUED then COMPLETED, and a resubmission
chain) in about 90 s; ``scripts/make-accounting-sample`` uses it to produce
``data/samples/``.

Run as a script (``python3 tests/support/slurm_cluster.py``) it brings the cluster up,
runs the mix and prints the mix records as JSON.

Facts this relies on (see notes/slurm.md): a finished job shows in sacct 1-5 s
after it ends, so everything polls; a job is requeued only after sacct shows it
RUNNING, or the REQUEUED record is lost; a 1-minute time limit ends after 75-90 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SLURM_UP = REPO / "scripts" / "slurm-up"
DEFAULT_SLURM_DIR = REPO / ".run" / "slurm"

# Fields read back from `sacct -X -D -P --noheader` by wait_state (one row per attempt).
SACCT_FIELDS = (
    "JobID",
    "JobIDRaw",
    "JobName",
    "User",
    "Account",
    "State",
    "ExitCode",
    "Submit",
    "Start",
    "End",
    "Elapsed",
    "Timelimit",
    "AllocTRES",
    "NodeList",
)

# States in which a job (attempt) will not change any more.
FINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REQUEUED",
        "REVOKED",
        "TIMEOUT",
    }
)


# Where ensure_slurm_up says slurmrestd listens (when its ports asked for one), and the user
# its tokens are for: any but root (slurmrestd rejects root's) reads all accounting here.
REST_URL_ENV = "CKPT_SLURM_REST_URL"
REST_USER = "nobody"


class SlurmClusterError(RuntimeError):
    """A Slurm command failed or a job did not reach the expected state in time."""


def slurm_dir() -> Path:
    """The cluster directory: ``$CKPT_SLURM_DIR`` or ``<repo>/.run/slurm``."""
    return Path(os.environ.get("CKPT_SLURM_DIR", DEFAULT_SLURM_DIR)).resolve()


def _run(argv: list[str], env: Mapping[str, str], timeout: float = 60.0) -> str:
    proc = subprocess.run(
        argv, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        detail = proc.stderr.strip() or proc.stdout.strip()
        raise SlurmClusterError(f"{' '.join(argv)} exited {proc.returncode}: {detail}")
    return proc.stdout


def ensure_slurm_up(
    directory: Path | None = None, ports: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Start (or find running) the cluster under ``directory``; return an env for its clients.

    ``ports``: scripts/slurm-up's ``CKPT_SLURM_*_PORT`` settings for a first start. The
    returned mapping is a copy of ``os.environ`` with ``SLURM_CONF`` set.
    """
    directory = (directory or slurm_dir()).resolve()
    proc = subprocess.run(
        [str(SLURM_UP), str(directory)],
        env={**os.environ, **(ports or {})},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise SlurmClusterError(
            f"scripts/slurm-up {directory} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}"
        )
    env = dict(os.environ)
    env["SLURM_CONF"] = str(directory / "etc" / "slurm.conf")
    if rest_port := (ports or {}).get("CKPT_SLURM_REST_PORT"):
        env[REST_URL_ENV] = f"http://127.0.0.1:{rest_port}"
    return env


def jwt_token(env: Mapping[str, str], user: str = REST_USER, lifespan_s: int = 600) -> str:
    """A JWT for ``user`` from ``scontrol token`` (slurmrestd refuses root's own)."""
    out = _run(["scontrol", "token", f"lifespan={lifespan_s}", f"username={user}"], env)
    for line in out.splitlines():
        if line.startswith("SLURM_JWT="):
            return line.removeprefix("SLURM_JWT=")
    raise SlurmClusterError("scontrol token printed no SLURM_JWT= line")


def _jobs_dir(env: Mapping[str, str]) -> Path:
    path = Path(env["SLURM_CONF"]).resolve().parents[1] / "jobs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def submit(script_text: str, *args: str, env: Mapping[str, str]) -> str:
    """Submit a batch script (its text, passed on stdin) with ``sbatch --parsable ARGS``.

    Job output goes to ``<cluster dir>/jobs/%x-%j.out`` unless ARGS set ``--output``.
    Returns the job id.
    """
    argv = ["sbatch", "--parsable"]
    if not any(a == "-o" or a.startswith(("--output", "-o")) for a in args):
        argv.append(f"--output={_jobs_dir(env)}/%x-%j.out")
    argv += list(args)
    proc = subprocess.run(
        argv,
        input=script_text,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if proc.returncode != 0:
        raise SlurmClusterError(f"sbatch {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip().split(";", 1)[0]


def sacct_attempts(jobid: str, env: Mapping[str, str]) -> list[dict[str, str]]:
    """Accounting rows of one job, one per attempt (``-X -D``), oldest first."""
    out = _run(
        [
            "sacct",
            "-X",
            "-D",
            "-P",
            "--noheader",
            f"--format={','.join(SACCT_FIELDS)}",
            "-j",
            jobid,
        ],
        env,
    )
    rows = [dict(zip(SACCT_FIELDS, line.split("|"), strict=True)) for line in out.splitlines()]
    rows = [r for r in rows if r["JobIDRaw"] == jobid]
    return sorted(rows, key=lambda r: r["Submit"])


def base_state(state: str) -> str:
    """``"CANCELLED by 0"`` -> ``"CANCELLED"``."""
    return state.split(" ", 1)[0]


def wait_state(
    jobid: str,
    states: Iterable[str],
    timeout: float = 60.0,
    *,
    env: Mapping[str, str],
    attempts: int = 1,
) -> list[dict[str, str]]:
    """Poll sacct until job ``jobid`` has ``attempts`` attempts and the last is in ``states``.

    Returns all attempts' rows (oldest first). Raises SlurmClusterError on timeout,
    or at once when the last attempt reached a different final state.
    """
    wanted = frozenset(states)
    deadline = time.monotonic() + timeout
    rows: list[dict[str, str]] = []
    while True:
        rows = sacct_attempts(jobid, env)
        if len(rows) >= attempts:
            last = base_state(rows[-1]["State"])
            if last in wanted:
                return rows
            if len(rows) == attempts and last in FINAL_STATES:
                raise SlurmClusterError(
                    f"job {jobid} ended {rows[-1]['State']} (exit {rows[-1]['ExitCode']}),"
                    f" expected {sorted(wanted)}"
                )
        if time.monotonic() > deadline:
            seen = [r["State"] for r in rows]
            raise SlurmClusterError(
                f"job {jobid}: no {sorted(wanted)} after {timeout:.0f} s"
                f" (attempts {attempts}, seen {seen})"
            )
        time.sleep(0.5)


def node_name(env: Mapping[str, str]) -> str:
    return _run(["sinfo", "-h", "-o", "%N"], env).split()[0]


def wait_node_idle(env: Mapping[str, str], timeout: float = 60.0) -> None:
    node = node_name(env)
    deadline = time.monotonic() + timeout
    while True:
        # One line per partition the node is in; none while slurmctld does not answer yet.
        state = next(iter(_run(["sinfo", "-h", "-n", node, "-o", "%T"], env).split()), "")
        if state in {"idle", "mixed", "allocated"}:
            return
        if time.monotonic() > deadline:
            raise SlurmClusterError(f"node {node} is {state!r}, not idle, after {timeout:.0f} s")
        time.sleep(0.5)


def jobs_in_queue(env: Mapping[str, str]) -> list[str]:
    return _run(["squeue", "-h", "-o", "%A"], env).split()


def reset(env: Mapping[str, str], timeout: float = 60.0) -> None:
    """Hand the cluster over clean: no job left from an earlier test (cancelled, and waited
    for until squeue no longer lists it) and the node back in service (a test that failed
    while the node was down leaves it down)."""
    left = jobs_in_queue(env)
    if left:
        _run(["scancel", "--full", *left], env)
    deadline = time.monotonic() + timeout
    while left := jobs_in_queue(env):
        if time.monotonic() > deadline:
            raise SlurmClusterError(f"jobs {left} still listed {timeout:.0f} s after scancel")
        time.sleep(0.2)
    node = node_name(env)
    state = next(iter(_run(["sinfo", "-h", "-n", node, "-o", "%T"], env).split()), "")
    if state.startswith(("down", "drain")):
        _run(["scontrol", "update", f"nodename={node}", "state=resume"], env)
    wait_node_idle(env, timeout)


def accounted_jobs(env: Mapping[str, str]) -> list[str]:
    """Every job the cluster's accounting holds (any user, any time)."""
    out = _run(["sacct", "-a", "-X", "-n", "-P", "-S", "2000-01-01", "-o", "JobIDRaw"], env)
    return out.split()


def wait_windowed(job_ids: Iterable[str], env: Mapping[str, str], timeout: float = 60.0) -> None:
    """Wait until a time window of the accounting holds each of ``job_ids``.

    ``sacct -j`` (wait_state) selects a job by id and submit time; a window (``-S``/``-E``,
    as the live baseline and slurmrestd read) selects it by its eligible time
    (as_mysql_jobacct_process.c), a column written by another of slurmctld's messages to
    slurmdbd. A lag there is waited for, not read as a missing job (CI once did).
    """
    wanted = set(job_ids)
    deadline = time.monotonic() + timeout
    while missing := wanted - set(accounted_jobs(env)):
        if time.monotonic() > deadline:
            rows = {
                j: _run(
                    ["sacct", "-X", "-n", "-P", "-j", j, "-o", "State,Submit,Eligible,End"], env
                )
                for j in sorted(missing)
            }
            raise SlurmClusterError(f"jobs not in a window after {timeout:.0f} s: {rows}")
        time.sleep(0.5)


# --- the job mix ------------------------------------------------------------------

_SCRIPT = '#!/bin/bash\necho "job $SLURM_JOB_ID gpus=${{CUDA_VISIBLE_DEVICES:-none}}"\n{body}\n'


def _submit_case(
    env: Mapping[str, str],
    case: str,
    how: str,
    name: str,
    body: str,
    expected_states: list[str],
    *args: str,
    gpus: int = 0,
    chain: str | None = None,
    chain_position: int | None = None,
) -> dict:
    """Submit one job of the mix; return its record (``attempts`` filled by _finish)."""
    gres = [f"--gres=gpu:{gpus}"] if gpus else []
    job_id = submit(_SCRIPT.format(body=body), f"--job-name={name}", *gres, *args, env=env)
    return {
        "case": case,
        "how": how,
        "job_id": job_id,
        "name": name,
        "gpus": gpus,
        "expected_states": expected_states,
        "chain": chain,
        "chain_position": chain_position,
        "attempts": [],
    }


def _finish(record: dict, env: Mapping[str, str], timeout: float = 60.0) -> dict:
    """Wait until the job's attempts end as expected; store their sacct rows."""
    expected = record["expected_states"]
    rows = wait_state(record["job_id"], {expected[-1]}, timeout, env=env, attempts=len(expected))
    observed = [base_state(r["State"]) for r in rows]
    if observed != expected:
        raise SlurmClusterError(
            f"{record['case']} job {record['job_id']}: attempts {observed}, expected {expected}"
        )
    record["attempts"] = rows
    return record


def _run_node_fail(env: Mapping[str, str]) -> dict:
    how = "`scontrol update nodename=N state=down reason=test` while RUNNING, then state=resume"
    rec = _submit_case(
        env, "node_fail", how, "mix-node-fail", "sleep 300", ["NODE_FAIL"], "--no-requeue", gpus=1
    )
    wait_state(rec["job_id"], {"RUNNING"}, 30, env=env)
    node = node_name(env)
    _run(["scontrol", "update", f"nodename={node}", "state=down", "reason=test"], env)
    try:
        return _finish(rec, env, 30)
    finally:
        _run(["scontrol", "update", f"nodename={node}", "state=resume"], env)
        wait_node_idle(env)


def _run_cancelled(env: Mapping[str, str]) -> dict:
    how = "`scancel` 2 s after sacct showed it RUNNING"
    rec = _submit_case(env, "cancelled", how, "mix-cancelled", "sleep 300", ["CANCELLED"])
    wait_state(rec["job_id"], {"RUNNING"}, 30, env=env)
    # Not a wait for anything: the job is to run 2 s (its Elapsed) before it is cancelled,
    # beside the TIMEOUT job that sets the mix's length.
    time.sleep(2)
    _run(["scancel", rec["job_id"]], env)
    return _finish(rec, env)


def _run_requeued(env: Mapping[str, str], case: str, name: str, *args: str, gpus: int = 0) -> dict:
    how = (
        f"`scontrol requeue` 2 s after sacct showed it RUNNING ({' '.join(args) or 'no --time'});"
        " the second attempt (SLURM_RESTART_COUNT=1) sleeps 2 s and completes"
    )
    body = 'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then sleep 2; else sleep 300; fi'
    rec = _submit_case(env, case, how, name, body, ["REQUEUED", "COMPLETED"], *args, gpus=gpus)
    wait_state(rec["job_id"], {"RUNNING"}, 30, env=env)
    time.sleep(2)  # its first attempt runs 2 s (see _run_cancelled)
    _run(["scontrol", "requeue", rec["job_id"]], env)
    return _finish(rec, env, 90)


def _run_chain(env: Mapping[str, str]) -> list[dict]:
    """A resubmission chain: ``train-chain`` fails, then is submitted again and completes."""
    name = "train-chain"
    first = _submit_case(
        env,
        "chain_failed",
        "chain step 0: `exit 1`",
        name,
        "sleep 2\nexit 1",
        ["FAILED"],
        gpus=1,
        chain=name,
        chain_position=0,
    )
    _finish(first, env)
    second = _submit_case(
        env,
        "chain_completed",
        "chain step 1: same name, submitted after step 0 ended",
        name,
        "sleep 3",
        ["COMPLETED"],
        gpus=1,
        chain=name,
        chain_position=1,
    )
    return [first, _finish(second, env)]


def submit_job_mix(env: Mapping[str, str]) -> list[dict]:
    """Run real jobs ending in each state of interest; return one record per job.

    Each record: ``case``, ``how``, ``job_id``, ``name``, ``gpus``, ``expected_states``
    (one per attempt, oldest first), ``chain``/``chain_position`` (resubmission chain
    membership, else None) and ``attempts`` (the sacct rows of :data:`SACCT_FIELDS`,
    one per attempt). Raises SlurmClusterError when a job ends otherwise.

    Order: the NODE_FAIL case runs first and alone (downing the node kills every job
    on it), then the 2-GPU job; then the TIMEOUT job (1 GPU, --time=1, ends after
    75-90 s) is started and the rest run beside it (FAILED, CANCELLED and two REQUEUED,
    with and without --time, in parallel, then the train-chain). Returns when all are
    final and in sacct, by id and in a window.
    """
    records = [_run_node_fail(env)]
    completed = _submit_case(
        env, "completed", "`sleep 2`", "mix-completed", "sleep 2", ["COMPLETED"], gpus=2
    )
    records.append(_finish(completed, env))
    timeout = _submit_case(
        env,
        "timeout",
        "`--time=1`, `sleep 600`",
        "mix-timeout",
        "sleep 600",
        ["TIMEOUT"],
        "--time=1",
        gpus=1,
    )
    failed = _submit_case(env, "failed", "`exit 3`", "mix-failed", "sleep 1\nexit 3", ["FAILED"])
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures: list[Future] = [
            pool.submit(_finish, failed, env),
            pool.submit(_run_cancelled, env),
            pool.submit(_run_requeued, env, "requeued", "mix-requeued", "--time=5", gpus=1),
            # Without a time limit: its REQUEUED row shows Timelimit 365-00:00:00.
            pool.submit(_run_requeued, env, "requeued_nolimit", "mix-requeued-nolimit"),
        ]
        records += [f.result() for f in futures]
    records += _run_chain(env)
    records.append(_finish(timeout, env, 180))
    wait_windowed((r["job_id"] for r in records), env)
    return records


def main() -> int:
    env = ensure_slurm_up()
    started = time.monotonic()
    records = submit_job_mix(env)
    print(json.dumps(records, indent=2))
    print(f"job mix finished in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
