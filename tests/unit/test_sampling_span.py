"""The procfs sampler on real workload copies, and the span runner under SIGKILL.

A sampler run is killed at random moments, again and again, then a last run completes:
the same sample is never written twice, every stretch of time from the first read to the
last is either a sample row or a gap row (no silent loss), and no half-written file is
visible to readers.
"""

from __future__ import annotations

import pytest

from tasks.data.errors import BlastRadiusError
from tasks.data.locks import NodesBusy, hold_nodes
from tasks.data.runctx import open_run
from tasks.window.sampling.nodes import nodes_to_sample, sample
from tests.integration.test_sampling_span import _plan


def test_nodes_outside_the_plan_are_refused(write_plan) -> None:
    plan, _ = _plan(write_plan)
    with pytest.raises(BlastRadiusError, match="not one of the plan's nodes"):
        nodes_to_sample(plan, "gpu-node-99")


def test_one_sampler_per_node(write_plan) -> None:
    plan, path = _plan(write_plan)
    held = hold_nodes("local-sampler", ["local-a"], poc=plan.poc, run_id="other", stage="x")
    with (
        held,
        pytest.raises(NodesBusy, match="local-a"),
        open_run(plan, path, "sample_window") as ctx,
    ):
        sample(plan, ctx, span_s=0.5, interval_s=0.25)
