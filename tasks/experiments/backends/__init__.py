"""The stages' side of each backend, one package per built cluster kind (local/, slurm/),
and their one registry (registry.py).

A backend is its engine package (tasks/engine/clusters/<kind>/: copies, faults, recovery's
steps) and, here, the runs overhead, cold start and the sweep make on it: these build the
stages' rows (tasks/experiments), which the engine layer below may not import.
"""
