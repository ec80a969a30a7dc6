"""Submit, Start and End in every format sacct prints them, detected per column from the values.

sacct formats times with Slurm's ``slurm_make_time_str`` (src/common/parse_time.c), as
``SLURM_TIME_FORMAT`` says:

- unset or ``standard``: ``%Y-%m-%dT%H:%M:%S`` (ISO);
- ``relative``: relative to the day sacct ran: that day ``%H:%M:%S``, the day before
  ``Ystday %H:%M``, the day after ``Tomorr %H:%M``, 2–6 days ahead ``%a %H:%M``, otherwise
  within a year ``%-d %b %H:%M`` and further ``%-d %b %Y`` (a date alone);
- any strftime string a site set (``%s``, epoch seconds, as Princeton's jobstats asks for;
  ``%Y-%m-%d %H:%M:%S``; ``%m/%d/%y-%H:%M:%S``; …).

A column's format is detected from a sample of its values (``detect_time_format``), then the
whole column is parsed with it in vectorised Arrow compute (``parse_times``); a value that
does not fit is quarantined naming the format.

Time zone: sacct prints local time. As ever in ckpt-poc, a dump's wall-clock times are read as
UTC (live sacct runs with ``TZ=UTC``; take dumps with ``TZ=UTC`` for exact times, as Open
XDMoD does); ``%s`` is exact whatever the zone.

Relative times need the day sacct ran (the anchor). ckpt-poc takes the dump file's mtime (its
UTC date): it is when sacct wrote the file, where the dump's own newest time is in a relative
dump itself relative. A copy that did not keep the mtime (``cp`` without ``-p``) moves every
relative time; ``relative_to`` (``--dumped-on``) overrides it. A ``%-d %b`` form without a
year is the latest such day not after the anchor's week (accounting is history).
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from tasks.baseline.dump_layout import DumpLayout
from tasks.baseline.fields import ABSENT, PLAUSIBLE_FROM, PLAUSIBLE_UNTIL, as_utf8
from tasks.data.errors import AccountingError

ISO_FORMAT = "%Y-%m-%dT%H:%M:%S"
TIME_FIELDS = ("Submit", "Start", "End")
_UTC = pa.timestamp("us", tz="UTC")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MON = "(?:" + "|".join(_MONTHS) + ")"
_DAY = "(?:" + "|".join(_WEEKDAYS) + ")"
# The forms of SLURM_TIME_FORMAT=relative, by name (see the module docstring).
RELATIVE_FORMS = {
    "today": r"^\d{2}:\d{2}:\d{2}$",
    "yesterday": r"^Ystday \d{2}:\d{2}$",
    "tomorrow": r"^Tomorr \d{2}:\d{2}$",
    "weekday": rf"^{_DAY} \d{{2}}:\d{{2}}$",
    "day_month": rf"^\d{{1,2}} {_MON} \d{{2}}:\d{{2}}$",
    "day_month_year": rf"^\d{{1,2}} {_MON} \d{{4}}$",
}
_RELATIVE_RE = re.compile("|".join(f"(?:{p})" for p in RELATIVE_FORMS.values()))
_EPOCH_RE = re.compile(r"^\d{9,10}$")
_ISO_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}$")
_EPOCH_BOUNDS = (
    int(PLAUSIBLE_FROM.replace(tzinfo=dt.UTC).timestamp()),
    int(PLAUSIBLE_UNTIL.replace(tzinfo=dt.UTC).timestamp()),
)


@dataclass(frozen=True)
class TimeFormat:
    """How one time column is written: ``kind`` standard | epoch | relative | strftime."""

    kind: str
    strftime: str = ISO_FORMAT  # standard and strftime kinds
    anchor: dt.date | None = None  # relative: the day sacct ran
    anchor_origin: str = ""  # relative: where the anchor came from
    note: str = ""  # an assumption detection had to make

    @property
    def label(self) -> str:
        """What the reports say was found."""
        if self.kind == "standard":
            text = f"standard ({ISO_FORMAT})"
        elif self.kind == "epoch":
            text = "%s (epoch seconds)"
        elif self.kind == "relative":
            text = f"relative (to {self.anchor}, {self.anchor_origin})"
        else:
            text = f"strftime {self.strftime}"
        return f"{text}; {self.note}" if self.note else text


STANDARD = TimeFormat("standard")
EPOCH = TimeFormat("epoch")


# --- detection -------------------------------------------------------------------------------


def detect_time_format(
    values: Sequence[str], anchor: dt.date | None = None, anchor_origin: str = ""
) -> TimeFormat | None:
    """The format most present values in ``values`` (a sample of one column) are written in
    (a damaged value is quarantined later, not a reason to misread the rest); None when the
    sample has no value or no format fits any."""
    present = [v.strip() for v in values if v.strip() not in ABSENT]
    if not present:
        return None
    counts: list[tuple[int, TimeFormat]] = [
        (sum(1 for v in present if _ISO_RE.match(v)), STANDARD),
        (sum(1 for v in present if _is_epoch(v)), EPOCH),
        (
            sum(1 for v in present if _RELATIVE_RE.match(v)),
            # Without an anchor the caller refuses the dump, saying what to give.
            TimeFormat("relative", anchor=anchor, anchor_origin=anchor_origin),
        ),
    ]
    best, fmt = max(counts, key=lambda c: c[0])  # the first of equals: standard, epoch, …
    if best < len(present):
        fitting, strftime = _detect_strftime(present)
        if fitting > best:
            best, fmt = fitting, strftime
    return fmt if best else None


def _is_epoch(value: str) -> bool:
    return bool(_EPOCH_RE.match(value)) and _EPOCH_BOUNDS[0] <= int(value) < _EPOCH_BOUNDS[1]


def _detect_strftime(present: list[str]) -> tuple[int, TimeFormat]:
    """The candidate (see ``strftime_candidates``) that parses the most sampled values into
    plausible times, and how many; noted when another parses as many (day/month order)."""
    sample = pa.array(present, pa.string())
    # One value of each of the commonest shapes (digits and words alike): values of one
    # format may differ in shape (a space-padded day), and damaged ones have their own.
    shapes: dict[str, list[str]] = {}
    for v in present:
        shapes.setdefault(_shape(v), []).append(v)
    examples = [vs[0] for vs in sorted(shapes.values(), key=len, reverse=True)[:5]]
    # Candidates differing only in runs of spaces parse alike (strptime skips whitespace).
    by_spacing = {re.sub(r"\s+", " ", c): c for v in examples for c in strftime_candidates(v)}
    scored = [(_fitting(sample, c), c) for c in by_spacing.values()]
    if not scored:
        return 0, STANDARD
    best = max(n for n, _ in scored)
    fitting = [c for n, c in scored if n == best]
    note = f"{fitting[1]} fits the sample too: the first candidate taken" if fitting[1:] else ""
    return best, TimeFormat("strftime", strftime=fitting[0], note=note)


def _shape(value: str) -> str:
    return re.sub(r"\d", "9", re.sub(r"[A-Za-z]+", "a", value))


def _fitting(sample: pa.Array, fmt: str) -> int:
    """How many values ``fmt`` parses into plausible times."""
    parsed = pc.strptime(sample, fmt, "s", error_is_null=True)
    low = pa.scalar(PLAUSIBLE_FROM, pa.timestamp("s"))
    high = pa.scalar(PLAUSIBLE_UNTIL, pa.timestamp("s"))
    plausible = pc.and_(pc.greater_equal(parsed, low), pc.less(parsed, high))
    return pc.sum(pc.fill_null(plausible, False)).as_py() or 0


_TOKEN_RE = re.compile(r"\d+|[A-Za-z]+|[^\dA-Za-z]+")
# Date-part orders to try, the most common first.
_DATE_ORDERS = {
    3: (("%m", "%d", "%y"), ("%d", "%m", "%y"), ("%y", "%m", "%d")),
    2: (("%m", "%d"), ("%d", "%m")),
    1: (("%d",),),
}
_YEAR_FIRST_ORDERS = (("%m", "%d"),)  # after a four-digit year: always year, month, day
# Digit runs holding several fields (ISO 8601's basic form and the like): a date is always
# year first there; a time after such a date is hours and minutes, with seconds or not.
_PACKED_DATES = {8: "%Y%m%d", 12: "%Y%m%d%H%M", 14: "%Y%m%d%H%M%S"}
_PACKED_TIMES = {4: "%H%M", 6: "%H%M%S"}


def strftime_candidates(value: str) -> list[str]:
    """strftime formats that could have written ``value``: each digit run given a role (four
    digits a year, runs around ':' a time, 8, 12 or 14 digits a packed year-first date and
    time, the rest day, month or two-digit year in every order), each word a month or
    weekday name, AM/PM, or itself."""
    tokens = _TOKEN_RE.findall(value)
    roles: list[str | None] = []
    has_year = has_month = has_day = am_pm = False
    time_roles = iter(("%H", "%M", "%S"))
    for i, tok in enumerate(tokens):
        near_colon = (i + 1 < len(tokens) and tokens[i + 1] == ":") or (
            i > 0 and tokens[i - 1] == ":"
        )
        packed_date = has_day and "%Y%m%d" in "".join(r or "" for r in roles)
        if tok.isdigit() and near_colon:
            roles.append(next(time_roles, None) or "")
        elif tok.isdigit() and len(tok) in _PACKED_DATES and tok[:2] in ("19", "20"):
            roles.append(_PACKED_DATES[len(tok)])
            has_year = has_month = has_day = True
        elif tok.isdigit() and len(tok) in _PACKED_TIMES and packed_date:
            roles.append(_PACKED_TIMES[len(tok)])
        elif tok.isdigit() and len(tok) == 4:
            roles.append("%Y")
            has_year = True
        elif tok.isdigit() and len(tok) <= 2:
            roles.append(None)  # a date part, filled in below
        elif tok.isdigit():
            return []
        elif tok.isalpha():
            role = _word_role(tok)
            has_month = has_month or role in ("%b", "%B")
            am_pm = am_pm or role == "%p"
            roles.append(role)
        else:
            roles.append(tok.replace("%", "%%"))
    if "" in roles:
        return []
    needed = [
        *([] if has_day else ["%d"]),
        *([] if has_month else ["%m"]),
        *([] if has_year else ["%y"]),
    ]
    open_slots = [i for i, r in enumerate(roles) if r is None]
    if len(open_slots) != len(needed):
        return []
    if not needed:
        fmt = "".join(r or "" for r in roles)
        return [fmt.replace("%H", "%I") if am_pm else fmt]
    orders = _DATE_ORDERS[len(needed)]
    if has_year and len(needed) == 2 and roles.index("%Y") < open_slots[0]:
        orders = _YEAR_FIRST_ORDERS
    elif len(needed) == 2 and "." in value:  # 04.09.2026: day first where dots are used
        orders = orders[::-1]
    out = []
    for order in orders:
        if sorted(order) != sorted(needed):
            continue
        filled = list(roles)
        for slot, role in zip(open_slots, order, strict=True):
            filled[slot] = role
        fmt = "".join(r or "" for r in filled)
        out.append(fmt.replace("%H", "%I") if am_pm else fmt)
    return out


def _word_role(word: str) -> str:
    title = word.title()
    if title[:3] in _MONTHS:
        return "%b" if len(word) == 3 else "%B"
    if title[:3] in _WEEKDAYS:
        return "%a" if len(word) == 3 else "%A"
    if word.upper() in ("AM", "PM"):
        return "%p"
    return word.replace("%", "%%")


# --- parsing a column ------------------------------------------------------------------------


def parse_times(col: pa.Array, fmt: TimeFormat) -> tuple[pa.Array, pa.Array]:
    """(UTC timestamps, bad mask) of one time column written in ``fmt``; absent values
    (``Unknown``, ``None``, empty) are null and not bad."""
    if pa.types.is_timestamp(col.type):  # the typed reader converted ISO already
        return pc.cast(pc.cast(col, pa.timestamp("us")), _UTC), pa.repeat(
            pa.scalar(False), len(col)
        )
    if pa.types.is_integer(col.type):  # the typed reader read epoch seconds
        parsed = pc.cast(pc.cast(col, pa.timestamp("s")), pa.timestamp("us"))
        return pc.cast(parsed, _UTC), pa.repeat(pa.scalar(False), len(col))
    raw, bad_utf8 = as_utf8(col)
    text = pc.utf8_trim_whitespace(pc.fill_null(raw, ""))
    if pa.types.is_dictionary(text.type):
        text = text.dictionary_decode()
    absent = pc.is_in(text, pa.array(ABSENT))
    if fmt.kind == "epoch":
        ok = pc.match_substring_regex(text, r"^\d{1,12}$")
        digits = pc.if_else(ok, text, pa.scalar(None, pa.string()))
        parsed = pc.cast(
            pc.cast(pc.cast(digits, pa.int64()), pa.timestamp("s")), pa.timestamp("us")
        )
    elif fmt.kind == "relative":
        parsed = _parse_relative(text, fmt.anchor or dt.date(1970, 1, 1))
    else:
        parsed = pc.strptime(text, fmt.strftime, "us", error_is_null=True)
    bad = pc.or_(pc.and_(pc.is_null(parsed), pc.invert(absent)), bad_utf8)
    return pc.cast(parsed, _UTC), bad


def _from_epoch(seconds: pa.Array) -> pa.Array:
    return pc.cast(pc.cast(seconds, pa.timestamp("s")), pa.timestamp("us"))


def _on(text: pa.Array, day: dt.date, fmt: str) -> pa.Array:
    """``text`` (a time of day, as ``fmt``) on ``day``."""
    dated = pc.binary_join_element_wise(pa.scalar(day.isoformat()), text, " ")
    return pc.strptime(dated, f"%Y-%m-%d {fmt}", "us", error_is_null=True)


def _parse_relative(text: pa.Array, anchor: dt.date) -> pa.Array:
    """Each relative form where it matches, resolved against ``anchor`` (the day sacct ran)."""
    null = pa.scalar(None, pa.timestamp("us"))
    out = pa.nulls(len(text), pa.timestamp("us"))

    def where(form: str, parsed: pa.Array) -> None:
        nonlocal out
        match = pc.match_substring_regex(text, RELATIVE_FORMS[form])
        out = pc.if_else(match, parsed, out)

    where("today", _on(text, anchor, "%H:%M:%S"))
    tail = pc.utf8_slice_codeunits(text, 7)  # after "Ystday " / "Tomorr "
    where("yesterday", _on(tail, anchor - dt.timedelta(days=1), "%H:%M"))
    where("tomorrow", _on(tail, anchor + dt.timedelta(days=1), "%H:%M"))
    # A weekday name: the day 2 to 6 days after the anchor that has it.
    clock = pc.utf8_slice_codeunits(text, 4)
    weekday = pc.utf8_slice_codeunits(text, 0, 3)
    for ahead in range(2, 7):
        day = anchor + dt.timedelta(days=ahead)
        named = pc.equal(weekday, _WEEKDAYS[day.weekday()])
        at = pc.if_else(named, _on(clock, day, "%H:%M"), null)
        where("weekday", pc.coalesce(at, out))
    # Day and month without a year: this year's, unless that is more than six days ahead
    # of the anchor (the "%a" form would have been printed): then last year's.
    this_year = _with_year(text, anchor.year, "%d %b %H:%M")
    last_year = _with_year(text, anchor.year - 1, "%d %b %H:%M")
    limit = pa.scalar(dt.datetime.combine(anchor + dt.timedelta(days=7), dt.time()))
    ahead = pc.fill_null(pc.greater_equal(this_year, limit), True)
    where("day_month", pc.if_else(ahead, last_year, this_year))
    where("day_month_year", pc.strptime(text, "%d %b %Y", "us", error_is_null=True))
    return out


def _with_year(text: pa.Array, year: int, fmt: str) -> pa.Array:
    return pc.strptime(
        pc.binary_join_element_wise(text, pa.scalar(str(year)), " "),
        f"{fmt} %Y",
        "us",
        error_is_null=True,
    )


def parse_dumped_on(text: str | None) -> dt.date | None:
    """``--dumped-on``'s value as a date; anything but YYYY-MM-DD is refused naming the flag."""
    if text is None:
        return None
    try:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            raise ValueError(text)
        return dt.date.fromisoformat(text)
    except ValueError:
        raise AccountingError(
            f"--dumped-on: {text!r} is not a date as YYYY-MM-DD (the day sacct wrote the dump)"
        ) from None


def file_anchor(path: str) -> tuple[dt.date, str]:
    """The UTC date of a dump file's mtime: when sacct wrote it (see the module docstring)."""
    mtime = dt.datetime.fromtimestamp(os.stat(path).st_mtime, dt.UTC)
    return mtime.date(), f"the file's mtime {mtime:%Y-%m-%dT%H:%M:%SZ}"


# --- a dump's time columns -------------------------------------------------------------------

SAMPLE_LINES = 2000  # rows each time column's format is detected from


def detect_dump_time_formats(
    sample: bytes, layout: DumpLayout, where: str, anchor: tuple[dt.date, str] | None = None
) -> dict[str, TimeFormat]:
    """Each time field the dump has → its format, from the first SAMPLE_LINES rows of
    ``sample`` (the dump's first bytes after any header). A column without a value there
    takes another column's format, else the standard one; so does a column whose values fit
    none (each such row is quarantined saying so)."""
    delim = layout.delimiter
    columns = {name: layout.names.index(name) for name in TIME_FIELDS if name in layout.names}
    values: dict[str, list[str]] = {name: [] for name in columns}
    for line in sample.split(b"\n")[:SAMPLE_LINES]:
        fields = line.rstrip(b"\r").split(delim)
        if len(fields) > layout.n_fields:
            continue
        for name, i in columns.items():
            if i < len(fields):
                values[name].append(fields[i].decode("utf-8", "replace"))
    day, origin = anchor if anchor else (None, "")
    found: dict[str, TimeFormat | None] = {
        name: detect_time_format(vals, day, origin) for name, vals in values.items()
    }
    for name, fmt in found.items():
        if fmt is not None and fmt.kind == "relative" and fmt.anchor is None:
            raise AccountingError(
                f"{where}: {name} is in SLURM_TIME_FORMAT=relative form ({values[name][0]!r}), "
                "which only the day sacct ran dates; read the dump from its file (its mtime "
                "gives the day) or take it again with SLURM_TIME_FORMAT=standard"
            )
    fallback = next((f for f in found.values() if f is not None), STANDARD)
    return {name: fmt or fallback for name, fmt in found.items()}
