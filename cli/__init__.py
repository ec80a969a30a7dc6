"""The `ckpt-poc` command line: cli/app.py holds the app and its one list of commands.

- common.py: what every command shares (the console, `PlanArg`, `JsonOpt`, the
  `command_body` that readies Prefect and says a `CkptPocError` as one clear line, exit 1);
  it imports no command module.
- one module per stage of commands (plan, baseline, experiments, window, samples, status,
  exit, install, poc, record); each imports flows/ lazily, inside its commands, so that a
  command that only reads never loads Prefect.
- reference.py: docs/reference/cli.md's command sections, written from each command's help
  (`scripts/cli-reference`; a unit test checks the page is current).
- server.py: the command's own Prefect API server; automations.py: a self-hosted server's
  watch for silent flow runs (`python -m cli.automations`).

flows/ never imports cli/.
"""

from __future__ import annotations

import os

# Before anything imports Prefect (flows/__init__.py says the same for the flows).
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
