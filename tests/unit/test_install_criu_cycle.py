"""Install, opt-in and uninstall of the criu checkpointer: locally (the demo plan's cycle) and
on the real single-node Slurm (SPANK flag, an opted-in job checkpointed and restored beside
one that did not opt in and is left alone), each stage refusing nodes the plan does not name,
and uninstall never deleting what install did not create."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.data.errors import BlastRadiusError
from tasks.data.plan import Plan, load_plan
from tasks.data.runctx import make_run_context
from tasks.engine.checkpointers.criu import Checkpoint
from tasks.engine.clock import Event, read_journal
from tasks.exit import install as inst
from tests.support.common import REPO


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def _local_plan(write_plan) -> tuple[Plan, Path]:
    path = write_plan()
    return load_plan(path), path


# --- local: the demo plan's own cycle ---------------------------------------------------------


@pytest.mark.criu
def test_local_demo_cycle_installs_into_its_prefix_and_uninstall_removes_it_all(
    write_plan,
) -> None:
    plan, path = _local_plan(write_plan)
    ctx = make_run_context(plan, path, stage="install")
    data = Path(plan.data_dir).resolve()
    before = _tree(data / plan.poc / "_install")
    done = inst.install(plan, ctx)
    for node in plan.cluster.nodes:
        prefix = Path(done.nodes[node].prefix)
        assert prefix.is_relative_to(data)  # never a system folder
        manifest = json.loads((prefix / "manifest.json").read_text())
        assert sorted(f["path"] for f in manifest["files"]) == sorted(
            [str(prefix / "bin" / "ckpt-poc-job"), str(prefix / "bin" / "criu")]
        )
        assert subprocess.run([prefix / "bin" / "criu", "--version"], check=False).returncode == 0
    opted = inst.opt_in(plan, ctx)
    assert opted["managed_arm"] and opted["workload"] == plan.workload.name
    # Uninstall runs the plan's own exit.uninstall: scripts/uninstall-criu.
    assert plan.exit.uninstall == ["scripts/uninstall-criu"]
    result = inst.uninstall(plan, ctx)
    assert all(r.rc == 0 for r in result.nodes.values()), result
    assert _tree(data / plan.poc / "_install") == before == []
    # Idempotent: a second uninstall finds nothing and succeeds.
    assert all(r.rc == 0 for r in inst.uninstall(plan, ctx).nodes.values())
    names = [e.event for e in inst.recorder_for(ctx).events()]
    assert names.count("install_step") >= 8 and "opted_in" in names and "uninstalled" in names
    step = next(e for e in inst.recorder_for(ctx).events() if e.event == "install_step")
    assert step.detail["who"] and isinstance(step.detail["argv"], list) and step.detail["rc"] == 0


def test_each_stage_refuses_a_node_the_plan_does_not_name(write_plan, tmp_path) -> None:
    plan, path = _local_plan(write_plan)
    ctx = make_run_context(plan, path, stage="install")
    for stage in (inst.install, inst.opt_in, inst.uninstall):
        with pytest.raises(BlastRadiusError, match="not the plan's nodes"):
            if stage is inst.opt_in:
                stage(plan, ctx, None, nodes=["local-a", "intruder"])
            else:
                stage(plan, ctx, nodes=["intruder"])
    with pytest.raises(BlastRadiusError):
        inst.on_node(plan, "intruder", ["true"])
    with pytest.raises(BlastRadiusError, match="not the plan's workload"):
        inst.opt_in(plan, ctx, "someone-elses-job")
    # Refused before doing anything: nothing was written.
    assert not (Path(plan.data_dir) / plan.poc / "_install").exists()


@pytest.mark.criu
def test_uninstall_never_deletes_what_install_did_not_create(write_plan) -> None:
    plan, path = _local_plan(write_plan)
    ctx = make_run_context(plan, path, stage="install")
    lay_a = inst.layout(plan, "local-a")
    # A file planted where install would write: install refuses and writes nothing.
    lay_a.prefix.joinpath("bin").mkdir(parents=True)
    planted = lay_a.prefix / "bin" / "criu"
    planted.write_text("someone else's criu\n")
    with pytest.raises(inst.InstallError, match="not created by this install"):
        inst.install(plan, ctx, nodes=["local-a"])
    inst.uninstall(plan, ctx, nodes=["local-a"])
    assert planted.read_text() == "someone else's criu\n"
    planted.unlink()
    # A foreign file inside a folder install then creates, and one install's file changed
    # after install: uninstall removes the rest, leaves both, and says so (exit 1).
    inst.install(plan, ctx, nodes=["local-a"])
    foreign = lay_a.prefix / "bin" / "notes.txt"
    foreign.write_text("mine\n")
    wrapper = lay_a.prefix / "bin" / "ckpt-poc-job"
    wrapper.write_text(wrapper.read_text() + "# edited by an admin\n")
    with pytest.raises(inst.InstallError, match="changed since install"):
        inst.uninstall(plan, ctx, nodes=["local-a"])
    assert foreign.read_text() == "mine\n" and wrapper.exists()
    assert not (lay_a.prefix / "bin" / "criu").exists()
    assert lay_a.manifest.exists()  # kept: a rerun can finish once the admin decides
    # A manifest edited to list a path outside the prefix is refused whole.
    manifest = json.loads(lay_a.manifest.read_text())
    manifest["files"].append({"path": str(path), "sha256": "0"})
    lay_a.manifest.write_text(json.dumps(manifest))
    rc = subprocess.run([REPO / "scripts" / "uninstall-criu", lay_a.manifest], check=False)
    assert rc.returncode == 2 and path.exists() and foreign.exists()


# --- the real single-node Slurm ---------------------------------------------------------------

COUNTER = (
    "import time\nfor i in range(10**6):\n    print(f'step={i} ', flush=True)\n    time.sleep(0.05)"
)


@pytest.fixture(scope="module")
def install_env(
    slurm_session: dict[str, str], criu_binary: str, tmp_path_factory
) -> Iterator[None]:
    """The session's cluster, its plugstack.conf including plugstack.conf.d/ (as Debian's
    does) while this module runs, SLURM_CONF and CRIU for the harness and the jobs, and a
    temp folder standing in for the node's /opt (other sessions share this machine)."""
    keys = ["SLURM_CONF", "CKPT_POC_CRIU", inst.PREFIX_ROOT_ENV]
    saved = {k: os.environ.get(k) for k in keys}
    etc = Path(slurm_session["SLURM_CONF"]).parent
    plugstack = etc / "plugstack.conf"
    original = plugstack.read_text()
    include = f"include {etc / 'plugstack.conf.d'}/*.conf"
    made_dir = not (etc / "plugstack.conf.d").exists()  # scripts/slurm-up makes it now
    (etc / "plugstack.conf.d").mkdir(exist_ok=True)
    if include not in original.splitlines():  # a cluster from before slurm-up wrote it
        plugstack.write_text(original + include + "\n")
    os.environ["SLURM_CONF"] = slurm_session["SLURM_CONF"]
    os.environ["CKPT_POC_CRIU"] = criu_binary
    opt = tmp_path_factory.mktemp("slurm-install") / "opt" / "ckpt-poc"
    os.environ[inst.PREFIX_ROOT_ENV] = str(opt)
    try:
        yield
    finally:
        plugstack.write_text(original)
        if made_dir:
            with contextlib.suppress(OSError):  # left if a failed test left its hook there
                (etc / "plugstack.conf.d").rmdir()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def slurm_env(install_env: None, slurm_env: dict[str, str]) -> dict[str, str]:
    return slurm_env


def _slurm_plan(tmp_path: Path) -> tuple[Plan, Path]:
    path = tmp_path / "plan.yaml"
    text = (REPO / "plans" / "demo.yaml").read_text()
    text = text.replace("poc: demo", "poc: slurm-install")
    text = text.replace("data_dir: data", f"data_dir: {tmp_path / 'data'}")
    text = text.replace(
        "kind: local\n  nodes: [local-a, local-b]\n  queue: demo",
        "kind: slurm\n  nodes: [ckpt-node1]\n  queue: poc",
    )
    text = re.sub(r"(?ms)^faults:\n.*?^repeats:", "faults:\n  - kind: scancel\n\nrepeats:", text)
    # What this test's snapshots watch: the prefix root and the cluster's configuration.
    etc = Path(os.environ["SLURM_CONF"]).parent
    text = text.replace(
        "  test_by: +21d",
        "  test_by: +21d\n  watch:\n    kinds: [files]\n"
        f"    paths: [{Path(os.environ[inst.PREFIX_ROOT_ENV]).parent}, {etc}]\n    names_only: []",
    )
    path.write_text(text)
    return load_plan(path), path


def _sbatch(args: list[str], wrapper: Path, spec: dict, tmp_path: Path, name: str) -> str:
    spec_path = tmp_path / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={name}",
        "--partition=poc",
        "--nodelist=ckpt-node1",
        "--no-requeue",
        f"--chdir={REPO}",
        f"--output={spec['log']}",
        "--open-mode=append",  # CRIU restores an open log only in append mode
        *args,
        str(wrapper),
        str(spec_path),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def _spec(tmp_path: Path, name: str, mode: str = "run", **more: object) -> dict:
    return {
        "mode": mode,
        "trial_id": name,
        "arm": "managed",
        "node": "ckpt-node1",
        "argv": ["python", "-u", "-c", COUNTER],
        "events": str(tmp_path / f"{name}.events.jsonl"),
        "log": str(tmp_path / f"{name}.log"),
        "ckpt_root": str(tmp_path / f"{name}.ckpt"),
        "keep": 3,
        "interval_s": 0.5,
        "checkpoint": True,  # asked for by both jobs: only the opt-in decides
        **more,
    }


def _wait(what: str, ok, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ok()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _latest_checkpoint(root: Path) -> Checkpoint | None:
    return next((c for p in sorted(root.glob("ckpt-*"))[::-1] if (c := Checkpoint.load(p))), None)


def _event(journal: Path, name: str) -> Event | None:
    return (
        next((e for e in read_journal(journal) if e.event == name), None)
        if journal.exists()
        else None
    )


def _steps(log: Path) -> list[int]:
    return [int(x.split("=")[1]) for x in log.read_text().split() if x.startswith("step=")]


def _snapshot(plan: Plan, path: Path, phase: str) -> None:
    from tasks.exit.snapshots import take_snapshot

    ctx = make_run_context(plan, path, stage="snapshot")
    take_snapshot(plan, ctx, phase, "ckpt-node1")
    ctx.commit()
