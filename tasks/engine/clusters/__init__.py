"""Cluster backends: where workload copies run — local slots and Slurm jobs, each behind the
`Cluster` protocol and keyed by the plan's cluster.kind (base.py); Kubernetes is contract only."""
