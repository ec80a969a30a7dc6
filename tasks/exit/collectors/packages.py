"""``packages``: Debian packages (name, version, status) and conffiles changed since shipped."""

from __future__ import annotations

from collections.abc import Iterator

from tasks.exit.collectors.base import Collector, Observation
from tasks.exit.collectors.fs import md5_file


def _dpkg_paragraphs(text: str) -> Iterator[dict[str, str]]:
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        last = ""
        for line in block.splitlines():
            if line.startswith((" ", "\t")) and last:
                fields[last] += "\n" + line.strip()
            elif ":" in line:
                last, _, value = line.partition(":")
                fields[last] = value.strip()
        if "Package" in fields:
            yield fields


def collect_packages(col: Collector, obs: Observation) -> None:
    status = col.path("/var/lib/dpkg/status")
    try:
        text = status.read_text(errors="replace")
    except FileNotFoundError:
        col.excluded("packages", "no dpkg database (/var/lib/dpkg/status): not a Debian node")
        return
    except OSError as exc:
        col.error("packages:/var/lib/dpkg/status", exc.strerror or exc)
        return
    for pkg in _dpkg_paragraphs(text):
        name = f"{pkg['Package']}:{pkg.get('Architecture', '?')}"
        col.add(
            "packages", name, {"version": pkg.get("Version", ""), "status": pkg.get("Status", "")}
        )
        # A conffile edited (or deleted) since the package shipped it: what an install that
        # edits packaged config leaves behind even when the file's name is unchanged.
        for line in pkg.get("Conffiles", "").splitlines():
            parts = line.split()
            if len(parts) < 2 or parts[1] == "newconffile" or "obsolete" in parts[2:]:
                continue
            conf, shipped = parts[0], parts[1]
            try:
                actual = md5_file(col.path(conf))
            except FileNotFoundError:
                actual = "missing"
            except OSError as exc:
                col.error(f"packages:conffile:{conf}", exc.strerror or exc)
                continue
            if actual != shipped:
                col.add("packages", f"conffile:{conf}", {"package": name, "md5": actual})
