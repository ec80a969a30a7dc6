"""The quarantine: rows that cannot be parsed, kept with a reason and their line number.

A quarantined row is written as it was read, except that what may name people or their work
becomes a keyed token: user and account always, the job name when the plan asks, and any field
that is not plainly an id, count, time or state (a site's dump may carry WorkDir, Group,
Comment, …).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from tasks.baseline.dump_layout import DumpLayout
from tasks.baseline.fields import KNOWN_STATES, normalise_state
from tasks.baseline.pseudonym import Pseudonymiser


@dataclass
class Quarantined:
    """A row that could not be parsed: its 1-based line, why, and the row fit to keep."""

    source_line: int
    reason: str
    raw: str


# Fields that name people or their work: never written in clear from a quarantined row.
_IDENTITY_PREFIX = {"User": "user", "Account": "account", "JobName": "name"}
# Values that cannot name anyone: ids, counts, times, durations, exit codes, sacct's words.
_PLAIN_VALUE_RE = re.compile(r"^[\d\s:_.+\-\[\]%,T]*$")
_PLAIN_WORDS = frozenset(("Unknown", "None", "None assigned", "UNLIMITED", "Partition_Limit"))


def _is_plain(value: str) -> bool:
    return (
        bool(_PLAIN_VALUE_RE.match(value))
        or value in _PLAIN_WORDS
        or normalise_state(value) in KNOWN_STATES
    )


def misaligned_raw(line: str, layout: DumpLayout, pseudonymiser: Pseudonymiser) -> str:
    """A line with the wrong field count, fit for the quarantine: its positions cannot be
    trusted to say which field is the user or the account, so besides the fields at those
    positions, every field that is not plainly an id, count, time or state becomes a keyed
    token."""
    delim = layout.delimiter.decode(errors="replace")
    out = []
    for i, value in enumerate(line.split(delim)):
        name = layout.names[i] if i < len(layout.names) else ""
        if value and (name in ("User", "Account") or not _is_plain(value)):
            value = pseudonymiser.token(_IDENTITY_PREFIX.get(name, "field"), value)
        out.append(value)
    return delim.join(out)


def quarantine_rows(
    table: pa.Table,
    lines: pa.Array,
    reason: pa.Array,
    bad: pa.Array,
    layout: DumpLayout,
    pseudonymiser: Pseudonymiser,
    pseudonymise_job_names: bool,
) -> list[Quarantined]:
    """The rejected rows as read, identities as keyed tokens: user and account always, the
    job name when the plan asks, and any field ckpt-poc does not read unless plainly an id,
    count, time or state (a site's dump may carry WorkDir, Group, Comment, …)."""
    tokens = {"User": "user", "Account": "account"}
    if pseudonymise_job_names:
        tokens["JobName"] = "name"
    delim = layout.delimiter.decode(errors="replace")
    rows = table.filter(bad).to_pylist()
    out = []
    for row, line, why in zip(
        rows, lines.filter(bad).to_pylist(), reason.filter(bad).to_pylist(), strict=True
    ):
        values = []
        for name, value in row.items():
            text = _raw_text(value)
            if text and name in tokens:
                text = pseudonymiser.token(tokens[name], text)
            elif text and name.startswith("_unknown") and not _is_plain(text):
                text = pseudonymiser.token("field", text)
            values.append(text)
        out.append(Quarantined(line, why, delim.join(values)))
    return out


def _raw_text(value: Any) -> str:
    """A value of the typed or the raw reader as the text it was read from."""
    if value is None:
        return ""
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%S")
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
