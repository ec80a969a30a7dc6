"""The plan's YAML itself: duplicate keys are refused naming both lines; a syntax error is one
line ``file:line:col: not valid YAML: what is wrong``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tasks.data.errors import PlanError
from tasks.data.plan import load_plan

REPO = Path(__file__).resolve().parents[2]
DEMO_TEXT = (REPO / "plans" / "demo.yaml").read_text()


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text.replace("data_dir: data", f"data_dir: {tmp_path / 'data'}"))
    return path


def _problems(path: Path) -> list[str]:
    with pytest.raises(PlanError) as info:
        load_plan(path)
    return info.value.problems


def _line_of(path: Path, text: str, after: int = 0) -> int:
    """The 1-based number of the first line after line ``after`` that equals ``text``."""
    lines = path.read_text().splitlines()
    return next(i for i, t in enumerate(lines, 1) if i > after and t == text)


def test_duplicate_keys_at_any_depth_name_both_lines(tmp_path: Path) -> None:
    text = DEMO_TEXT.replace("  keep: 3\n", "  keep: 3\n  interval_s: 5\n")  # in a block
    text = text.replace(  # in a flow mapping, on one line
        "{statistic: median, threshold: 30}", "{statistic: median, threshold: 30, threshold: 3}"
    )
    text += "repeats: 50\n"  # at the top
    path = _write(tmp_path, text)

    problems = _problems(path)

    assert len(problems) == 3, problems
    interval_first = next(
        i for i, t in enumerate(path.read_text().splitlines(), 1) if t.startswith("  interval_s:")
    )
    interval_again = _line_of(path, "  interval_s: 5")
    threshold_line = next(
        i for i, t in enumerate(path.read_text().splitlines(), 1) if "threshold: 3}" in t
    )
    repeats_first = _line_of(path, "repeats: 3")
    repeats_again = _line_of(path, "repeats: 50")
    assert (
        f"{path}:{interval_again}: checkpointer.interval_s: duplicate key 'interval_s', "
        f"first at line {interval_first}, again at line {interval_again}"
    ) in "\n".join(problems)
    assert any(
        p.startswith(f"{path}:{threshold_line}: success.recovery_time_s.threshold: duplicate key")
        and f"first at line {threshold_line}, again at line {threshold_line}" in p
        for p in problems
    ), problems
    assert any(
        p.startswith(f"{path}:{repeats_again}: repeats: duplicate key 'repeats'")
        and f"first at line {repeats_first}" in p
        for p in problems
    ), problems


def test_duplicate_key_inside_a_list_item(tmp_path: Path) -> None:
    path = _write(
        tmp_path, DEMO_TEXT.replace("  - kind: sigkill\n", "  - kind: sigkill\n    kind: x\n")
    )
    problems = _problems(path)
    assert len(problems) == 1
    assert ": faults.0.kind: duplicate key 'kind'" in problems[0]


def test_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    """`<<: *anchor` then a key of its own is YAML's way to override, not a duplicate."""
    text = DEMO_TEXT.replace(
        "recovery_time_s: {statistic: median, threshold: 30}",
        "recovery_time_s: &median30 {statistic: median, threshold: 30}",
    ).replace(
        "overhead_pct: {statistic: median, threshold: 2}",
        "overhead_pct: {<<: *median30, threshold: 2}",
    )
    plan = load_plan(_write(tmp_path, text))
    assert plan.success.overhead_pct.threshold == 2
    assert plan.success.overhead_pct.statistic == "median"


@pytest.mark.parametrize(
    ("broken", "replacement", "column", "what"),
    [
        ("poc: demo\n", "poc: demo: again\n", 10, "mapping values are not allowed here"),
        ("  keep: 3\n", "\tkeep: 3\n", 1, "found character '\\t' that cannot start any token"),
        ("  keep: 3\n", "  keep: [3\n", None, "expected ',' or ']'"),
        ("  keep: 3\n", "  keep: 3\x07\n", 10, "unacceptable character #x0007"),
    ],
    ids=["mapping-in-scalar", "tab", "unclosed-list", "control-character"],
)
def test_yaml_syntax_error_is_one_line_with_line_and_column(
    tmp_path: Path, broken: str, replacement: str, column: int | None, what: str
) -> None:
    path = _write(tmp_path, DEMO_TEXT.replace(broken, replacement))
    broken_line = next(
        i for i, t in enumerate(path.read_text().splitlines(), 1) if t == replacement.rstrip("\n")
    )

    problems = _problems(path)

    assert len(problems) == 1 and "\n" not in problems[0], problems
    match = re.fullmatch(rf"{re.escape(str(path))}:(\d+):(\d+): not valid YAML: (.+)", problems[0])
    assert match, problems[0]
    line, col = int(match[1]), int(match[2])
    # An unclosed list is noticed where the next token is, just below it.
    assert line == broken_line if column is not None else broken_line < line <= broken_line + 2
    if column is not None:
        assert col == column
    assert what in match[3]
