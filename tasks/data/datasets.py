"""Dataset declarations (how one is declared: dataset_spec.py; the store: store.py).

Each dataset is declared once (``DatasetSpec``): its columns with types, bounds and allowed
values, its key, and the timestamp column whose ISO week partitions it. The declaration
produces the pyarrow schema (writer), the pandas dtypes (readers, pandas and Dask) and the
Great Expectations suite (``tasks.data.gates``); ``tests/unit/test_datasets.py`` asserts they agree.
"""

from __future__ import annotations

import pyarrow as pa

from tasks.data.arms import ARMS
from tasks.data.dataset_spec import F64, FIRST_VERSION, I64, TS, Column, DatasetSpec, S
from tasks.data.events import ALL_EVENTS
from tasks.data.fingerprint import FINGERPRINT_COLUMNS
from tasks.data.page_cache import PAGE_CACHE_DROPS, PAGE_CACHE_STATES
from tasks.data.plan import SAMPLE_UNITS, SNAPSHOT_KINDS
from tasks.data.slurm_states import SLURM_STATES

_FP = tuple(
    Column(name, I64 if name in ("fp_cores", "fp_mem_bytes", "fp_gpu_count") else S, False)
    for name in FINGERPRINT_COLUMNS
)
# CRIU's own split of one dump (`--display-stats`), on every dump row whichever stage made it.
DUMP_PHASES = (
    Column("dump_memdump_s", F64, min=0, doc="CRIU's memory dump time: the pages dumped"),
    Column("dump_memwrite_s", F64, min=0, doc="CRIU's memory write time, within memdump"),
    Column("dump_pages_scanned", I64, min=0, doc="memory pages CRIU scanned"),
    Column("dump_pages_written", I64, min=0, doc="memory pages CRIU wrote"),
)
# Where a dump wrote its images, or a restore read them (checkpointer.images_dir), and on
# what file system: a restore reads at that file system's speed.
IMAGES_PLACE = (
    Column("images_dir", S, doc="the checkpoint's folder"),
    Column("images_fs", S, doc="its file system type (/proc/self/mountinfo)"),
)
_RUN = (
    Column("poc", S, False, doc="the plan's poc name"),
    Column("run_id", S, False, doc="the run that wrote the row"),
)

JOBS = DatasetSpec(
    name="jobs",
    doc="One row per parsed sacct row (allocations and steps), identities pseudonymised.",
    key=("cluster", "job_id_raw", "step", "submit", "state"),
    week_from="submit",
    columns=(
        *_RUN,
        Column("cluster", S, False),
        Column("job_id", S, False, doc="as sacct shows it: 123, 123_4, 123+0"),
        Column("job_id_raw", S, False, doc="the numeric id Slurm allocated"),
        Column("array_job_id", S, doc="123 for array task 123_4"),
        Column("array_task_id", S, doc="4 for 123_4"),
        Column("het_job_id", S, doc="123 for het component 123+0"),
        Column("het_offset", I64, min=0),
        Column("step", S, doc="null for an allocation; batch, extern, interactive, 0, 1, …"),
        Column("is_allocation", pa.bool_(), False),
        Column("partition", S),
        Column("user", S, False, doc="pseudonym (HMAC)"),
        Column("account", S, False, doc="pseudonym (HMAC)"),
        Column("job_name", S, False, doc="plain, or a pseudonym when the plan asks"),
        Column("state", S, False, allowed=SLURM_STATES),
        Column("state_raw", S, False),
        Column("exit_code", I64, min=0, max=255),
        Column("exit_signal", I64, min=0, max=255),
        Column("submit", TS),
        Column("start", TS),
        Column("end", TS),
        Column("elapsed_s", I64, False, min=0),
        Column("timelimit_s", I64, min=0, doc="null for UNLIMITED / Partition_Limit"),
        Column("timelimit_raw", S),
        Column("nnodes", I64, False, min=0),
        Column("ncpus", I64, False, min=0),
        Column("gpus", I64, False, min=0),
        Column("mem_bytes", I64, min=0),
        Column("node_list", S),
        Column("source_line", I64, False, min=1, doc="line in the input, for tracing"),
        *_FP,
    ),
)

QUARANTINE = DatasetSpec(
    name="quarantine",
    doc="Input rows that could not be parsed, with the reason; never silently dropped.",
    key=("run_id", "source", "source_line"),
    week_from="read_at",
    columns=(
        *_RUN,
        Column("source", S, False, doc="file path, 'sacct-live' or 'slurmrestd URL'"),
        Column("source_line", I64, False, min=0),
        Column("reason", S, False),
        Column("raw", S, False, doc="the row as read, identities pseudonymised where parsed"),
        Column("read_at", TS, False),
        *_FP,
    ),
)

EXPOSURE = DatasetSpec(
    name="exposure",
    doc="Baseline exposure: totals per final allocation state, and ranked candidate workloads.",
    key=("run_id", "kind", "state", "workload"),
    week_from="computed_at",
    columns=(
        *_RUN,
        Column("kind", S, False, allowed=("state", "candidate")),
        Column("state", S, doc="the final state (kind=state)"),
        Column("workload", S, doc="account/job name pseudonym pair (kind=candidate)"),
        Column("allocations", I64, False, min=0),
        Column("node_hours", F64, False, min=0),
        Column("gpu_hours", F64, False, min=0),
        Column("exposed_gpu_hours", F64, False, min=0),
        Column("timeout_gpu_hours", F64, False, min=0),
        Column("exposed_allocations", I64, False, min=0),
        Column("chains", I64, False, min=0),
        Column("rank", I64, min=1),
        Column("window_start", TS),
        Column("window_end", TS),
        Column("computed_at", TS, False),
        Column("provenance", S, False, allowed=("measured",)),
        *_FP,
    ),
)

GATES = DatasetSpec(
    name="gates",
    doc="Every gate check that ran: which expectation, on what, and whether it held.",
    key=("run_id", "gate", "dataset", "expectation", "column"),
    week_from="checked_at",
    columns=(
        *_RUN,
        Column("gate", S, False),
        Column("dataset", S, False),
        Column("expectation", S, False),
        Column("column", S),
        Column("success", pa.bool_(), False),
        Column("observed", S, doc="what the check saw, as JSON"),
        Column("checked_at", TS, False),
        *_FP,
    ),
)

EVENTS = DatasetSpec(
    name="events",
    doc="Every moment that matters, on one clock: a clock is a pair of event names.",
    key=("run_id", "trial_id", "arm", "event", "t_mono_ns"),
    week_from="t_wall",
    history=(FIRST_VERSION, "2: intended: `event` allows only the names of tasks/data/events.py"),
    columns=(
        *_RUN,
        Column("trial_id", S, False),
        Column("arm", S, False, allowed=ARMS),
        Column("event", S, False, allowed=ALL_EVENTS),
        Column("t_wall", TS, False, doc="UTC wall clock, for people and partitions"),
        Column("t_mono_ns", I64, False, min=0, doc="CLOCK_MONOTONIC ns: durations use this"),
        Column("host", S, False),
        Column("detail", S, doc="JSON: what the event carries (step, bytes, pid, …)"),
        *_FP,
    ),
)

TRIALS = DatasetSpec(
    name="trials",
    doc="One row per trial of an experiment, failed ones included with their reason.",
    key=("run_id", "measure", "trial_id", "arm"),
    week_from="started_at",
    columns=(
        *_RUN,
        Column("measure", S, False, allowed=("recovery", "overhead", "cold_start", "checkpoint")),
        Column("trial_id", S, False),
        Column("arm", S, False, allowed=ARMS),
        Column("fault", S),
        Column("repeat", I64, False, min=0),
        Column("status", S, False, allowed=("ok", "failed")),
        Column("reason", S, doc="why a failed trial failed"),
        Column("started_at", TS, False),
        Column("recovery_s", F64, min=0),
        Column("detection_s", F64, min=0),
        Column("scheduling_s", F64, min=0),
        Column("restore_s", F64, min=0),
        Column(
            "restore",
            S,
            allowed=("ok", "failed"),
            doc="the checkpointer's restore: ok once the restored copy made progress again; "
            "null when none was attempted (an unmanaged trial, a failure before the restore)",
        ),
        Column("warmup_s", F64, min=0),
        Column("includes", S, doc="the components recovery_s covers"),
        Column("work_lost_gpu_h", F64, min=0),
        Column("work_lost_s", F64, min=0, doc="compute time since the recoverable point"),
        Column("steps_lost", I64, min=0),
        Column("recoverable_point", S, allowed=("checkpoint", "app_checkpoint", "start")),
        Column("checkpoint_bytes", I64, min=0),
        Column("gpus", I64, False, min=0),
        Column("gpus_from", S, False, allowed=("allocation", "plan")),
        Column("clock", S, False),
        Column("workload_hash", S, False),
        Column("nodes", S, False),
        Column("detect_latency_ms", F64, min=0, doc="observation latency of `detected`"),
        Column("serving_latency_ms", F64, min=0, doc="observation latency of `serving_again`"),
        Column("job_id", S, doc="the scheduler's id of the interrupted job (Slurm)"),
        Column("recovery_job_id", S, doc="the job that brought it back, linked to job_id"),
        Column("fault_outcome", S, doc="what the scheduler or OS reported for the fault"),
        # a fault with a notice (grace_s): did the managed arm's checkpoint on the notice beat
        # the deadline (none: the arm takes none, as the unmanaged one)
        Column("notice_checkpoint", S, allowed=("finished", "missed", "none")),
        Column("notice_checkpoint_s", F64, min=0, doc="notice dump's seconds (or until cut)"),
        Column("queued_s", F64, min=0, doc="waiting in the queue after a requeue"),
        # overhead: one timed run of the workload
        Column(
            "variant", S, allowed=("steady", "checkpointing"), doc="what an overhead run measures"
        ),
        Column("pair", I64, min=0, doc="the A/B pair an overhead run belongs to"),
        Column("run_s", F64, min=0, doc="first to last progress step of the run"),
        Column("steps", I64, min=0),
        Column("steps_per_s", F64, min=0),
        # cold start: launch (native) or restore start (managed) to ready
        Column("ready_s", F64, min=0),
        Column("restore_gbps", F64, min=0, doc="checkpoint bytes / CRIU restore seconds / 1e9"),
        Column(
            "page_cache",
            S,
            allowed=PAGE_CACHE_STATES,
            doc="before the start was timed: dropped, warm (the plan asked), not_allowed",
        ),
        Column("page_cache_drop", S, allowed=PAGE_CACHE_DROPS, doc="global, or the files read"),
        Column("restore_fork_s", F64, min=0, doc="CRIU's forking time within restore_s"),
        Column("restore_warmup_s", F64, min=0, doc="cold start: restored to ready"),
        # checkpoint: one CRIU dump
        Column("dump_s", F64, min=0),
        Column("freeze_s", F64, min=0, doc="how long CRIU kept the workload frozen"),
        *DUMP_PHASES,
        Column(
            "images_write_gbps",
            F64,
            min=0,
            doc="CRIU's write of the pages to the images: pages written × page / memwrite s",
        ),
        *IMAGES_PLACE,
        Column(
            "raw_read_gbps",
            F64,
            min=0,
            doc="cold start: a plain read of the same images, the cache as the restore found "
            "it (the limit a restore can approach; restore_gbps beside it)",
        ),
        *_FP,
    ),
)

SAMPLE_SOURCES = ("nvml", "procfs", "prometheus", "import")
SAMPLES = DatasetSpec(
    name="samples",
    doc=(
        "The long window: one row per (entity, metric, interval) a sampler read; each row "
        "covers its whole interval [t_from, t_to]. `device` says whose data it is: a CPU row "
        "is never a GPU row, and `metric` keeps a duty cycle apart from SM activity."
    ),
    key=("node", "source", "entity", "metric", "t_to"),
    week_from="t_to",
    columns=(
        *_RUN,
        Column("node", S, False, doc="the plan's test node"),
        Column("source", S, False, allowed=SAMPLE_SOURCES),
        Column(
            "entity",
            S,
            False,
            doc="GPU UUID (nvml), 'host' or 'pid:N' (procfs), a series label (prometheus), "
            "the export's entity (import)",
        ),
        Column("device", S, False, allowed=("gpu", "cpu", "unknown")),
        Column("gpu_uuid", S, doc="the GPU by UUID; the NVML index alone never names a GPU"),
        Column("gpu_index", I64, min=0, doc="NVML ordinal at sampling time, informative only"),
        Column(
            "metric",
            S,
            False,
            doc="gpu_utilization (driver duty cycle), sm_activity, sm_occupancy, "
            "memory_used_bytes, power_w, process_sm_utilization, cpu_utilization, …",
        ),
        Column("unit", S, False, allowed=SAMPLE_UNITS),
        Column("value", F64, False),
        Column("t_from", TS, False, doc="start of the interval the value covers"),
        Column("t_to", TS, False, doc="end of the interval (the read)"),
        Column("points", I64, False, min=1, doc="driver/exporter readings the value averages"),
        Column("pid", I64, min=0, doc="the process a per-process row is about"),
        Column("job_id", S, doc="the scheduler's job (Slurm id) or the local run's copy"),
        Column("arm", S, allowed=ARMS),
        Column("workload", S, doc="the plan's workload name when the sample is a PoC job's"),
        Column("trial_id", S),
        Column(
            "attributed_by",
            S,
            False,
            allowed=("env", "cgroup", "gres", "cuda_visible_devices", "label", "none"),
            doc="how the row was tied to a job; 'none': no PoC job (kept, labelled)",
        ),
        *_FP,
    ),
)

SAMPLE_GAPS = DatasetSpec(
    name="sample_gaps",
    doc="Every stretch of the window that has no samples, with why: gaps are rows, never silent.",
    key=("node", "source", "entity", "metric", "t_from"),
    week_from="t_from",
    columns=(
        *_RUN,
        Column("node", S, False),
        Column("source", S, False, allowed=SAMPLE_SOURCES),
        Column("entity", S, doc="null: the whole node"),
        Column("metric", S, doc="null: every metric"),
        Column("t_from", TS, False),
        Column("t_to", TS, False),
        Column("gap_s", F64, False, min=0),
        Column("reason", S, False),
        Column(
            "detected_by",
            S,
            False,
            allowed=("sampler", "next_run", "import", "prometheus"),
            doc="the run itself, or the next run finding a span no run covered",
        ),
        *_FP,
    ),
)

UTILIZATION = DatasetSpec(
    name="utilization",
    doc=(
        "Job-level utilization per arm, ISO week and workload (docs/design.md §4): the allocation "
        "split into delivered, lost and idle (checkpointing, recovery, other) GPU-hours, "
        "which add up to it exactly; goodput = delivered / allocated (the seed's split), "
        "goodput_job_span = delivered / (allocated + queued) (ml-goodput-measurement's)."
    ),
    key=("run_id", "week", "arm", "workload"),
    week_from="week_start",
    columns=(
        *_RUN,
        Column("week", S, False, doc="ISO week YYYY-Www"),
        Column("week_start", TS, False),
        Column("arm", S, False, allowed=ARMS),
        Column("workload", S, False),
        Column("jobs", I64, False, min=0, doc="attempts (copies) that held an allocation"),
        Column("allocated_gpu_h", F64, False, min=0),
        Column("delivered_gpu_h", F64, False, min=0),
        Column("lost_gpu_h", F64, False, min=0),
        Column("idle_checkpoint_gpu_h", F64, False, min=0, doc="frozen for a checkpoint"),
        Column("idle_recovery_gpu_h", F64, False, min=0, doc="fault → serving again"),
        Column("idle_other_gpu_h", F64, False, min=0, doc="allocated, not progressing"),
        Column("goodput", F64, min=0, max=1, doc="delivered / allocated; null: no allocation"),
        # The job-span reading and the exclusions (tasks/window/chains.py); null: rows before.
        Column("queued_gpu_h", F64, min=0, doc="released between attempts (a requeue's queue)"),
        Column("unfinished_step_gpu_h", F64, min=0, doc="of lost: the step in flight at a fault"),
        Column("excluded_gpu_h", F64, min=0, doc="in the plan's exclusions: in no other column"),
        Column("goodput_job_span", F64, min=0, max=1, doc="delivered / (allocated + queued)"),
        Column("chains", I64, min=0, doc="workload copies and their recoveries in the row"),
        Column("chains_open", I64, min=0, doc="of them, not ended when the row was computed"),
        Column("provisional", pa.bool_(), doc="a chain in the row had not ended: may change"),
        Column("busy_fraction", F64, min=0, doc="mean of the samples over the allocation"),
        Column("busy_metric", S, doc="the sample metric busy_fraction comes from"),
        Column("samples", I64, False, min=0),
        Column("computed_at", TS, False),
        *_FP,
    ),
)

REPORTS = DatasetSpec(
    name="reports",
    doc=(
        "The weekly report: one row per (measure, arm, week), measured or extrapolated "
        "(with its inputs), against the plan's threshold."
    ),
    key=("run_id", "week", "measure", "arm"),
    week_from="week_start",
    columns=(
        *_RUN,
        Column("week", S, False),
        Column("week_start", TS, False),
        Column("measure", S, False),
        Column("arm", S, False, allowed=(*ARMS, "both")),
        Column("n", I64, False, min=0),
        Column("value", F64),
        Column("ci_low", F64),
        Column("ci_high", F64),
        Column("unit", S, False),
        Column("method", S, False, doc="how value and CI were computed"),
        Column("basis", S, False, allowed=("measured", "extrapolated")),
        Column("inputs", S, doc="JSON: the rows and figures an extrapolated value came from"),
        Column("threshold", F64),
        Column(
            "verdict",
            S,
            False,
            allowed=("met", "not met", "undecided", "no data", "blocked", "info"),
            doc="undecided: the CI straddles the threshold (more runs decide)",
        ),
        Column("note", S, doc="why the verdict is what it is"),
        Column(
            "segment", I64, False, min=0, doc="comparability segment; a change point starts one"
        ),
        Column("provisional", pa.bool_(), doc="a chain in the figure had not ended"),
        Column("computed_at", TS, False),
        *_FP,
    ),
)

SNAPSHOTS = DatasetSpec(
    name="snapshots",
    doc=(
        "A node observed at one phase (before_install, after_install, after_uninstall, or "
        "any name): one row per item. A snapshot that could not read something says so in a "
        "row of kind 'error' and is marked partial: it is never diffed as if whole."
    ),
    key=("run_id", "node", "phase", "kind", "key"),
    week_from="taken_at",
    columns=(
        *_RUN,
        Column("node", S, False),
        Column("phase", S, False),
        Column("kind", S, False, allowed=(*SNAPSHOT_KINDS, "error", "excluded")),
        Column("key", S, False, doc="what the item is: a path, a package, a unit, a sysctl"),
        Column("value", S, doc="what it is like: a hash, a version, a state (JSON if several)"),
        Column("partial", pa.bool_(), False, doc="the snapshot missed something (see 'error')"),
        Column("taken_at", TS, False),
        *_FP,
    ),
)

EXIT_DIFF = DatasetSpec(
    name="exit_diff",
    doc=(
        "What differs between two snapshots of a node that the plan does not allow, each "
        "attributed: the PoC's and the unexplained ones are leftovers; the node's own are "
        "listed, never counted."
    ),
    key=("run_id", "node", "kind", "key"),
    week_from="diffed_at",
    columns=(
        *_RUN,
        Column("node", S, False),
        Column("from_phase", S, False),
        Column("to_phase", S, False),
        Column("kind", S, False, allowed=SNAPSHOT_KINDS),
        Column("key", S, False, doc="a process as its executable and argv hash, never argv"),
        Column("change", S, False, allowed=("added", "removed", "changed")),
        Column("before", S),
        Column("after", S),
        Column(
            "class",
            S,
            allowed=("poc", "node_own", "unexplained"),
            doc="whose the change is (tasks/exit/exit_diff.py); null: written before "
            "attribution, every such row a leftover",
        ),
        Column("reason", S, doc="why it has its class"),
        Column("diffed_at", TS, False),
        *_FP,
    ),
)

EXIT_VERDICTS = DatasetSpec(
    name="exit_verdicts",
    doc=(
        "One row per node and exit diff: the verdict, clean or how many leftovers (the "
        "PoC's and the unexplained items), and how many node-own changes were listed apart."
    ),
    key=("run_id", "node"),
    week_from="diffed_at",
    columns=(
        *_RUN,
        Column("node", S, False),
        Column("from_phase", S, False),
        Column("to_phase", S, False),
        Column("verdict", S, False, allowed=("clean", "leftovers")),
        Column("leftovers", I64, False, min=0, doc="poc_items + unexplained"),
        # Null in rows written before the diff attributed its items.
        Column("poc_items", I64, min=0, doc="leftovers that are the PoC's"),
        Column("unexplained", I64, min=0, doc="leftovers neither the PoC's nor the node's"),
        Column("node_own", I64, min=0, doc="the node's own changes: listed, not leftovers"),
        Column("items_compared", I64, False, min=0),
        Column("diffed_at", TS, False),
        *_FP,
    ),
)

# The compatibility stage (tasks/experiments/compatibility.py): what a cycle and a workload
# may be, declared here for the schema and imported there.
CYCLE_MOMENTS = ("app-checkpoint", "io", "periodic", "steady")
FIDELITY_VERDICTS = ("same", "differs", "not checked")

COMPATIBILITY = DatasetSpec(
    name="compatibility",
    doc=(
        "The range of applications: one row per checkpoint → kill → restore cycle of a "
        "workload, and one per workload (restores k/n with a Wilson 95 % CI, fidelity "
        "against an uninterrupted reference run, or why it could not be tried)."
    ),
    key=("run_id", "workload", "row", "cycle"),
    week_from="started_at",
    columns=(
        *_RUN,
        Column("workload", S, False),
        Column("row", S, False, allowed=("cycle", "workload")),
        Column("cycle", I64, False, min=0, doc="1..n; 0 on the workload's row"),
        Column("started_at", TS, False),
        # a cycle
        Column("moment", S, allowed=CYCLE_MOMENTS, doc="when the dump was aimed"),
        Column("caught", pa.bool_(), doc="the moment seen at the dump (null: not checkable)"),
        Column("target_step", I64, min=0),
        Column("step", I64, min=0, doc="the last step the frozen log held"),
        Column("dump", S, allowed=("ok", "failed")),
        Column("freeze_s", F64, min=0, doc="how long CRIU kept the workload frozen"),
        Column("dump_s", F64, min=0),
        *DUMP_PHASES,
        *IMAGES_PLACE,
        Column("image_bytes", I64, min=0),
        Column("restore", S, allowed=("ok", "failed", "not tried")),
        Column("restore_s", F64, min=0),
        Column("restore_fork_s", F64, min=0, doc="CRIU's forking time within restore_s"),
        Column("resumed_step", I64, min=0, doc="the first step logged after the restore"),
        Column("query", S, allowed=("same", "differs"), doc="a service's query, after/before"),
        Column("cause", S, doc="CRIU's own error line, or what else failed"),
        Column("wants_option", S, doc="the CRIU option its error names"),
        Column("criu_log", S, doc="CRIU's log of the failed dump or restore"),
        # a workload
        Column("cycles", I64, min=0, doc="cycles tried"),
        Column("restored", I64, min=0, doc="cycles restored and resumed"),
        Column("success_rate", F64, min=0, max=1),
        Column("ci_low", F64, min=0, max=1, doc="Wilson 95 % interval of success_rate"),
        Column("ci_high", F64, min=0, max=1),
        Column("fidelity", S, allowed=FIDELITY_VERDICTS),
        Column("fidelity_detail", S, doc="each file's or the query's verdict"),
        Column("error", S, doc="why the workload could not be tried (names the field)"),
        Column("criu_version", S, doc="the checkpointer that did the cycles"),
        *_FP,
    ),
)

# The writer recorder (tasks/exit/writers), committed with the exit diff.
WRITER_SIDES = ("poc", "node", "unresolved")
WRITES = DatasetSpec(
    name="writes",
    doc="Each path changed while the writer recorder ran, per writer (exe, cgroup; no argv).",
    key=("run_id", "node", "path", "writer_exe", "writer_cgroup", "side"),
    week_from="first_at",
    columns=(
        *_RUN,
        Column("node", S, False, doc="the machine the recorder ran on"),
        Column("path", S, False, doc="'(unresolved)/NAME': its folder could not be resolved"),
        Column("writer_exe", S),
        Column("writer_cgroup", S),
        Column("side", S, False, allowed=WRITER_SIDES),
        Column("why", S, False),
        Column("pid", I64, False, min=0, doc="the first writer's pid"),
        Column("first_at", TS, False),
        Column("last_at", TS, False),
        Column("count", I64, False, min=1),
        Column("what", S, False, doc="create, delete, modify, attrib, moved_from, moved_to"),
        *_FP,
    ),
)
WRITE_GAPS = DatasetSpec(
    name="write_gaps",
    doc="Every stretch the writer recorder could not attribute, with why: gaps are rows.",
    key=("run_id", "node", "t_from", "reason"),
    week_from="t_from",
    columns=(
        *_RUN,
        Column("node", S, False),
        Column("t_from", TS, False),
        Column("t_to", TS, doc="null: to the end of the recording"),
        Column("reason", S, False),
        *_FP,
    ),
)

DATASETS: dict[str, DatasetSpec] = {
    d.name: d
    for d in (
        JOBS,
        QUARANTINE,
        EXPOSURE,
        GATES,
        EVENTS,
        TRIALS,
        SAMPLES,
        SAMPLE_GAPS,
        UTILIZATION,
        REPORTS,
        SNAPSHOTS,
        EXIT_DIFF,
        EXIT_VERDICTS,
        COMPATIBILITY,
        WRITES,
        WRITE_GAPS,
    )
}
