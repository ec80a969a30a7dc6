"""Running workloads: clusters (local, Slurm), checkpointers (CRIU, Cedana contract), probes,
the clock's events, faults, preflight, the in-job wrappers, and where a run's files go
(paths.py). Each backend kind is one module behind a protocol and a registry (clusters/base.py,
checkpointers/base.py, faults.py)."""
