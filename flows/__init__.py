"""Prefect flows, one per stage; thin: they sequence tasks/ and gates."""

from __future__ import annotations

import logging
import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


class _DomainErrorsWithoutTraceback(logging.Filter):
    """A CkptPocError is an expected outcome (a bad plan, a failed gate) with its own clear
    message: log that message, not a Python traceback. Other exceptions keep theirs."""

    def filter(self, record: logging.LogRecord) -> bool:
        from tasks.data.errors import CkptPocError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, CkptPocError):
            record.exc_info = None
            record.exc_text = None
        return True


for _name in ("prefect.task_runs", "prefect.flow_runs"):
    logging.getLogger(_name).addFilter(_DomainErrorsWithoutTraceback())
