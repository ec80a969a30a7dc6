"""The extrapolated rows: λ from the baseline, Young/Daly's optimal interval, the waste
fraction at the plan's interval and the expected goodput gain (the package docstring gives
the model)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from tasks.baseline.exposure import EXPOSED_STATES
from tasks.data.arms import MANAGED, UNMANAGED
from tasks.data.jsonform import JsonForm
from tasks.data.measures import (
    CHECKPOINT_INTERVAL_S,
    GOODPUT_GAIN_EXPECTED,
    RECOVERY_S,
    WASTE_FRACTION,
    WORK_LOST_GPU_H,
)
from tasks.window.weekly.model import WeekRows, ok_trials, runs_of

# --- Young / Daly ------------------------------------------------------------------------------


def young_interval(delta: float, mtbf: float) -> float:
    """Young 1974: τ = √(2δM). δ (checkpoint cost) and M (MTBF) in the same unit."""
    _positive_pair(delta, mtbf)
    return math.sqrt(2 * delta * mtbf)


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly 2006, eq. 37: τ = √(2δM)·[1 + ⅓√(δ/2M) + (1/9)(δ/2M)] − δ for δ < 2M, else M."""
    _positive_pair(delta, mtbf)
    if delta >= 2 * mtbf:
        return mtbf
    x = delta / (2 * mtbf)
    return math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - delta


def expected_waste(delta: float, tau: float, rate: float, restart: float) -> float:
    """First-order waste fraction δ/τ + λ(τ/2 + R) (docs/design.md §4); λ per unit of τ's time."""
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    return delta / tau + rate * (tau / 2 + restart)


def _positive_pair(delta: float, mtbf: float) -> None:
    for name, v in (("delta", delta), ("mtbf", mtbf)):
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be finite and > 0, got {v}")


# --- the model's inputs ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InterruptionRate(JsonForm):
    """λ from the latest baseline run's exposure rows, with what it was computed from."""

    run_id: str
    states: list[str]
    interruptions: int
    # The states counted as interruptions: the same for every rate, said beside the count.
    interrupted_states: tuple[str, ...] = field(init=False, default=EXPOSED_STATES)
    gpu_hours: float
    node_hours: float
    lambda_per_h: float
    lambda_basis: str


def interruption_rate(exposure: pd.DataFrame, gpus: int) -> InterruptionRate | None:
    """λ per hour of job time from the latest baseline's exposure rows (package docstring)."""
    states = exposure[exposure["kind"] == "state"]
    if states.empty:
        return None
    latest = states.sort_values("computed_at")["run_id"].iloc[-1]
    states = states[states["run_id"] == latest]
    exposed = int(states[states["state"].isin(EXPOSED_STATES)]["allocations"].sum())
    gpu_h, node_h = float(states["gpu_hours"].sum()), float(states["node_hours"].sum())
    if gpu_h > 0 and gpus > 0:
        per_h, basis = exposed / gpu_h * gpus, f"interruptions per GPU-hour × {gpus} GPU(s)"
    elif node_h > 0:
        per_h, basis = exposed / node_h, "interruptions per node-hour (one-node job)"
    else:
        return None
    return InterruptionRate(
        run_id=str(latest),
        states=sorted(states["state"].dropna().astype(str)),
        interruptions=exposed,
        gpu_hours=gpu_h,
        node_hours=node_h,
        lambda_per_h=per_h,
        lambda_basis=basis,
    )


def _median(values: pd.Series) -> float | None:
    v = values.dropna().astype(float)
    return float(v.median()) if not v.empty else None


@dataclass
class _Model:
    """δ, R, L and λ as the segment's rows give them, and the inputs every row lists."""

    delta: float | None
    n_delta: int
    r_managed: float | None
    r_unmanaged: float | None
    lost_unmanaged: float | None
    n_recovery: int
    rate_s: float | None  # λ per second
    tau_plan: float
    missing: list[str]  # what the managed side lacks (λ, δ, R_managed)
    inputs: dict[str, Any]
    runs: list[str]


def _model(c: WeekRows, exposure: pd.DataFrame) -> _Model:
    plan = c.plan
    lam = interruption_rate(exposure, plan.workload.gpus)
    ckpt = ok_trials(c.trials, "checkpoint", MANAGED)
    freeze, dump = _median(ckpt["freeze_s"]), _median(ckpt["dump_s"])
    delta = freeze if freeze is not None else dump
    n_delta = int(ckpt["freeze_s" if freeze is not None else "dump_s"].notna().sum())
    rec_m = ok_trials(c.trials, "recovery", MANAGED)
    rec_u = ok_trials(c.trials, "recovery", UNMANAGED)
    r_m, r_u = _median(rec_m[RECOVERY_S.column]), _median(rec_u[RECOVERY_S.column])
    lost_u = _median(rec_u["work_lost_s"])
    lost_from = "median work_lost_s"
    lost_gpu_h = _median(rec_u[WORK_LOST_GPU_H.column])
    if lost_u is None and plan.workload.gpus > 0 and lost_gpu_h is not None:
        lost_u = lost_gpu_h * 3600 / plan.workload.gpus
        lost_from = "median work_lost_gpu_h × 3600 / workload GPUs"
    tau_plan = float(plan.checkpointer.interval_s)
    inputs: dict[str, Any] = {
        "exposure": lam.to_json() if lam else None,
        "delta_s": delta,
        "delta_from": "median freeze_s" if freeze is not None else "median dump_s",
        "checkpoint_trials": {"n": n_delta, "run_ids": runs_of(ckpt)},
        "R_managed_s": r_m,
        "R_unmanaged_s": r_u,
        "L_unmanaged_s": lost_u,
        "L_unmanaged_from": lost_from,
        "recovery_trials": {
            MANAGED: len(rec_m),
            UNMANAGED: len(rec_u),
            "run_ids": runs_of(pd.concat([rec_m, rec_u])),
        },
        "tau_plan_s": tau_plan,
        "segment": c.segment,
    }
    return _Model(
        delta=delta,
        n_delta=n_delta,
        r_managed=r_m,
        r_unmanaged=r_u,
        lost_unmanaged=lost_u,
        n_recovery=len(rec_m) + len(rec_u),
        rate_s=lam.lambda_per_h / 3600 if lam else None,
        tau_plan=tau_plan,
        missing=[k for k, v in (("λ", lam), ("δ", delta), ("R_managed", r_m)) if v is None],
        inputs=inputs,
        runs=[*runs_of(ckpt), *runs_of(rec_m), *runs_of(rec_u), *([lam.run_id] if lam else [])],
    )


# --- the rows ----------------------------------------------------------------------------------


def extrapolated_rows(c: WeekRows, exposure: pd.DataFrame, measured_gain: float | None) -> None:
    """checkpoint_interval_s, waste_fraction and goodput_gain_expected, in that order."""
    m = _model(c, exposure)
    waste_m = _interval_rows(c, m)
    _gain_row(c, m, waste_m, measured_gain)


def _interval_rows(c: WeekRows, m: _Model) -> float | None:
    """The optimal interval and the managed waste at the plan's; returns that waste."""
    inputs, delta, rate_s, r_m = m.inputs, m.delta, m.rate_s, m.r_managed
    tau_opt = None
    if not m.missing and rate_s and delta and delta > 0:
        mtbf = 1 / rate_s
        tau_opt = daly_interval(delta, mtbf)
        inputs.update(
            mtbf_s=mtbf,
            young_s=young_interval(delta, mtbf),
            daly_s=tau_opt,
            waste_at_optimum=expected_waste(delta, tau_opt, rate_s, r_m),
            waste_at_plan=expected_waste(delta, m.tau_plan, rate_s, r_m),
        )
    why = "missing " + ", ".join(m.missing) if m.missing else "no interruption in the baseline"
    c.add(
        CHECKPOINT_INTERVAL_S,
        MANAGED,
        m.n_delta if tau_opt is not None else 0,
        tau_opt,
        "Daly 2006 eq. 37 with δ and M = 1/λ (Young's √(2δM) in inputs)",
        basis="extrapolated",
        inputs=inputs,
        note="" if tau_opt is not None else why,
        run_ids=m.runs,
    )
    waste_m = None
    if not m.missing and delta is not None and r_m is not None and rate_s is not None:
        waste_m = expected_waste(delta, m.tau_plan, rate_s, r_m)
    c.add(
        WASTE_FRACTION,
        MANAGED,
        m.n_delta if waste_m is not None else 0,
        waste_m,
        "δ/τ + λ(τ/2 + R) at the plan's checkpointer.interval_s (first order)",
        basis="extrapolated",
        inputs=inputs,
        note="" if waste_m is not None else "missing " + ", ".join(m.missing),
        run_ids=m.runs,
    )
    return waste_m


def _gain_row(c: WeekRows, m: _Model, waste_m: float | None, measured_gain: float | None) -> None:
    r_u, lost_u, rate_s = m.r_unmanaged, m.lost_unmanaged, m.rate_s
    gain, note, inputs = None, "", m.inputs
    if waste_m is not None and rate_s is not None and r_u is not None and lost_u is not None:
        waste_u = rate_s * (lost_u + r_u)
        # Goodput cannot leave [0, 1]; first order breaks down when waste nears 1 (window.md).
        good_m, good_u = min(1.0, max(0.0, 1 - waste_m)), min(1.0, max(0.0, 1 - waste_u))
        gain = good_m - good_u
        inputs = {
            **inputs,
            "waste_unmanaged": waste_u,
            "goodput_managed_expected": good_m,
            "goodput_unmanaged_expected": good_u,
            "goodput_gain_measured": measured_gain,
        }
        if max(waste_m, waste_u) >= 0.5:
            note = "waste ≥ 0.5: the first-order model is unreliable here"
    else:
        note = "missing " + ", ".join(
            [
                *m.missing,
                *(["R_unmanaged"] if r_u is None else []),
                *(["L_unmanaged"] if lost_u is None else []),
            ]
        )
    c.add(
        GOODPUT_GAIN_EXPECTED,
        "both",
        (m.n_recovery + m.n_delta) if gain is not None else 0,
        gain,
        "(1 − W_managed) − (1 − W_unmanaged); W_managed = δ/τ + λ(τ/2 + R_managed) at the "
        "plan's interval, W_unmanaged = λ(L_unmanaged + R_unmanaged)",
        basis="extrapolated",
        inputs=inputs,
        note=note,
        run_ids=m.runs,
    )
