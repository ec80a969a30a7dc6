"""Stage 1: the scheduler's accounting history -> jobs, exposure, candidates."""
