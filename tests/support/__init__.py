"""The infrastructure the tests share: the real services they start (Slurm, Prefect,
Prometheus), their watchdog, the stand-in GPU libraries and the data fixtures."""
