"""The PoC plan: the four things on paper (workload, baseline, success, exit) plus where it runs.

A plan is a YAML file validated by the pydantic models below. ``load_plan`` reads it and
``ensure_plan_is_valid`` raises ``PlanError`` listing *every* problem with its field path and
YAML line, so a platform engineer fixes the whole file in one pass. The YAML itself is read
strictly too (tasks/data/plan_yaml.py): a repeated key is an error naming both lines, a syntax
error is one line ``file:line:col``; every number is finite and bounded, and a Slurm plan's
nodes are checked with ``sinfo`` when the cluster answers (tasks/data/plan_cluster.py).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import shutil
import urllib.parse
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from tasks.data.errors import PlanError
from tasks.data.measures import CRITERIA, DECISION_CRITERIA
from tasks.data.plan_cluster import check_slurm_nodes
from tasks.data.plan_cold_start import MAX_RUNS, ColdStart, cold_start_warnings
from tasks.data.plan_dates import ANCHOR, PlanDate, PlanDates, anchor_for, dates_of

# The fault kinds, one model each (tasks/data/plan_faults.py): re-exported from here.
from tasks.data.plan_faults import (  # noqa: F401
    ALL_FAULTS,
    FAULTS_BY_CLUSTER,
    MAX_GRACE_S,
    MAX_SECONDS,
    MAX_WARN_S,
    NOTICE_FAULTS,
    ClusterKindName,
    Fault,
    FaultItem,
    fault_problems,
    grace_of,
    parse_fault,
    warn_of,
)
from tasks.data.plan_gpu import gpu_plan_problems
from tasks.data.plan_preempt import preemptor_problems
from tasks.data.plan_short_forms import OneOrList
from tasks.data.plan_sizes import size_problems

# What a node snapshot observes (exit.watch, exit.allowed_changes): re-exported from here.
from tasks.data.plan_watch import (  # noqa: F401
    DEFAULT_NAMES_ONLY,
    DEFAULT_WATCHED_PATHS,
    SNAPSHOT_KINDS,
    AllowedChange,
    SnapshotKind,
    Watch,
    control_node_problems,
)

# The workload models (tasks/data/plan_workload.py): re-exported from here.
# The sampling window and the exclusions (tasks/data/plan_window.py): re-exported from here.
from tasks.data.plan_window import (  # noqa: F401
    MAX_EXCLUSIONS,
    MAX_SAMPLE_SPAN_S,
    MAX_WINDOW_WEEKS,
    MIN_SAMPLE_INTERVAL_S,
    SAMPLE_UNITS,
    Exclusion,
    PrometheusMetric,
    PrometheusSource,
    SampleUnit,
    Schedules,
    Window,
)
from tasks.data.plan_workload import (  # noqa: F401
    CRIU_DUMP_OPTIONS,
    CRIU_RESTORE_OPTIONS,
    MAX_GPUS,
    MAX_STEPS,
    MAX_WORKLOADS,
    SAFE_NAME,
    WORKDIR,
    AppCheckpoint,
    Compatibility,
    CriuOptions,
    Fidelity,
    FidelityFile,
    Numbers,
    ProgressProbe,
    ReadyProbe,
    SafeName,
    Workload,
    without_alias_repeats,
    workloads_problems,
)
from tasks.data.plan_yaml import (
    DuplicateKeysError,
    duplicate_key_problems,
    file_line,
    parse_yaml,
    validation_problems,
    yaml_error_line,
)

log = logging.getLogger(__name__)

# Relative paths in exit.uninstall (the demo's scripts/uninstall-criu) resolve against the repo.
REPO_ROOT = Path(__file__).resolve().parents[2]

# Weeks of weekly utilization samples a verdict on utilization gain needs at the least.
MIN_UTILIZATION_WEEKS = 4

# Upper bounds no real PoC needs. Every number in a plan ends up in a sleep, a timer, a loop
# count or a comparison; `.inf`, `.nan` or 1e300 there makes a thread die (OverflowError) or a
# loop never end long after `plan check` said yes, so they are refused up front instead.
MAX_DAYS = 3650  # ten years of accounting history
MAX_KEPT_CHECKPOINTS = 1000
# A success threshold is seconds, GPU-hours, percent, a fraction or a factor: a million of
# any of them is no agreed number.
MAX_THRESHOLD = 1e6


class _Strict(BaseModel):
    # allow_inf_nan=False: every float in a plan must be finite (`.inf`/`.nan` are refused
    # with the field's name); each numeric field also has an explicit upper bound above.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class SacctFileSource(_Strict):
    kind: Literal["sacct-file"]
    path: str


class SacctLiveSource(_Strict):
    kind: Literal["sacct-live"]
    clusters: list[SafeName] = Field(default_factory=list)


def _check_rest_url(value: str) -> str:
    parts = urllib.parse.urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL with a host (e.g. http://host:6820)")
    if parts.username or parts.password or parts.query or parts.fragment:
        # A token belongs in a Secret block (token_secret), never in the plan.
        raise ValueError("the URL must not carry credentials, a query or a fragment")
    return value.rstrip("/")


class SlurmrestdSource(_Strict):
    """Accounting from slurmrestd's ``/slurmdb/v0.0.NN/jobs``, with a JWT from a Secret block."""

    kind: Literal["slurmrestd"]
    url: Annotated[str, AfterValidator(_check_rest_url)]
    # Name of a Prefect Secret block holding the JWT (`scontrol token`); never the token.
    token_secret: SafeName
    user: SafeName | None = Field(default=None, description="X-SLURM-USER-NAME")
    timeout_s: float = Field(default=120, gt=0, le=3600, description="per request, ≤ 3600 s")
    window_days: int = Field(
        default=1, ge=1, le=MAX_DAYS, description="days of history per request (paging), ≤ 3650"
    )


class Baseline(_Strict):
    source: Annotated[
        SacctFileSource | SacctLiveSource | SlurmrestdSource, Field(discriminator="kind")
    ]
    days: int = Field(gt=0, le=MAX_DAYS, description="days of accounting history, ≤ 3650")
    same_node_runs: int = Field(ge=1, le=MAX_RUNS, description="runs on the test nodes, ≤ 10000")
    # Also pseudonymise job names (user and account always are).
    pseudonymise_job_names: bool = False
    # Name of a Prefect Secret block holding the HMAC key; the key itself is never in a plan.
    pseudonym_key_secret: str | None = None
    max_quarantined_share: float = Field(
        default=0.5,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description=(
            "the largest share (0..1) of accounting rows the baseline may quarantine "
            "before its gate fails"
        ),
    )


Statistic = Literal["median", "p90", "mean", "min", "max"]


class Criterion(_Strict):
    """One success number: ``statistic(measure) op threshold``."""

    statistic: Statistic
    threshold: float = Field(
        ge=-MAX_THRESHOLD, le=MAX_THRESHOLD, description="finite, |threshold| ≤ 10⁶"
    )


class UtilizationCriterion(Criterion):
    min_weeks: int = Field(default=MIN_UTILIZATION_WEEKS, ge=1, le=MAX_WINDOW_WEEKS)


class RestoreCriterion(_Strict):
    """Restores that succeeded out of those attempted (compatibility cycles, managed recovery
    and cold-start trials), judged by the Wilson 95 % interval of the latest checkpointer
    version: met when its lower bound is ≥ threshold, not met when its upper bound is below."""

    # Only the CI's lower end: a rate of 10/10 is 1.0, yet says little about 0.99.
    statistic: Literal["lower_ci"]
    threshold: float = Field(gt=0, le=1, description="a fraction of restores, 0 < threshold ≤ 1")


class _SuccessRules(_Strict):
    """What counts as success. Units are fixed per measure so nobody argues about them later."""

    @model_validator(mode="after")
    def _sane(self) -> Any:
        # The floors "> 0" first: the order these errors have always come in.
        for c in sorted((c for c in CRITERIA if c.floor), key=lambda c: c.floor != "> 0"):
            threshold = getattr(self, c.name).threshold
            if not (threshold > 0 if c.floor == "> 0" else threshold >= 0):
                raise ValueError(f"{c.name}.threshold must be {c.floor}")
        return self


_MODELS = {"criterion": Criterion, "weeks": UtilizationCriterion, "restores": RestoreCriterion}
# One field per criterion of the measure registry (tasks/data/measures.py), in its order; an
# optional one is None when a plan leaves it out.
Success = create_model(
    "Success",
    __base__=_SuccessRules,
    __doc__=_SuccessRules.__doc__,
    __module__=__name__,
    **{
        c.name: (
            _MODELS[c.model] | None if c.optional else _MODELS[c.model],
            Field(None if c.optional else ..., description=c.description),
        )
        for c in CRITERIA
    },
)


class Exit(_Strict):
    uninstall: list[str] = Field(min_length=1, description="argv of the uninstall command")
    verification: Annotated[list[str], OneOrList()] = Field(
        min_length=1, description="what 'nothing left behind' means: the checks run after"
    )
    # A date or relative to the PoC's anchor day (today, +Nd, +Nw: tasks/data/plan_dates.py).
    test_by: PlanDate
    watch: Watch = Field(default_factory=Watch)
    allowed_changes: list[AllowedChange] = Field(default_factory=list)
    # Never installed on, snapshotted at the same phases: what changes the same way there is
    # the node's own life (tasks/exit/exit_diff.py; checked by control_node_problems).
    control_node: SafeName | None = None
    recheck_after_s: float = Field(
        default=30, ge=0, le=3600, description="after_uninstall snapshotted again, s later"
    )

    @field_validator("uninstall", mode="before")
    @classmethod
    def _argv(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError("uninstall must be an argv list (YAML list of strings), not a string")
        return value


class Cluster(_Strict):
    kind: ClusterKindName
    nodes: Annotated[list[SafeName], OneOrList()] = Field(min_length=1, max_length=2)
    queue: SafeName

    @field_validator("nodes")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("node names repeat")
        return value


class Checkpointer(_Strict):
    kind: Literal["criu", "cedana"]
    interval_s: float = Field(gt=0, le=MAX_SECONDS, description="seconds, at most a week")
    keep: int = Field(default=3, ge=1, le=MAX_KEPT_CHECKPOINTS, description="≤ 1000")
    # Where the images go: by default beside each copy under the PoC's folder (data_dir); a
    # site names its shared file system or node-local scratch, where production would keep
    # them (a restore reads them at that file system's speed). Its PoC folder is the PoC's
    # own, as data_dir is: never walked by the exit snapshots.
    images_dir: str | None = Field(
        default=None, description="an absolute folder for the checkpoint images"
    )
    # The copies run on GPUs: their GPU state is toggled out before each dump and back in
    # after each restore (cuda-checkpoint; tasks/engine/checkpointers/criu_gpu.py).
    gpu: bool = Field(default=False, description="the workload's copies use GPUs")

    @field_validator("images_dir")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).is_absolute():
            raise ValueError(f"{value!r} is not an absolute path")
        return value


# What a decision rule may name: the plan's success criteria, and `exit` (every test node's
# newest exit diff clean); the measure registry declares them.
DecisionCriterion = Literal[DECISION_CRITERIA]
# Criteria a plan may leave out of success: (the default decision.criteria names them only
# when the plan sets them).
OPTIONAL_CRITERIA = tuple(c.name for c in CRITERIA if c.optional)


class DecisionRule(_Strict):
    """The rule the PoC is decided by, agreed before it starts: adopt when every listed
    criterion is met; reject when any (or, with `all-not-met`, every) listed criterion is not
    met; otherwise extend the window by `extend_weeks` once it has ended (0: no extension, the
    decision stays undecided). Before the window ends, an open criterion leaves it undecided."""

    # Default: every criterion (the Plan drops optional ones its success does not set).
    criteria: Annotated[list[DecisionCriterion], OneOrList()] = Field(
        default_factory=lambda: list(DecisionCriterion.__args__), min_length=1
    )
    adopt: Literal["all-met"] = "all-met"
    reject: Literal["any-not-met", "all-not-met"] = "any-not-met"
    extend_weeks: int = Field(default=4, ge=0, le=MAX_WINDOW_WEEKS)

    @field_validator("criteria")
    @classmethod
    def _once(cls, value: list[str]) -> list[str]:
        twice = sorted({c for c in value if value.count(c) > 1})
        if twice:
            raise ValueError(f"names {', '.join(twice)} more than once")
        return value


class Plan(_Strict):
    poc: SafeName
    # `workloads:` lists every workload; `workload:` alone is its one-item form. Either way
    # `workload` is the first, the one the comparisons run (load fills in both fields). Both
    # may stand together when `workload` is the list's first item (a YAML anchor:
    # `workload: &w {...}` and `workloads: [*w, ...]`), so a plan keeps its `workload:` key.
    workload: Workload = Field(default=None, validate_default=False)  # type: ignore[assignment]
    workloads: list[Workload] = Field(default_factory=list, max_length=MAX_WORKLOADS)
    compatibility: Compatibility = Field(default_factory=Compatibility)
    cold_start: ColdStart = Field(default_factory=ColdStart)
    baseline: Baseline
    success: Success
    exit: Exit
    cluster: Cluster
    checkpointer: Checkpointer
    faults: list[FaultItem] = Field(min_length=1)
    repeats: int = Field(
        ge=3, le=MAX_RUNS, description="runs per (measure, arm), 3..10000; one run proves nothing"
    )
    window: Window
    exclusions: list[Exclusion] = Field(default_factory=list, max_length=MAX_EXCLUSIONS)
    decision: DecisionRule = Field(default_factory=DecisionRule)
    data_dir: str = "data"
    # What load_plan could not check and why (e.g. sinfo did not answer): said, not failed.
    _check_warnings: tuple[str, ...] = PrivateAttr(default=())
    # The date fields' forms, anchor and resolved dates (load_plan sets them).
    _dates: PlanDates | None = PrivateAttr(default=None)

    @property
    def check_warnings(self) -> tuple[str, ...]:
        """Lines ``file:line: field: message`` for checks load_plan skipped; not problems."""
        return self._check_warnings

    @property
    def cold_start_workload(self) -> Workload:
        """The workload cold start times: ``cold_start.workload``, else the first with a
        ready probe, else the first."""
        if self.cold_start.workload is not None:
            return next(w for w in self.workloads if w.name == self.cold_start.workload)
        return next((w for w in self.workloads if w.ready_probe), self.workload)

    @property
    def dates(self) -> PlanDates:
        """window.start and exit.test_by as written, their anchor day and resolved dates (a
        plan validated without load_plan: its dates as they are, anchored today)."""
        return self._dates or dates_of(self.window.start, self.exit.test_by)[0]

    @model_validator(mode="after")
    def _one_form_of_workloads(self) -> Plan:
        given = {"workload", "workloads"} & self.model_fields_set
        if not given or ("workloads" in given and not self.workloads):
            raise ValueError(
                "workloads: none given: give workload (one) or workloads (a list of at least one)"
            )
        if len(given) == 2 and self.workloads[0] != self.workload:
            raise ValueError(
                "workloads: with workload beside it, its first item must be that workload "
                "(the one the comparisons run): write `workload: &w ...` and "
                "`workloads: [*w, ...]`, or give workloads alone"
            )
        # Frozen model: both forms are filled in once, here, so every reader sees both.
        if given == {"workload"}:
            object.__setattr__(self, "workloads", [self.workload])
        else:
            object.__setattr__(self, "workload", self.workloads[0])
        problems = workloads_problems(self.workloads)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _cold_start_problems(self) -> list[str]:
        name = self.cold_start.workload
        names = [w.name for w in self.workloads]
        if name is not None and name not in names:
            listed = ", ".join(names)
            return [f"cold_start.workload: {name!r} is none of the plan's workloads ({listed})"]
        timed = self.cold_start_workload
        if any(WORKDIR in w for w in timed.command or []):
            return [
                f"cold_start.workload: {timed.name}'s command uses {WORKDIR}, filled in by the "
                "compatibility stage only; its copies run from the repo: use a relative path"
            ]
        return []

    @model_validator(mode="after")
    def _coherent(self) -> Plan:
        problems: list[str] = []
        problems += fault_problems(self.faults, self.cluster.kind)
        problems += control_node_problems(self.exit.control_node, list(self.cluster.nodes))
        problems += self._decided_by_unset()
        problems += self._cold_start_problems()
        need = self.success.utilization_gain.min_weeks
        if self.window.weeks < need:
            problems.append(
                f"window.weeks: {self.window.weeks} week(s) is shorter than the "
                f"{need} weeks success.utilization_gain needs (min_weeks)"
            )
        if not (self.window.start <= self.exit.test_by <= self.window.end):
            problems.append(
                f"exit.test_by: {self.exit.test_by} must fall inside the window "
                f"{self.window.start}..{self.window.end}: the way out is tested during the PoC"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _decided_by_unset(self) -> list[str]:
        """A rule naming an optional criterion the plan does not set is an error; the default
        rule leaves such criteria out (frozen model: set once, here)."""
        unset = [c for c in OPTIONAL_CRITERIA if getattr(self.success, c) is None]
        if "criteria" not in self.decision.model_fields_set:
            kept = [c for c in self.decision.criteria if c not in unset]
            object.__setattr__(self.decision, "criteria", kept)
            return []
        return [
            f"decision.criteria: names {c}, which success does not set "
            f"(add success.{c}: {{statistic: lower_ci, threshold: ...}})"
            for c in unset
            if c in self.decision.criteria
        ]


def plan_hash(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


# --- the way out exists ----------------------------------------------------------------------


def check_uninstall_command(
    path: str, root: yaml.Node | None, plan: Plan
) -> tuple[list[str], list[str]]:
    """(problems, warnings) about exit.uninstall's program: a path (relative ones resolve
    against the repo root) must be an executable file; a bare name is looked up on PATH. On
    Slurm or Kubernetes a bare name runs on the nodes (or the admin host), where this machine
    cannot look: a name missing here is a warning there, a problem for a local plan."""
    program = plan.exit.uninstall[0]
    here = file_line(path, root, ("exit", "uninstall"))
    if "/" in program:
        resolved = Path(program) if Path(program).is_absolute() else REPO_ROOT / program
        if not resolved.is_file():
            return [f"{here}: exit.uninstall: {program!r} does not exist ({resolved})"], []
        if not os.access(resolved, os.X_OK):
            return [f"{here}: exit.uninstall: {program!r} is not executable ({resolved})"], []
        return [], []
    if shutil.which(program) is not None:
        return [], []
    message = f"{here}: exit.uninstall: {program!r} is not found on PATH"
    if plan.cluster.kind == "local":
        return [message], []
    return [], [f"{message} here; it runs on the {plan.cluster.kind} nodes, not checked there"]


# --- the cluster itself ----------------------------------------------------------------------


def check_plan_against_cluster(
    path: str, root: yaml.Node | None, plan: Plan
) -> tuple[list[str], list[str]]:
    """(problems, warnings) from checking a Slurm plan's nodes and partition with sinfo.

    Other cluster kinds have nothing to ask here yet. A skipped check is a warning: the plan
    may be written away from the cluster it is for.
    """
    if plan.cluster.kind != "slurm":
        return [], []
    check = check_slurm_nodes(plan.cluster.nodes, plan.cluster.queue)
    if check.skipped is not None:
        here = file_line(path, root, ("cluster", "nodes"))
        warning = f"{here}: cluster.nodes: not checked against the cluster: {check.skipped}"
        return [], [warning]
    problems = [
        f"{file_line(path, root, loc)}: {'.'.join(str(p) for p in loc)}: {message}"
        for loc, message in check.problems
    ]
    # A preempt fault's preemptor (and grace) against the cluster's partitions and its jobs.
    for i, fault in enumerate(plan.faults):
        if fault.kind != "preempt":
            continue
        here = file_line(path, root, ("faults", i))
        problems += [
            f"{here}: {message}"
            for message in preemptor_problems(fault, i, plan.cluster.queue, plan.cluster.nodes)
        ]
    return problems, []


def prepare_size_problems(path: str, root: yaml.Node | None, plan: Plan) -> list[str]:
    """Weights a prepare step writes that this node cannot hold (tasks/data/plan_sizes.py)."""
    items = [
        (f"workloads.{i}.prepare.{j}", (i, j), argv)
        for i, w in enumerate(plan.workloads)
        for j, argv in enumerate(w.prepare)
    ]
    said = size_problems([(field, argv) for field, _, argv in items], plan.data_dir)
    where = {
        field: file_line(path, root, ("workloads", i, "prepare", j)) for field, (i, j), _ in items
    }
    return [f"{where[line.split(':', 1)[0]]}: {line}" for line in said]


def load_plan(
    path: str | Path, *, check_cluster: bool = True, now: dt.datetime | None = None
) -> Plan:
    """Read and validate a plan; raise PlanError naming every problem with file:line: field.

    With ``check_cluster`` a Slurm plan's nodes are also checked with sinfo when it answers;
    when it does not, ``plan.check_warnings`` says the check was skipped. Relative dates
    resolve against the anchor day the PoC's first run fixed, else against today (``now``:
    the clock, for tests) in the plan's time zone (tasks/data/plan_dates.py).
    """
    path = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(path, [f"{path}: cannot read plan: {exc}"]) from exc
    try:
        root, data = parse_yaml(text)
    except DuplicateKeysError as exc:
        raise PlanError(path, duplicate_key_problems(path, exc)) from exc
    except yaml.YAMLError as exc:
        raise PlanError(path, [yaml_error_line(path, text, exc)]) from exc
    if not isinstance(data, dict):
        raise PlanError(path, [f"{path}:1: the plan must be a YAML mapping"])
    anchor, stored = anchor_for(path, data, now)
    try:
        plan = Plan.model_validate(data, context={ANCHOR: anchor})
    except ValidationError as exc:
        problems = validation_problems(path, root, exc)
        raise PlanError(path, without_alias_repeats(problems)) from exc
    plan._dates, date_warnings = dates_of(
        plan.window.start, plan.exit.test_by, anchor, data, stored
    )
    problems, warnings = check_uninstall_command(path, root, plan)
    warnings += [f"{path}: {line}" for line in date_warnings]
    warnings += [f"{path}: {line}" for line in cold_start_warnings(plan.cold_start_workload)]
    if plan.cluster.kind == "local":  # the node is this machine: its disk and memory
        problems += prepare_size_problems(path, root, plan)
    if plan.checkpointer.gpu:
        more_problems, more_warnings = gpu_plan_problems(
            path, root, plan.checkpointer.kind, plan.cluster.kind, list(plan.cluster.nodes)
        )
        problems += more_problems
        warnings += more_warnings
    if check_cluster:
        more_problems, more_warnings = check_plan_against_cluster(path, root, plan)
        problems += more_problems
        warnings += more_warnings
    if problems:
        raise PlanError(path, problems)
    for warning in warnings:
        log.warning("%s", warning)
    plan._check_warnings = tuple(warnings)
    return plan
