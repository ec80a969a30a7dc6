"""The cold-start stage's report: its verdict, its numbers per page-cache condition, where
its images were and how fast a restore read them, each restore, the plot."""

from __future__ import annotations

from tasks.data.render import fixed, markdown_table
from tasks.experiments.report import (
    checkpoint_lines,
    failure_lines,
    png_data_uri,
    verdict_line,
)
from tasks.experiments.results import ColdStartResult


def cold_start_lines(result: ColdStartResult) -> list[str]:
    lines = []
    # The judged condition (page cache dropped), then the warm one when the plan asks for it.
    for cond, s in (("", result.speedup), ("page cache warm, not judged: ", result.speedup_warm)):
        if s is None:
            lines.extend([] if cond else ["no native and restored start to compare"])
            continue
        for label, a in (("native launch → ready", s.native), ("restore → ready", s.restore)):
            lines.append(
                f"{cond}{label}: n={a.n}, median {fixed(a.median)} s "
                f"(min {fixed(a.min)}, max {fixed(a.max)})"
            )
        lines.append(
            f"{cond}speed-up (native/restore, {s.statistic}): {fixed(s.speedup, 2)}× "
            f"(95% CI {fixed(s.ci_low, 2)} … {fixed(s.ci_high, 2)}); verdict vs "
            f"{result.threshold}×: {s.verdict} ({s.verdict_reason})"
        )
    fit = result.restore_throughput
    if fit:
        lines.append(
            f"restore throughput: {fixed(fit.gbps, 2)} GB/s ({fit.method}, n={fit.n})"
            + (f"; {fit.note}" if fit.note else "")
        )
    images = result.images
    if images:
        lines.append(
            f"images in {images.images_dir} ({images.images_fs or 'file system unknown'}):"
            f" restore {fixed(images.restore_gbps, 2)} GB/s against a plain read of the same "
            f"bytes at {fixed(images.raw_read_gbps, 2)} GB/s (medians; efficiency "
            f"{fixed(images.efficiency, 2)}, 1.0 = as fast as reading them)"
        )
    lines.append(f"page cache before each timed start: {', '.join(result.page_cache)}")
    return lines


def cold_start_verdicts(result: ColdStartResult) -> list[str]:
    s = result.speedup
    threshold = f"{result.threshold:g}×"
    if s is None:
        return [
            verdict_line(
                "cold-start speed-up",
                "median",
                "—",
                threshold,
                "undecided",
                at_most=False,
                detail="no native and restored start to compare",
            )
        ]
    return [
        verdict_line(
            "cold-start speed-up (native launch / restore)",
            s.statistic,
            f"{fixed(s.speedup, 2)}×",
            threshold,
            s.verdict,
            at_most=False,
            by_ci=True,
            detail=f"95% CI {fixed(s.ci_low, 2)} … {fixed(s.ci_high, 2)}; {s.verdict_reason}",
        )
    ]


def cold_start_markdown(result: ColdStartResult) -> str:
    lines = [
        "# Cold start: native launch against restore",
        "",
        "## Verdict (against the plan)",
        "",
        *[f"- {v}" for v in cold_start_verdicts(result)],
        "",
        "## Numbers (measured)",
        "",
        f"Run `{result.run_id}`: the same ready probe ends both clocks (native launch → "
        "ready on the unmanaged arm, restore → ready on the managed arm).",
        "",
    ]
    if result.workload:
        lines += [
            f"Timed: the workload `{result.workload}`, ready when {result.ready_signal}. The "
            "native side is the plan's command, unmodified.",
            "",
        ]
    lines += [f"- {line}" for line in cold_start_lines(result)]
    lines.append("")
    lines += markdown_table(
        ("trial", "restore → ready s", "criu restore s", "checkpoint MB", "GB/s"),
        [
            [
                r.trial_id,
                fixed(r.ready_s),
                fixed(r.restore_s),
                "—" if r.checkpoint_bytes is None else f"{r.checkpoint_bytes / 1e6:.1f}",
                fixed(r.restore_gbps, 2),
            ]
            for r in result.restores
        ],
        "lrrrr",
    )
    uri = png_data_uri(result.plot)
    lines += ["", "## Restore seconds against checkpoint size", ""]
    if uri:
        lines.append(f"![restore seconds against checkpoint bytes]({uri})")
    lines += ["", f"The plot's file: `{result.plot}`", "", "## Checkpoints taken", ""]
    lines += checkpoint_lines(result.checkpoints)
    lines += failure_lines(result.failures, "Failed starts")
    return "\n".join(lines)
