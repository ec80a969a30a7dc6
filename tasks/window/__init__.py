"""The long window: samplers, job-level utilization, the weekly report."""
