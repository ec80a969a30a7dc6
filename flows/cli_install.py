"""`ckpt-poc install | opt-in | uninstall PLAN`: the stages that touch a node, and the way out.

flows/cli.py calls ``register(app)``; each command runs its flow (flows/install.py). The
commands are module-level so that `ckpt-poc demo` calls the very same functions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from tasks.data.errors import CkptPocError

PlanArg = Annotated[Path, typer.Argument(help="the PoC plan (YAML)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the result as JSON")]


def install_cmd(plan: PlanArg, as_json: JsonOpt = False) -> None:
    """Install the plan's checkpointer on its nodes only (needs a baseline and a
    before_install snapshot of every node); then snapshot after_install."""
    from flows.cli import _fail, _flows_ready, out  # lazily: flows.cli imports us

    _flows_ready()
    from flows.install import install

    try:
        result = install(str(plan))
    except CkptPocError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(result, default=str) + "\n")
        return
    for node, info in result["nodes"].items():
        what = "already installed" if info.get("skipped") else ", ".join(info["files"])
        out.print(f"{node}: {info['prefix']}: {what}", highlight=False, markup=False)


def opt_in_cmd(
    plan: PlanArg,
    workload: Annotated[str | None, typer.Option(help="the workload (default: the plan's)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Mark the plan's workload as managed; say how its jobs opt in."""
    from flows.cli import _fail, _flows_ready, out

    _flows_ready()
    from flows.install import opt_in

    try:
        record = opt_in(str(plan), workload)
    except CkptPocError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(record, default=str) + "\n")
        return
    how = " or ".join(" ".join(record[k]) for k in ("sbatch_args", "or_sbatch_args") if k in record)
    out.print(
        f"{record['workload']} opted in by {record['who']} at {record['when']}: "
        + (f"sbatch {how}" if how else "the managed arm"),
        highlight=False,
        markup=False,
    )


def run_uninstall(plan: Path) -> dict[str, Any]:
    """The uninstall flow (exit.uninstall, after_uninstall snapshot, diff); a failed step
    is a command failure (exit 1), a leftover is not: it is in the result's verdict."""
    from flows.cli import _fail, _flows_ready

    _flows_ready()
    from flows.install import uninstall

    try:
        return uninstall(str(plan))
    except CkptPocError as exc:
        _fail(exc)
        raise  # unreachable: _fail exits


def print_verdict(result: dict[str, Any]) -> None:
    """Each leftover by name, then the verdict line."""
    from flows.cli import out

    for x in result["leftovers"]:
        out.print(
            f"  {x['node']} {x['kind']} {x['key']}: {x['change']}",
            highlight=False,
            markup=False,
        )
    out.print(f"exit verdict: {result['verdict']}", highlight=False, markup=False)


def uninstall_cmd(plan: PlanArg, as_json: JsonOpt = False) -> None:
    """Run the plan's exit.uninstall on every node, snapshot after_uninstall and diff it
    against before_install; exit 0 only when the verdict is clean."""
    result = run_uninstall(plan)
    if as_json:
        sys.stdout.write(json.dumps(result, default=str) + "\n")
    else:
        print_verdict(result)
    if result["verdict"] != "clean":
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `install`, `opt-in` and `uninstall` to the `ckpt-poc` app."""
    app.command("install")(install_cmd)
    app.command("opt-in")(opt_in_cmd)
    app.command("uninstall")(uninstall_cmd)
