"""The record's sections, one function each, in the order SECTIONS lists them. Each writes
its blocks from the facts build_document gathered; none reads a number typed by hand."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tasks.data.arms import MANAGED, UNMANAGED
from tasks.data.dataset_versions import versions_lines
from tasks.data.datasets import EVENTS, EXIT_DIFF, UTILIZATION
from tasks.data.measures import (
    BUSY_FRACTION,
    COLD_START_NATIVE_S,
    COLD_START_RESTORE_S,
    MEASURES,
    RECOVERY_S,
    VERDICTS,
    WORK_LOST_GPU_H,
)
from tasks.data.measures import GOODPUT as GOODPUT_MEASURE
from tasks.data.plan import Plan
from tasks.data.render import NO_VALUE, ci, css_class, number, records
from tasks.data.store import read_dataset, stored_versions
from tasks.poc.record.decision import Decision
from tasks.poc.record.document import Doc
from tasks.poc.record.figures import add_extrapolation_inputs, add_figures
from tasks.poc.record.method import method_lines
from tasks.poc.record.sources import FIGURE_SOURCES, files_of
from tasks.window.weekly.goodput import HEADS as GOODPUT_HEADS
from tasks.window.weekly.goodput import TITLE as GOODPUT
from tasks.window.weekly.goodput import goodput_section
from tasks.window.weekly.interruptions import HEADS as LOSS_HEADS
from tasks.window.weekly.interruptions import TITLE as INTERRUPTIONS
from tasks.window.weekly.interruptions import interruption_section
from tasks.window.weekly.mistakes import GateResult
from tasks.window.weekly.model import TITLES, verdict_text
from tasks.window.weekly.render import CHANGE_HEADS, VERSIONS_READ, change_rows
from tasks.window.weekly.restores import (
    CAUSE_HEADS,
    RESTORE_HEADS,
    WORKLOAD_HEADS,
    CompatSection,
    cause_rows,
    restore_rows,
    restores_line,
    workload_rows,
)
from tasks.window.weekly.rows import weekly_report_rows

# The plan-judged measures, as the record's `verdicts` names them.
VERDICT_MEASURES = tuple(m.name for m in VERDICTS)
VERDICT_HEADS = (
    "measure",
    "arm",
    "basis",
    "n",
    "weeks",
    "value",
    "95% CI",
    "threshold",
    "verdict",
)
# Every registered measure's title, the record's cold-start clocks' with them.
TITLES_HERE = TITLES
# Measures with a row per arm, shown as one line: (managed measure, unmanaged measure, title).
PAIRED = tuple(
    (managed.name, unmanaged.name, title)
    for managed, unmanaged, title in (
        (RECOVERY_S, RECOVERY_S, RECOVERY_S.title),
        (WORK_LOST_GPU_H, WORK_LOST_GPU_H, WORK_LOST_GPU_H.title),
        (GOODPUT_MEASURE, GOODPUT_MEASURE, "goodput"),
        (BUSY_FRACTION, BUSY_FRACTION, BUSY_FRACTION.title),
        (COLD_START_RESTORE_S, COLD_START_NATIVE_S, "cold start (restore vs native)"),
    )
)
HISTORY_RESAMPLES = 1_000  # past weeks' CIs in the weeks table only (months of weeks)


@dataclass
class Facts:
    """What the sections read, gathered once by build_document."""

    plan: Plan
    data_dir: Path
    frames: Mapping[str, pd.DataFrame]
    weeks: list[str]  # every week with data
    week: str  # the latest of them: the record's week
    rows: pd.DataFrame  # the week's report rows
    recs: list[dict[str, Any]]  # the rows shown, each with its weeks and run_ids
    change_points: list[dict[str, Any]]
    segment: int
    seg_weeks: list[str]
    files: Mapping[str, list[str]]  # run_id → its parquet files
    verdicts: dict[str, str]  # VERDICT_MEASURES → verdict as people read it
    mistakes: list[GateResult]  # the checks the verdicts were judged with
    decision: Decision
    exit_state: str
    latest_exit: pd.DataFrame  # each node's newest exit verdict
    compatibility: CompatSection  # the range of applications, restores per version

    def title(self, r: Mapping[str, Any]) -> str:
        return TITLES_HERE.get(r["measure"], r["measure"])


def table_rows(recs: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """The verdict table's rows (VERDICT_HEADS)."""
    return [
        [
            TITLES_HERE.get(r["measure"], r["measure"]),
            r["arm"],
            r["basis"],
            str(int(r["n"])),
            str(r["weeks"]),
            number(r["value"], r["unit"]),
            ci(r),
            number(r["threshold"], r["unit"]),
            verdict_text(str(r["verdict"]), r.get("note")),
        ]
        for r in recs
    ]


def side_by_side(recs: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """The per-arm rows paired: managed beside unmanaged, each with its CI."""
    by_key = {(r["measure"], r["arm"]): r for r in recs}

    def cell(r: Mapping[str, Any] | None) -> str:
        if r is None:
            return NO_VALUE
        interval = ci(r)
        return number(r["value"], r["unit"]) + (f" ({interval})" if interval else "")

    out = []
    for m_measure, u_measure, title in PAIRED:
        m, u = by_key.get((m_measure, MANAGED)), by_key.get((u_measure, UNMANAGED))
        if m is None and u is None:
            continue
        n = f"{int(m['n']) if m else 0} / {int(u['n']) if u else 0}"
        out.append([title, cell(m), cell(u), n])
    return out


# --- the sections --------------------------------------------------------------------------------


def heading(d: Doc, f: Facts) -> None:
    """The title and what the record covers (before the first section)."""
    d.h(1, f"Decision record — {f.plan.poc} / {f.plan.workload.name}")
    d.p(
        f"Data to ISO week {f.week} (comparability segment {f.segment}, weeks "
        f"{', '.join(f.seg_weeks) or 'none'}); generated "
        f"{dt.datetime.now(dt.UTC).isoformat(timespec='seconds')} from the committed datasets "
        f"under {f.data_dir / f.plan.poc}."
    )


def _decision(d: Doc, f: Facts) -> None:
    """The decision first: what the PoC concluded under the plan's rule, and why."""
    dec = f.decision
    d.p(f"Decision: {dec.decision.upper()}: {dec.reason}.")
    d.p(f"The plan's rule (decision:): {dec.rule}.")
    if dec.open:
        d.table(
            ["criterion", "verdict", "what would settle it", "basis", "inputs"],
            [
                [
                    o.criterion,
                    o.verdict,
                    o.settle,
                    o.basis,
                    ", ".join(f"{k} {v}" for k, v in o.inputs.items()) or NO_VALUE,
                ]
                for o in dec.open
            ],
        )


def _verdicts(d: Doc, f: Facts) -> None:
    d.table(
        ["measure", "verdict"],
        [[TITLES_HERE[m], v] for m, v in f.verdicts.items()],
        [css_class(v.split(":", 1)[0]) for v in f.verdicts.values()],
    )
    failed = [g for g in f.mistakes if not g.passed]
    d.p(
        f"The six mistakes: {6 - len(failed)} of 6 checks passed"
        + "".join(
            f"; {g.title} holds {', '.join(TITLES_HERE.get(m, m) for m in g.guards)}"
            for g in failed
            if g.guards
        )
        + f". The way out: {f.exit_state}."
    )


def _measures(d: Doc, f: Facts) -> None:
    d.p(
        "Both arms side by side; trial-based rows pool the segment's trials to date, goodput "
        f"and busy fraction are week {f.week}'s. weeks = ISO weeks of rows behind the figure. "
        "Each figure's method follows the table; its runs and files are under Lineage."
    )
    d.table(VERDICT_HEADS, table_rows(f.recs), [css_class(r["verdict"]) for r in f.recs])
    d.h(3, "Side by side")
    d.table(
        ["measure", "managed (95% CI)", "unmanaged (95% CI)", "n managed / unmanaged"],
        side_by_side(f.recs),
    )
    for r in f.recs:
        note = f" Note: {r['note']}" if r.get("note") else ""
        d.p(f"{f.title(r)} ({r['arm']}): {r['method']}.{note}")


def _compatibility(d: Doc, f: Facts) -> None:
    """The range of applications (each workload's latest compatibility run to the record's
    week) and every restore the product attempted, per checkpointer version."""
    s = f.compatibility
    d.p(s.headline + ".")
    if s.workloads:
        d.table(WORKLOAD_HEADS, workload_rows(s))
    causes = cause_rows(s)
    if causes:
        d.h(3, "Failures and their causes")
        d.table(CAUSE_HEADS, causes)
    d.h(3, "Restore reliability")
    d.p(
        restores_line(s.restores)
        + " Counted: compatibility cycles whose restore was tried, and the managed arm's "
        "recovery and cold-start trials that attempted one; pooled per checkpointer version, "
        "never across versions; 95 % CI Wilson."
    )
    d.table(RESTORE_HEADS, restore_rows(s.restores))


def _method(d: Doc, f: Facts) -> None:
    for title, text in method_lines(f.plan, f.frames["trials"], f.frames[UTILIZATION.name]):
        d.h(3, title)
        d.p(text)
    # A PoC outlives upgrades of the product: the versions of each dataset read, events
    # (read by the utilization stage) from the files' footers.
    d.h(3, VERSIONS_READ)
    events = stored_versions(EVENTS, data_dir=f.data_dir, poc=f.plan.poc)
    for line in [*versions_lines(f.frames), events.line()]:
        d.p(line)


def _measured_and_extrapolated(d: Doc, f: Facts) -> None:
    measured = [r for r in f.recs if r["basis"] == "measured"]
    d.p("Measured: " + ", ".join(f"{f.title(r)} ({r['arm']})" for r in measured) + ".")
    for r in f.recs:
        if r["basis"] == "extrapolated":
            d.h(3, f"{f.title(r)}: {number(r['value'], r['unit'])} (extrapolated)")
            d.p(r["method"])
    add_extrapolation_inputs(d, f)


def _six_mistakes(d: Doc, f: Facts) -> None:
    d.p(
        "The checks the verdicts above were judged with (tasks.window.weekly.mistakes), not a "
        "second computation: a failed check holds the verdicts it names — blocked, or undecided "
        "when the evidence is short of the plan's minimum — and no others."
    )
    d.table(
        ["gate", "result", "why", "holds", "rows looked at"],
        [
            [
                g.title,
                "passed" if g.passed else "FAILED",
                g.reason,
                "; ".join(f"{TITLES_HERE.get(m, m)} ({g.effect})" for m in g.guards) or NO_VALUE,
                "; ".join(
                    f"{x['dataset']}: {x['rows']} rows, runs {', '.join(x['run_ids']) or '—'}"
                    for x in g.rows
                ),
            ]
            for g in f.mistakes
        ],
        ["met" if g.passed else "not-met" for g in f.mistakes],
    )


def _baseline(d: Doc, f: Facts) -> None:
    exposure = f.frames["exposure"]
    if exposure.empty:
        d.p("No baseline exposure rows.")
        return
    latest = exposure.sort_values("computed_at")["run_id"].iloc[-1]
    ex = exposure[exposure["run_id"] == latest]
    states = ex[ex["kind"] == "state"]
    d.p(
        f"Latest baseline run {latest}: {number(float(states['exposed_gpu_hours'].sum()))} "
        f"exposed GPU-hours of {number(float(states['gpu_hours'].sum()))} GPU-hours "
        f"({int(states['exposed_allocations'].sum())} exposed allocations)."
    )
    d.table(
        ["state", "allocations", "GPU-hours", "exposed GPU-hours", "time-limit GPU-hours"],
        [
            [
                s.state,
                s.allocations,
                number(s.gpu_hours),
                number(s.exposed_gpu_hours),
                number(s.timeout_gpu_hours),
            ]
            for s in states.itertuples()
        ],
    )
    cands = ex[ex["kind"] == "candidate"].sort_values("rank")
    d.h(3, "Candidate workloads")
    d.table(
        ["rank", "workload", "allocations", "exposed GPU-hours", "chains"],
        [
            [c.rank, c.workload, c.allocations, number(c.exposed_gpu_hours), c.chains]
            for c in cands.itertuples()
        ],
    )


def _interruptions(d: Doc, f: Facts) -> None:
    """The baseline's exposure beside the work each arm lost per interruption, by fault."""
    section = interruption_section(f.plan, f.frames["exposure"], f.frames["trials"])
    d.p(section.line)
    if section.rows:
        d.table(LOSS_HEADS, section.rows)
    for line in section.holds:
        d.p(line[0].upper() + line[1:] + ".")


def _goodput(d: Doc, f: Facts) -> None:
    """Goodput over every week, the seed's split beside ml-goodput-measurement's, whether
    the figures are final, and the plan's exclusions."""
    section = goodput_section(f.plan, f.frames[UTILIZATION.name])
    d.p(section.status)
    if section.rows:
        d.table(GOODPUT_HEADS, section.rows)
    for line in section.exclusions:
        d.p(f"Excluded: {line}.")


LEFTOVER_COLUMNS = ("node", "class", "kind", "key", "change", "before", "after", "reason")


def _way_out(d: Doc, f: Facts) -> None:
    latest = f.latest_exit
    d.p(f"Exit verdict: {f.exit_state}.")
    d.table(
        [
            "node",
            "from",
            "to",
            "verdict",
            "leftovers",
            "the PoC's",
            "unexplained",
            "node's own",
            "items compared",
            "diffed at",
            "run",
        ],
        [
            [
                v.node,
                v.from_phase,
                v.to_phase,
                v.verdict,
                v.leftovers,
                *(
                    NO_VALUE if pd.isna(n) else int(n)
                    for n in (v.poc_items, v.unexplained, v.node_own)
                ),
                v.items_compared,
                pd.Timestamp(v.diffed_at).isoformat(),
                v.run_id,
            ]
            for v in latest.itertuples()
        ],
    )
    if not len(latest):
        return
    diff = read_dataset(EXIT_DIFF, data_dir=f.data_dir, poc=f.plan.poc)
    diff = diff[diff["run_id"].isin(set(latest["run_id"]))]
    # Rows diffed before the classes existed (class null) count as leftovers, as they did.
    own = diff["class"].astype("string").fillna("") == "node_own"
    d.h(3, "Leftovers")
    d.p("The PoC's and unexplained differences: each counts against the way out.")
    d.table(
        [*LEFTOVER_COLUMNS[:-1], "why"],
        [
            [x[c] if x[c] is not None else NO_VALUE for c in LEFTOVER_COLUMNS]
            for x in records(diff[~own])
        ],
    )
    d.h(3, "The node's own")
    d.p(
        "Differences the node's own life explains (the same change on the control node, gone "
        "again at the recheck, or a process whose ancestry never touches the PoC): listed, "
        "never counted as leftovers."
    )
    d.table(
        ["node", "kind", "key", "change", "why"],
        [[x["node"], x["kind"], x["key"], x["change"], x["reason"]] for x in records(diff[own])],
    )


def _change_points_and_gaps(d: Doc, f: Facts) -> None:
    d.table(CHANGE_HEADS, change_rows(f.change_points))
    gaps = f.frames["sample_gaps"]
    gaps = gaps.drop_duplicates(["node", "source", "entity", "metric", "t_from"])
    d.h(3, "Sample gaps")
    d.table(
        ["node", "source", "metric", "from", "to", "seconds", "reason"],
        [
            [
                g.node,
                g.source,
                g.metric if isinstance(g.metric, str) else "all",
                pd.Timestamp(g.t_from).isoformat(),
                pd.Timestamp(g.t_to).isoformat(),
                f"{g.gap_s:.0f}",
                g.reason,
            ]
            for g in gaps.sort_values("t_from").itertuples()
        ],
    )


def _weeks(d: Doc, f: Facts) -> None:
    d.p(
        "Each week's verdict of the plan-judged measures, as that week's report computed it "
        f"(past weeks' CIs with {HISTORY_RESAMPLES} resamples)."
    )
    history = []
    for w in f.weeks:
        wrows = (
            f.rows
            if w == f.week
            else weekly_report_rows(f.plan, f.frames, w, n_resamples=HISTORY_RESAMPLES)[0]
        )
        wrec = {(r["measure"], r["arm"]): r for r in records(wrows)}
        cells = [w]
        for m in VERDICT_MEASURES:
            r = wrec.get((m, MANAGED)) or wrec.get((m, "both"))
            cells.append(f"{number(r['value'], r['unit'])} {r['verdict']}" if r else "—")
        history.append(cells)
    d.table(["week", *VERDICT_MEASURES], history)


def _lineage(d: Doc, f: Facts) -> None:
    d.p(
        "Every figure with the runs and parquet files it comes from: read them with pandas or "
        "DuckDB and the dataset declarations (tasks/data/datasets.py) to redo it."
    )
    lineage = []
    for r in f.recs:
        dataset = FIGURE_SOURCES.get(r["measure"], ("trials", None))[0]
        used = files_of(f.files, r["run_ids"], dataset)
        measure = MEASURES.get(r["measure"])
        for also in measure.also_reads if measure else ():
            used += files_of(f.files, r["run_ids"], also)
        if r["basis"] == "extrapolated":
            used += files_of(f.files, r["run_ids"], "exposure")
        lineage.append(
            [
                f"{f.title(r)} ({r['arm']})",
                ", ".join(r["run_ids"]) or "—",
                "\n".join(sorted(set(used))) or "—",
            ]
        )
    d.table(["figure", "runs", "files"], lineage)


# The sections in order, each under its heading; SECTIONS are the headings (the test checks
# each is in the HTML and the PDF text).
WRITERS: tuple[tuple[str, Callable[[Doc, Facts], None]], ...] = (
    ("Decision", _decision),
    ("Verdicts", _verdicts),
    ("Measures against the plan", _measures),
    ("Figures", add_figures),
    ("Compatibility and restore reliability", _compatibility),
    ("Method", _method),
    ("Measured and extrapolated", _measured_and_extrapolated),
    ("The six mistakes", _six_mistakes),
    ("Baseline", _baseline),
    (INTERRUPTIONS, _interruptions),
    (GOODPUT, _goodput),
    ("The way out", _way_out),
    ("Change points and gaps", _change_points_and_gaps),
    ("Weeks", _weeks),
    ("Lineage", _lineage),
)
SECTIONS = tuple(title for title, _ in WRITERS)


def write_document(f: Facts) -> Doc:
    """The record's blocks: the heading, then every section under its h2."""
    d = Doc()
    heading(d, f)
    for title, write in WRITERS:
        d.h(2, title)
        write(d, f)
    return d
