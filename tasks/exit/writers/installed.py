"""What the install put on a node, as the writer recorder needs it: an executable or a
service unit the install created or changed runs with no PoC ancestry (a daemon the install
enabled is started by the service manager, a plugin is loaded by slurmd), yet its writes are
the PoC's.

Two sources: the checkpointer's known footprint (file and unit globs, fixed before the
install: tasks/exit/footprint.py) and the install's manifests, read while the recorder runs
(each is written before the install's first file and removed by the uninstall, so what was
read once is remembered).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from dataclasses import dataclass, field

# A unit named in a path or a glob: a unit file or its drop-in folder (`X.service.d/…`).
_UNIT = re.compile(r"([\w@:.\\-]+\.(?:service|socket|timer|path|mount|scope))(?:\.d)?(?:/|$)")


def unit_of(path: str) -> str | None:
    """The systemd unit a unit file, drop-in or cgroup path names (its last), or None."""
    found = _UNIT.findall(path)
    return found[-1] if found else None


@dataclass
class InstalledSet:
    """The install's executables and units on this node (module docstring)."""

    globs: tuple[str, ...] = ()
    manifests: tuple[str, ...] = ()
    files: set[str] = field(default_factory=set)
    _read: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    _units: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._units = self._named_units()

    def refresh(self) -> None:
        """Read a manifest that is new or changed since the last look (a stat each)."""
        for path in self.manifests:
            try:
                st = os.stat(path)
            except OSError:
                continue  # not written yet, or removed: what was read is kept
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if self._read.get(path) == stamp:
                continue
            try:
                with open(path, encoding="utf-8") as fh:
                    manifest = json.load(fh)
            except (OSError, ValueError):
                continue  # half-written: its rename comes next
            self._read[path] = stamp
            entries = [*manifest.get("files", []), *manifest.get("hooks", [])]
            for entry in entries:
                self.files.add(str(entry["path"] if isinstance(entry, dict) else entry))
            self._units = self._named_units()

    def _named_units(self) -> set[str]:
        named = (unit_of(p) for p in (*self.files, *self.globs))
        return {u for u in named if u is not None}

    def owns_file(self, path: str | None) -> str | None:
        """Why ``path`` (an executable, a script) is the install's, or None."""
        if path is None:
            return None
        if path in self.files:
            return f"{path}, in the install's manifest"
        glob = next((g for g in self.globs if fnmatch.fnmatchcase(path, g)), None)
        return f"{path}, the checkpointer's known footprint ({glob})" if glob else None

    def owns_unit(self, cgroup: str | None) -> str | None:
        """Why a process in ``cgroup`` runs in a unit the install created or changed."""
        unit = unit_of(cgroup or "")
        if unit is None or unit not in self._units:
            return None
        return f"its unit {unit} was created or changed by the install"
