"""The way out, proved (docs/design.md §1.8): two snapshots of each plan node, diffed, attributed.

Every item added, removed or changed between ``from_phase`` and ``to_phase`` that the plan's
``exit.allowed_changes`` does not allow (same kind, fnmatch glob over the key; for a process
also its argv glob, matched on the node: tasks.exit.collectors.processes) gets a class:

- ``poc``: the PoC's — under its install prefix or its hook, a file its install recorded
  (the `installed` events), the checkpointer's known footprint (tasks/exit/footprint.py; for
  Cedana its known leftovers), a process or socket whose owner or an ancestor is the PoC's;
- ``node_own``: the node's own life — on the control node (``exit.control_node``, never
  installed on), changed the same way there, transient (back as it was in the
  ``after_uninstall.recheck`` snapshot of the same run), or a process (or its socket) whose
  ancestry never touches the PoC and whose executable is no new, changed or deleted file;
- ``unexplained``: the rest.

Leftovers are the ``poc`` and ``unexplained`` items; the verdict is ``clean`` only without
any. Node-own items are written and listed apart, each with its reason, never counted.
A partial snapshot (one that could not read something) is refused: a diff of half a node
would call it clean.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypedDict

import pandas as pd

from tasks.data.datasets import EVENTS, EXIT_DIFF, EXIT_VERDICTS, WRITE_GAPS, WRITES
from tasks.data.errors import CkptPocError
from tasks.data.events import Ev
from tasks.data.plan import AllowedChange, Plan
from tasks.data.runctx import RunContext
from tasks.data.settings import env_name
from tasks.data.store import read_dataset, write_dataset
from tasks.exit.exit_result import ExitDiff, NodeDiff
from tasks.exit.footprint import known_footprint
from tasks.exit.snapshots import allowed_changes, latest_snapshot, recheck_phase
from tasks.exit.writers.service import WriterLog, host_of, read_writer_log, recorder_hosts

NOT_COMPARED = ("error", "excluded")
LEFTOVER_FIELDS = ("node", "kind", "key", "change", "before", "after")
CLASSES = ("poc", "node_own", "unexplained")
# Kinds whose items are a process (or a process's socket): attributed by its facts.
PROCESS_KINDS = ("processes", "sockets")
KEY_ID_ROW = "processes:argv"
MEMFD = "/memfd:"  # an anonymous executable's /proc/PID/exe


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


def _key_id(df: pd.DataFrame) -> str | None:
    """Which key hashed the snapshot's argv (its excluded row names it; None: no processes)."""
    row = df[(df["kind"] == "excluded") & (df["key"] == KEY_ID_ROW)]
    return None if row.empty else str(row["value"].iloc[0])


def refuse_other_keys(before: pd.DataFrame, after: pd.DataFrame) -> None:
    """Argv hashes made with two keys never match: every process would read as new."""
    a, b = _key_id(before), _key_id(after)
    if a is not None and b is not None and a != b:
        raise CkptPocError(
            f"{_describe(before)} and {_describe(after)} hashed the processes' argv with "
            f"different pseudonymisation keys: set {env_name('pseudonym_key')} (or the plan's "
            "baseline.pseudonym_key_secret) to the key of the first and snapshot again"
        )


# a dict: a process item's JSON value as parsed
def _process_value(value: str | None) -> dict[str, Any]:
    if value is None:
        return {}
    try:
        parsed = json.loads(value)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def is_allowed(
    kind: str, key: str, allowed: list[AllowedChange], values: Iterable[str | None] = ()
) -> bool:
    """Allowed by a rule of its kind whose key glob matches; a rule with an argv glob only
    where the node matched it (the item's ``argv_allowed``, on either side)."""
    matched_argv = {g for v in values for g in _process_value(v).get("argv_allowed", [])}
    return any(
        a.kind == kind
        and fnmatch.fnmatchcase(key, a.key)
        and (a.argv is None or a.argv in matched_argv)
        for a in allowed
    )


def diff_snapshots(
    before: pd.DataFrame, after: pd.DataFrame, allowed: list[AllowedChange], node: str
) -> list[dict[str, Any]]:
    """What differs on ``node`` and is not allowed: {node, kind, key, change, before, after},
    sorted by kind, key. Refuses (PartialSnapshotError) a partial snapshot on either side."""
    refuse_partial(before)
    refuse_partial(after)
    refuse_other_keys(before, after)
    old, new = _items(before), _items(after)
    found = []
    for kind, key in sorted(set(old) | set(new)):
        was, now = old.get((kind, key)), new.get((kind, key))
        if (kind, key) in old and (kind, key) in new and was == now:
            continue
        if is_allowed(kind, key, allowed, (was, now)):
            continue
        change = "added" if (kind, key) not in old else "changed"
        if (kind, key) not in new:
            change = "removed"
        found.append(
            {"node": node, "kind": kind, "key": key, "change": change, "before": was, "after": now}
        )
    return found


# --- attribution ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Attribution:
    """What the classes of one node's differences are judged by."""

    node: str
    control_node: str | None = None
    # (kind, glob, why) the PoC's own: its install's records and the checkpointer's footprint.
    footprint: tuple[tuple[str, str, str], ...] = ()
    # (kind, key, change) of the control node's own differences over the same phases.
    mirrored: frozenset[tuple[str, str, str]] = frozenset()
    # The node's items in the recheck snapshot (None: no recheck of the same run).
    recheck: dict[tuple[str, str], str | None] | None = None
    recheck_after_s: float = 0
    # Files added or changed on this node (a process run from one is not the node's own).
    new_files: frozenset[str] = field(default_factory=frozenset)
    before: dict[tuple[str, str], str | None] = field(default_factory=dict)
    # The writer recorder's rows by path (None: no recorder ran for this node), and whether
    # it had a gap (then no change is the node's own by its writers).
    writes: dict[str, list[dict[str, Any]]] | None = None
    writer_gaps: tuple[str, ...] = ()


def _poc_reason(item: dict[str, Any], at: Attribution) -> str | None:
    kind, key = item["kind"], item["key"]
    for fkind, glob, why in at.footprint:
        if fkind == kind and fnmatch.fnmatchcase(key, glob):
            return why
    if kind in PROCESS_KINDS:
        markers = sorted(
            {m for v in (item["before"], item["after"]) for m in _process_value(v).get("poc", [])}
        )
        if markers:
            return "its process or an ancestor is the PoC's: " + ", ".join(markers)
    return None


def _writers_say(item: dict[str, Any], at: Attribution) -> tuple[str, str] | None:
    """(class, reason) of a change to a file (of any kind keyed by its path) by who wrote it
    (tasks/exit/writers): the PoC's when any recorded write came from its side; the node's
    own when every one came from outside it and the recorder had no gap; None (other checks
    decide) without a recorded write."""
    key = str(item["key"])
    path = key.removeprefix("file:")  # a unit file, cron file or scheduler config file too
    if at.writes is None or not path.startswith("/"):
        return None
    rows = at.writes.get(path, [])
    if not rows:
        return None
    poc = [r for r in rows if r["side"] == "poc"]
    if poc:
        r = poc[0]
        return "poc", f"written by the PoC's {r['writer_exe']} (pid {r['pid']}: {r['why']})"
    if at.writer_gaps or any(r["side"] != "node" for r in rows):
        return None
    said = "; ".join(
        f"{r['writer_exe']}, pid {r['pid']}, cgroup {r['writer_cgroup']} ({r['count']} {r['what']})"
        for r in rows[:3]
    )
    return "node_own", f"written by {said}: not the PoC's"


def _process_is_nodes(item: dict[str, Any], at: Attribution) -> str | None:
    """A process (or socket) with no PoC marker, run from no new, changed or deleted file."""
    if item["kind"] not in PROCESS_KINDS:
        return None
    facts = [_process_value(v) for v in (item["before"], item["after"]) if v is not None]
    # A memfd executable reads as deleted: it was never a file on the node to be left behind.
    deleted = [f for f in facts if f.get("exe_deleted") and not str(f.get("exe")).startswith(MEMFD)]
    if not facts or deleted or any(f.get("poc") for f in facts):
        return None
    exes = {f.get("exe") for f in facts}
    if None in exes or exes & at.new_files:
        return None
    what = "a process" if item["kind"] == "processes" else "a socket of a process"
    return (
        f"{what} whose ancestry never touches the PoC; its executable "
        f"{', '.join(sorted(str(e) for e in exes))} is no new or changed file"
    )


def classify(item: dict[str, Any], at: Attribution) -> tuple[str, str]:
    """(class, reason) of one difference: the PoC's first, then the node's own, else
    unexplained."""
    why = _poc_reason(item, at)
    if why is not None and item["kind"] in PROCESS_KINDS and item["change"] == "removed":
        # The PoC's own process, running before the install, has ended: nothing is left.
        return "node_own", f"ended: a PoC process running before the install ({why})"
    if why is not None:
        return "poc", why
    by_writer = _writers_say(item, at)
    if by_writer is not None:
        return by_writer
    if at.control_node is not None and item["node"] == at.control_node:
        return "node_own", "on the control node (exit.control_node), never installed on"
    if (item["kind"], item["key"], item["change"]) in at.mirrored:
        return "node_own", f"changed the same way on the control node {at.control_node}"
    if at.recheck is not None:
        where = (item["kind"], item["key"])
        if at.recheck.get(where) == at.before.get(where):
            return (
                "node_own",
                f"transient: as before again in the recheck {at.recheck_after_s:g} s later",
            )
    why = _process_is_nodes(item, at)
    if why is not None:
        return "node_own", why
    return "unexplained", "not the PoC's by its records, not the node's own by any check"


def install_footprint(plan: Plan, data_dir: Any, poc: str) -> list[tuple[str, str, str]]:
    """(kind, glob, why) of what the PoC's install and checkpointer put on a node: the known
    footprint (tasks/exit/footprint.py) and every file the install recorded."""
    found = known_footprint(plan)
    events = read_dataset(EVENTS, data_dir=data_dir, poc=poc, columns=["event", "detail"])
    for detail in events.loc[events["event"] == Ev.INSTALLED, "detail"].dropna():
        record = _process_value(str(detail))
        for path in [*record.get("files", []), *(record.get("hook") or [])]:
            found.append(("files", str(path), "written by the install (its installed event)"))
        if record.get("prefix"):
            found.append(("files", f"{record['prefix']}*", "under the recorded install prefix"))
    return found


# --- the stage --------------------------------------------------------------------------------


@dataclass
class NodePair:
    """One node's two snapshots, and the recheck of the later one (None: none taken)."""

    before: pd.DataFrame
    after: pd.DataFrame
    recheck: pd.DataFrame | None = None


def _pairs(ctx: RunContext, plan: Plan, from_phase: str, to_phase: str) -> dict[str, NodePair]:
    missing, pairs = [], {}
    for node in plan.cluster.nodes:
        before = latest_snapshot(ctx.data_dir, ctx.poc, node, from_phase)
        after = latest_snapshot(ctx.data_dir, ctx.poc, node, to_phase)
        for phase, df in ((from_phase, before), (to_phase, after)):
            if df is None:
                missing.append(f"  - {node} at {phase!r}")
        if before is None or after is None:
            continue
        recheck = latest_snapshot(ctx.data_dir, ctx.poc, node, recheck_phase(to_phase))
        # Only the recheck the same run took right after; a partial one checks nothing.
        if recheck is not None and (
            recheck["run_id"].iloc[0] != after["run_id"].iloc[0] or bool(recheck["partial"].any())
        ):
            recheck = None
        pairs[node] = NodePair(before, after, recheck)
    if missing:
        raise CkptPocError(
            "no committed snapshot of:\n"
            + "\n".join(missing)
            + "\ntake it with `ckpt-poc snapshot PLAN --phase PHASE --node NODE`"
        )
    return pairs


def diff_and_attribute(
    plan: Plan,
    pairs: dict[str, NodePair],
    data_dir: Any,
    logs: dict[str, WriterLog | None] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Each node's differences that the plan does not allow, each with its ``class`` and
    ``reason``. ``data_dir``: where the install's `installed` events are read."""
    diffs = {
        node: diff_snapshots(p.before, p.after, allowed_changes(plan), node)
        for node, p in pairs.items()
    }
    if logs is None:
        logs = writer_logs(plan)
    control = plan.exit.control_node
    footprint = tuple(install_footprint(plan, data_dir, plan.poc))
    mirrored = frozenset((x["kind"], x["key"], x["change"]) for x in diffs.get(control or "", []))
    for node, found in diffs.items():
        pair = pairs[node]
        at = Attribution(
            node=node,
            control_node=control,
            footprint=footprint,
            mirrored=mirrored if node != control else frozenset(),
            recheck=_items(pair.recheck) if pair.recheck is not None else None,
            recheck_after_s=plan.exit.recheck_after_s,
            new_files=frozenset(
                x["key"] for x in found if x["kind"] == "files" and x["change"] != "removed"
            ),
            before=_items(pair.before),
            **_writer_evidence(logs.get(host_of(plan, node) or "")),
        )
        for item in found:
            item["class"], item["reason"] = classify(item, at)
    return diffs


def writer_logs(plan: Plan) -> dict[str, WriterLog | None]:
    """Each recorder host's log (None: no recorder ran there)."""
    return {host: read_writer_log(plan, host) for host in recorder_hosts(plan)}


class WriterEvidence(TypedDict):
    """An Attribution's writer fields, from its node's recorder log."""

    writes: dict[str, list[dict[str, Any]]] | None
    writer_gaps: tuple[str, ...]


def _writer_evidence(log: WriterLog | None) -> WriterEvidence:
    """The Attribution's writes (by path) and writer gaps from a node's recorder log."""
    if log is None:
        return {"writes": None, "writer_gaps": ()}
    writes: dict[str, list[dict[str, Any]]] = {}
    for row in log.rows:
        writes.setdefault(row["path"], []).append(row)
    return {"writes": writes, "writer_gaps": tuple(g["reason"] for g in log.gaps)}


def _node_info(node: str, pair: NodePair, found: list[dict[str, Any]]) -> NodeDiff:
    counts = {c: sum(1 for x in found if x["class"] == c) for c in CLASSES}
    return NodeDiff(
        leftovers=counts["poc"] + counts["unexplained"],
        poc_items=counts["poc"],
        unexplained=counts["unexplained"],
        node_own=counts["node_own"],
        from_run=str(pair.before["run_id"].iloc[0]),
        to_run=str(pair.after["run_id"].iloc[0]),
        recheck=pair.recheck is not None,
        from_taken_at=pd.Timestamp(pair.before["taken_at"].max()).isoformat(),
        to_taken_at=pd.Timestamp(pair.after["taken_at"].max()).isoformat(),
        items_compared=len(_items(pair.before).keys() | _items(pair.after).keys()),
    )


def exit_diff(plan: Plan, ctx: RunContext, from_phase: str, to_phase: str) -> ExitDiff:
    """Diff the newest committed snapshots of every plan node and attribute each difference;
    write them (``exit_diff``, node-own ones too) and each node's verdict
    (``exit_verdicts``); return the verdict, the items and each node's counts. The caller
    commits."""
    pairs = _pairs(ctx, plan, from_phase, to_phase)
    logs = writer_logs(plan)
    diffs = diff_and_attribute(plan, pairs, ctx.data_dir, logs)
    for log in logs.values():
        write_writer_log(ctx, log)
    nodes = {node: _node_info(node, pairs[node], found) for node, found in diffs.items()}
    everything = [x for found in diffs.values() for x in found]
    diffed_at = pd.Timestamp(dt.datetime.now(dt.UTC))
    _write(ctx, everything, nodes, from_phase, to_phase, diffed_at)
    leftovers = [x for x in everything if x["class"] != "node_own"]
    return ExitDiff(
        verdict="leftovers" if leftovers else "clean",
        leftovers=leftovers,
        node_own=[x for x in everything if x["class"] == "node_own"],
        nodes=nodes,
        control_node=plan.exit.control_node,
        recheck_after_s=plan.exit.recheck_after_s,
        from_phase=from_phase,
        to_phase=to_phase,
    )


def write_writer_log(ctx: RunContext, log: WriterLog | None) -> None:
    """The recorder's rows and gaps as the run's ``writes`` and ``write_gaps``."""
    if log is None:
        return
    for rows, spec in ((log.rows, WRITES), (log.gaps, WRITE_GAPS)):
        if not rows:
            continue
        df = pd.DataFrame(rows)
        df["node"] = log.host
        for column, value in ctx.stamp().items():
            df[column] = value
        for column in ("first_at", "last_at", "t_from", "t_to"):
            if column in df:
                df[column] = pd.to_datetime(df[column], utc=True, format="ISO8601")
        write_dataset(
            df[spec.column_names], spec, data_dir=ctx.data_dir, poc=ctx.poc,
            run_id=ctx.run_id, metadata=ctx.file_metadata,
        )  # fmt: skip


def _write(
    ctx: RunContext,
    everything: list[dict[str, Any]],
    nodes: dict[str, NodeDiff],
    from_phase: str,
    to_phase: str,
    diffed_at: pd.Timestamp,
) -> None:
    if everything:
        df = pd.DataFrame(everything)
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
    # The verdict per node, clean ones too: the weekly report and the record read it here.
    verdicts = pd.DataFrame(
        [
            {
                **ctx.stamp(),
                "node": node,
                "from_phase": from_phase,
                "to_phase": to_phase,
                "verdict": info.verdict,
                "leftovers": info.leftovers,
                "poc_items": info.poc_items,
                "unexplained": info.unexplained,
                "node_own": info.node_own,
                "items_compared": info.items_compared,
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


# --- what people read -------------------------------------------------------------------------


def verdict_line(result: dict[str, Any]) -> str:
    """``clean`` or ``leftovers: N`` (the PoC's and the unexplained items together)."""
    n = len(result["leftovers"])
    return "clean" if not n else f"leftovers: {n}"


def summary_line(result: dict[str, Any]) -> str:
    """The verdict with its split: ``leftovers: N (P the PoC's, U unexplained); M node-own
    change(s) listed apart``."""
    left = result["leftovers"]
    own = len(result.get("node_own", []))
    tail = f"; {own} node-own change(s) listed apart, not leftovers" if own else ""
    if not left:
        return f"clean{tail}"
    poc = sum(1 for x in left if x.get("class") == "poc")
    return f"leftovers: {len(left)} ({poc} the PoC's, {len(left) - poc} unexplained){tail}"


# a dict: the --json document, from the flow's JSON result
def json_form(result: dict[str, Any]) -> dict[str, Any]:
    """What ``exit-diff --json`` prints: the verdict, the leftovers (each with its class and
    reason) and the nodes' own changes apart (each with its reason)."""
    return {
        "verdict": result["verdict"],
        "leftovers": [
            {**{f: x[f] for f in LEFTOVER_FIELDS}, "class": x["class"], "reason": x["reason"]}
            for x in result["leftovers"]
        ],
        "node_own": [
            {**{f: x[f] for f in LEFTOVER_FIELDS}, "reason": x["reason"]}
            for x in result["node_own"]
        ],
    }


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    text = text if len(text) <= 80 else text[:77] + "…"
    return text.replace("|", "\\|").replace("\n", " ")


def leftovers_markdown(result: dict[str, Any], limit: int = 200) -> str:
    """The verdict first, then the leftovers (class, reason), then the node's own changes
    apart (reason), one table row each (values cut to stay readable)."""
    lines = [
        f"# Exit verdict: **{summary_line(result)}**",
        "",
        f"From `{result['from_phase']}` to `{result['to_phase']}`, per node: "
        + ", ".join(
            f"{n}: {v['leftovers']} leftover(s), {v.get('node_own', 0)} node-own"
            for n, v in result["nodes"].items()
        ),
        "",
    ]
    heads = [*LEFTOVER_FIELDS, "class", "reason"]
    for title, items in (
        ("Leftovers", result["leftovers"]),
        ("The nodes' own changes (not leftovers)", result.get("node_own", [])),
    ):
        if not items:
            continue
        lines += [f"## {title}", "", "| " + " | ".join(heads) + " |", "|---" * len(heads) + "|"]
        for item in items[:limit]:
            lines.append("| " + " | ".join(_cell(item.get(f)) for f in heads) + " |")
        if len(items) > limit:
            lines.append(f"\n… and {len(items) - limit} more (dataset exit_diff)")
        lines.append("")
    return "\n".join(lines) + "\n"
