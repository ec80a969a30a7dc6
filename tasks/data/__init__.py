"""What every stage reads and writes: the plan, the datasets and their gates, runs and their
commit records, fingerprints, node locks, ISO weeks, errors."""
