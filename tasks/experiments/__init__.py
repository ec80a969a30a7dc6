"""The comparisons on both arms: recovery, overhead, cold start, checkpoint cost, their trials,
statistics and renderings."""
