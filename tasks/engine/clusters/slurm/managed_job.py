"""The managed-job wrapper install puts on a node: `<prefix>/bin/ckpt-poc-job SPEC.json`.

It is tasks/engine/clusters/slurm/job.py with one rule in front: CRIU checkpoints a job only
when the job
opted in, i.e. its environment has ``CKPT_POC_MANAGED`` equal to the PoC the wrapper was
installed for (``CKPT_POC_WRAPPER_POC``, written into the wrapper by install). The variable
comes from the SPANK plugin's ``--ckpt-poc`` flag or from ``sbatch
--export=ALL,CKPT_POC_MANAGED=<poc>``. A job that did not opt in runs its workload plainly:
no checkpoint folder, no dump, no checkpoint event (whatever its spec asks), and it cannot
restore. The first event, `managed_job`, says which it was.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tasks.data import env_markers, settings_bare
from tasks.data.events import Ev
from tasks.engine.clock import EventRecorder

WRAPPER_POC_ENV = env_markers.WRAPPER_POC
OPT_IN_ENV = env_markers.MANAGED


def opted_in(env: dict[str, str] | None = None) -> bool:
    env = dict(os.environ) if env is None else env
    poc = env.get(WRAPPER_POC_ENV, "")
    return bool(poc) and env.get(OPT_IN_ENV) == poc


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: ckpt-poc-job SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(args[0]).read_text())
    managed = opted_in()
    recorder = EventRecorder(None, jsonl=Path(spec["events"]))
    recorder.record(
        spec["trial_id"],
        spec["arm"],
        Ev.MANAGED_JOB,
        poc=os.environ.get(WRAPPER_POC_ENV, ""),
        opted_in=managed,
        job_id=os.environ.get("SLURM_JOB_ID"),
        criu=settings_bare.criu(),
    )
    if spec["mode"] == "restore" and not managed:
        recorder.record(spec["trial_id"], spec["arm"], Ev.RESTORE_REFUSED, reason="not opted in")
        return 72
    from tasks.engine.clusters.slurm.job import (
        run,  # CRIU and the workload machinery, only past the gate
    )

    return run({**spec, "checkpoint": managed})


if __name__ == "__main__":
    sys.exit(main())
