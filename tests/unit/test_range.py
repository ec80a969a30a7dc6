"""The range of applications (plans/range.yaml): the plan, its inputs and their own restarts.

What is checked here is the range's own material, without CRIU: the plan checks, the LAMMPS
input is the bundled melt example, the package sets install what the plan runs, and each
application's own checkpoint resumes to the uninterrupted run's numbers (the unmanaged arm's
recoverable point). tests/integration/test_range_sweep.py takes each application through CRIU.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tasks.data.plan import load_plan

REPO = Path(__file__).resolve().parents[2]
RANGE_PLAN = REPO / "plans" / "range.yaml"
BUNDLED_MELT = Path("/usr/share/lammps/examples/melt/in.melt")
# What each workload of the range runs, from which Debian package (scripts/setup-debian @range).
PROGRAMS = {
    "gmx": "gromacs",
    "gmx_mpi": "gromacs",
    "lmp": "lammps",
    "mpirun": "openmpi-bin",
    "redis-server": "redis-server",
    "redis-cli": "redis-server",
}


def need(*programs: str) -> None:
    """Fail (never skip) naming the package when a program of the range is missing."""
    missing = [p for p in programs if shutil.which(p) is None]
    if missing:
        packages = sorted({PROGRAMS.get(p, p) for p in missing})
        pytest.fail(
            f"{', '.join(missing)} not installed: run scripts/setup-debian @range "
            f"(Debian {' '.join(packages)}); scripts/test does"
        )


def test_range_plan_checks_and_every_workload_has_a_fidelity_check() -> None:
    plan = load_plan(RANGE_PLAN, check_cluster=False)
    names = [w.name for w in plan.workloads]
    assert names == [
        "digits-train",
        "digits-serve",
        "sklearn-mlp",
        "gromacs-water",
        "lammps-melt",
        "mpi-gromacs",
        "redis",
    ]
    assert plan.workload.name == "digits-train"  # the comparisons run the shipped example
    assert plan.compatibility.cycles == 3
    for workload in plan.workloads:
        assert workload.fidelity is not None, workload.name
        assert workload.fidelity.files or workload.fidelity.query, workload.name


def test_every_program_the_range_runs_comes_from_a_package_setup_installs() -> None:
    plan = load_plan(RANGE_PLAN, check_cluster=False)
    text = (REPO / "scripts" / "setup-debian").read_text()
    listed = re.search(r"^range_packages=\(([^)]*)\)", text, re.M)
    assert listed, "scripts/setup-debian has no range_packages=(...) list"
    packages = set(listed.group(1).split())
    programs = {w.command[0] for w in plan.workloads if w.command}
    programs |= {argv[0] for w in plan.workloads for argv in w.prepare}
    programs |= {w.fidelity.query[0] for w in plan.workloads if w.fidelity and w.fidelity.query}
    programs |= {"gmx_mpi"}  # mpirun's program
    for program in sorted(programs - {"python"}):
        assert PROGRAMS[program] in packages, program
    assert (REPO / "scripts" / "test").read_text().count("@range") >= 1


def test_setup_debian_refuses_an_unknown_set_by_name() -> None:
    done = subprocess.run(
        [str(REPO / "scripts" / "setup-debian"), "@nosuch"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "unknown package set @nosuch (known: @range, @demo)" in done.stderr


def _commands(text: str) -> list[str]:
    """LAMMPS commands of an input, comments dropped, whitespace made single."""
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [" ".join(line.split()) for line in lines if line]


def test_lammps_input_runs_the_bundled_melt_example() -> None:
    need("lmp")
    assert BUNDLED_MELT.is_file(), "Debian lammps-examples not installed (setup-debian @range)"
    ours = (REPO / "examples" / "range" / "lammps" / "in.melt").read_text()
    setup = ours.split("# melt: begin", 1)[1].split("# melt: end", 1)[0]
    bundled = _commands(BUNDLED_MELT.read_text())
    # Ours is the bundled setup, in its order, up to its first output command.
    first_output = next(i for i, c in enumerate(bundled) if c.split()[0] in ("dump", "thermo"))
    assert _commands(setup) == bundled[:first_output]


def _run(argv: list[str], cwd: Path, timeout: float = 120) -> str:
    done = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{argv[0]} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout
