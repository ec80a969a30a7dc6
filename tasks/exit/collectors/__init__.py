"""Snapshot collectors (docs/design.md §1.8), one per kind, keyed by the kind's name in the plan's
``exit.watch.kinds`` (tasks.data.plan.SnapshotKind).

Adding a kind: its name in ``SnapshotKind``, one module here with a
``collect_<kind>(col, obs)`` (a `SnapshotCollector`), and its entry in ``COLLECTORS``.
`tasks.exit.snapshots.collect` runs them in the order the plan names the kinds.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from tasks.exit.collectors.base import Collector, Observation, SnapshotCollector
from tasks.exit.collectors.cron import collect_cron
from tasks.exit.collectors.files import collect_files
from tasks.exit.collectors.ldconfig import collect_ldconfig
from tasks.exit.collectors.modules import collect_modules
from tasks.exit.collectors.mounts import collect_mounts
from tasks.exit.collectors.packages import collect_packages
from tasks.exit.collectors.processes import collect_processes
from tasks.exit.collectors.scheduler import collect_scheduler
from tasks.exit.collectors.sockets import collect_sockets
from tasks.exit.collectors.sysctls import collect_sysctls
from tasks.exit.collectors.units import collect_units
from tasks.exit.collectors.users import collect_users

COLLECTORS: Mapping[str, SnapshotCollector] = MappingProxyType(
    {
        "packages": collect_packages,
        "units": collect_units,
        "files": collect_files,
        "modules": collect_modules,
        "sysctls": collect_sysctls,
        "sockets": collect_sockets,
        "processes": collect_processes,
        "mounts": collect_mounts,
        "users": collect_users,
        "cron": collect_cron,
        "ldconfig": collect_ldconfig,
        "scheduler": collect_scheduler,
    }
)

__all__ = ["COLLECTORS", "Collector", "Observation", "SnapshotCollector"]
