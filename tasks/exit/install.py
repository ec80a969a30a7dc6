"""Contained install of the `criu` checkpointer, per-workload opt-in, and the way out.

What install puts where (one prefix per node, one hook, nothing else):

- **Slurm** — on each node the plan names, under ``/opt/ckpt-poc/<poc>/``
  (``$CKPT_POC_PREFIX_ROOT`` overrides ``/opt/ckpt-poc``):
  ``bin/criu`` (the CRIU scripts/install-criu finds or builds: Debian's if ``criu check``
  passes, else the .tools/criu build), ``bin/ckpt-poc-job`` (the managed-job wrapper,
  tasks/engine/clusters/slurm/managed_job.py), ``lib/ckpt_poc_spank.so`` (scripts/build-spank) and
  ``manifest.json``; and ONE hook: the drop-in ``ckpt-poc-<poc>.conf`` in the folder the
  cluster's plugstack.conf already includes (Debian: /etc/slurm/plugstack.conf.d/), one line
  ``optional <prefix>/lib/ckpt_poc_spank.so poc=<poc> prefix=<prefix>``. slurm.conf and
  plugstack.conf are never edited (no reconfigure: slurmstepd reads plugstack per job); a
  plugstack.conf without such an include is refused, not edited.
- **Local** — ``<data_dir>/<poc>/_install/<node>/``: ``bin/criu``, ``bin/ckpt-poc-job`` and
  ``manifest.json``; no hook and nothing in system folders.

How a job opts in: ``sbatch --ckpt-poc …`` (the SPANK flag; the plugin sets
``CKPT_POC_MANAGED=<poc>`` and ``CKPT_POC_CRIU`` in the job's tasks) or, where the flag is not
known (a submit host without the drop-in), ``sbatch --export=ALL,CKPT_POC_MANAGED=<poc>``;
the job runs its workload under ``<prefix>/bin/ckpt-poc-job``, which takes CRIU dumps only
when it opted in. Nothing on the node watches or touches other jobs. Locally, opting in is
the managed arm. ``opt_in`` records who, what and when as events.

Every install step is an argv list run on the node (Slurm: ``srun`` pinned to the node, no
SSH; locally: here), recorded as an `install_step` event with who, the argv and its exit
code. Install writes the manifest *before* the first file: every folder it will create
(only those that did not exist) and every file with the sha256 it will have. A path install
would create that already exists is refused before anything is written: install never
overwrites what it did not create. ``scripts/uninstall-criu`` (the demo plan's
exit.uninstall) removes exactly the manifest's files (while their sha256 still matches), the
manifest, and the folders it lists that are then empty — nothing else.

``uninstall`` runs the plan's exit.uninstall argv on every node, with ``CKPT_POC_MANIFEST``
set to that node's manifest. A failing node is recorded (exit code and the tail of its
output) and the other nodes are still attempted; then InstallError names every failure.

Every function refuses a node the plan does not name (BlastRadiusError) before doing anything.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tasks.data import env_markers
from tasks.data.arms import MANAGED
from tasks.data.errors import BlastRadiusError, CkptPocError
from tasks.data.events import Ev
from tasks.data.plan import Plan
from tasks.data.runctx import REPO_ROOT, RunContext
from tasks.data.runs import write_json_atomically
from tasks.data.settings import env_name, settings
from tasks.engine.clock import EventRecorder
from tasks.exit.install_result import (
    InstallManifest,
    InstallResult,
    NodeInstall,
    NodeUninstall,
    OptInHow,
    OptInRecord,
    OptInWhat,
    UninstallResult,
)

PREFIX_ROOT_ENV = env_name("prefix_root")
MANIFEST = "manifest.json"
WRAPPER = "ckpt-poc-job"
SPANK_SO = "ckpt_poc_spank.so"
OPT_IN_FLAG = "--ckpt-poc"
OPT_IN_ENV = env_markers.MANAGED
TRIAL = "install"  # the events' trial_id for install, opt-in and uninstall
STEP_TIMEOUT_S = 600  # a step that has not ended by then (srun waiting for the node) failed


class InstallError(CkptPocError):
    """An install, opt-in or uninstall step failed, or would overwrite what is not ours."""


@dataclass(frozen=True)
class NodeLayout:
    node: str
    prefix: Path
    hook: Path | None  # the plugstack drop-in (Slurm); None locally

    @property
    def manifest(self) -> Path:
        return self.prefix / MANIFEST


_RECORDERS: dict[str, EventRecorder] = {}


def recorder_for(ctx: RunContext) -> EventRecorder:
    """One recorder per run: each flush writes only its new events (one file per flush)."""
    if ctx.run_id not in _RECORDERS:
        _RECORDERS[ctx.run_id] = EventRecorder(ctx)
    return _RECORDERS[ctx.run_id]


def who() -> str:
    """Who acts: the user behind sudo when there is one, and this host."""
    user = os.environ.get("SUDO_USER") or getpass.getuser()
    return f"{user}@{socket.gethostname()}"


def install_targets(plan: Plan) -> list[str]:
    """The plan's nodes the PoC installs on: all but its control node (exit.control_node)."""
    return [n for n in plan.cluster.nodes if n != plan.exit.control_node]


def target_nodes(plan: Plan, nodes: Sequence[str] | None) -> list[str]:
    """The nodes to act on (default: every install target); any other node, and the control
    node (never installed on), is refused here, first."""
    chosen = install_targets(plan) if nodes is None else list(nodes)
    outside = [n for n in chosen if n not in plan.cluster.nodes]
    if outside:
        raise BlastRadiusError(
            f"node(s) {outside} are not the plan's nodes {list(plan.cluster.nodes)}: refused"
        )
    if plan.exit.control_node in chosen:
        raise BlastRadiusError(
            f"node {plan.exit.control_node!r} is the plan's control node (exit.control_node): "
            "never installed on: refused"
        )
    if plan.cluster.kind not in NODE_KINDS:
        raise InstallError(f"install of criu on a {plan.cluster.kind} cluster is not built")
    if plan.checkpointer.kind != "criu":  # this module is the criu checkpointer's install
        raise InstallError(f"this install is the criu checkpointer's, not {plan.checkpointer.kind}")
    return chosen


def prefix_root() -> Path:
    return settings().prefix_root


def plugstack_dropin_dir() -> Path:
    """The folder the cluster's plugstack.conf includes ``*.conf`` from (Debian:
    /etc/slurm/plugstack.conf.d): where the hook goes, so no packaged file is edited."""
    out = _run_here(["scontrol", "show", "config"]).stdout
    match = re.search(r"^PlugStackConfig\s*=\s*(\S+)", out, re.M)
    conf = Path(match.group(1)) if match else Path("/etc/slurm/plugstack.conf")
    try:
        text = conf.read_text()
    except OSError as exc:
        raise InstallError(f"cannot read the cluster's plugstack config {conf}: {exc}") from exc
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "include" and parts[1].endswith("/*.conf"):
            return Path(parts[1][: -len("/*.conf")])
    raise InstallError(
        f"{conf} has no `include <dir>/*.conf` line: there is no drop-in folder for the hook, "
        "and this install does not edit plugstack.conf (add Debian's include line first)"
    )


def layout(plan: Plan, node: str, dropin_dir: Path | None = None) -> NodeLayout:
    target_nodes(plan, [node])
    return NODE_KINDS[plan.cluster.kind].layout(plan, node, dropin_dir)


def manifest_path(plan: Plan, node: str) -> Path:
    """Where install writes ``node``'s manifest (the hook's folder is not needed to say)."""
    target_nodes(plan, [node])
    return NODE_KINDS[plan.cluster.kind].layout(plan, node, Path("/")).manifest


# --- running a step on a node ------------------------------------------------------------------


def _run_here(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            argv,
            env=env,
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: {exc}")


def on_node(
    plan: Plan, node: str, argv: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run ``argv`` on ``node``: here for a local plan; on Slurm as a job step pinned to the
    node (srun, the way the PoC reaches a node without SSH). ``env`` adds variables."""
    target_nodes(plan, [node])
    return NODE_KINDS[plan.cluster.kind].run(plan, node, argv, env)


# --- the nodes of each cluster kind -------------------------------------------------------------


class LocalNodes:
    """A local plan's nodes are slots on this machine: steps run here, the prefix is under
    the PoC's data folder, and there is no hook (the managed arm is the opt-in)."""

    spank_hook: ClassVar[bool] = False

    def dropin_dir(self) -> Path | None:
        return None

    def layout(self, plan: Plan, node: str, dropin_dir: Path | None) -> NodeLayout:
        return NodeLayout(node, Path(plan.data_dir).resolve() / plan.poc / "_install" / node, None)

    def run(
        self, plan: Plan, node: str, argv: list[str], env: dict[str, str] | None
    ) -> subprocess.CompletedProcess:
        return _run_here(argv, {**os.environ, **(env or {})})

    def opt_in_how(self, plan: Plan) -> OptInHow:
        return {"managed_arm": True, "env": {OPT_IN_ENV: plan.poc}}


class SlurmNodes:
    """A Slurm plan's nodes: steps are job steps pinned to the node (srun), the prefix is
    under /opt/ckpt-poc, and the hook is a plugstack drop-in loading the SPANK plugin."""

    spank_hook: ClassVar[bool] = True

    def dropin_dir(self) -> Path | None:
        return plugstack_dropin_dir()

    def layout(self, plan: Plan, node: str, dropin_dir: Path | None) -> NodeLayout:
        hook_dir = dropin_dir if dropin_dir is not None else plugstack_dropin_dir()
        return NodeLayout(node, prefix_root() / plan.poc, hook_dir / f"ckpt-poc-{plan.poc}.conf")

    def run(
        self, plan: Plan, node: str, argv: list[str], env: dict[str, str] | None
    ) -> subprocess.CompletedProcess:
        export = ",".join(["ALL", *(f"{k}={v}" for k, v in (env or {}).items())])
        srun = [
            "srun",
            f"--nodelist={node}",
            f"--partition={plan.cluster.queue}",
            "--nodes=1",
            "--ntasks=1",
            "--quiet",
            f"--job-name=ckpt-poc-{plan.poc}-install",
            f"--export={export}",
            "--",
        ]
        return _run_here([*srun, *argv])

    def opt_in_how(self, plan: Plan) -> OptInHow:
        return {
            "sbatch_args": [OPT_IN_FLAG],
            "or_sbatch_args": [f"--export=ALL,{OPT_IN_ENV}={plan.poc}"],
            "env": {OPT_IN_ENV: plan.poc},
            "wrapper": str(prefix_root() / plan.poc / "bin" / WRAPPER),
        }


# Keyed by the plan's cluster.kind: where this install reaches a node (Kubernetes: not built).
NODE_KINDS: dict[str, LocalNodes | SlurmNodes] = {"local": LocalNodes(), "slurm": SlurmNodes()}


def _step(
    plan: Plan, recorder: EventRecorder, node: str, what: str, argv: list[str], **env: str
) -> subprocess.CompletedProcess:
    done = on_node(plan, node, argv, env or None)
    recorder.record(
        TRIAL,
        MANAGED,
        f"{what}_step",
        node=node,
        who=who(),
        argv=argv,
        rc=done.returncode,
        output_tail=(done.stderr + done.stdout)[-2000:],
    )
    return done


def _existing(plan: Plan, node: str, paths: list[Path]) -> set[Path]:
    """Which of ``paths`` exist on the node (`stat` lists those it finds)."""
    done = on_node(plan, node, ["stat", "--printf=%n\\n", "--", *map(str, paths)])
    if done.returncode not in (0, 1):
        raise InstallError(f"cannot look at {node}: stat exited {done.returncode}: {done.stderr}")
    return {Path(line) for line in done.stdout.splitlines() if line}


# --- what install copies -----------------------------------------------------------------------


def criu_binary() -> Path:
    """A CRIU whose `criu check` passes: Debian's, else the .tools/criu build (install-criu)."""
    done = _run_here([str(REPO_ROOT / "scripts" / "install-criu")])
    if done.returncode != 0 or not done.stdout.strip():
        raise InstallError(f"no working CRIU (scripts/install-criu): {done.stderr[-1000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def spank_plugin() -> Path:
    done = _run_here([str(REPO_ROOT / "scripts" / "build-spank")])
    if done.returncode != 0 or not done.stdout.strip():
        raise InstallError(f"the SPANK plugin did not build: {done.stderr[-1000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def wrapper_text(plan: Plan, prefix: Path) -> str:
    q = shlex.quote  # every value quoted: the file is a shell script
    poc_env, criu_env = env_markers.WRAPPER_POC, env_name("criu")
    return (
        "#!/bin/sh\n"
        f"# ckpt-poc managed-job wrapper of PoC {plan.poc}: written by `ckpt-poc install`,\n"
        "# removed by its uninstall. CRIU checkpoints a job only when it opted in\n"
        f"# ({OPT_IN_ENV}={plan.poc}, set by `sbatch {OPT_IN_FLAG}` or --export).\n"
        f"{poc_env}={q(plan.poc)}\n"
        f"{criu_env}={q(str(prefix / 'bin' / 'criu'))}\n"
        f'PYTHONPATH={q(str(REPO_ROOT))}"${{PYTHONPATH:+:$PYTHONPATH}}"\n'
        f"export {poc_env} {criu_env} PYTHONPATH\n"
        f'exec {q(sys.executable)} -m tasks.engine.clusters.slurm.managed_job "$@"\n'
    )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def install(
    plan: Plan,
    ctx: RunContext,
    nodes: Sequence[str] | None = None,
    recorder: EventRecorder | None = None,
) -> InstallResult:
    """Install CRIU, the wrapper and (Slurm) the SPANK hook on the nodes; return per node the
    prefix, hook, manifest and files. A node already installed (its manifest is there) is
    left as it is."""
    chosen = target_nodes(plan, nodes)
    rec = recorder or recorder_for(ctx)
    nodes_kind = NODE_KINDS[plan.cluster.kind]
    dropin_dir = nodes_kind.dropin_dir()
    criu = criu_binary()
    spank = spank_plugin() if nodes_kind.spank_hook else None
    staging_root = ctx.data_dir / ctx.poc / "runs" / ctx.run_id / "install"
    result: dict[str, NodeInstall] = {}
    for node in chosen:
        lay = layout(plan, node, dropin_dir)
        staging = staging_root / node
        staging.mkdir(parents=True, exist_ok=True)
        sources = _staged_sources(plan, lay, staging, criu, spank)
        wanted_dirs = _wanted_dirs(lay, spank)
        existing = _existing(plan, node, [*wanted_dirs, *sources, lay.manifest])
        if lay.manifest in existing:
            rec.record(
                TRIAL,
                MANAGED,
                Ev.INSTALL_SKIPPED,
                node=node,
                who=who(),
                reason=f"already installed: {lay.manifest}",
            )
            result[node] = NodeInstall(str(lay.prefix), str(lay.manifest), skipped=True)
            continue
        taken = sorted(str(p) for p in sources if p in existing)
        if taken:
            raise InstallError(
                f"{node}: {', '.join(taken)} already exist and were not created by this "
                "install: refusing to overwrite them (nothing was written)"
            )
        new_dirs = [d for d in wanted_dirs if d not in existing]
        manifest = _manifest(plan, ctx, lay, sources, new_dirs, spank)
        staged_manifest = staging / MANIFEST
        write_json_atomically(staged_manifest, manifest)
        for argv in _install_steps(lay, staged_manifest, new_dirs, sources):
            done = _step(plan, rec, node, "install", argv)
            if done.returncode != 0:
                if recorder is None:
                    rec.flush()
                raise InstallError(
                    f"{node}: install step {argv} exited {done.returncode}: "
                    f"{(done.stderr or done.stdout).strip()[-500:]}; run `ckpt-poc uninstall` "
                    "to remove what was written (the manifest lists it)"
                )
        rec.record(
            TRIAL,
            MANAGED,
            Ev.INSTALLED,
            node=node,
            who=who(),
            prefix=str(lay.prefix),
            hook=manifest["hooks"],
            files=[f["path"] for f in manifest["files"]],
        )
        result[node] = NodeInstall(
            str(lay.prefix),
            str(lay.manifest),
            skipped=False,
            hooks=manifest["hooks"],
            dirs=manifest["dirs"],
            files=[f["path"] for f in manifest["files"]],
        )
    if recorder is None:
        rec.flush()
    return InstallResult(result)


def _staged_sources(
    plan: Plan, lay: NodeLayout, staging: Path, criu: Path, spank: Path | None
) -> dict[Path, tuple[Path, str]]:
    """What install copies where, ``{target: (source, mode)}``; the wrapper and the drop-in
    are written into ``staging`` first."""
    wrapper = staging / WRAPPER
    wrapper.write_text(wrapper_text(plan, lay.prefix))
    sources: dict[Path, tuple[Path, str]] = {  # target: (source, mode)
        lay.prefix / "bin" / "criu": (criu, "0755"),
        lay.prefix / "bin" / WRAPPER: (wrapper, "0755"),
    }
    if spank is not None and lay.hook is not None:
        dropin = staging / lay.hook.name
        dropin.write_text(
            f"# ckpt-poc PoC {plan.poc}: opt-in flag --ckpt-poc (removed by its uninstall)\n"
            f"optional {lay.prefix / 'lib' / SPANK_SO} poc={plan.poc} prefix={lay.prefix}\n"
        )
        sources[lay.prefix / "lib" / SPANK_SO] = (spank, "0644")
        sources[lay.hook] = (dropin, "0644")
    return sources


def _wanted_dirs(lay: NodeLayout, spank: Path | None) -> list[Path]:
    """Every folder up to one that exists: `install -d` makes missing parents too, and
    each one it makes must be in the manifest to be removed again."""
    parents = [d for d in reversed(lay.prefix.parents) if d != Path("/")]
    wanted_dirs = [*parents, lay.prefix, lay.prefix / "bin"]
    if spank is not None:
        wanted_dirs.append(lay.prefix / "lib")
    return wanted_dirs


def _manifest(
    plan: Plan,
    ctx: RunContext,
    lay: NodeLayout,
    sources: dict[Path, tuple[Path, str]],
    new_dirs: list[Path],
    spank: Path | None,
) -> InstallManifest:
    """The node's manifest: every folder install creates and every file with its sha256."""
    return {
        "poc": plan.poc,
        "node": lay.node,
        "checkpointer": "criu",
        "prefix": str(lay.prefix),
        "hooks": [str(lay.hook)] if lay.hook is not None and spank is not None else [],
        "dirs": [str(d) for d in new_dirs],
        "files": [
            {"path": str(t), "sha256": _sha256(src), "mode": mode, "source": str(src)}
            for t, (src, mode) in sources.items()
        ],
        "processes": [],  # install starts no daemon
        "reconfigure": False,  # plugstack drop-ins are read per job step: no reconfigure
        "installed_by": who(),
        "run_id": ctx.run_id,
        "installed_at": ctx.started_at.isoformat(),
    }


def _install_steps(
    lay: NodeLayout,
    staged_manifest: Path,
    new_dirs: list[Path],
    sources: dict[Path, tuple[Path, str]],
) -> list[list[str]]:
    """The argv lists install runs on the node, in order: folders, the manifest, the files."""
    steps: list[list[str]] = []
    if new_dirs:
        steps.append(["install", "-d", "-m", "0755", *map(str, new_dirs)])
    # The manifest first: a half-done install is still undone exactly by uninstall.
    tmp = lay.prefix / f".{MANIFEST}.tmp"
    steps.append(["install", "-m", "0644", str(staged_manifest), str(tmp)])
    steps.append(["mv", "-f", "--", str(tmp), str(lay.manifest)])
    for target, (src, mode) in sources.items():
        steps.append(["install", "-m", mode, str(src), str(target)])
    return steps


def opt_in(
    plan: Plan,
    ctx: RunContext,
    workload: str | None = None,
    nodes: Sequence[str] | None = None,
    recorder: EventRecorder | None = None,
) -> OptInRecord:
    """Mark the plan's workload as managed, the way the criu checkpointer defines it (Slurm:
    the ``--ckpt-poc`` flag, or the variable the hook sets; local: the managed arm), on nodes
    where install ran; record who, what and when (an `opted_in` event)."""
    chosen = target_nodes(plan, nodes)
    name = workload or plan.workload.name
    if name != plan.workload.name:
        raise BlastRadiusError(
            f"workload {name!r} is not the plan's workload {plan.workload.name!r}: refused"
        )
    nodes_kind = NODE_KINDS[plan.cluster.kind]
    dropin_dir = nodes_kind.dropin_dir()
    for node in chosen:
        lay = layout(plan, node, dropin_dir)
        if lay.manifest not in _existing(plan, node, [lay.manifest]):
            raise InstallError(f"{node}: not installed ({lay.manifest} missing): install first")
    how = nodes_kind.opt_in_how(plan)
    what: OptInWhat = {"poc": plan.poc, "workload": name, "nodes": chosen, "who": who(), **how}
    rec = recorder or recorder_for(ctx)
    event = rec.record(TRIAL, MANAGED, Ev.OPTED_IN, **what)
    record: OptInRecord = {**what, "when": event.t_wall.isoformat()}
    write_json_atomically(ctx.data_dir / ctx.poc / "opt-in" / f"{name}.json", record)
    if recorder is None:
        rec.flush()
    return record


def uninstall_argv(plan: Plan) -> list[str]:
    """exit.uninstall with its program resolved as plan check does (paths against the repo)."""
    program, *args = plan.exit.uninstall
    if "/" in program and not Path(program).is_absolute():
        program = str(REPO_ROOT / program)
    return [program, *args]


def uninstall(
    plan: Plan,
    ctx: RunContext,
    nodes: Sequence[str] | None = None,
    recorder: EventRecorder | None = None,
) -> UninstallResult:
    """Run the plan's exit.uninstall on every node with CKPT_POC_MANIFEST set to that node's
    manifest; every node is attempted, then InstallError names each that failed."""
    chosen = target_nodes(plan, nodes)
    rec = recorder or recorder_for(ctx)
    dropin_dir = NODE_KINDS[plan.cluster.kind].dropin_dir()
    argv = uninstall_argv(plan)
    result: dict[str, NodeUninstall] = {}
    failures = []
    # Last installed, first removed: a folder the first node's install created (the local
    # nodes' shared _install/) is empty only once the later ones are gone.
    for node in reversed(chosen):
        lay = layout(plan, node, dropin_dir)
        manifest = {env_markers.MANIFEST: str(lay.manifest)}  # where exit.uninstall reads it
        done = _step(plan, rec, node, "uninstall", argv, **manifest)
        tail = (done.stderr + done.stdout).strip()[-1500:]
        result[node] = NodeUninstall(done.returncode, str(lay.manifest), tail)
        if done.returncode != 0:
            failures.append(f"{node}: {argv[0]} exited {done.returncode}:\n{tail}")
    rec.record(
        TRIAL,
        MANAGED,
        Ev.UNINSTALLED,
        who=who(),
        nodes=chosen,
        failed=[n for n in chosen if result[n].rc != 0],
    )
    if recorder is None:
        rec.flush()
    if failures:
        raise InstallError("uninstall failed on " + "\n".join(failures))
    return UninstallResult(result)
