"""The PoC plan: the four things on paper (workload, baseline, success, exit) plus where it runs.

A plan is a YAML file validated by the pydantic models below. ``load_plan`` reads it and
``ensure_plan_is_valid`` raises ``PlanError`` listing *every* problem with its field path and
YAML line, so a platform engineer fixes the whole file in one pass.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from tasks.errors import PlanError

# A name that is safe as one argv element and as a hostname: no shell metacharacters, no
# spaces, no leading dash (which a command would read as an option).
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")

FAULTS_BY_CLUSTER: dict[str, tuple[str, ...]] = {
    "local": ("sigkill", "sigkill-group"),
    "slurm": ("scancel", "node-down", "kill-step", "time-limit"),
    "kubernetes": ("pod-delete", "node-drain"),
}
ALL_FAULTS = tuple(sorted({f for kinds in FAULTS_BY_CLUSTER.values() for f in kinds}))

# Weeks of weekly utilization samples a verdict on utilization gain needs at the least.
MIN_UTILIZATION_WEEKS = 4


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_safe_name(value: str) -> str:
    if not SAFE_NAME.match(value):
        raise ValueError(
            f"{value!r} is not a safe name: use letters, digits, '.', '_' or '-', "
            "starting with a letter or digit (no spaces or shell metacharacters)"
        )
    return value


SafeName = Annotated[str, AfterValidator(_check_safe_name)]


class ProgressProbe(_Strict):
    """Yields a step counter: a regex with one group over the workload's log, or a file."""

    log_regex: str | None = None
    file: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> ProgressProbe:
        if (self.log_regex is None) == (self.file is None):
            raise ValueError("give exactly one of log_regex or file")
        if self.log_regex is not None:
            try:
                compiled = re.compile(self.log_regex)
            except re.error as exc:
                raise ValueError(f"log_regex does not compile: {exc}") from exc
            if compiled.groups < 1:
                raise ValueError("log_regex needs one capture group holding the step number")
        return self


class ReadyProbe(_Strict):
    url: str

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        if not re.match(r"^https?://[^\s]+$", value):
            raise ValueError("ready probe url must be an http(s) URL")
        return value


class AppCheckpoint(_Strict):
    """The application's own checkpoint: the unmanaged arm's recoverable point.

    ``path`` may use ``{copy_dir}``, as the command may: each workload copy gets its own
    folder, so the two arms never share a checkpoint file.
    """

    every_steps: int = Field(gt=0)
    path: str | None = None
    resume_args: list[str] = Field(
        default_factory=list, description="argv appended to restart from this checkpoint"
    )


class Workload(_Strict):
    name: SafeName
    command: list[str] | None = Field(default=None, min_length=1)
    script: str | None = None
    gpus: int = Field(ge=0, le=64)
    progress_probe: ProgressProbe | None = None
    ready_probe: ReadyProbe | None = None
    app_checkpoint: AppCheckpoint | None = None
    production_owner: str | None = Field(
        default=None, description="who runs this workload in production (gate 3)"
    )

    @field_validator("command", mode="before")
    @classmethod
    def _argv(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError("command must be an argv list (YAML list of strings), not a string")
        return value

    @model_validator(mode="after")
    def _what_runs(self) -> Workload:
        if (self.command is None) == (self.script is None):
            raise ValueError("give exactly one of command (argv list) or script (path)")
        if self.progress_probe is None and self.ready_probe is None:
            raise ValueError("give a progress_probe (training) or a ready_probe (serving)")
        return self


class SacctFileSource(_Strict):
    kind: Literal["sacct-file"]
    path: str


class SacctLiveSource(_Strict):
    kind: Literal["sacct-live"]
    clusters: list[SafeName] = Field(default_factory=list)


class Baseline(_Strict):
    source: Annotated[SacctFileSource | SacctLiveSource, Field(discriminator="kind")]
    days: int = Field(gt=0, le=3650)
    same_node_runs: int = Field(ge=1)
    # Also pseudonymise job names (user and account always are).
    pseudonymise_job_names: bool = False
    # Name of a Prefect Secret block holding the HMAC key; the key itself is never in a plan.
    pseudonym_key_secret: str | None = None


Statistic = Literal["median", "p90", "mean", "min", "max"]


class Criterion(_Strict):
    """One success number: ``statistic(measure) op threshold``."""

    statistic: Statistic
    threshold: float


class UtilizationCriterion(Criterion):
    min_weeks: int = Field(default=MIN_UTILIZATION_WEEKS, ge=1)


class Success(_Strict):
    """What counts as success. Units are fixed per measure so nobody argues about them later."""

    recovery_time_s: Criterion = Field(description="managed recovery time ≤ threshold seconds")
    work_lost_gpu_h: Criterion = Field(description="managed work lost per interruption ≤ GPU-h")
    utilization_gain: UtilizationCriterion = Field(
        description="managed − unmanaged goodput ≥ threshold (fraction of allocated GPU-hours)"
    )
    overhead_pct: Criterion = Field(description="steady-state overhead ≤ threshold percent")
    cold_start_speedup: Criterion = Field(description="native / restore ready time ≥ threshold ×")

    @model_validator(mode="after")
    def _sane(self) -> Success:
        if self.cold_start_speedup.threshold <= 0:
            raise ValueError("cold_start_speedup.threshold must be > 0")
        for name in ("recovery_time_s", "work_lost_gpu_h", "overhead_pct"):
            if getattr(self, name).threshold < 0:
                raise ValueError(f"{name}.threshold must be ≥ 0")
        return self


class Exit(_Strict):
    uninstall: list[str] = Field(min_length=1, description="argv of the uninstall command")
    verification: list[str] = Field(
        min_length=1, description="what 'nothing left behind' means: the checks run after"
    )
    test_by: dt.date

    @field_validator("uninstall", mode="before")
    @classmethod
    def _argv(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError("uninstall must be an argv list (YAML list of strings), not a string")
        return value


class Cluster(_Strict):
    kind: Literal["local", "slurm", "kubernetes"]
    nodes: list[SafeName] = Field(min_length=1, max_length=2)
    queue: SafeName

    @field_validator("nodes")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("node names repeat")
        return value


class Checkpointer(_Strict):
    kind: Literal["criu", "cedana"]
    interval_s: float = Field(gt=0)
    keep: int = Field(default=3, ge=1)


class Fault(_Strict):
    kind: str
    # node-down only: how long the node stays down before the harness returns it to service
    # (a reboot, a repair); null means it never comes back within the trial.
    down_s: float | None = Field(default=0, ge=0)

    @field_validator("kind")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in ALL_FAULTS:
            raise ValueError(f"unknown fault kind {value!r}; known: {', '.join(ALL_FAULTS)}")
        return value


class Window(_Strict):
    start: dt.date
    weeks: int = Field(gt=0, le=104)

    @property
    def end(self) -> dt.date:
        return self.start + dt.timedelta(weeks=self.weeks)


class Plan(_Strict):
    poc: SafeName
    workload: Workload
    baseline: Baseline
    success: Success
    exit: Exit
    cluster: Cluster
    checkpointer: Checkpointer
    faults: list[Fault] = Field(min_length=1)
    repeats: int = Field(ge=3, description="runs per (measure, arm); one run proves nothing")
    window: Window
    data_dir: str = "data"

    @model_validator(mode="after")
    def _coherent(self) -> Plan:
        problems: list[str] = []
        allowed = FAULTS_BY_CLUSTER[self.cluster.kind]
        for i, fault in enumerate(self.faults):
            if fault.kind not in allowed:
                problems.append(
                    f"faults.{i}.kind: {fault.kind!r} does not apply to a {self.cluster.kind} "
                    f"cluster; use one of {', '.join(allowed)}"
                )
            if fault.kind != "node-down" and fault.down_s != 0:
                problems.append(f"faults.{i}.down_s: only a node-down fault has a down time")
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


# --- loading, with field paths mapped back to YAML lines -------------------------------------


def _yaml_line(root: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """The 1-based YAML line of the deepest node on ``loc`` that exists in the file."""
    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == part), None)
            if match is None:
                break
            key, node = match
            line = key.start_mark.line + 1  # the key's line reads best ("success:")
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                break
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def _problem_lines(path: str, root: yaml.Node | None, exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        # Drop pydantic's union-branch tags (e.g. 'sacct-file') so paths read like the YAML.
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("sacct-")))
        field = ".".join(str(p) for p in loc) or "(plan)"
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            message = "required field is missing"
        line = _yaml_line(root, loc)
        where = f"{path}:{line}" if line else path
        # A cross-field problem lists its own field paths; split them into separate lines.
        for part in message.split("; ") if loc == () else [message]:
            lines.append(f"{where}: {field}: {part}" if loc else f"{where}: {part}")
    return lines


def plan_hash(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan; raise PlanError naming every problem with file:line: field."""
    path = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(path, [f"{path}: cannot read plan: {exc}"]) from exc
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        raise PlanError(path, [f"{where}: not valid YAML: {exc}"]) from exc
    if not isinstance(data, dict):
        raise PlanError(path, [f"{path}:1: the plan must be a YAML mapping"])
    try:
        return Plan.model_validate(data)
    except ValidationError as exc:
        raise PlanError(path, _problem_lines(path, root, exc)) from exc
