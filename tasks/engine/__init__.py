"""Running workloads: clusters (local, Slurm), checkpointers (CRIU, Cedana contract), probes,
the clock's events, faults, preflight, the in-job wrappers."""
