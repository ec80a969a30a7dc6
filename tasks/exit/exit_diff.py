"""The way out, proved (DESIGN §1.8): two snapshots of each plan node, diffed.

Every item added, removed or changed between ``from_phase`` and ``to_phase`` is a leftover
unless the plan's ``exit.allowed_changes`` allows it (same kind, fnmatch glob over the key).
What may change is declared in the plan, never here. A partial snapshot (one that could not
read something) is refused: a diff of half a node would call it clean.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from typing import Any

import pandas as pd

from tasks.data.datasets import EXIT_DIFF, EXIT_VERDICTS
from tasks.data.errors import CkptPocError
from tasks.data.plan import AllowedChange, Plan
from tasks.data.runctx import RunContext
from tasks.data.store import write_dataset
from tasks.exit.snapshots import latest_snapshot

NOT_COMPARED = ("error", "excluded")
LEFTOVER_FIELDS = ("node", "kind", "key", "change", "before", "after")


class PartialSnapshotError(CkptPocError):
    """A snapshot missed something: it cannot stand for the whole node."""


def _describe(df: pd.DataFrame) -> str:
    if df.empty:
        return "an empty snapshot"
    first = df.iloc[0]
    return f"snapshot {first['phase']!r} of node {first['node']!r} (run {first['run_id']})"


def refuse_partial(df: pd.DataFrame) -> None:
    errors = df[df["kind"] == "error"]
    if errors.empty and not bool(df["partial"].any()):
        return
    reasons = [f"{r.key}: {r.value}" for r in errors.itertuples()][:20]
    more = len(errors) - len(reasons)
    raise PartialSnapshotError(
        f"{_describe(df)} is partial, so it is not diffed as if whole; it could not read:\n"
        + "\n".join(f"  - {r}" for r in reasons or ["(no error row: marked partial)"])
        + (f"\n  … and {more} more" if more > 0 else "")
    )


def _items(df: pd.DataFrame) -> dict[tuple[str, str], str | None]:
    kept = df[~df["kind"].isin(NOT_COMPARED)]
    return {
        (str(k), str(key)): (None if pd.isna(v) else str(v))
        for k, key, v in zip(kept["kind"], kept["key"], kept["value"], strict=True)
    }


def is_allowed(kind: str, key: str, allowed: list[AllowedChange]) -> bool:
    return any(a.kind == kind and fnmatch.fnmatchcase(key, a.key) for a in allowed)


def diff_snapshots(
    before: pd.DataFrame, after: pd.DataFrame, allowed: list[AllowedChange], node: str
) -> list[dict[str, Any]]:
    """Leftovers of ``node``: {node, kind, key, change, before, after}, sorted by kind, key.
    Refuses (PartialSnapshotError) a partial snapshot on either side."""
    refuse_partial(before)
    refuse_partial(after)
    old, new = _items(before), _items(after)
    leftovers = []
    for kind, key in sorted(set(old) | set(new)):
        was, now = old.get((kind, key)), new.get((kind, key))
        if (kind, key) in old and (kind, key) in new and was == now:
            continue
        if is_allowed(kind, key, allowed):
            continue
        change = (
            "added"
            if (kind, key) not in old
            else "removed"
            if (kind, key) not in new
            else ("changed")
        )
        leftovers.append(
            {"node": node, "kind": kind, "key": key, "change": change, "before": was, "after": now}
        )
    return leftovers


def exit_diff(plan: Plan, ctx: RunContext, from_phase: str, to_phase: str) -> dict[str, Any]:
    """Diff the newest committed snapshots of every plan node; write the leftovers
    (``exit_diff``) and return {verdict, leftovers, nodes}. The caller commits."""
    missing, pairs = [], {}
    for node in plan.cluster.nodes:
        before = latest_snapshot(ctx.data_dir, ctx.poc, node, from_phase)
        after = latest_snapshot(ctx.data_dir, ctx.poc, node, to_phase)
        for phase, df in ((from_phase, before), (to_phase, after)):
            if df is None:
                missing.append(f"  - {node} at {phase!r}")
        pairs[node] = (before, after)
    if missing:
        raise CkptPocError(
            "no committed snapshot of:\n"
            + "\n".join(missing)
            + "\ntake it with `ckpt-poc snapshot PLAN --phase PHASE --node NODE`"
        )
    leftovers: list[dict[str, Any]] = []
    nodes: dict[str, Any] = {}
    for node, (before, after) in pairs.items():
        assert before is not None and after is not None
        found = diff_snapshots(before, after, list(plan.exit.allowed_changes), node)
        leftovers += found
        nodes[node] = {
            "leftovers": len(found),
            "from_run": str(before["run_id"].iloc[0]),
            "to_run": str(after["run_id"].iloc[0]),
            "from_taken_at": pd.Timestamp(before["taken_at"].max()).isoformat(),
            "to_taken_at": pd.Timestamp(after["taken_at"].max()).isoformat(),
            "items_compared": len(_items(before).keys() | _items(after).keys()),
        }
    diffed_at = pd.Timestamp(dt.datetime.now(dt.UTC))
    if leftovers:
        df = pd.DataFrame(leftovers)
        for column, value in ctx.stamp().items():
            df[column] = value
        df["from_phase"] = from_phase
        df["to_phase"] = to_phase
        df["diffed_at"] = diffed_at
        write_dataset(
            df[EXIT_DIFF.column_names],
            EXIT_DIFF,
            data_dir=ctx.data_dir,
            poc=ctx.poc,
            run_id=ctx.run_id,
            metadata=ctx.file_metadata,
        )
    # The verdict per node, clean ones too: the weekly report reads it from here.
    verdicts = pd.DataFrame(
        [
            {
                **ctx.stamp(),
                "node": node,
                "from_phase": from_phase,
                "to_phase": to_phase,
                "verdict": "leftovers" if info["leftovers"] else "clean",
                "leftovers": info["leftovers"],
                "items_compared": info["items_compared"],
                "diffed_at": diffed_at,
            }
            for node, info in nodes.items()
        ]
    )
    write_dataset(
        verdicts[EXIT_VERDICTS.column_names],
        EXIT_VERDICTS,
        data_dir=ctx.data_dir,
        poc=ctx.poc,
        run_id=ctx.run_id,
        metadata=ctx.file_metadata,
    )
    return {
        "verdict": "leftovers" if leftovers else "clean",
        "leftovers": leftovers,
        "nodes": nodes,
        "from_phase": from_phase,
        "to_phase": to_phase,
    }


def verdict_line(result: dict[str, Any]) -> str:
    n = len(result["leftovers"])
    return "clean" if not n else f"leftovers: {n}"


def leftovers_markdown(result: dict[str, Any], limit: int = 200) -> str:
    """The verdict first, then one table row per leftover (values cut to stay readable)."""

    def cell(value: Any) -> str:
        text = "" if value is None else str(value)
        text = text if len(text) <= 80 else text[:77] + "…"
        return text.replace("|", "\\|").replace("\n", " ")

    lines = [
        f"# Exit verdict: **{verdict_line(result)}**",
        "",
        f"From `{result['from_phase']}` to `{result['to_phase']}`, per node: "
        + ", ".join(f"{n}: {v['leftovers']}" for n, v in result["nodes"].items()),
        "",
    ]
    if result["leftovers"]:
        lines += ["| node | kind | key | change | before | after |", "|---|---|---|---|---|---|"]
        for item in result["leftovers"][:limit]:
            lines.append("| " + " | ".join(cell(item[f]) for f in LEFTOVER_FIELDS) + " |")
        if len(result["leftovers"]) > limit:
            lines.append(f"\n… and {len(result['leftovers']) - limit} more (dataset exit_diff)")
    return "\n".join(lines) + "\n"
