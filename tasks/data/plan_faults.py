"""The plan's fault kinds, each declared once: one model per kind, with its own fields and the
cluster kinds it applies to. `Fault` is their discriminated union on ``kind``, so a field on
the wrong kind is a schema error naming the field (rendered by `fault_schema_problem`), and
every per-kind table (the kinds per cluster, the kinds with a notice) is read off the models.
Their delivery lives in the engine's backends (tasks/engine/faults.py); tests/unit/test_backends.py
proves the two cover each other."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from tasks.data.plan_short_forms import ShortForm
from tasks.data.plan_workload import SafeName

# The plan's cluster kinds (cluster.kind); each backend registers under one of them.
ClusterKindName = Literal["local", "slurm", "kubernetes"]
PLAN_CLUSTER_KINDS: tuple[str, ...] = get_args(ClusterKindName)

MAX_SECONDS = 7 * 24 * 3600
MAX_GRACE_S = 3600.0
# sbatch --signal's seconds are at most 65535; a warning longer than an hour is not a notice.
MAX_WARN_S = 3600

# What each kind-specific field is, for the message when a kind needs it or lacks it.
FIELD_MEANING = {
    "grace_s": "grace period (seconds from the notice to the kill)",
    "down_s": "down time",
    "warn_s": "warning",
    "preemptor_partition": "preemptor (the higher-priority partition its preemptor job, the "
    "PoC's own sleep, is submitted to)",
}


class _FaultModel(BaseModel):
    # As every plan model: unknown keys refused, frozen, every float finite (plan.py).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    clusters: ClassVar[tuple[str, ...]]  # the cluster kinds it applies to


# A fault with a notice: seconds from the notice (SIGTERM; the managed arm's checkpointer
# told) to SIGKILL, as a pod deletion's terminationGracePeriodSeconds or a spot notice.
GraceS = Annotated[float, Field(gt=0, le=MAX_GRACE_S, description="seconds, at most an hour")]


class SigkillFault(_FaultModel):
    clusters = ("local",)
    kind: Literal["sigkill"]


class SigkillGroupFault(_FaultModel):
    clusters = ("local",)
    kind: Literal["sigkill-group"]


class SigtermGraceFault(_FaultModel):
    clusters = ("local",)
    kind: Literal["sigterm-grace"]
    grace_s: GraceS


class ScancelFault(_FaultModel):
    clusters = ("slurm",)
    kind: Literal["scancel"]


class NodeDownFault(_FaultModel):
    clusters = ("slurm",)
    kind: Literal["node-down"]
    # How long the node stays down before the harness returns it to service (a reboot, a
    # repair); null means it never comes back within the trial.
    down_s: float | None = Field(default=0, ge=0, le=MAX_SECONDS, description="≤ a week")


class KillStepFault(_FaultModel):
    clusters = ("slurm",)
    kind: Literal["kill-step"]


class TimeLimitFault(_FaultModel):
    clusters = ("slurm",)
    kind: Literal["time-limit"]
    # Slurm's warning (`--signal=B:USR1@warn_s`) this long before the limit; null is the bare
    # time limit (SIGTERM at the limit). Slurm checks about once a minute.
    warn_s: int | None = Field(default=None, ge=1, le=MAX_WARN_S, description="seconds ≤ 3600")


class PreemptFault(_FaultModel):
    clusters = ("slurm",)
    kind: Literal["preempt"]
    grace_s: GraceS
    # The higher-priority partition (same nodes) the preemptor job goes to; plan check
    # refuses one that does not exist or would preempt another's jobs.
    preemptor_partition: SafeName


class DrainFault(_FaultModel):
    clusters = ("slurm",)
    kind: Literal["drain"]
    grace_s: GraceS


class PodDeleteFault(_FaultModel):
    clusters = ("kubernetes",)
    kind: Literal["pod-delete"]


class NodeDrainFault(_FaultModel):
    clusters = ("kubernetes",)
    kind: Literal["node-drain"]


FAULT_MODELS: tuple[type[_FaultModel], ...] = (
    SigkillFault,
    SigkillGroupFault,
    SigtermGraceFault,
    ScancelFault,
    NodeDownFault,
    KillStepFault,
    TimeLimitFault,
    PreemptFault,
    DrainFault,
    PodDeleteFault,
    NodeDrainFault,
)


def _kind_of(model: type[_FaultModel]) -> str:
    (kind,) = get_args(model.model_fields["kind"].annotation)
    return str(kind)


MODEL_BY_KIND: dict[str, type[_FaultModel]] = {_kind_of(m): m for m in FAULT_MODELS}
ALL_FAULTS = tuple(sorted(MODEL_BY_KIND))
FAULTS_BY_CLUSTER: dict[str, tuple[str, ...]] = {
    cluster: tuple(k for k, m in MODEL_BY_KIND.items() if cluster in m.clusters)
    for cluster in PLAN_CLUSTER_KINDS
}
# Faults that come with a notice: the grace between the notice and the kill (grace_s). A
# time limit's notice is its warning instead (warn_s: `sbatch --signal=B:USR1@warn_s`).
NOTICE_FAULTS = tuple(k for k, m in MODEL_BY_KIND.items() if "grace_s" in m.model_fields)

Fault = Annotated[
    SigkillFault
    | SigkillGroupFault
    | SigtermGraceFault
    | ScancelFault
    | NodeDownFault
    | KillStepFault
    | TimeLimitFault
    | PreemptFault
    | DrainFault
    | PodDeleteFault
    | NodeDrainFault,
    Field(discriminator="kind"),
]
_FAULT = TypeAdapter(Fault)


def kind_alone(value: Any) -> Any:
    """A bare kind is its short form: ``scancel`` is ``{kind: scancel}`` (a kind that needs a
    field of its own, grace_s say, is then refused naming that field)."""
    return {"kind": value} if isinstance(value, str) else value


# The kinds a bare kind is a whole fault of: those with no field they need besides kind.
KINDS_ALONE = tuple(
    k
    for k in ALL_FAULTS
    if not any(
        info.is_required() for f, info in MODEL_BY_KIND[k].model_fields.items() if f != "kind"
    )
)

# One item of the plan's ``faults:``: a fault, or its kind alone (tasks/data/plan_short_forms.py).
FaultItem = Annotated[
    Fault,
    ShortForm(
        kind_alone,
        {
            "type": "string",
            "enum": list(KINDS_ALONE),
            "description": "a fault's kind alone (a kind that needs no other field)",
        },
    ),
]


def parse_fault(**fields: Any) -> Fault:
    """One fault item, as the plan's ``faults:`` would hold it (``parse_fault(kind="drain",
    grace_s=3)``)."""
    return _FAULT.validate_python(fields)


def grace_of(fault: Any) -> float | None:
    """A fault's grace period (None: a kind without a notice)."""
    return getattr(fault, "grace_s", None)


def warn_of(fault: Any) -> int | None:
    """A time limit's warning (None: none, or another kind)."""
    return getattr(fault, "warn_s", None)


def _kinds_with(field: str) -> list[str]:
    return [k for k, m in MODEL_BY_KIND.items() if field in m.model_fields]


def fault_schema_problem(err: Any) -> tuple[tuple[int | str, ...], str] | None:
    """A pydantic error inside ``faults``, as (location, message) in the plan's own words —
    the kind's tag dropped from the location — or None when it is not one."""
    loc = tuple(err["loc"])
    if len(loc) < 2 or loc[0] != "faults" or not isinstance(loc[1], int):
        return None
    if err["type"] == "union_tag_invalid":
        tag = err.get("ctx", {}).get("tag", err.get("input"))
        return (*loc[:2], "kind"), f"unknown fault kind {tag!r}; known: {', '.join(ALL_FAULTS)}"
    if err["type"] == "union_tag_not_found":
        return (*loc[:2], "kind"), f"a fault names its kind; known: {', '.join(ALL_FAULTS)}"
    if len(loc) < 4 or loc[2] not in MODEL_BY_KIND:
        return None
    kind, field, where = loc[2], str(loc[3]), (loc[0], loc[1], *loc[3:])
    if err["type"] == "extra_forbidden":
        owners = _kinds_with(field)
        verb = "has" if len(owners) == 1 else "have"
        also = f" (only {', '.join(owners)} {verb} one)" if owners else ""
        return where, f"a {kind} fault has no {field}{also}"
    if err["type"] == "missing":
        return where, f"a {kind} fault needs its {FIELD_MEANING.get(field, field)}"
    return where, err["msg"].removeprefix("Value error, ")


def fault_problems(faults: Sequence[Any], cluster_kind: str) -> list[str]:
    """``faults.N.kind: why`` for each fault item whose kind does not apply to the cluster."""
    allowed = FAULTS_BY_CLUSTER[cluster_kind]
    return [
        f"faults.{i}.kind: {fault.kind!r} does not apply to a {cluster_kind} cluster; "
        f"use one of {', '.join(allowed)}"
        for i, fault in enumerate(faults)
        if fault.kind not in allowed
    ]
