"""Plan dates that follow the run (tasks/data/plan_dates.py): `window.start` and `exit.test_by`
as a date or relative (today, +Nd, +Nw), resolved once per PoC folder against the anchor day its
first run fixed; the clock is injected (load_plan's ``now``), nothing sleeps."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from tasks.data.errors import PlanError
from tasks.data.plan import load_plan
from tasks.data.plan_dates import (
    DATES_FILE,
    PlanDatesError,
    dates_file,
    fix_plan_dates,
    resolve_date,
)
from tasks.data.runctx import open_run
from tasks.data.runs import committed_runs
from tasks.window.sampling.span import opening_gap

DAY1 = dt.datetime(2026, 12, 1, 14, 30, tzinfo=dt.UTC)
DAY2 = dt.datetime(2027, 3, 17, 9, 5, tzinfo=dt.UTC)
RELATIVE = {"window.start": "today", "exit.test_by": "+21d"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("today", dt.date(2026, 12, 1)),
        ("+0d", dt.date(2026, 12, 1)),
        ("+21d", dt.date(2026, 12, 22)),
        ("+3w", dt.date(2026, 12, 22)),
        (" +1d ", dt.date(2026, 12, 2)),
        ("2026-11-30", dt.date(2026, 11, 30)),
        (dt.date(2027, 1, 4), dt.date(2027, 1, 4)),
    ],
)
def test_the_forms_resolve_against_the_anchor(value: object, expected: dt.date) -> None:
    assert resolve_date(value, dt.date(2026, 12, 1)) == expected


@pytest.mark.parametrize(
    "value", ["tomorow", "+3", "21d", "+3m", "-2d", "+2 weeks", "2026-02-30", "", 21, None]
)
def test_other_forms_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match="not a"):
        resolve_date(value, dt.date(2026, 12, 1))


def test_a_date_too_far_out_is_refused() -> None:
    with pytest.raises(ValueError, match="more than 3650 days"):
        resolve_date("+99999d", dt.date(2026, 12, 1))


@pytest.mark.parametrize(
    ("field", "value"), [("window.start", "tomorow"), ("exit.test_by", "+3 weeks")]
)
def test_plan_check_names_the_field_of_a_bad_relative_date(
    write_plan, field: str, value: str
) -> None:
    path = write_plan({field: value})
    with pytest.raises(PlanError) as info:
        load_plan(path, check_cluster=False, now=DAY1)
    expected = f"{field}: {value!r} is not a date (YYYY-MM-DD) or a relative date (today, +Nd, +Nw)"
    assert any(expected in p and p.startswith(f"{path}:") for p in info.value.problems), (
        info.value.problems
    )


def test_both_forms_pass_plan_check(write_plan) -> None:
    fixed = load_plan(
        write_plan({"window.start": "2026-11-30", "exit.test_by": "2026-12-21"}),
        check_cluster=False,
        now=DAY2,  # a fixed date never moves, whenever it is loaded
    )
    assert (fixed.window.start, fixed.exit.test_by) == (
        dt.date(2026, 11, 30),
        dt.date(2026, 12, 21),
    )
    relative = load_plan(write_plan(RELATIVE, name="rel.yaml"), check_cluster=False, now=DAY1)
    assert isinstance(relative.window.start, dt.date)
    assert (relative.window.start, relative.exit.test_by) == (
        dt.date(2026, 12, 1),
        dt.date(2026, 12, 22),
    )
    assert relative.dates.forms == RELATIVE and relative.dates.fixed_at is None


def test_the_demo_plan_is_relative_and_checks(tmp_path: Path) -> None:
    demo = Path(__file__).resolve().parents[2] / "plans" / "demo.yaml"
    text = demo.read_text().replace("data_dir: data", f"data_dir: {tmp_path}")
    (tmp_path / "demo.yaml").write_text(text)
    plan = load_plan(tmp_path / "demo.yaml", check_cluster=False, now=DAY2)
    assert plan.dates.forms == RELATIVE
    assert plan.window.start == DAY2.date() <= plan.exit.test_by <= plan.window.end


def test_a_check_writes_nothing(write_plan, tmp_path: Path) -> None:
    plan = load_plan(write_plan(RELATIVE), check_cluster=False, now=DAY1)
    assert not dates_file(plan.data_dir, plan.poc).exists()


@pytest.mark.parametrize("today", [DAY1, DAY2])
def test_a_demo_like_plan_has_no_gap_before_its_first_data(
    write_plan, tmp_path: Path, today: dt.datetime
) -> None:
    """On any day, the first sample of a PoC whose window starts `today` opens the window:
    no gap before it (with the old fixed start, the days before the run were one gap)."""
    plan = load_plan(write_plan(RELATIVE), check_cluster=False, now=today)
    fix_plan_dates(plan.dates, plan.data_dir, plan.poc, now=today)
    first_read = today + dt.timedelta(minutes=3)
    node = plan.cluster.nodes[0]
    assert opening_gap(plan, Path(plan.data_dir), node, "procfs", first_read, []) is None

    three_days_before = (today - dt.timedelta(days=3)).date().isoformat()
    fixed = load_plan(
        write_plan({"window.start": three_days_before, "exit.test_by": "+21d"}, name="f.yaml"),
        check_cluster=False,
        now=today,
    )
    gap = opening_gap(fixed, Path(fixed.data_dir), node, "procfs", first_read, [])
    assert gap is not None and gap["t_to"] == first_read  # a fixed date's gap stays counted


def test_the_anchor_survives_a_reload_and_is_in_the_commit_record(write_plan) -> None:
    path = write_plan(RELATIVE)
    plan = load_plan(path, check_cluster=False, now=DAY1)
    fixed = fix_plan_dates(plan.dates, plan.data_dir, plan.poc, now=DAY1)
    stored = json.loads(dates_file(plan.data_dir, plan.poc).read_text())
    assert stored == {
        "anchor": "2026-12-01",
        "window.start": "2026-12-01",
        "exit.test_by": "2026-12-22",
        "forms": RELATIVE,
        "fixed_at": DAY1.isoformat(),
    }
    later = load_plan(path, check_cluster=False, now=DAY2)  # months later: the same dates
    assert (later.window.start, later.exit.test_by) == (plan.window.start, plan.exit.test_by)
    assert later.dates.fixed_at == fixed.fixed_at and not later.check_warnings
    with open_run(later, path, "baseline") as ctx:
        pass  # a run that wrote nothing still commits its record with the dates
    (record,) = committed_runs(later.data_dir, later.poc).values()
    assert record["plan_dates"] == {
        "anchor": "2026-12-01",
        "window.start": "2026-12-01",
        "exit.test_by": "2026-12-22",
        "forms": RELATIVE,
    }
    assert ctx.plan_dates == record["plan_dates"]


def test_a_form_changed_after_the_anchor_resolves_against_the_same_day(write_plan) -> None:
    path = write_plan(RELATIVE)
    plan = load_plan(path, check_cluster=False, now=DAY1)
    fix_plan_dates(plan.dates, plan.data_dir, plan.poc, now=DAY1)
    path = write_plan({**RELATIVE, "exit.test_by": "+2w"})  # the same file, edited later
    edited = load_plan(path, check_cluster=False, now=DAY2)
    assert edited.exit.test_by == dt.date(2026, 12, 15) and edited.window.start == DAY1.date()
    (warning,) = edited.check_warnings
    assert "exit.test_by: '+2w' now, '+21d' when the PoC's dates were fixed" in warning
    assert "resolved again against the same anchor day 2026-12-01: 2026-12-15" in warning
    refixed = fix_plan_dates(edited.dates, edited.data_dir, edited.poc, now=DAY2)
    stored = json.loads(dates_file(plan.data_dir, plan.poc).read_text())
    assert stored["anchor"] == "2026-12-01" and stored["fixed_at"] == DAY1.isoformat()
    assert stored["exit.test_by"] == "2026-12-15" and refixed.anchor == DAY1.date()


def test_a_plan_resolved_before_another_run_fixed_the_anchor_is_refused(write_plan) -> None:
    path = write_plan(RELATIVE)
    early = load_plan(path, check_cluster=False, now=DAY1)  # loaded, no run yet
    other = load_plan(path, check_cluster=False, now=DAY2)
    fix_plan_dates(other.dates, other.data_dir, other.poc, now=DAY2)  # another run, first
    with pytest.raises(PlanDatesError, match=r"fixed against 2027-03-17 .* load the plan again"):
        fix_plan_dates(early.dates, early.data_dir, early.poc, now=DAY2)


def test_an_unreadable_dates_file_is_a_plan_error_naming_it(write_plan) -> None:
    path = write_plan(RELATIVE)
    plan = load_plan(path, check_cluster=False, now=DAY1)
    target = Path(plan.data_dir) / plan.poc / DATES_FILE
    target.parent.mkdir(parents=True)
    target.write_text('{"anchor": "soon"}')
    with pytest.raises(PlanError, match=f"{target}: anchor: not a date record"):
        load_plan(path, check_cluster=False, now=DAY1)


def test_a_plan_pointed_at_a_new_data_dir_fixes_its_dates_there(write_plan, tmp_path: Path) -> None:
    """Loaded against a folder whose dates were fixed, then copied to another data_dir (as the
    tests and `demo --fresh` do): its first run there fixes the same anchor, never fails."""
    path = write_plan(RELATIVE)
    plan = load_plan(path, check_cluster=False, now=DAY1)
    fix_plan_dates(plan.dates, plan.data_dir, plan.poc, now=DAY1)
    loaded = load_plan(path, check_cluster=False, now=DAY2)
    assert loaded.dates.fixed_at is not None
    moved = loaded.model_copy(update={"data_dir": str(tmp_path / "elsewhere")})
    fixed = fix_plan_dates(moved.dates, moved.data_dir, moved.poc, now=DAY2)
    assert fixed.anchor == plan.dates.anchor
    stored = json.loads(dates_file(moved.data_dir, moved.poc).read_text())
    assert stored["anchor"] == "2026-12-01" and stored["fixed_at"] == DAY2.isoformat()
