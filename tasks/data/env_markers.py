"""The environment variables the PoC hands to the processes it starts, each name declared once.

None of these configures the product (tasks/data/settings.py holds what does): the PoC writes
them into a child's environment, and reads them back from a process it started (or from
/proc/<pid>/environ) to know it as its own. Standard library only, and nothing imported: the
reaper (``python -I -S``) and a Slurm job's wrapper read these names too.
"""

from __future__ import annotations

PREFIX = "CKPT_POC_"  # every name here, and every setting's variable, starts with it

# A copy the local cluster starts (LocalCluster.labels): the samplers attribute its CPU and
# GPU use by them, and CRIU restores them with the process.
NODE = "CKPT_POC_NODE"
ARM = "CKPT_POC_ARM"
JOB = "CKPT_POC_JOB"
TRIAL = "CKPT_POC_TRIAL"
WORKLOAD = "CKPT_POC_WORKLOAD"
LABELS = (NODE, ARM, JOB, TRIAL, WORKLOAD)

SPAWN = "CKPT_POC_SPAWN"  # one spawn of one reaper: the harness sets it, the reaper looks for it

# The managed-job wrapper install writes (the PoC it was installed for), and a Slurm job's
# opt-in (the SPANK plugin's --ckpt-poc, or sbatch --export): equal, the job is checkpointed.
WRAPPER_POC = "CKPT_POC_WRAPPER_POC"
MANAGED = "CKPT_POC_MANAGED"
MANIFEST = "CKPT_POC_MANIFEST"  # the node's install manifest, for the plan's exit.uninstall

# CRIU's action script (scripts/criu-action-script) at post-dump: the workload's log whose
# size it writes to HELD_OUT; the tree, checkpoint and size limit of the files it keeps
# beside the images (tasks/engine/checkpointers/open_files.py), and the Python that runs it.
HELD_LOG = "CKPT_POC_HELD_LOG"
HELD_OUT = "CKPT_POC_HELD_OUT"
KEEP_FILES_PID = "CKPT_POC_KEEP_FILES_PID"
KEEP_FILES_DIR = "CKPT_POC_KEEP_FILES_DIR"
KEEP_FILES_LIMIT = "CKPT_POC_KEEP_FILES_LIMIT"
PYTHON = "CKPT_POC_PYTHON"

# What prefect.yaml's `{{ $CKPT_POC_… }}` placeholders take: flows/deploy_settings.py prints
# them from the plan as `export` lines, scripts/prefect-up evals them before `prefect deploy`.
PLAN = "CKPT_POC_PLAN"
SCHEDULES_ACTIVE = "CKPT_POC_SCHEDULES_ACTIVE"
TIMEZONE = "CKPT_POC_TIMEZONE"
CRON_SAMPLE_WINDOW = "CKPT_POC_CRON_SAMPLE_WINDOW"
CRON_UTILIZATION = "CKPT_POC_CRON_UTILIZATION"
CRON_WEEKLY_REPORT = "CKPT_POC_CRON_WEEKLY_REPORT"
RRULE_UNINSTALL = "CKPT_POC_RRULE_UNINSTALL"
