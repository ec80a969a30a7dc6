"""Checkpoint cost: one `trials` row per CRIU dump taken in any experiment.

Freeze time (how long CRIU kept the workload frozen), dump duration and image bytes are
what the later extrapolation needs (the interval that minimises waste for a failure rate,
docs/design.md §4). Rows come from the checkpointer's own events, so every dump is counted —
failed ones too, with CRIU's reason.
"""

from __future__ import annotations

import os
from typing import Any

import pandas as pd

from tasks.data.events import Ev
from tasks.data.plan import Plan
from tasks.data.row_types import CheckpointRow, DumpPhases, ImagesPlace
from tasks.engine.clock import Event
from tasks.experiments.clocks import clock_of
from tasks.experiments.results import CheckpointSummary, Spread
from tasks.experiments.trials import workload_hash

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")  # CRIU's pages are the host's
# The reason's prefix of a dump that failed because the workload ended while it was dumped.
WORKLOAD_EXITED = "the workload exited during the dump: "


def checkpoint_rows(events: list[Event], plan: Plan, node: str) -> pd.DataFrame:
    """The `measure='checkpoint'` rows for every dump in ``events``."""
    starts = {
        (e.trial_id, e.arm, e.detail.get("index")): e
        for e in events
        if e.event == Ev.CHECKPOINT_START
    }
    rows: list[CheckpointRow] = []
    for e in events:
        if e.event not in (Ev.CHECKPOINT_END, Ev.CHECKPOINT_FAILED):
            continue
        index = int(e.detail["index"])
        start = starts.get((e.trial_id, e.arm, index), e)
        row: CheckpointRow = {
            "measure": "checkpoint",
            "trial_id": f"{e.trial_id}/ckpt-{index:05d}",
            "arm": e.arm,
            "repeat": index,
            "started_at": start.t_wall,
            "clock": clock_of("checkpoint", e.arm),
            "includes": "one full CRIU dump, the workload left running"
            if start.detail.get("leave_running", True)
            else "one full CRIU dump that ended the workload (on a notice)",
            "gpus": plan.workload.gpus,
            "gpus_from": "plan",
            "nodes": node,
            "workload_hash": workload_hash(plan),
        }
        row.update(images_place(e))
        if e.event == Ev.CHECKPOINT_END:
            frozen = e.detail.get("frozen_us")
            phases = dump_phases(e.detail)
            row.update(
                status="ok",
                dump_s=e.detail.get("dump_s"),
                freeze_s=frozen / 1e6 if frozen is not None else None,
                checkpoint_bytes=e.detail.get("image_bytes"),
                images_write_gbps=images_write_gbps(phases),
                **phases,
            )
        else:
            tail = str(e.detail.get("log_tail", "")).strip().splitlines()
            why = WORKLOAD_EXITED if e.detail.get("workload_exited") else ""
            row.update(
                status="failed",
                reason=f"{why}criu dump exited {e.detail.get('rc')}: {tail[-1] if tail else ''}"[
                    :500
                ],
            )
        rows.append(row)
    return pd.DataFrame(rows)


def _s(us: Any) -> float | None:
    return int(us) / 1e6 if us is not None else None


def dump_phases(detail: dict[str, Any]) -> DumpPhases:
    """CRIU's own split of one dump (its `--display-stats`, as `checkpoint_end` carries
    them): the rows' columns, on every dump row whichever stage made it."""
    return {
        "dump_memdump_s": _s(detail.get("memdump_us")),
        "dump_memwrite_s": _s(detail.get("memwrite_us")),
        "dump_pages_scanned": detail.get("pages_scanned"),
        "dump_pages_written": detail.get("pages_written"),
    }


def images_write_gbps(phases: DumpPhases) -> float | None:
    """The pages CRIU wrote over its memory write time, GB/s (a dump's write throughput)."""
    pages, seconds = phases.get("dump_pages_written"), phases.get("dump_memwrite_s")
    if not pages or not seconds:
        return None
    return int(pages) * PAGE_BYTES / seconds / 1e9


def images_place(event: Any) -> ImagesPlace:
    """Where a dump or restore event's images were, and on what file system (CRIU's
    checkpointer puts both on its events)."""
    detail = event.detail if event is not None else {}
    return {"images_dir": detail.get("images"), "images_fs": detail.get("images_fs")}


def restore_fork_s(restored: Any) -> float | None:
    """CRIU's forking time of one restore (its `restored` event's ``forking_us``); the rest
    of the restore's seconds is CRIU's restore proper."""
    return _s(restored.detail.get("forking_us")) if restored is not None else None


def summarise_checkpoints(trials: pd.DataFrame) -> dict[str, CheckpointSummary]:
    """Per workload (by its hash): n, failed, median/min/max of dump seconds, freeze
    seconds, bytes."""
    rows = trials[trials["measure"] == "checkpoint"]
    ok = rows[rows["status"] == "ok"]
    out: dict[str, CheckpointSummary] = {}
    for wl, mine in ok.groupby("workload_hash"):
        out[str(wl)] = CheckpointSummary(
            n=len(mine),
            failed=int(((rows["workload_hash"] == wl) & (rows["status"] == "failed")).sum()),
            dump_s=Spread.of(mine["dump_s"]),
            freeze_s=Spread.of(mine["freeze_s"]),
            checkpoint_bytes=Spread.of(mine["checkpoint_bytes"]),
        )
    return out
