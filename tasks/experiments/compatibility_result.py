"""The compatibility stage's result: per workload k/n restores with a Wilson 95 % CI,
fidelity, failure causes grouped; its `compatibility` rows, gates and markdown matrix."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from statistics import median
from typing import Any

import pandas as pd

from tasks.data.datasets import COMPATIBILITY
from tasks.data.gates import CheckResult, plain_check
from tasks.data.jsonform import JsonForm
from tasks.data.runctx import RunContext
from tasks.experiments.compatibility import CompatibilityRun, WorkloadSweep
from tasks.experiments.compatibility_cycle import CycleRecord
from tasks.experiments.stats import wilson_interval as wilson

GATE = "compatibility"
# What `ckpt-poc sweep --json` prints per workload: exactly the keys its --help promises.
SWEEP_KEYS = (
    "name",
    "cycles",
    "restored",
    "success_rate",
    "ci",
    "fidelity",
    "failures",
    "freeze_s_median",
    "image_bytes_median",
)


def cause_of(c: CycleRecord) -> str | None:
    """What failed in a cycle, in words, with the option CRIU asks for when it names one."""
    if c.ok:
        return None
    half = "dump" if c.dump == "failed" else "restore"
    text = f"{half}: {c.cause or 'no cause given'}"
    if c.wants_option:
        text += f" — CRIU asks for {c.wants_option} (add it to the workload's criu options)"
    return text


def _group_key(cause: str) -> str:
    # Sizes, pids and paths differ per cycle; the cause is the same.
    return re.sub(r"\d+", "N", cause)


@dataclass(frozen=True)
class Failure(JsonForm):
    cycle: int | None
    step: int | None
    cause: str


@dataclass(frozen=True)
class CauseGroup(JsonForm):
    cause: str  # the first cycle's wording
    cycles: tuple[int, ...]
    criu_log: str | None  # the first failed cycle's CRIU log


@dataclass(frozen=True)
class WorkloadResult(JsonForm):
    name: str
    cycles: int
    restored: int
    success_rate: float | None
    ci: tuple[float, float] | None
    fidelity: str
    failures: tuple[Failure, ...]
    freeze_s_median: float | None
    image_bytes_median: float | None
    fidelity_detail: str = ""
    causes: tuple[CauseGroup, ...] = ()
    error: str | None = None
    notes: tuple[str, ...] = ()
    final_step: int | None = None
    reference_s: float | None = None
    cycle_rows: tuple[Mapping[str, Any], ...] = ()

    # a dict: the JSON document `sweep --json` prints
    def sweep_json(self) -> dict[str, Any]:
        full = self.to_json()
        return {k: full[k] for k in SWEEP_KEYS}


def workload_result(s: WorkloadSweep) -> WorkloadResult:
    n = len(s.cycles)
    k = sum(c.ok for c in s.cycles)
    failures = [
        Failure(c.cycle, c.step, cause) for c in s.cycles if (cause := cause_of(c)) is not None
    ]
    if s.error:
        failures.append(Failure(None, None, s.error))
    groups: dict[str, list[CycleRecord]] = {}
    for c in s.cycles:
        if (cause := cause_of(c)) is not None:
            groups.setdefault(_group_key(cause), []).append(c)
    causes = tuple(
        CauseGroup(cause_of(cs[0]) or "", tuple(c.cycle for c in cs), cs[0].criu_log)
        for cs in groups.values()
    )
    freezes = [c.freeze_s for c in s.cycles if c.freeze_s is not None]
    images = [c.image_bytes for c in s.cycles if c.image_bytes is not None]
    return WorkloadResult(
        name=s.name,
        cycles=n,
        restored=k,
        success_rate=k / n if n else None,
        ci=wilson(k, n),
        fidelity=s.fidelity,
        failures=tuple(failures),
        freeze_s_median=median(freezes) if freezes else None,
        image_bytes_median=float(median(images)) if images else None,
        fidelity_detail=s.fidelity_detail,
        causes=causes,
        error=s.error,
        notes=tuple(s.notes),
        final_step=s.final_step,
        reference_s=s.reference_s,
        cycle_rows=tuple(asdict(c) for c in s.cycles),
    )


@dataclass(frozen=True)
class CompatibilityResult(JsonForm):
    poc: str
    run_id: str
    criu_version: str
    cycles_planned: int
    workloads: tuple[WorkloadResult, ...]
    files: tuple[str, ...]
    run_dir: str

    # a dict: the JSON document `sweep --json` prints
    def sweep_json(self) -> dict[str, Any]:
        """Exactly what `ckpt-poc sweep --json` prints."""
        return {"workloads": [w.sweep_json() for w in self.workloads]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CompatibilityResult:
        def workload(w: Mapping[str, Any]) -> WorkloadResult:
            return WorkloadResult(
                **{
                    **w,
                    "ci": tuple(w["ci"]) if w.get("ci") else None,
                    "failures": tuple(Failure(**f) for f in w["failures"]),
                    "causes": tuple(
                        CauseGroup(**{**g, "cycles": tuple(g["cycles"])}) for g in w["causes"]
                    ),
                    "notes": tuple(w.get("notes", ())),
                    "cycle_rows": tuple(w.get("cycle_rows", ())),
                }
            )

        return cls(
            **{
                **d,
                "workloads": tuple(workload(w) for w in d["workloads"]),
                "files": tuple(d["files"]),
            }
        )


def compatibility_frame(run: CompatibilityRun, ctx: RunContext) -> pd.DataFrame:
    """One row per cycle and one per workload, stamped with the run."""
    rows: list[dict[str, Any]] = []
    for s in run.sweeps:
        r = workload_result(s)
        for c in s.cycles:
            rows.append(
                {**asdict(c), "workload": s.name, "row": "cycle", "started_at": s.started_at}
            )
        ci = r.ci or (None, None)
        rows.append(
            {
                "workload": s.name,
                "row": "workload",
                "cycle": 0,
                "started_at": s.started_at,
                "cycles": r.cycles,
                "restored": r.restored,
                "success_rate": r.success_rate,
                "ci_low": ci[0],
                "ci_high": ci[1],
                "fidelity": r.fidelity,
                "fidelity_detail": r.fidelity_detail or None,
                "error": r.error,
                "cause": "; ".join(g.cause for g in r.causes) or None,
            }
        )
    frame = pd.DataFrame(rows)
    for name, value in ctx.stamp().items():
        frame[name] = value
    frame["criu_version"] = run.criu_version
    return frame.reindex(columns=COMPATIBILITY.column_names)


def compatibility_gate_checks(frame: pd.DataFrame) -> list[CheckResult]:
    """Each workload has its row, and its k/n are its cycle rows' counts."""
    checks = []
    for name, rows in frame.groupby("workload"):
        summary = rows[rows["row"] == "workload"]
        cycles = rows[rows["row"] == "cycle"]
        ok = int(((cycles["dump"] == "ok") & (cycles["restore"] == "ok")).sum())
        good = len(summary) == 1 and (
            int(summary["cycles"].iloc[0]) == len(cycles) and int(summary["restored"].iloc[0]) == ok
        )
        checks.append(
            plain_check(
                GATE,
                "compatibility",
                f"counts_match_cycles[{name}]",
                good,
                workload_rows=len(summary),
                cycle_rows=len(cycles),
                restored_rows=ok,
            )
        )
    return checks


def compatibility_result(
    run: CompatibilityRun, ctx: RunContext, files: list[Any]
) -> CompatibilityResult:
    return CompatibilityResult(
        poc=ctx.poc,
        run_id=ctx.run_id,
        criu_version=run.criu_version,
        cycles_planned=run.cycles,
        workloads=tuple(workload_result(s) for s in run.sweeps),
        files=tuple(str(f) for f in files),
        run_dir=str(run.run_dir),
    )


def headline(result: CompatibilityResult) -> str:
    """ "N applications tried; M restored faithfully in all their cycles" and the rest."""
    tried = len(result.workloads)
    faithful = [
        w
        for w in result.workloads
        if w.cycles and w.restored == w.cycles and w.fidelity == "same" and not w.error
    ]
    restored = sum(w.restored for w in result.workloads)
    total = sum(w.cycles for w in result.workloads)
    return (
        f"{tried} application(s) tried; {len(faithful)} restored faithfully in every cycle; "
        f"{restored}/{total} restores succeeded in all (CRIU {result.criu_version})"
    )


def _num(v: float | None, fmt: str) -> str:
    return "–" if v is None else format(v, fmt)


def _ci(w: WorkloadResult) -> str:
    if w.ci is None:
        return f"{w.restored}/{w.cycles}"
    return f"{w.restored}/{w.cycles} ({w.ci[0]:.2f}–{w.ci[1]:.2f})"


def matrix_lines(result: CompatibilityResult) -> list[str]:
    """The workload × (dump, restore, resumed, fidelity, k/n, bytes, freeze) matrix."""
    lines = [
        "| workload | dumps ok | restores ok | resumed steps | fidelity | restored k/n (95 % CI) "
        "| image (median MB) | freeze (median ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w in result.workloads:
        rows = w.cycle_rows
        dumps = sum(r["dump"] == "ok" for r in rows)
        restores = sum(r["restore"] == "ok" for r in rows)
        resumed = ", ".join(str(r["resumed_step"]) for r in rows if r["resumed_step"] is not None)
        image = w.image_bytes_median / 1e6 if w.image_bytes_median is not None else None
        freeze = w.freeze_s_median * 1e3 if w.freeze_s_median is not None else None
        lines.append(
            f"| {w.name} | {dumps}/{len(rows)} | {restores}/{len(rows)} | {resumed or '–'} "
            f"| {w.fidelity} | {_ci(w)} | {_num(image, '.1f')} | {_num(freeze, '.0f')} |"
        )
    return lines


def compatibility_markdown(result: CompatibilityResult) -> str:
    lines = [f"# Compatibility: {headline(result)}", "", *matrix_lines(result), ""]
    for w in result.workloads:
        if w.error or w.causes or w.notes or w.fidelity_detail:
            lines.append(f"## {w.name}")
        if w.error:
            lines.append(f"- not tried through: {w.error}")
        for g in w.causes:
            where = f" (CRIU log: `{g.criu_log}`)" if g.criu_log else ""
            cycles = ", ".join(map(str, g.cycles))
            lines.append(f"- cycles {cycles}: {g.cause}{where}")
        lines += [f"- {note}" for note in w.notes]
        if w.fidelity_detail:
            lines.append(f"- fidelity: {w.fidelity_detail}")
    lines += ["", "## Cycles", "", *cycle_lines(result)]
    return "\n".join(lines) + "\n"


def cycle_lines(result: CompatibilityResult) -> list[str]:
    lines = [
        "| workload | cycle | moment | caught | step | dump | freeze ms | dump s | MB "
        "| restore | restore s | resumed | query |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in result.workloads:
        for r in w.cycle_rows:
            freeze = r["freeze_s"] * 1e3 if r["freeze_s"] is not None else None
            mb = r["image_bytes"] / 1e6 if r["image_bytes"] is not None else None
            lines.append(
                f"| {w.name} | {r['cycle']} | {r['moment']} | {_caught(r['caught'])} "
                f"| {_num(r['step'], 'd')} | {r['dump'] or '–'} | {_num(freeze, '.0f')} "
                f"| {_num(r['dump_s'], '.3f')} | {_num(mb, '.1f')} | {r['restore']} "
                f"| {_num(r['restore_s'], '.3f')} | {_num(r['resumed_step'], 'd')} "
                f"| {r['query'] or '–'} |"
            )
    return lines


def _caught(value: bool | None) -> str:
    return "–" if value is None else ("yes" if value else "no")


def result_lines(result: CompatibilityResult) -> list[str]:
    """What `ckpt-poc sweep` prints without --json."""
    lines = [headline(result)]
    for w in result.workloads:
        rate = f"{w.success_rate:.2f}" if w.success_rate is not None else "–"
        lines.append(f"{w.name}: restored {_ci(w)}, rate {rate}, fidelity {w.fidelity}")
        lines += [f"  {f.cause}" for f in w.failures if f.cycle is None]
        for g in w.causes:
            lines.append(f"  cycles {', '.join(map(str, g.cycles))}: {g.cause}")
            if g.criu_log:
                lines.append(f"    CRIU log: {g.criu_log}")
        lines += [f"  note: {n}" for n in w.notes]
    return lines


def sweep_json_text(result: CompatibilityResult) -> str:
    return json.dumps(result.sweep_json())
