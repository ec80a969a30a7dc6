"""The exit verdict attributes every difference: the PoC's, the node's own, or unexplained;
and no process's argv or environment reaches anything the run writes.

Real files and processes of this machine: the file kinds are pointed at a temporary root (as
a fake node's tree), processes are this kernel's, started outside the test's own process tree
(``setsid -f``, as a daemon or another session's command is). Only the planted items are
asserted on: the machine is shared, its other processes come and go.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from tasks.data.plan import Plan, Watch, load_plan
from tasks.data.runctx import make_run_context
from tasks.exit.exit_diff import (
    NodePair,
    diff_and_attribute,
    exit_diff,
    json_form,
    leftovers_markdown,
    summary_line,
)
from tasks.exit.snapshots import collect, take_snapshots

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="setcap needs root")
WATCH = Watch(kinds=["files", "sysctls", "processes"], paths=["/etc", "/usr/local", "/opt", "/tmp"])


def fake_node(root: Path) -> Path:
    """A node's tree: /etc/profile.d, /usr/local/bin, /opt, /tmp and one sysctl."""
    for folder in ("etc/profile.d", "usr/local/bin", "opt", "tmp", "proc/sys/fs"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / "etc/profile.d/site.sh").write_text("export SITE=1\n")
    (root / "etc/motd").write_text("welcome\n")
    (root / "proc/sys/fs/pipe-max-size").write_text("1048576\n")
    return root


def snap(root: Path, node: str, phase: str, data_dir: Path) -> pd.DataFrame:
    df = pd.DataFrame(collect(node, WATCH, root=root, data_dirs=[str(data_dir)]))
    df["node"], df["phase"], df["run_id"], df["partial"] = node, phase, f"run-{phase}", False
    df["taken_at"] = pd.Timestamp.now(tz="UTC")
    return df


@contextlib.contextmanager
def started(argv: list[str], env: dict[str, str] | None = None) -> Iterator[int]:
    """``argv`` started outside this test's process tree (setsid -f); its pid (found by a
    mark in its environment); killed after."""
    mark = f"CKPT_POC_TEST_MARK={uuid.uuid4().hex}".encode()
    name, _, value = mark.decode().partition("=")
    subprocess.run(
        ["setsid", "-f", *argv], check=True, env={**os.environ, **(env or {}), name: value}
    )
    pid = None
    deadline = time.monotonic() + 10
    while pid is None:
        assert time.monotonic() < deadline, f"{argv} did not start"
        for p in (int(x) for x in os.listdir("/proc") if x.isdigit()):
            try:
                if mark in Path(f"/proc/{p}/environ").read_bytes().split(b"\0"):
                    pid = p
            except OSError:
                continue
        time.sleep(0.02)
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def plan_for(write_plan, **exit_fields: object) -> tuple[Plan, Path]:
    overrides = {f"exit.{k}": v for k, v in exit_fields.items()}
    path = write_plan(overrides)
    return load_plan(path), path


def by_key(diffs: dict[str, list[dict]], node: str) -> dict[tuple[str, str], dict]:
    return {(x["kind"], x["key"]): x for x in diffs[node]}


def process_items(found: dict[tuple[str, str], dict], pid: int, root: Path | None = None) -> list:
    """The items of the planted process: its exe's key (as the fake node names it) with an
    argv hash."""
    exe = os.readlink(f"/proc/{pid}/exe")
    if root is not None and exe.startswith(f"{root}/"):
        exe = exe[len(str(root)) :]
    items = [x for (k, key), x in found.items() if k == "processes" and key.startswith(exe + " ")]
    assert items, f"process {pid} ({exe}) not in the diff"
    return items


# --- planted residue: found every time, never the node's own --------------------------------


@ROOT_ONLY
def test_planted_residue_is_the_pocs_or_unexplained_never_the_nodes_own(
    write_plan, tmp_path: Path
) -> None:
    plan, _ = plan_for(write_plan)
    data_dir = Path(plan.data_dir)
    root = fake_node(tmp_path / "node")
    before = snap(root, "local-a", "before_install", data_dir)
    # Residue planted by this test: a process outside the PoC.
    (root / "etc/profile.d/left-behind.sh").write_text("export LEFT=1\n")
    binary = root / "usr/local/bin/capped"
    shutil.copy2("/usr/bin/sleep", binary)
    subprocess.run(["setcap", "cap_net_raw+ep", str(binary)], check=True)
    (root / "proc/sys/fs/pipe-max-size").write_text("4194304\n")
    (root / "opt/ckpt-poc/demo/bin").mkdir(parents=True)  # under the install's prefix
    (root / "opt/ckpt-poc/demo/bin/criu").write_text("criu\n")
    # A process run from the planted binary (outside the PoC), one from the PoC's tree (the
    # marker a local copy is started with), and one run from the PoC's data folder.
    copy = data_dir / "demo" / "runs" / "r1" / "sleep"
    copy.parent.mkdir(parents=True)
    shutil.copy2("/usr/bin/sleep", copy)
    with (
        started([str(binary), "301"]) as outside,
        started(["/usr/bin/sleep", "302"], env={"CKPT_POC_JOB": "r1/local-a-managed"}) as poc,
        started([str(copy), "303"]) as from_data,
    ):
        after = snap(root, "local-a", "after_uninstall", data_dir)
        diffs = diff_and_attribute(plan, {"local-a": NodePair(before, after)}, data_dir)
        found = by_key(diffs, "local-a")
        planted_outside = process_items(found, outside, root)
        from_poc = [x for x in process_items(found, poc) if "env:CKPT_POC_JOB" in x["reason"]]
        from_copy = process_items(found, from_data)
    classes = {
        key: found[("files", key)]["class"]
        for key in (
            "/etc/profile.d/left-behind.sh",
            "/usr/local/bin/capped",
            "/opt/ckpt-poc/demo/bin/criu",
        )
    }
    assert classes == {
        "/etc/profile.d/left-behind.sh": "unexplained",
        "/usr/local/bin/capped": "unexplained",
        "/opt/ckpt-poc/demo/bin/criu": "poc",
    }
    assert "caps" in json.loads(found[("files", "/usr/local/bin/capped")]["after"])
    assert found[("sysctls", "fs.pipe-max-size")]["class"] == "unexplained"
    # Its executable is a new file: not the node's own, though no ancestor is the PoC's.
    assert [x["class"] for x in planted_outside] == ["unexplained"]
    assert [x["class"] for x in from_poc] == ["poc"]
    assert [x["class"] for x in from_copy] == ["poc"]
    assert "runs-from:poc-folder" in from_copy[0]["reason"]


def test_a_cedana_sysctl_is_the_checkpointers_footprint(write_plan, tmp_path: Path) -> None:
    plan, _ = plan_for(write_plan)
    plan = plan.model_copy(
        update={
            "checkpointer": plan.checkpointer.model_copy(update={"kind": "cedana"}),
            "cluster": plan.cluster.model_copy(update={"kind": "slurm"}),
        }
    )
    root = fake_node(tmp_path / "node")
    watch_sysctls = Watch(kinds=["sysctls"], paths=["/etc"])
    rows = [collect("n", watch_sysctls, root=root)]
    (root / "proc/sys/fs/pipe-max-size").write_text("4194304\n")
    rows.append(collect("n", watch_sysctls, root=root))
    before, after = (
        pd.DataFrame(r).assign(node="n", phase="p", run_id="r", partial=False) for r in rows
    )
    diffs = diff_and_attribute(plan, {"local-a": NodePair(before, after)}, tmp_path)
    item = by_key(diffs, "local-a")[("sysctls", "fs.pipe-max-size")]
    assert item["class"] == "poc" and "Cedana" in item["reason"]


# --- the node's own life: listed apart, with its reason ------------------------------------


def test_an_unrelated_process_and_a_transient_file_are_the_nodes_own(
    write_plan, tmp_path: Path
) -> None:
    plan, _ = plan_for(write_plan, recheck_after_s=0.2)
    data_dir = Path(plan.data_dir)
    root = fake_node(tmp_path / "node")
    before = snap(root, "local-a", "before_install", data_dir)
    transient = root / "tmp" / "editor-swap"
    transient.write_text("x")
    with started(["/usr/bin/sleep", "304"]) as admin:
        after = snap(root, "local-a", "after_uninstall", data_dir)
        transient.unlink()
        time.sleep(plan.exit.recheck_after_s)
        recheck = snap(root, "local-a", "after_uninstall.recheck", data_dir)
        pairs = {"local-a": NodePair(before, after, recheck)}
        found = by_key(diff_and_attribute(plan, pairs, data_dir), "local-a")
        admin_items = process_items(found, admin)
    item = found[("files", "/tmp/editor-swap")]
    assert item["class"] == "node_own"
    assert item["reason"].startswith("transient: as before again in the recheck 0.2 s later")
    # The `sleep` is still there in the recheck: its ancestry says whose it is.
    [sleep] = admin_items
    assert sleep["class"] == "node_own"
    assert "ancestry never touches the PoC" in sleep["reason"], sleep["reason"]
    assert "/usr/bin/sleep" in sleep["reason"] or "sleep" in sleep["reason"]


def test_a_change_mirrored_on_the_control_node_is_the_nodes_own(write_plan, tmp_path: Path) -> None:
    plan, _ = plan_for(write_plan, control_node="local-b")
    assert plan.cluster.nodes == ["local-a", "local-b"]
    nodes = {n: fake_node(tmp_path / n) for n in plan.cluster.nodes}
    data_dir = Path(plan.data_dir)
    before = {n: snap(r, n, "before_install", data_dir) for n, r in nodes.items()}
    for root in nodes.values():  # a site's own config management, on every node
        (root / "etc/motd").write_text("maintenance on Friday\n")
    (nodes["local-a"] / "etc/profile.d/only-here.sh").write_text("x\n")
    pairs = {
        n: NodePair(before[n], snap(r, n, "after_uninstall", data_dir)) for n, r in nodes.items()
    }
    diffs = diff_and_attribute(plan, pairs, data_dir)
    a, b = by_key(diffs, "local-a"), by_key(diffs, "local-b")
    assert a[("files", "/etc/motd")]["class"] == "node_own"
    assert a[("files", "/etc/motd")]["reason"] == "changed the same way on the control node local-b"
    assert b[("files", "/etc/motd")]["class"] == "node_own"
    # Only on the installed node: not mirrored, so not the node's own.
    assert a[("files", "/etc/profile.d/only-here.sh")]["class"] == "unexplained"


def test_the_control_node_is_never_an_install_target(write_plan) -> None:
    from tasks.data.errors import BlastRadiusError
    from tasks.exit.install import install_targets, target_nodes

    plan, _ = plan_for(write_plan, control_node="local-b")
    assert install_targets(plan) == ["local-a"]
    assert target_nodes(plan, None) == ["local-a"]
    with pytest.raises(BlastRadiusError, match="control node"):
        target_nodes(plan, ["local-b"])


def test_plan_check_names_a_bad_control_node(write_plan) -> None:
    from tasks.data.errors import PlanError

    for node, why in (("local-z", "is not one of cluster.nodes"), ("local-a", "first node")):
        with pytest.raises(PlanError, match=rf"exit\.control_node: '{node}' {why}|{why}"):
            plan_for(write_plan, control_node=node)


# --- nothing secret written ----------------------------------------------------------------


def test_no_argv_or_environment_reaches_anything_the_run_writes(
    write_plan, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    watched = tmp_path / "watched"
    watched.mkdir()
    plan, path = plan_for(
        write_plan,
        recheck_after_s=0.1,
        watch={"kinds": ["files", "processes", "sockets"], "paths": [str(watched)]},
    )
    password, token = secrets.token_hex(12), secrets.token_hex(12)
    ctx = make_run_context(plan, path, stage="snapshot")
    take_snapshots(plan, ctx, "before_install", list(plan.cluster.nodes))
    ctx.commit()
    code = "import socket,time;s=socket.socket();s.bind(('127.0.0.1',0));s.listen();time.sleep(60)"
    with started(
        ["/usr/bin/python3", "-c", code, f"--password={password}", f"TOKEN={token}"],
        env={"TOKEN": token, "DB_PASSWORD": password},
    ):
        time.sleep(0.3)  # its socket is listening
        ctx = make_run_context(plan, path, stage="uninstall")
        take_snapshots(plan, ctx, "after_uninstall", list(plan.cluster.nodes))
        ctx.commit()
    ctx = make_run_context(plan, path, stage="exit_diff")
    result = exit_diff(plan, ctx, "before_install", "after_uninstall")
    ctx.commit()
    assert result.nodes["local-a"].recheck is True  # the recheck of the same run
    # The process was seen (as its exe and an argv hash) and judged the node's own.
    seen = [x for x in result.node_own if x["kind"] in ("processes", "sockets")]
    assert any(x["key"].startswith("/usr/bin/python3") for x in seen), result.node_own[:5]
    written = b"".join(p.read_bytes() for p in Path(plan.data_dir).rglob("*") if p.is_file())
    shown = result.to_json()
    printed = json.dumps(json_form(shown)) + leftovers_markdown(shown) + summary_line(shown)
    out = capsys.readouterr()
    logs = caplog.text + out.out + out.err
    for secret in (password, token):
        assert secret.encode() not in written
        assert secret not in printed
        assert secret not in logs
        assert secret not in json.dumps(result, default=str)


def test_a_poc_process_that_ended_is_no_leftover(write_plan, tmp_path: Path) -> None:
    """A workload copy running at before_install and gone at after_uninstall left nothing."""
    plan, _ = plan_for(write_plan, recheck_after_s=0)
    data_dir = Path(plan.data_dir)
    root = fake_node(tmp_path / "node")
    with started(["/usr/bin/sleep", "305"], env={"CKPT_POC_JOB": "copy-1"}) as copy:
        before = snap(root, "local-a", "before_install", data_dir)
        exe = os.readlink(f"/proc/{copy}/exe")
    deadline = time.monotonic() + 10  # killed on leaving the block: wait until it is gone
    while os.path.exists(f"/proc/{copy}/exe") and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            os.readlink(f"/proc/{copy}/exe")
            time.sleep(0.05)
            continue
        break
    after = snap(root, "local-a", "after_uninstall", data_dir)
    found = by_key(
        diff_and_attribute(plan, {"local-a": NodePair(before, after)}, data_dir), "local-a"
    )
    ended = [x for (k, key), x in found.items() if k == "processes" and key.startswith(exe + " ")]
    ended = [x for x in ended if x["change"] == "removed" and "CKPT_POC_JOB" in x["reason"]]
    assert ended, "the ended PoC process is not in the diff"
    assert all(x["class"] == "node_own" and x["reason"].startswith("ended:") for x in ended)
