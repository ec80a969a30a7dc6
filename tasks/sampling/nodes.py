"""Which nodes a sampler run reads, with which backend (the plan's ``window.sampler``).

procfs and nvml read the machine they run on: on a local cluster every named slot is this
machine; on Slurm or Kubernetes the run must be on a test node (the deployment's worker
runs there), and a node outside the plan is refused, as every other action refuses it.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from collections.abc import Iterator
from typing import Any

from tasks.datasets import TRIALS, read_dataset
from tasks.errors import BlastRadiusError
from tasks.locks import hold_nodes
from tasks.plan import Plan
from tasks.runctx import RunContext
from tasks.sampling import Backend
from tasks.sampling.attribution import ProcessAttributor, slurm_jobs_from_trials
from tasks.sampling.span import STAGE, run_span


def nodes_to_sample(plan: Plan, node: str | None = None) -> list[str]:
    """The nodes this run samples; refuses any node the plan does not name."""
    if node is not None and node not in plan.cluster.nodes:
        raise BlastRadiusError(f"node {node!r} is not one of the plan's nodes {plan.cluster.nodes}")
    if plan.cluster.kind == "local" or plan.window.sampler == "prometheus":
        return [node] if node else list(plan.cluster.nodes)
    here = node or socket.gethostname().split(".")[0]
    if here not in plan.cluster.nodes:
        raise BlastRadiusError(
            f"this machine ({here}) is not one of the plan's nodes {plan.cluster.nodes}: the "
            f"{plan.window.sampler} sampler reads the node it runs on; run it there"
        )
    return [here]


def make_backends(plan: Plan, ctx: RunContext, nodes: list[str]) -> dict[str, Backend]:
    trials = read_dataset(
        TRIALS,
        data_dir=ctx.data_dir,
        poc=ctx.poc,
        columns=["arm", "trial_id", "job_id", "recovery_job_id"],
    )
    slurm_jobs = slurm_jobs_from_trials(trials)
    backends: dict[str, Backend] = {}
    for node in nodes:
        attribute = ProcessAttributor(node, plan.workload.name, slurm_jobs)
        if plan.window.sampler == "procfs":
            from tasks.sampling.procfs import ProcfsSampler

            backends[node] = ProcfsSampler(node, attribute)
        elif plan.window.sampler == "nvml":
            from tasks.sampling.nvml import NvmlSampler

            backends[node] = NvmlSampler(node, attribute)
        else:
            raise NotImplementedError("prometheus spans are read by tasks.sampling.nodes.sample")
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
) -> dict[str, Any]:
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
