"""The range of applications (plans/range.yaml): the plan, its inputs and their own restarts.

What is checked here is the range's own material, without CRIU: the plan checks, the LAMMPS
input is the bundled melt example, the package sets install what the plan runs, and each
application's own checkpoint resumes to the uninterrupted run's numbers (the unmanaged arm's
recoverable point). tests/integration/test_range_sweep.py takes each application through CRIU.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.unit.test_range import REPO, _run, need


def test_sklearn_job_resumed_from_its_own_checkpoint_ends_as_an_uninterrupted_run(
    tmp_path: Path,
) -> None:
    # ~4 s: three short runs of scikit-learn (most of it the import).
    job = [sys.executable, "-m", "examples.range.sklearn_mlp", "--steps", "300"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    whole.mkdir()
    parts.mkdir()
    _run([*job, "--checkpoint-dir", str(whole)], REPO)
    first = [*job[:-1], "150", "--checkpoint-every", "50", "--checkpoint-dir", str(parts)]
    _run(first, REPO)
    out = _run([*job, "--checkpoint-every", "50", "--checkpoint-dir", str(parts), "--resume"], REPO)
    assert "resumed step=150" in out
    assert (parts / "final.txt").read_text() == (whole / "final.txt").read_text()
    assert (whole / "final.txt").read_text().startswith("final step=300 accuracy=")


def test_lammps_resumed_from_its_own_restart_file_prints_the_same_thermo(tmp_path: Path) -> None:
    # ~8 s: 2000 steps whole, then 1500 and a resume from restart.1000 to 2000.
    need("lmp")
    melt = str(REPO / "examples" / "range" / "lammps" / "in.melt")
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    for folder in (whole, parts):
        folder.mkdir()
    lmp = ["lmp", "-in", melt, "-log", "none", "-var", "dir"]
    ref = _run([*lmp, str(whole), "-var", "steps", "2000"], tmp_path)
    _run([*lmp, str(parts), "-var", "steps", "1500"], tmp_path)
    assert sorted(p.name for p in parts.glob("restart.*")) == ["restart.1000"]
    out = _run([*lmp, str(parts), "-var", "steps", "2000", "-var", "resume", "1"], tmp_path)
    thermo = re.compile(r"^\s*(1[1-9]|20)00\s.*$", re.M)  # steps 1100..2000
    assert [m.group(0) for m in thermo.finditer(out)] == [m.group(0) for m in thermo.finditer(ref)]
    assert (parts / "final.txt").read_text() == (whole / "final.txt").read_text()


def test_gromacs_continued_from_its_own_checkpoint_writes_the_same_energies(
    tmp_path: Path,
) -> None:
    # ~10 s: the water box built as the plan's prepare builds it (8000 steps: convert-tpr),
    # run whole; then stopped by SIGTERM (mdrun writes md.cpt and exits) and continued, -cpi.
    need("gmx")
    mdp, top = (str(REPO / "examples" / "range" / "gromacs" / f) for f in ("md.mdp", "topol.top"))
    gmx = ["gmx", "-quiet"]
    box = ["-cs", "spc216.gro", "-box", "1.8", "1.8", "1.8", "-o", "water.gro"]
    _run([*gmx, "solvate", *box], tmp_path)
    grompp = ["-f", mdp, "-c", "water.gro", "-p", top, "-o", "full.tpr", "-po", "mdout.mdp"]
    _run([*gmx, "grompp", *grompp], tmp_path)
    _run([*gmx, "convert-tpr", "-s", "full.tpr", "-nsteps", "8000", "-o", "md.tpr"], tmp_path)
    env = {**os.environ, "GMX_MAXBACKUP": "-1"}

    def mdrun(name: str) -> list[str]:
        out = tmp_path / name
        out.mkdir(exist_ok=True)
        files = ["-s", "md.tpr", "-deffnm", str(out / "md"), "-cpi", str(out / "md.cpt")]
        return [*gmx, "mdrun", "-nt", "1", "-reprod", *files]

    subprocess.run(mdrun("whole"), cwd=tmp_path, env=env, capture_output=True, check=True)
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    first = subprocess.Popen(mdrun("parts"), cwd=tmp_path, env=env, **quiet)
    time.sleep(0.8)
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=60) in (0, 1), "mdrun did not stop on SIGTERM"
    assert (tmp_path / "parts" / "md.cpt").is_file(), "mdrun wrote no checkpoint on SIGTERM"
    subprocess.run(mdrun("parts"), cwd=tmp_path, env=env, capture_output=True, check=True)
    log = (tmp_path / "parts" / "md.log").read_text(errors="replace")
    assert "Restarting from checkpoint, appending to previous log file" in log
    whole_edr = (tmp_path / "whole" / "md.edr").read_bytes()
    assert (tmp_path / "parts" / "md.edr").read_bytes() == whole_edr
