"""plan check: the way out must exist — exit.uninstall's program is there and executable."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.data.errors import PlanError
from tasks.data.plan import REPO_ROOT, load_plan


def _problems(path: Path) -> list[str]:
    with pytest.raises(PlanError) as info:
        load_plan(path, check_cluster=False)
    return info.value.problems


def test_demo_uninstall_script_resolves_against_the_repo(write_plan) -> None:
    # The plan lives in a temp folder; scripts/uninstall-criu is the repo's.
    assert (REPO_ROOT / "scripts" / "uninstall-criu").is_file()
    assert load_plan(write_plan(), check_cluster=False).exit.uninstall == ["scripts/uninstall-criu"]


def test_missing_uninstall_script_is_a_problem_with_its_line(write_plan) -> None:
    path = write_plan({"exit.uninstall": ["scripts/no-such-uninstall"]})
    problems = _problems(path)
    line = next(i for i, t in enumerate(path.read_text().splitlines(), 1) if "uninstall:" in t)
    assert any(
        p.startswith(f"{path}:{line}: exit.uninstall: 'scripts/no-such-uninstall' does not exist")
        for p in problems
    ), problems


def test_uninstall_script_that_is_not_executable_is_a_problem(write_plan, tmp_path) -> None:
    script = tmp_path / "uninstall.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    problems = _problems(write_plan({"exit.uninstall": [str(script), "--all"]}))
    assert any("exit.uninstall:" in p and "is not executable" in p for p in problems), problems
    script.chmod(0o755)
    assert load_plan(write_plan({"exit.uninstall": [str(script)]}), check_cluster=False)


def test_bare_name_is_looked_up_on_path(write_plan) -> None:
    assert load_plan(write_plan({"exit.uninstall": ["true"]}), check_cluster=False)
    problems = _problems(write_plan({"exit.uninstall": ["no-such-uninstaller-xyz"]}))
    assert any(
        "exit.uninstall: 'no-such-uninstaller-xyz' is not found on PATH" in p for p in problems
    )


def test_bare_name_on_a_slurm_plan_runs_on_the_nodes_so_only_a_warning(write_plan) -> None:
    path = write_plan(
        {
            "exit.uninstall": ["no-such-uninstaller-xyz", "destroy"],
            "cluster": {"kind": "slurm", "nodes": ["n1"], "queue": "poc"},
            "faults": [{"kind": "scancel"}],
        }
    )
    plan = load_plan(path, check_cluster=False)
    assert any("not checked there" in w for w in plan.check_warnings)
