"""Every number in a plan is finite and below a documented bound, refused with its field name.

`interval_s: .inf` used to pass the check and then kill the checkpoint thread with
OverflowError while the run exited 0 with 0 checkpoints.
"""

from __future__ import annotations

import math
import re
import types
import typing
from pathlib import Path

import annotated_types
import pytest
from pydantic import BaseModel

from tasks.data.errors import PlanError
from tasks.data.plan import Plan, load_plan

REPO = Path(__file__).resolve().parents[2]
PROBLEM = re.compile(r"^(?P<file>.+?):(?P<line>\d+): (?P<field>[^ :]+): (?P<message>.+)$")


def _problems(path: Path) -> list[str]:
    with pytest.raises(PlanError) as info:
        load_plan(path)
    return info.value.problems


def test_infinite_checkpoint_interval_is_refused_at_its_line(tmp_path: Path) -> None:
    text = (REPO / "plans" / "demo.yaml").read_text()
    text = text.replace("interval_s: 0.5\n", "interval_s: .inf\n")
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "interval_s: .inf" in t)

    problems = _problems(path)

    assert problems == [f"{path}:{line}: checkpointer.interval_s: Input should be a finite number"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("checkpointer.interval_s", math.inf),
        ("checkpointer.interval_s", math.nan),
        ("checkpointer.interval_s", 1e300),
        ("checkpointer.interval_s", 7 * 24 * 3600 + 1),  # above a week
        ("checkpointer.keep", 10**6),
        ("repeats", 10**30),
        ("repeats", 10_001),
        ("window.weeks", 10**12),
        ("baseline.same_node_runs", 10**9),
        ("baseline.days", 10**6),
        ("baseline.max_quarantined_share", math.inf),
        ("workload.app_checkpoint.every_steps", 10**20),
        ("workload.gpus", 10**6),
        ("success.recovery_time_s.threshold", math.inf),
        ("success.recovery_time_s.threshold", math.nan),
        ("success.work_lost_gpu_h.threshold", 1e300),
        ("success.utilization_gain.threshold", -math.inf),
        ("success.utilization_gain.min_weeks", 10**6),
        ("success.overhead_pct.threshold", math.nan),
        ("success.cold_start_speedup.threshold", math.inf),
    ],
)
def test_non_finite_or_absurd_number_is_refused_with_its_field(
    write_plan, field: str, value: float
) -> None:
    path = write_plan({field: value})
    problems = _problems(path)
    fields = {m["field"] for p in problems if (m := PROBLEM.match(p))}
    assert field in fields, problems


def test_node_down_time_is_finite(write_plan) -> None:
    # Checked on a Slurm plan, where node-down applies, with the cluster check off (no sinfo).
    path = write_plan(
        {
            "cluster.kind": "slurm",
            "faults": [{"kind": "node-down", "down_s": math.inf}, {"kind": "scancel"}],
        }
    )
    with pytest.raises(PlanError) as info:
        load_plan(path, check_cluster=False)
    assert any(": faults.0.down_s: " in p for p in info.value.problems), info.value.problems


def _numeric_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, typing.Any]]:
    """(dotted name, FieldInfo) of every int/float field reachable from ``model``."""
    found = []
    for name, info in model.model_fields.items():
        pending = [info.annotation]
        while pending:
            tp = pending.pop()
            origin = typing.get_origin(tp)
            if origin is typing.Annotated:
                pending.append(typing.get_args(tp)[0])
            elif origin in (typing.Union, types.UnionType, list, tuple):
                pending.extend(typing.get_args(tp))
            elif isinstance(tp, type) and issubclass(tp, BaseModel):
                found += _numeric_fields(tp, f"{prefix}{name}.")
            elif tp in (int, float):
                found.append((f"{prefix}{name}", info))
    return found


def test_every_numeric_field_has_an_upper_bound_and_floats_are_finite() -> None:
    fields = _numeric_fields(Plan)
    assert len(fields) >= 12  # the walk reaches the nested sections
    unbounded = [
        name
        for name, info in fields
        if not any(isinstance(m, annotated_types.Le | annotated_types.Lt) for m in info.metadata)
    ]
    assert unbounded == []
    assert Plan.model_config.get("allow_inf_nan") is False
