"""The writer recorder on a real Slurm install node: started through the install's path (a
job step pinned to the node) right after the before_install snapshot, it leaves that step
(it runs on with no job holding the node), tells a foreign writer from a PoC job, and is
stopped, and checked gone, after the recheck. Real fanotify, the real process-events
connector and the session's real single-node Slurm."""

from __future__ import annotations

from pathlib import Path


def test_contract_the_recorder_as_a_transient_systemd_unit() -> None:
    """Contract test (no systemd runs here): where systemd runs the node, the recorder is
    the transient unit these exact arguments start, gone once stopped (--collect), and the
    unit's active state is the recorder's allowed footprint, never residue."""
    import fnmatch
    import sys

    from tasks.exit.writers import daemon
    from tasks.exit.writers.service import RECORDER_ALLOWED

    unit = daemon.unit_name("demo")
    assert daemon.systemd_run_argv(unit, Path("/data/demo/writers/n1/spec.json")) == [
        "systemd-run",
        "--unit=ckpt-poc-writers-demo.service",
        "--collect",
        "--quiet",
        f"--setenv=PYTHONPATH={daemon.REPO}",
        "--property=KillMode=mixed",
        "--",
        sys.executable,
        "-m",
        "tasks.exit.writers.recorder",
        "/data/demo/writers/n1/spec.json",
    ]
    units = [a for a in RECORDER_ALLOWED if a.kind == "units"]
    assert any(fnmatch.fnmatchcase(f"active:{unit}", a.key) for a in units)
