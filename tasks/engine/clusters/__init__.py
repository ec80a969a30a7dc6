"""Cluster backends: where workload copies run (local slots now; Slurm and Kubernetes next)."""
