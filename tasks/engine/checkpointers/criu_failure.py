"""What a failed CRIU run says about itself: its own error line and the option it asks for.

Classified by CRIU's exit status and its ``Dumping FAILED`` / ``Restoring FAILED`` verdict,
never by the word "Error": every log on these machines has ``Error (criu/util.c:…): rlimit:
Can't setup RLIMIT_NOFILE for self`` and CRIU still exits 0 (../shared/notes/range.md).
"""

from __future__ import annotations

import re
from pathlib import Path

# CRIU's own verdict line ends a failed log; every other "Error (...)" line before it may be
# noise (each log here has the rlimit one, and CRIU still exits 0: range.md). The cause is
# the first error line that is neither.
_FAILED_LINE = re.compile(r"(Dumping|Restoring|Pre-dumping) FAILED")
# "(00.019500) Error (file:line): what" at -v4; "Error (file:line): what" at the default level;
# a restore's lines may carry the task's pid first ("     1: Error ...").
_ERROR_LINE = re.compile(r"^(?:\([0-9.]+\)\s+)?(?:\d+:\s+)?Error \(([^)]*)\):\s*(.*)$")
_NOISE = ("Can't setup RLIMIT_NOFILE",)
# "consider using --tcp-established option", "Consider using --shell-job option"
_WANTS = re.compile(r"[Cc]onsider using (--[a-z][a-z-]*)")


def criu_failure_cause(log: Path) -> tuple[str | None, str | None]:
    """(CRIU's own line saying why it failed, the option it asks for) from its log."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return None, None
    cause = None
    for line in lines:
        match = _ERROR_LINE.match(line.strip())
        if match is None or _FAILED_LINE.search(line) or any(n in line for n in _NOISE):
            continue
        cause = f"{match.group(2).strip()} ({match.group(1)})"
        break
    if cause is None:  # no error line: the verdict line at least, if there is one
        cause = next((ln.strip() for ln in lines if _FAILED_LINE.search(ln)), None)
    wants = next((m.group(1) for ln in lines if (m := _WANTS.search(ln))), None)
    return cause, wants
