"""``users``: users and groups (/etc/passwd, /etc/group), without their password field."""

from __future__ import annotations

from tasks.exit.collectors.base import Collector, Observation


def collect_users(col: Collector, obs: Observation) -> None:
    for file, label in (("/etc/passwd", "user"), ("/etc/group", "group")):
        try:
            lines = col.path(file).read_text().splitlines()
        except OSError as exc:
            col.error(f"users:{file}", exc.strerror or exc)
            continue
        for line in lines:
            fields = line.split(":")
            if len(fields) >= 3 and fields[0]:
                # The password field ("x") carries nothing: shadow is hashed under files.
                col.add("users", f"{label}:{fields[0]}", ":".join(fields[2:]))
