"""The job states Slurm's accounting can hold: what the jobs dataset's `state` column allows
(declared here, beside the datasets, so that the schema needs nothing from the parser)."""

# The job states sacct documents (``CANCELLED by N`` is normalised to CANCELLED).
DOCUMENTED_STATES = (
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PENDING",
    "PREEMPTED",
    "RUNNING",
    "REQUEUED",
    "RESIZING",
    "REVOKED",
    "SUSPENDED",
    "TIMEOUT",
)
# A state sacct does not document (a site's plugin, a newer Slurm) is kept, not quarantined:
# its row's ``state`` is UNKNOWN and its name stays in ``state_raw``, under which exposure
# counts it. These are the values the jobs dataset's ``state`` column may take.
UNKNOWN_STATE = "UNKNOWN"
# What exposure groups the allocations of a dump without a State field under.
NO_STATE = "(no State in the dump)"
SLURM_STATES = (*DOCUMENTED_STATES, UNKNOWN_STATE)
