"""Node snapshots and the exit diff, on this machine (root) and on the test's real Slurm.

This VM is shared with a CI run and other sessions: their processes, listening sockets and
temporary files come and go while a test runs. The test plan declares that churn as allowed
changes (each with its why), exactly as a site would declare its own; everything else is
compared, and the planted residue must be reported item by item, and nothing beside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from tasks.baseline.pseudonym import KEY_ENV, Pseudonymiser
from tasks.data.errors import BlastRadiusError, CkptPocError
from tasks.data.plan import AllowedChange, Plan, Watch, load_plan
from tasks.data.runctx import make_run_context
from tasks.exit.exit_diff import diff_snapshots, exit_diff
from tasks.exit.exit_result import ExitDiff
from tasks.exit.snapshots import collect, latest_snapshot, take_snapshot
from tests.support.common import REPO

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="plants residue as root")

# The shared VM's churn, declared the way a plan declares its own (see the module doc).
SHARED_VM_CHURN = [
    {"kind": "files", "key": "/tmp/*", "why": "other sessions' and CI's temporary files"},
    {"kind": "files", "key": "/var/tmp/*", "why": "other sessions' temporary files"},
    {"kind": "files", "key": "/dev/shm/*", "why": "other sessions' shared memory"},
    {"kind": "files", "key": "/run/user/*", "why": "login sessions of the VM's tooling"},
    # A process's key is its exe and an argv hash: what shows its argv is an argv glob.
    {"kind": "processes", "key": "*", "argv": "*/tmp/ci/*", "why": "the CI run on this VM"},
    {"kind": "processes", "key": "/tmp/ci/*", "why": "the CI run on this VM"},
    {"kind": "processes", "key": "*", "argv": "*/tmp/pytest-of-*", "why": "other test sessions"},
    {"kind": "processes", "key": "/root/.pyenv/*", "why": "other sessions' Python tools"},
    {"kind": "processes", "key": "*", "argv": "*/.venv/bin/*", "why": "other sessions' venvs"},
    # The VM's tool runner (every session's shell; it runs from a sealed memfd).
    {"kind": "processes", "key": "/memfd:sealed-*", "why": "the runner"},
    {"kind": "processes", "key": "/usr/sbin/slurmstepd*", "why": "other sessions' Slurm steps"},
    {"kind": "sockets", "key": "unix /tmp/*", "why": "other test sessions' daemons"},
    {"kind": "sockets", "key": "* /tmp/ci/*", "why": "the CI run's servers"},
    {"kind": "sockets", "key": "* /root/.pyenv/*", "why": "other sessions' Python servers"},
    {"kind": "sockets", "key": "*/.venv/bin/*", "why": "other sessions' servers"},
    {"kind": "sockets", "key": "*/tmp/pytest-of-*", "why": "other test sessions' daemons"},
    {"kind": "sockets", "key": "* /memfd:sealed-*", "why": "the runner's servers"},
]


def local_plan(write_plan, extra_allowed: list[dict] | None = None) -> tuple[Plan, Path]:
    base = load_plan(REPO / "plans" / "demo.yaml").exit.allowed_changes
    allowed = [a.model_dump() for a in base] + SHARED_VM_CHURN + (extra_allowed or [])
    # One node: every local plan node is this machine, one is enough to diff.
    path = write_plan({"exit.allowed_changes": allowed, "cluster.nodes": ["local-a"]})
    return load_plan(path), path


def snapshot(plan: Plan, path: Path, phase: str, node: str = "local-a") -> pd.DataFrame:
    ctx = make_run_context(plan, path, stage="snapshot")
    df = take_snapshot(plan, ctx, phase, node)
    ctx.commit()
    return df


def diff(plan: Plan, path: Path, a: str, b: str) -> ExitDiff:
    ctx = make_run_context(plan, path, stage="exit_diff")
    result = exit_diff(plan, ctx, a, b)
    ctx.commit()
    return result


# --- nothing changed: clean -------------------------------------------------------------------


# --- planted residue: 100 % detected, nothing else -------------------------------------------


@contextlib.contextmanager
def planted_residue(mark: str) -> Iterator[dict[tuple[str, str], str]]:
    """Plant one of each leftover Cedana's notes list; yield {(kind, key): change}; undo it
    all (only what was created here) afterwards."""
    made: list[Path] = []  # files and links, removed in reverse
    made_dirs: list[Path] = []
    expected: dict[tuple[str, str], str] = {}
    sysctl = Path("/proc/sys/fs/pipe-user-pages-soft")
    sysctl_was = sysctl.read_text().strip()
    daemon_pid: int | None = None
    user = f"ckpt-poc-t{mark[:8]}"
    user_added = False

    def mkdirs(folder: Path) -> None:
        missing = []
        while not folder.exists():
            missing.append(folder)
            folder = folder.parent
        for d in reversed(missing):
            d.mkdir()
            made_dirs.append(d)
            expected[("files", str(d))] = "added"

    def plant_file(path: Path, text: str) -> None:
        mkdirs(path.parent)
        path.write_text(text)
        made.append(path)
        expected[("files", str(path))] = "added"

    try:
        plant_file(Path(f"/etc/profile.d/ckpt-poc-test-{mark}.sh"), "export CEDANA_LEFT=1\n")
        wants = Path("/etc/systemd/system/multi-user.target.wants")
        mkdirs(wants)
        link = wants / f"ckpt-poc-test-{mark}.service"
        link.symlink_to(f"/etc/systemd/system/ckpt-poc-test-{mark}.service")  # dangling
        made.append(link)
        expected[("files", str(link))] = "added"
        expected[("units", str(link))] = "added"
        sysctl.write_text("1\n" if sysctl_was != "1" else "2\n")
        expected[("sysctls", "fs.pipe-user-pages-soft")] = "changed"
        binary = Path(f"/usr/local/bin/ckpt-poc-test-{mark}")
        shutil.copy2("/usr/bin/true", binary)
        made.append(binary)
        subprocess.run(["setcap", "cap_net_raw+ep", str(binary)], check=True)
        expected[("files", str(binary))] = "added"
        plant_file(
            Path(f"/etc/slurm/plugstack.conf.d/ckpt-poc-test-{mark}.conf"),
            "required /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_ckpt_poc_test.so\n",
        )
        plant_file(Path(f"/run/ckpt-poc-test-{mark}-criu.kdat"), "kdat")
        plant_file(
            Path(f"/etc/containerd/conf.d/999-ckpt-poc-test-{mark}.toml"),
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.cedana]\n',
        )
        # A daemon (reparented to PID 1, as a leftover is) that also listens on a port.
        code = (
            "import socket,sys,time;s=socket.socket();s.bind(('127.0.0.1',0));s.listen();"
            "print(s.getsockname()[1],flush=True);time.sleep(600)"
        )
        port_file = Path(f"/run/ckpt-poc-test-{mark}.port")
        launcher = subprocess.run(
            [
                "setsid",
                "-f",
                "sh",
                "-c",
                'exec /usr/bin/python3 -c "$1" "$2" > "$3"',
                "sh",
                code,
                f"ckpt-poc-test-{mark}",
                str(port_file),
            ],
            check=True,
            # Started as the PoC starts a copy: the marker is inherited by the daemon.
            env={**os.environ, "CKPT_POC_JOB": f"test/{mark}"},
        )
        assert launcher.returncode == 0
        deadline = time.monotonic() + 10
        while not (port_file.exists() and port_file.read_text().strip()):
            assert time.monotonic() < deadline, "the planted daemon did not start"
            time.sleep(0.05)
        port = int(port_file.read_text())
        port_file.unlink()
        daemon_pid = next(
            int(p)
            for p in os.listdir("/proc")
            if p.isdigit() and f"ckpt-poc-test-{mark}".encode() in _cmdline(int(p))
        )
        exe = os.readlink(f"/proc/{daemon_pid}/exe")
        argv = ["/usr/bin/python3", "-c", code, f"ckpt-poc-test-{mark}"]
        token = Pseudonymiser(os.environ[KEY_ENV].encode()).token("argv", "\0".join(argv))
        proc_key = f"{exe} {token}"
        expected[("processes", proc_key)] = "added"
        expected[("sockets", f"tcp 127.0.0.1:{port} {proc_key}")] = "added"
        subprocess.run(
            ["useradd", "-r", "-M", "-N", "-s", "/usr/sbin/nologin", user],
            check=True,
            capture_output=True,
        )
        user_added = True
        expected[("users", f"user:{user}")] = "added"
        yield expected
    finally:
        if daemon_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(daemon_pid, 9)
        if user_added:
            subprocess.run(["userdel", user], check=False, capture_output=True)
        sysctl.write_text(sysctl_was + "\n")
        for path in reversed(made):
            path.unlink(missing_ok=True)
        for folder in reversed(made_dirs):
            with contextlib.suppress(OSError):
                folder.rmdir()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


# useradd rewrites the account databases (and their "-" backups): consequences of the
# planted user, reported under files as they should be.
USER_DATABASES = {"/etc/passwd", "/etc/shadow", "/etc/passwd-", "/etc/shadow-", "/etc/.pwd.lock"}


# --- refusals ---------------------------------------------------------------------------------


def test_a_partial_snapshot_is_refused_by_the_diff(tmp_path: Path) -> None:
    # A scheduler that cannot be asked: a genuine 'error' row, so a partial snapshot. (An
    # empty slurm.conf fails at once; a missing one makes every Slurm client retry 60 s.)
    (tmp_path / "empty.conf").write_text("")
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "empty.conf")}
    rows = collect("ckpt-node1", Watch(kinds=["scheduler", "users"]), slurm=True, env=env)
    errors = [r for r in rows if r["kind"] == "error"]
    assert errors and errors[0]["key"].startswith("scheduler:")

    def frame(rows: list[dict], phase: str) -> pd.DataFrame:
        df = pd.DataFrame(rows)
        df["node"], df["phase"], df["run_id"] = "ckpt-node1", phase, f"run-{phase}"
        df["partial"] = (df["kind"] == "error").any()
        return df

    whole = frame([r for r in rows if r["kind"] != "error"], "before_install")
    partial = frame(rows, "after_uninstall")
    with pytest.raises(CkptPocError, match=r"'after_uninstall' of node 'ckpt-node1'.*partial"):
        diff_snapshots(whole, partial, [], "ckpt-node1")
    with pytest.raises(CkptPocError, match=r"scheduler:slurm config"):
        diff_snapshots(partial, whole, [], "ckpt-node1")
    assert diff_snapshots(whole, whole, [], "ckpt-node1") == []


def test_a_node_outside_the_plan_is_refused_before_anything_runs(write_plan) -> None:
    plan, path = local_plan(write_plan)
    ctx = make_run_context(plan, path, stage="snapshot")
    with pytest.raises(BlastRadiusError, match="not one of the plan's nodes"):
        take_snapshot(plan, ctx, "before_install", "prod-node-7")
    ctx.commit()
    assert latest_snapshot(ctx.data_dir, plan.poc, "prod-node-7", "before_install") is None


def test_exit_diff_refuses_without_both_snapshots(write_plan) -> None:
    plan, path = local_plan(write_plan)
    ctx = make_run_context(plan, path, stage="exit_diff")
    with pytest.raises(CkptPocError, match="no committed snapshot"):
        exit_diff(plan, ctx, "before_install", "after_uninstall")


def test_an_allowed_change_is_skipped_and_only_on_its_kind() -> None:
    def frame(items: dict[tuple[str, str], str]) -> pd.DataFrame:
        df = pd.DataFrame([{"kind": k, "key": key, "value": v} for (k, key), v in items.items()])
        df["node"], df["phase"], df["run_id"], df["partial"] = "n", "p", "r", False
        return df

    before = frame({("files", "/var/log/syslog"): "a", ("sysctls", "fs.x"): "1"})
    after = frame({("files", "/var/log/syslog"): "b", ("sysctls", "fs.x"): "2"})
    allowed = [AllowedChange(kind="files", key="/var/log/*", why="logs")]
    left = diff_snapshots(before, after, allowed, "n")
    assert left == [
        {
            "node": "n",
            "kind": "sysctls",
            "key": "fs.x",
            "change": "changed",
            "before": "1",
            "after": "2",
        }
    ]


# --- a Slurm node, snapshotted by a job pinned to it ------------------------------------------


# The cluster is the session's (tests/conftest.py: slurm_env).


def test_the_collector_runs_as_a_module_and_prints_json() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tasks.exit.snapshots",
            "collect",
            "--node",
            "n1",
            "--watch",
            Watch(kinds=["users", "mounts"]).model_dump_json(),
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    rows = json.loads(done.stdout)
    assert {"kind": "users", "key": "user:root", "value": "0:0:root:/root:/bin/bash"} in rows
