"""Which nodes a sampler run reads, with which backend (the plan's ``window.sampler``).

procfs and nvml read the machine they run on: on a local cluster every named slot is this
machine; on Slurm or Kubernetes the run must be on a test node (the deployment's worker
runs there), and a node outside the plan is refused, as every other action refuses it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import signal
import socket
import threading
from collections.abc import Iterator

from tasks.data.datasets import TRIALS
from tasks.data.errors import BlastRadiusError
from tasks.data.locks import hold_nodes
from tasks.data.plan import Plan
from tasks.data.runctx import RunContext
from tasks.data.store import read_dataset
from tasks.engine.clusters.registry import cluster_kind
from tasks.window.sampling import Backend
from tasks.window.sampling.attribution import ProcessAttributor, slurm_jobs_from_trials
from tasks.window.sampling.span import (
    STAGE,
    SampleRun,
    SpanWriter,
    covered_until,
    run_span,
    salvage_killed_runs,
    window_start,
)


def nodes_to_sample(plan: Plan, node: str | None = None) -> list[str]:
    """The nodes this run samples; refuses any node the plan does not name."""
    if node is not None and node not in plan.cluster.nodes:
        raise BlastRadiusError(f"node {node!r} is not one of the plan's nodes {plan.cluster.nodes}")
    if cluster_kind(plan).nodes_are_this_machine or plan.window.sampler == "prometheus":
        return [node] if node else list(plan.cluster.nodes)
    here = node or _plan_node_here(plan)
    if here not in plan.cluster.nodes:
        raise BlastRadiusError(
            f"this machine ({here}) is not one of the plan's nodes {plan.cluster.nodes}: the "
            f"{plan.window.sampler} sampler reads the node it runs on; run it there"
        )
    return [here]


def _plan_node_here(plan: Plan) -> str:
    """The plan node this machine is: its own name, else the node the scheduler runs on
    this host (a Slurm NodeName with this NodeHostName); else this machine's name."""
    here = socket.gethostname().split(".")[0]
    if here in plan.cluster.nodes:
        return here
    host_of = cluster_kind(plan).host_of
    return next((n for n in plan.cluster.nodes if host_of(n) == here), here)


def experiment_jobs(ctx: RunContext) -> dict[str, tuple[str, str]]:
    """Scheduler job id -> (arm, trial) of every job the experiments ran (committed)."""
    trials = read_dataset(
        TRIALS,
        data_dir=ctx.data_dir,
        poc=ctx.poc,
        columns=["arm", "trial_id", "job_id", "recovery_job_id"],
    )
    return slurm_jobs_from_trials(trials)


def make_backends(plan: Plan, ctx: RunContext, nodes: list[str]) -> dict[str, Backend]:
    slurm_jobs = experiment_jobs(ctx)
    backends: dict[str, Backend] = {}
    for node in nodes:
        attribute = ProcessAttributor(node, plan.workload.name, slurm_jobs)
        if plan.window.sampler == "procfs":
            from tasks.window.sampling.procfs import ProcfsSampler

            backends[node] = ProcfsSampler(node, attribute)
        elif plan.window.sampler == "nvml":
            from tasks.window.sampling.nvml import NvmlSampler

            backends[node] = NvmlSampler(node, attribute)
        else:
            raise ValueError("a prometheus window is read back, not sampled live (sample())")
    return backends


def sample(
    plan: Plan,
    ctx: RunContext,
    *,
    span_s: float | None = None,
    interval_s: float | None = None,
    node: str | None = None,
    flush_s: float | None = None,
    stop: threading.Event | None = None,
) -> SampleRun:
    """One sampler run over the plan's (or the given) span on each node, committed."""
    nodes = nodes_to_sample(plan, node)
    span = float(span_s if span_s is not None else plan.window.span_s)
    interval = float(interval_s if interval_s is not None else plan.window.interval_s)
    if not (0 < interval <= span):
        raise ValueError(f"interval {interval} s must be > 0 and ≤ the span {span} s")
    stop = stop or threading.Event()
    held = hold_nodes(
        f"{plan.cluster.kind}-sampler",
        nodes,
        poc=plan.poc,
        run_id=ctx.run_id,
        stage=STAGE,
        wait=False,
    )
    with held, _stop_on_sigterm(stop):
        if plan.window.sampler == "prometheus":
            return read_prometheus_history(plan, ctx, nodes, span)
        backends = make_backends(plan, ctx, nodes)
        extra = {} if flush_s is None else {"flush_s": flush_s}
        return run_span(plan, ctx, backends, span_s=span, interval_s=interval, stop=stop, **extra)


@contextlib.contextmanager
def _stop_on_sigterm(stop: threading.Event) -> Iterator[None]:
    """SIGTERM (a cancelled flow run, `kill`) ends the span early but cleanly: what was read
    is written and committed ('stopped early'). Only the main thread can take signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def read_prometheus_history(
    plan: Plan, ctx: RunContext, nodes: list[str], span_s: float
) -> SampleRun:
    """Read each node's history from where the committed rows end (or one span back) to a
    little before now: Prometheus keeps what a missed run did not read, so only its own
    holes (an exporter outage) become gaps. The last two steps are left for the next run:
    their scrapes may not have arrived yet and would be recorded as a gap for ever."""
    from tasks.window.sampling.prometheus import read_span

    source = plan.window.prometheus
    assert source is not None  # the plan validator requires it for this sampler
    salvaged = salvage_killed_runs(ctx.data_dir, ctx.poc)
    # whole seconds: Prometheus times are milliseconds, and the next run starts exactly here
    until = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=2 * source.step_s)).replace(
        microsecond=0
    )
    jobs = experiment_jobs(ctx)
    writer = SpanWriter(ctx)
    spans: dict[str, tuple[str, str]] = {}
    for node in nodes:
        since = covered_until(ctx.data_dir, ctx.poc, node, "prometheus", until)
        start = since or max(window_start(plan), until - dt.timedelta(seconds=span_s))
        if start >= until:
            continue
        rows, gaps = read_span(source, node, start, until)
        for row in rows:  # the series' job label, tied to the arm the experiments ran it in
            if row.get("job_id") in jobs:
                row["arm"], row["trial_id"] = jobs[row["job_id"]]
                row["workload"] = plan.workload.name
        writer.samples.extend(rows)
        writer.gaps.extend(gaps)
        spans[node] = (start.isoformat(), until.isoformat())
    writer.flush()
    return SampleRun(
        run_id=ctx.run_id,
        nodes=nodes,
        reads=len(spans),
        samples=writer.rows_written["samples"],
        gaps=writer.rows_written["gaps"],
        parts=writer.parts,
        salvaged_runs=salvaged,
        from_=min((f for f, _ in spans.values()), default=until.isoformat()),
        to=until.isoformat(),
        data_dir=str(ctx.data_dir),
    )
