"""The stages' side of the Slurm backend: overhead, cold start and the sweep as jobs."""
