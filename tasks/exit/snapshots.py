"""Node snapshots (docs/design.md §1.8): what a node looks like, item by item, read-only.

`collect` observes THIS machine and returns one ``{kind, key, value}`` dict per item for
each kind the plan's ``exit.watch`` names, running each kind's collector from the registry
in `tasks.exit.collectors` (one module per kind). Collecting never writes anything (no
cache, no temp file, no tool that installs its own database): it reads files and /proc and
runs a few read-only commands (systemctl list-units, ldconfig -p, scontrol show, kubectl
get). Whatever cannot be read is an ``error`` row (key: what, value: why) and makes the
snapshot partial; what is left out on purpose (volatile sysctls, the plan's data folder,
active unit states without systemd) is an ``excluded`` row, so the snapshot says what it
is not.

`take_snapshot` runs the collector for one plan node — locally, or inside a Slurm job
pinned to that node with `srun` (`python -m tasks.exit.snapshots collect ... --json`, no SSH) —
stamps the rows and writes the ``snapshots`` dataset; the caller commits the run.

A process is stored as its executable and an HMAC of its argv with the pseudonymisation key
(tasks.baseline.pseudonym: the environment or the plan's Prefect Secret); the key reaches the
Slurm job in its environment, never on a command line. ``take_snapshots`` of ``after_uninstall``
takes it again ``exit.recheck_after_s`` later (phase ``after_uninstall.recheck``, the same run):
what is gone by then was transient.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tasks.baseline.pseudonym import KEY_ENV, Pseudonymiser, load_pseudonym_key
from tasks.data.datasets import SNAPSHOTS
from tasks.data.errors import BlastRadiusError, CkptPocError
from tasks.data.jsonform import JsonForm
from tasks.data.plan import AllowedChange, Plan, Watch
from tasks.data.runctx import REPO_ROOT, RunContext
from tasks.data.store import read_dataset, write_dataset
from tasks.exit.collectors import COLLECTORS, Collector, Observation
from tasks.exit.collectors.base import ProcessTable
from tasks.exit.collectors.files import NEVER_WALKED
from tasks.exit.collectors.processes import (
    COLLECTOR_MODULE,
    READS_PROCESS_TABLE,
    read_processes,
)
from tasks.exit.footprint import installed_globs
from tasks.exit.install import prefix_root
from tasks.exit.writers.service import RECORDER_ALLOWED, start_recorders, stop_recorders

SRUN_TIMEOUT_S = 600
# The phase whose snapshot is taken a second time, exit.recheck_after_s later, and its name.
RECHECKED_PHASE = "after_uninstall"
INSTALL_PHASE = "before_install"  # the writer recorder starts once it is taken
RECHECK_SUFFIX = ".recheck"


def recheck_phase(phase: str) -> str:
    return phase + RECHECK_SUFFIX


def poc_paths() -> tuple[str, ...]:
    """The PoC's own folders on a node: this checkout and the install prefix root."""
    return (str(REPO_ROOT), str(prefix_root()))


def allowed_changes(plan: Plan) -> list[AllowedChange]:
    """The plan's allowed changes and the harness's own (the writer recorder's process and
    unit)."""
    return [*plan.exit.allowed_changes, *RECORDER_ALLOWED]


def argv_rules(plan: Plan) -> tuple[str, ...]:
    """The allowed argv globs, matched by the processes collector on the node."""
    return tuple(a.argv for a in allowed_changes(plan) if a.argv is not None)


def plan_pseudonymiser(plan: Plan) -> Pseudonymiser:
    """The argv hash's key: the project's pseudonymisation key (environment or Secret)."""
    key, _origin = load_pseudonym_key(plan.baseline.pseudonym_key_secret)
    return Pseudonymiser(key)


def collect(
    node: str,
    watch: Watch,
    *,
    root: Path = Path("/"),
    slurm: bool = False,
    data_dirs: list[str] | None = None,
    kubernetes: bool = False,
    env: Mapping[str, str] | None = None,
    pseudonymiser: Pseudonymiser | None = None,
    allowed_argv: tuple[str, ...] = (),
) -> list[dict[str, str]]:
    """Observe this machine: one {kind, key, value} per item of each kind ``watch`` names.

    ``data_dirs`` (the plan's data folder) are never walked; ``root`` lets a test point the
    file-based kinds at a fake tree (processes and sockets always read this kernel).
    ``pseudonymiser`` keys the argv hashes (default: the key in the environment);
    ``allowed_argv``: the plan's argv globs (tasks.data.plan.AllowedChange.argv).
    """
    reads_procs = bool(READS_PROCESS_TABLE & set(watch.kinds))
    if reads_procs and pseudonymiser is None:
        pseudonymiser = Pseudonymiser(load_pseudonym_key(None)[0])
    col = Collector(root)
    obs = Observation(
        node=node,
        watch=watch,
        data_dirs=[os.path.abspath(d) for d in data_dirs or []],
        scheduler="slurm" if slurm else "kubernetes" if kubernetes else None,
        env=env,
        # Read once, before any kind, for every kind that reads it.
        processes=_as_seen_from(read_processes(), root) if reads_procs else None,
        pseudonymiser=pseudonymiser,
        argv_rules=tuple(allowed_argv),
        poc_paths=poc_paths(),
    )
    for kind in watch.kinds:
        COLLECTORS[kind](col, obs)
    return col.rows()


def _as_seen_from(procs: ProcessTable, root: Path) -> ProcessTable:
    """A fake root's processes name their executables as the node would (``root`` cut off),
    so a process run from a file the snapshot lists is matched with that file."""
    top = str(root).rstrip("/")
    if not top:
        return procs
    for info in procs.values():
        if info["exe"].startswith(top + "/"):
            info["exe"] = info["exe"][len(top) :]
    return procs


# --- the dataset -----------------------------------------------------------------------------


def _check_node(plan: Plan, node: str) -> None:
    if node not in plan.cluster.nodes:
        raise BlastRadiusError(
            f"node {node!r} is not one of the plan's nodes {list(plan.cluster.nodes)}: "
            "nothing was observed"
        )


def _data_dirs(plan: Plan, ctx: RunContext) -> list[str]:
    """The PoC's own folders, never walked: its data dir and its images_dir's PoC folder."""
    images = plan.checkpointer.images_dir
    own = {str(Path(plan.data_dir).resolve()), str(ctx.data_dir)}
    return sorted(own | ({str(Path(images).resolve() / plan.poc)} if images else set()))


def collect_on_slurm(
    plan: Plan, node: str, data_dirs: list[str], env: Mapping[str, str] | None = None
) -> list[dict[str, str]]:
    """Run the collector in a Slurm job pinned to ``node`` (srun waits and relays stdout)."""
    argv = [
        "srun",
        "-w",
        node,
        "-p",
        plan.cluster.queue,
        "-N1",
        "-n1",
        "--quiet",
        "--job-name=ckpt-poc-snapshot",
        f"--chdir={REPO_ROOT}",
        sys.executable,
        "-m",
        COLLECTOR_MODULE,
        "collect",
        "--node",
        node,
        "--watch",
        plan.exit.watch.model_dump_json(),
        "--slurm",
        "--json",
        *[a for d in data_dirs for a in ("--data-dir", d)],
        *[a for g in argv_rules(plan) for a in ("--allowed-argv", g)],
    ]
    # The key travels in srun's environment (exported to the job), never on its command line.
    job_env = {**(os.environ if env is None else env)}
    job_env[KEY_ENV] = load_pseudonym_key(plan.baseline.pseudonym_key_secret)[0].decode()
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=SRUN_TIMEOUT_S,
            check=False,
            cwd=REPO_ROOT,
            env=job_env,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CkptPocError(f"snapshot of node {node}: srun failed: {exc}") from exc
    if done.returncode != 0:
        raise CkptPocError(
            f"snapshot of node {node}: srun exited {done.returncode}: "
            f"{(done.stderr.strip() or done.stdout.strip())[-800:]}"
        )
    try:
        rows = json.loads(done.stdout)
    except ValueError as exc:
        raise CkptPocError(f"snapshot of node {node}: the job printed no JSON: {exc}") from exc
    return rows


def take_snapshots(
    plan: Plan, ctx: RunContext, phase: str, nodes: list[str]
) -> dict[str, pd.DataFrame]:
    """``take_snapshot`` of each of ``nodes``. On a local plan every node is this machine:
    it is observed once and the rows are written under each node's name (observing the
    same machine twice in a row only doubles the time). The ``after_uninstall`` snapshot is
    taken again ``exit.recheck_after_s`` later (``after_uninstall.recheck``, not returned)."""
    out = _snapshot_nodes(plan, ctx, phase, nodes)
    if phase == RECHECKED_PHASE and plan.exit.recheck_after_s > 0:
        time.sleep(plan.exit.recheck_after_s)
        _snapshot_nodes(plan, ctx, recheck_phase(phase), nodes)
    if phase == INSTALL_PHASE:  # from here to the recheck, every write has its writer
        skip = [*_data_dirs(plan, ctx), *NEVER_WALKED]
        start_recorders(plan, skip, list(poc_paths()), installed_globs(plan))
    elif phase == RECHECKED_PHASE:
        stop_recorders(plan)
    return out


def _snapshot_nodes(
    plan: Plan, ctx: RunContext, phase: str, nodes: list[str]
) -> dict[str, pd.DataFrame]:
    out: dict[str, pd.DataFrame] = {}
    observed: list[dict[str, str]] | None = None
    for node in nodes:
        out[node] = take_snapshot(plan, ctx, phase, node, observed=observed)
        if plan.cluster.kind == "local":
            observed = out[node][["kind", "key", "value"]].to_dict("records")
    return out


def take_snapshot(
    plan: Plan,
    ctx: RunContext,
    phase: str,
    node: str,
    env: Mapping[str, str] | None = None,
    observed: list[dict[str, str]] | None = None,
) -> pd.DataFrame:
    """Observe one plan node at ``phase`` and write its rows (``snapshots``); the caller
    commits. A node the plan does not name is refused before anything runs. ``observed``:
    rows already read from this same machine (a local plan's other node)."""
    _check_node(plan, node)
    if not phase or not re.fullmatch(r"[A-Za-z0-9_.-]+", phase):
        raise CkptPocError(f"phase {phase!r}: use letters, digits, '_', '-' or '.'")
    data_dirs = _data_dirs(plan, ctx)
    kind = plan.cluster.kind
    if observed is not None and kind == "local":
        rows = observed
    elif kind == "slurm":
        rows = collect_on_slurm(plan, node, data_dirs, env)
    else:  # local: every plan node is this machine; kubernetes: run where kubectl reaches
        rows = collect(
            node,
            plan.exit.watch,
            slurm=False,
            kubernetes=kind == "kubernetes",
            data_dirs=data_dirs,
            pseudonymiser=plan_pseudonymiser(plan),
            allowed_argv=argv_rules(plan),
        )
    df = pd.DataFrame(rows, columns=["kind", "key", "value"])
    partial = bool((df["kind"] == "error").any())
    for column, value in ctx.stamp().items():
        df[column] = value
    df["node"] = node
    df["phase"] = phase
    df["partial"] = partial
    df["taken_at"] = pd.Timestamp(dt.datetime.now(dt.UTC))
    df = df[SNAPSHOTS.column_names]
    write_dataset(
        df,
        SNAPSHOTS,
        data_dir=ctx.data_dir,
        poc=ctx.poc,
        run_id=ctx.run_id,
        # One run snapshots every plan node: one file each (a second <run_id>.parquet in the
        # same week would be refused as a rewrite).
        # The recheck is the same run's second snapshot of the node: its own file.
        part=list(plan.cluster.nodes).index(node)
        + (len(plan.cluster.nodes) if phase.endswith(RECHECK_SUFFIX) else 0),
        metadata=ctx.file_metadata,
    )
    return df


def latest_snapshot(data_dir: str | Path, poc: str, node: str, phase: str) -> pd.DataFrame | None:
    """The newest committed snapshot of ``node`` at ``phase``, or None."""
    df = read_dataset(SNAPSHOTS, data_dir=data_dir, poc=poc)
    df = df[(df["node"] == node) & (df["phase"] == phase)]
    if df.empty:
        return None
    newest = df.groupby("run_id", observed=True)["taken_at"].max().idxmax()
    return df[df["run_id"] == newest].reset_index(drop=True)


# --- `python -m tasks.exit.snapshots collect` (what the Slurm job runs) ----------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.exit.snapshots")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="observe this machine; print the rows")
    c.add_argument("--node", required=True)
    c.add_argument("--watch", default="{}", help="the plan's exit.watch as JSON")
    c.add_argument("--slurm", action="store_true")
    c.add_argument("--kubernetes", action="store_true")
    c.add_argument("--data-dir", action="append", default=[])
    c.add_argument("--allowed-argv", action="append", default=[], help="a plan argv glob")
    c.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    args = parser.parse_args(argv)
    watch = Watch.model_validate_json(args.watch)
    rows = collect(
        args.node,
        watch,
        slurm=args.slurm,
        kubernetes=args.kubernetes,
        data_dirs=args.data_dir,
        allowed_argv=tuple(args.allowed_argv),
    )
    sys.stdout.write(json.dumps(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# --- the stage's result ------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeSnapshot(JsonForm):
    """One node's snapshot: items read, whether partial, what could not be read, the kinds."""

    items: int
    partial: bool
    errors: tuple[str, ...]
    kinds: tuple[str, ...]

    @classmethod
    def of(cls, rows: pd.DataFrame) -> NodeSnapshot:
        errors = rows[rows["kind"] == "error"]
        return cls(
            items=int((~rows["kind"].isin(["error", "excluded"])).sum()),
            partial=bool(rows["partial"].any()),
            errors=tuple(f"{r.key}: {r.value}" for r in errors.itertuples()),
            kinds=tuple(sorted(set(rows["kind"]) - {"error", "excluded"})),
        )


@dataclass(frozen=True)
class SnapshotResult(JsonForm):
    """A snapshot run: one NodeSnapshot per node; partial when any node's is."""

    run_id: str
    phase: str
    nodes: Mapping[str, NodeSnapshot]
    partial: bool

    @classmethod
    def of(cls, run_id: str, phase: str, by_node: Mapping[str, pd.DataFrame]) -> SnapshotResult:
        nodes = {node: NodeSnapshot.of(rows) for node, rows in by_node.items()}
        return cls(run_id, phase, nodes, any(n.partial for n in nodes.values()))

    def partial_nodes(self) -> list[str]:
        return sorted(n for n, s in self.nodes.items() if s.partial)

    def markdown(self) -> str:
        lines = [f"# Snapshot `{self.phase}`", ""]
        lines += ["| node | items | partial | kinds |", "|---|---|---|---|"]
        for node, s in self.nodes.items():
            lines.append(f"| {node} | {s.items} | {s.partial} | {', '.join(s.kinds)} |")
        for node, s in self.nodes.items():
            if s.errors:
                lines += ["", f"## {node}: could not read", *[f"- {e}" for e in s.errors[:50]]]
        return "\n".join(lines) + "\n"

    def partial_error(self) -> CkptPocError:
        """The error a partial snapshot fails its run with: what could not be read."""
        errors = [f"  - {n}: {e}" for n, s in self.nodes.items() for e in s.errors[:10]]
        return CkptPocError(
            f"snapshot {self.phase!r} is partial (written and marked so; never diffed as "
            "whole):\n" + "\n".join(errors)
        )
