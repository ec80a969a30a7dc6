"""The site's reference pages from the declarations themselves: docs/reference/datasets.md
from every dataset's schema (tasks/data/datasets.py) and docs/concepts/measures.md from the
measure registry (tasks/data/measures.py), so a page says what the code declares.

    scripts/docs-reference            # write both pages
    scripts/docs-reference --check    # write nothing; exit 1 when a page is out of date

A page's top is prose kept by hand: everything down to its marker line is kept as it is, and
everything after it is written here, the same way every time.
"""

from __future__ import annotations

import html
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from tasks.data import generated
from tasks.data.dataset_spec import Column, DatasetSpec
from tasks.data.datasets import DATASETS
from tasks.data.fingerprint import FINGERPRINT_COLUMNS
from tasks.data.generated import Generated, below_marker
from tasks.data.measures import MEASURES, Measure

REPO_ROOT = Path(__file__).resolve().parents[2]
# What writes the pages again; said whenever one is out of date.
REGENERATE = "scripts/docs-reference"


def _cell(text: str, prose: bool = True) -> str:
    """Text for a table cell: one line, no column break; prose has no markup of its own
    (code spans keep their text as it is)."""
    text = " ".join(text.split())
    return (html.escape(text, quote=False) if prose else text).replace("|", "\\|")


def _code(names: Iterable[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def _row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: tuple[str, ...], rows: Iterable[Iterable[str]]) -> list[str]:
    rule = "|" + "|".join("---" for _ in header) + "|"
    return [_row(header), rule, *(_row(r) for r in rows)]


# --- datasets ----------------------------------------------------------------------------------


def type_name(t: pa.DataType) -> str:
    """A column's type as a reader sees it: `int64`, `float64`, `timestamp (UTC)`, …"""
    if pa.types.is_timestamp(t):
        return f"timestamp ({t.tz})" if t.tz else "timestamp"
    if pa.types.is_floating(t):
        return f"float{t.bit_width}"
    return str(t)


def values(column: Column) -> str:
    """What a column may hold: its allowed values, its bounds."""
    said = [_code(column.allowed)] if column.allowed is not None else []
    low, high = column.min, column.max
    if low is not None and high is not None:
        said.append(f"{low:g}–{high:g}")
    elif low is not None:
        said.append(f"≥ {low:g}")
    elif high is not None:
        said.append(f"≤ {high:g}")
    return "; ".join(said)


def meaning(column: Column) -> str:
    """The declaration's note, and what a null means in files older than the column."""
    text = " ".join(column.doc.split())
    if column.meaning_when_missing:
        older = f"null in files before version {column.since}: {column.meaning_when_missing}"
        text = f"{text} ({older})" if text else older
    return text


def column_row(column: Column) -> list[str]:
    return [
        f"`{column.name}`",
        type_name(column.type),
        "yes" if column.nullable else "no",
        _cell(values(column), prose=False),
        str(column.since),
        _cell(meaning(column)),
    ]


def _ends_with_fingerprint(spec: DatasetSpec) -> bool:
    tail = spec.column_names[len(spec.columns) - len(FINGERPRINT_COLUMNS) :]
    return tuple(tail) == FINGERPRINT_COLUMNS


def dataset_section(spec: DatasetSpec) -> str:
    """One dataset's section: name, note, key, version and history, renames, columns."""
    lines = [f"### `{spec.name}`", ""]
    if spec.doc:
        lines += [html.escape(" ".join(spec.doc.split()), quote=False), ""]
    lines += [
        f"Key: {_code(spec.key)}. Partitioned by the ISO week of `{spec.week_from}`.",
        "",
        f"Version {spec.version}. History:",
        "",
        *(f"- {html.escape(line, quote=False)}" for line in spec.history),
        "",
    ]
    for r in spec.renamed:
        lines += [
            f"Renamed in version {r.since}: `{r.column}` `{r.old}` is now `{r.new}` "
            "(older files are read with the new name).",
            "",
        ]
    columns = spec.columns
    if _ends_with_fingerprint(spec):
        columns = columns[: -len(FINGERPRINT_COLUMNS)]
    rows = [column_row(c) for c in columns]
    if len(columns) < len(spec.columns):
        first, last = FINGERPRINT_COLUMNS[0], FINGERPRINT_COLUMNS[-1]
        rows.append(
            [
                f"`{first}` … `{last}`",
                "",
                "",
                "",
                "",
                "the run's fingerprint ([above](#the-fingerprint))",
            ]
        )
    header = ("column", "type", "null", "values", "since", "meaning")
    return "\n".join([*lines, *_table(header, rows), ""])


def datasets_markdown() -> str:
    """Every dataset's section, in the declaration's order."""
    return "\n".join(dataset_section(spec) for spec in DATASETS.values())


# --- measures ----------------------------------------------------------------------------------


def _criterion(m: Measure) -> str:
    if m.criterion is not None:
        optional = " (optional)" if m.criterion.optional else ""
        return f"`success.{m.criterion.name}`{optional}"
    if m.decided_as is not None:
        return f"none: its own rule, `{m.decided_as}` in `decision.criteria`"
    return ""


def _source(m: Measure) -> str:
    """Where its figure comes from: the dataset, the trials it pools, the column."""
    said = f"`{m.dataset}`"
    if m.trials is not None:
        said += f" (measure `{m.trials}`)"
    if m.column is not None:
        said += f", column `{m.column}`"
    if m.statistic is not None:
        said += f", its {m.statistic}"
    if m.also_reads:
        said += f"; also {_code(m.also_reads)}"
    return said


def _evidence(m: Measure) -> str:
    if m.evidence is None:
        return ""
    estimated = " (estimated at the measured rate)" if m.evidence.estimated else ""
    return f"`{m.evidence.stage}`: {m.evidence.unit}{estimated}"


def measure_row(m: Measure) -> list[str]:
    return [
        f"`{m.name}`",
        _cell(m.title),
        _cell(m.unit),
        m.direction.replace("_", " ") if m.decision else "",
        _cell(_criterion(m), prose=False),
        _cell(_source(m), prose=False),
        _code(m.gate_names),
        _cell(_evidence(m)),
        f"`{m.computed_in}`",
        "verdict" if m.verdict else "information",
    ]


def criteria_rows() -> list[list[str]]:
    """The plan's `success:` fields, as the registry declares them."""
    rows = []
    for m in MEASURES.values():
        c = m.criterion
        if c is not None:
            floor = f"threshold {c.floor}" if c.floor else ""
            optional = "yes" if c.optional else "no"
            rows.append([f"`{c.name}`", _cell(c.description), c.model, optional, _cell(floor)])
    return rows


def measures_markdown() -> str:
    """Every measure of the registry, in its order, then the plan's criteria."""
    head = ("measure", "title", "unit", "direction", "plan criterion", "from", "gates")
    tail = ("evidence", "computed in", "kind")
    measures = _table((*head, *tail), map(measure_row, MEASURES.values()))
    criteria = _table(
        ("`success:` field", "what the plan states", "model", "optional", "must be"),
        criteria_rows(),
    )
    return "\n".join([*measures, "", "The plan's criteria:", "", *criteria, ""])


# --- the pages ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """A page: where it lives under the repository, what its generated part is written from."""

    path: str
    source: str
    body: Callable[[], str]

    @property
    def marker(self) -> str:
        """The line the hand-written part ends with (an HTML comment: the site hides it)."""
        return (
            f"<!-- Below: written by {REGENERATE} from {self.source}; "
            "edit the declarations there, not this page. -->"
        )

    def generated(self) -> Generated:
        """The page as a generated file: its hand-written part kept down to the marker."""
        return Generated(
            self.path, self.source, REGENERATE, below_marker(self.path, self.marker, self.body)
        )


PAGES = (
    Page("docs/reference/datasets.md", "tasks/data/datasets.py", datasets_markdown),
    Page("docs/concepts/measures.md", "tasks/data/measures.py", measures_markdown),
)


def main(argv: list[str] | None = None) -> int:
    return generated.main(
        [page.generated() for page in PAGES],
        "Write the datasets and measures pages from the code.",
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
