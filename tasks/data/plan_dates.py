"""A plan's dates that follow the run: ``window.start`` and ``exit.test_by``.

Each is a date (``YYYY-MM-DD``) or a relative date: ``today``, ``+Nd`` or ``+Nw`` (N days or
weeks after the PoC's *anchor day*; both fields count from the anchor, not from each other).
The anchor is fixed once per PoC folder, by the PoC's first run: ``<data_dir>/<poc>/
plan-dates.json`` (written atomically, never over another anchor) holds it with the forms as
written and the dates they resolved to. Every later load, run, report and record resolves
against that same day, so a demo on any date opens its window that day and a PoC's dates never
drift. Until the first run a load resolves against today in the plan's time zone and writes
nothing (``plan check`` writes no data). A form changed after the anchor was fixed is resolved
again against the same anchor day, and ``load_plan`` says so.

A window that starts ``today`` (or ``+0d``) opens at the PoC's first sample rather than at the
midnight before it: nothing before the PoC began sampling was due
(tasks/window/sampling/span.py).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import uuid
import zoneinfo
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, ValidationInfo, WithJsonSchema

from tasks.data.errors import CkptPocError, PlanError
from tasks.data.runs import poc_dir, write_json_atomically

DATES_FILE = "plan-dates.json"
# The plan's date fields, as (section, key): the order load_plan reports them in.
DATE_FIELDS: tuple[tuple[str, str], ...] = (("window", "start"), ("exit", "test_by"))
FORMS = "a date (YYYY-MM-DD) or a relative date (today, +Nd, +Nw)"
MAX_OFFSET_DAYS = 3650  # ten years after the anchor: no PoC plans further out
# The key a pydantic validation context carries the anchor day under (load_plan sets it).
ANCHOR = "plan_dates_anchor"
_RELATIVE = re.compile(r"^\+(\d{1,5})([dw])$")
_ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")  # a poc the plan can accept


class PlanDatesError(CkptPocError):
    """The PoC folder's plan-dates.json is unreadable, or another run fixed other dates."""


def is_relative(form: str) -> bool:
    return form == "today" or _RELATIVE.match(form) is not None


def resolve_date(value: Any, anchor: dt.date) -> dt.date:
    """``value`` as written in the plan (a YAML date, or a string) → the date it means."""
    if isinstance(value, dt.datetime):  # YAML reads "2026-11-30 09:00" as a timestamp
        raise ValueError(f"{value.isoformat()!r} is not {FORMS}: a day, not a time")
    if isinstance(value, dt.date):
        return value
    text = value.strip() if isinstance(value, str) else None
    if text == "today":
        return anchor
    match = _RELATIVE.match(text or "")
    if match:
        days = int(match.group(1)) * (7 if match.group(2) == "w" else 1)
        if days > MAX_OFFSET_DAYS:
            raise ValueError(f"{text!r} is more than {MAX_OFFSET_DAYS} days after the anchor day")
        return anchor + dt.timedelta(days=days)
    if text is not None and _ISO_DATE.match(text):
        try:
            return dt.date.fromisoformat(text)
        except ValueError as exc:
            raise ValueError(f"{text!r} is not a real date ({exc})") from exc
    raise ValueError(f"{value!r} is not {FORMS}")


def form_of(value: Any) -> str:
    """How a date field was written, as a string: ``today``, ``+21d``, ``2026-11-30``."""
    return value.isoformat() if isinstance(value, dt.date) else str(value).strip()


def today_in(timezone: str, now: dt.datetime | None = None) -> dt.date:
    """Today in the plan's time zone (UTC when the name is unknown: the plan check says so)."""
    try:
        tz: dt.tzinfo = zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        tz = dt.UTC
    return (now or dt.datetime.now(dt.UTC)).astimezone(tz).date()


def _plan_date(value: Any, info: ValidationInfo) -> dt.date:
    context = info.context or {}
    anchor = context.get(ANCHOR)
    # A plan validated without load_plan (a test's dict) counts from today, in UTC.
    return resolve_date(value, anchor if isinstance(anchor, dt.date) else today_in("UTC"))


# A plan date: what code reads is always a datetime.date, resolved while the plan validates.
# Its JSON Schema takes both forms as written (tasks/data/plan_schema.py).
PlanDate = Annotated[
    dt.date,
    BeforeValidator(_plan_date),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "format": "date"},
                {"type": "string", "pattern": r"^(today|\+[0-9]{1,5}[dw])$"},
            ],
            "description": FORMS,
        }
    ),
]


@dataclass(frozen=True)
class PlanDates:
    """The forms as written, the anchor day they count from and the dates they mean."""

    anchor: dt.date
    forms: dict[str, str]  # "window.start" → "today"
    dates: dict[str, dt.date]  # "window.start" → 2026-12-01
    # When the PoC's first run fixed the anchor; None: not fixed yet (resolved against today).
    fixed_at: str | None = None
    # Fields whose form differs from the one stored: resolved again against the same anchor.
    reresolved: tuple[str, ...] = field(default=())

    @property
    def window_opens_at_first_sample(self) -> bool:
        """The window starts on the anchor day by a relative form (``today``, ``+0d``)."""
        form = self.forms.get("window.start", "")
        return is_relative(form) and self.dates.get("window.start") == self.anchor

    def record(self) -> dict[str, str | dict[str, str]]:
        """What a run's commit record carries: the dates its rows were judged under, keyed
        by the plan's date fields (ISO days), beside the anchor and the forms as written."""
        return {
            "anchor": self.anchor.isoformat(),
            **{name: day.isoformat() for name, day in self.dates.items()},
            "forms": dict(self.forms),
        }

    def to_json(self) -> dict[str, str | dict[str, str] | None]:
        """The dates file's document: the record and when the anchor was fixed."""
        return {**self.record(), "fixed_at": self.fixed_at}


def dates_file(data_dir: str | Path, poc: str) -> Path:
    return poc_dir(data_dir, poc) / DATES_FILE


def read_stored(data_dir: str | Path, poc: str) -> PlanDates | None:
    """The anchor the PoC's first run fixed, or None when no run has yet."""
    path = dates_file(data_dir, poc)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise PlanDatesError(f"{path}: cannot read the PoC's fixed dates: {exc}") from exc
    try:
        anchor = dt.date.fromisoformat(str(raw["anchor"]))
        forms = {str(k): str(v) for k, v in dict(raw.get("forms") or {}).items()}
        dates = {n: dt.date.fromisoformat(str(raw[n])) for n in forms if n in raw}
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanDatesError(
            f"{path}: anchor: not a date record ({exc!r}); it is written by the PoC's first "
            "run: restore it, or start a new PoC folder"
        ) from exc
    return PlanDates(anchor, forms, dates, fixed_at=raw.get("fixed_at"))


def stored_for(data: dict[str, Any]) -> PlanDates | None:
    """The stored dates of the PoC a plan's raw YAML data names (None: no PoC folder yet, or
    the plan's poc/data_dir are not plain names: its validation says why)."""
    poc, data_dir = data.get("poc"), data.get("data_dir", "data")
    if not isinstance(poc, str) or not isinstance(data_dir, str) or not _PLAIN.match(poc):
        return None
    return read_stored(data_dir, poc)


def raw_timezone(data: dict[str, Any]) -> str:
    """The plan's time zone as written (UTC when absent or not a string)."""
    window = data.get("window")
    schedules = window.get("schedules") if isinstance(window, dict) else None
    tz = schedules.get("timezone") if isinstance(schedules, dict) else None
    return tz if isinstance(tz, str) else "UTC"


def raw_forms(data: dict[str, Any]) -> dict[str, str]:
    """Each date field's form as written in the plan's raw data."""
    forms = {}
    for section, key in DATE_FIELDS:
        part = data.get(section)
        if isinstance(part, dict) and key in part:
            forms[f"{section}.{key}"] = form_of(part[key])
    return forms


def anchor_for(
    path: str, data: dict[str, Any], now: dt.datetime | None
) -> tuple[dt.date, PlanDates | None]:
    """The day a plan's relative dates count from: the PoC's fixed anchor, else today in the
    plan's time zone; and the stored record (None: no run yet)."""
    try:
        stored = stored_for(data)
    except PlanDatesError as exc:
        raise PlanError(path, [str(exc)]) from exc
    return (stored.anchor if stored else today_in(raw_timezone(data), now)), stored


def dates_of(
    start: dt.date,
    test_by: dt.date,
    anchor: dt.date | None = None,
    data: dict[str, Any] | None = None,
    stored: PlanDates | None = None,
) -> tuple[PlanDates, list[str]]:
    """A validated plan's dates, resolved against ``anchor`` (default: today, UTC), with
    their forms as written in ``data`` (none: the dates themselves); and a line for each form
    changed since the stored record: resolved again against the same anchor day."""
    dates = {"window.start": start, "exit.test_by": test_by}
    forms = {**{n: d.isoformat() for n, d in dates.items()}, **raw_forms(data or {})}
    anchor = anchor or today_in("UTC")
    if stored is None:
        return PlanDates(anchor, forms, dates), []
    changed = tuple(n for n in forms if stored.forms.get(n) != forms[n])
    warnings = [
        f"{name}: {forms[name]!r} now, {stored.forms.get(name)!r} when the PoC's dates were "
        f"fixed ({stored.fixed_at}): resolved again against the same anchor day "
        f"{anchor}: {dates[name]}"
        for name in changed
    ]
    return PlanDates(anchor, forms, dates, stored.fixed_at, changed), warnings


def _create_exclusively(path: Path, record: dict[str, Any]) -> bool:
    """Write ``path`` whole, only if it does not exist (two first runs: one wins)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # fails when another run fixed the dates first
        except FileExistsError:
            return False
        return True
    finally:
        tmp.unlink(missing_ok=True)


def fix_plan_dates(
    dates: PlanDates, data_dir: str | Path, poc: str, now: dt.datetime | None = None
) -> PlanDates:
    """At a run's start: fix the PoC's anchor if no run has yet (the dates this plan was
    resolved to), else check the plan was resolved against the fixed anchor. A form changed
    since is stored with its new date, under the same anchor. Returns the dates as fixed."""
    path = dates_file(data_dir, poc)
    stamp = (now or dt.datetime.now(dt.UTC)).isoformat()
    stored = read_stored(data_dir, poc)
    if stored is None:
        # The PoC's first run here: fix the anchor this plan was resolved against (also when
        # it came from another folder's dates: a plan copied to a new data_dir keeps its day).
        fixed = PlanDates(dates.anchor, dates.forms, dates.dates, fixed_at=stamp)
        if _create_exclusively(path, fixed.to_json()):
            return fixed
        stored = read_stored(data_dir, poc)  # another run fixed it first
    if stored is None:
        raise PlanDatesError(f"{path}: could not be created nor read")
    if stored.anchor != dates.anchor:
        raise PlanDatesError(
            f"{path}: anchor: the PoC's dates were fixed against {stored.anchor} (at "
            f"{stored.fixed_at}), but this plan was resolved against {dates.anchor} before "
            "that: load the plan again"
        )
    if stored.forms != dates.forms or stored.dates != dates.dates:
        write_json_atomically(
            path, PlanDates(stored.anchor, dates.forms, dates.dates, stored.fixed_at).to_json()
        )
    return PlanDates(stored.anchor, dates.forms, dates.dates, stored.fixed_at, dates.reresolved)
