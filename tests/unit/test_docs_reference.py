"""docs/reference/datasets.md and docs/concepts/measures.md are what the declarations give
today (tasks/data/docs_reference.py writes them below their markers)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tasks.data.dataset_spec import Column
from tasks.data.datasets import DATASETS
from tasks.data.docs_reference import (
    PAGES,
    REGENERATE,
    REPO_ROOT,
    column_row,
    main,
    type_name,
)
from tasks.data.fingerprint import FINGERPRINT_COLUMNS
from tasks.data.measures import MEASURES

REPO = Path(__file__).resolve().parents[2]
DATASETS_PAGE, MEASURES_PAGE = PAGES


def _generated(page) -> str:
    return (REPO / page.path).read_text(encoding="utf-8").partition(page.marker)[2]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.path)
def test_the_committed_page_is_what_the_declarations_give_today(page) -> None:
    assert REPO_ROOT == REPO
    written = (REPO / page.path).read_text(encoding="utf-8")
    assert written == page.generated().text(written), (
        f"{page.path} is out of date with {page.source}: run {REGENERATE}"
    )


def test_every_dataset_has_its_section_and_every_column_a_row() -> None:
    generated = _generated(DATASETS_PAGE)
    for spec in DATASETS.values():
        assert f"\n### `{spec.name}`\n" in generated, spec.name
        assert f"Version {spec.version}. History:" in generated
        for column in spec.columns:
            if column.name not in FINGERPRINT_COLUMNS:
                assert f"| `{column.name}` | {type_name(column.type)} |" in generated
    assert "- 2: intended: `event` allows only the names" in generated
    assert "| `exit_code` | int64 | yes | 0–255 | 1 |" in generated
    assert "| `arm` | string | no | `unmanaged`, `managed` | 1 |" in generated


def test_the_hand_written_fingerprint_table_has_every_fingerprint_column() -> None:
    page = (REPO / DATASETS_PAGE.path).read_text(encoding="utf-8")
    hand = page.partition(DATASETS_PAGE.marker)[0]
    jobs = DATASETS["jobs"]
    for name in FINGERPRINT_COLUMNS:
        assert f"| `{name}` | {type_name(jobs.column(name).type)} |" in hand, name


def test_a_cell_escapes_pipes_and_says_what_an_older_null_means() -> None:
    column = Column(
        "mode",
        pa.string(),
        allowed=("a|b", "c"),
        doc="x | y",
        since=2,
        meaning_when_missing="not recorded",
    )
    row = column_row(column)
    assert row[3] == "`a\\|b`, `c`"
    assert row[4] == "2"
    assert row[5] == "x \\| y (null in files before version 2: not recorded)"


def test_every_measure_has_its_row() -> None:
    generated = _generated(MEASURES_PAGE)
    for m in MEASURES.values():
        assert f"\n| `{m.name}` | " in generated, m.name
    assert "| `success.restore_success_rate` (optional) |" in generated
    assert "`exit` in `decision.criteria`" in generated
    assert "| `cold_start_speedup` | native / restore ready time ≥ threshold × |" in generated


def test_check_mode_says_what_to_run_and_keeps_the_hand_written_part(
    tmp_path: Path, capsys
) -> None:
    for page in PAGES:
        out = tmp_path / page.path
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(f"# Page\n\nWritten by hand.\n\n{page.marker}\n\n### stale\n", "utf-8")
    assert main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert all(page.path in err for page in PAGES) and REGENERATE in err
    assert main(["--root", str(tmp_path)]) == 0
    for page in PAGES:
        text = (tmp_path / page.path).read_text(encoding="utf-8")
        assert text.startswith(f"# Page\n\nWritten by hand.\n\n{page.marker}\n\n")
        assert "### stale" not in text and text.endswith("|\n")
    assert main(["--check", "--root", str(tmp_path)]) == 0
    (tmp_path / MEASURES_PAGE.path).write_text("# Measures\n", encoding="utf-8")  # no marker
    assert main(["--root", str(tmp_path)]) == 1
    assert MEASURES_PAGE.marker in capsys.readouterr().err
